"""NeRD's contact geometry: the slots collect records (MuJoCo's own contacts, inactive
slots zero), the same slots computed again from a state, a geometry model that does not
care where the robot stands or faces, exact resume, validation with teacher-forced and
self-computed contacts, and exports (simulator, ONNX, learned env) that compute their
own contacts."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import slhub
from helpers import REPO, check_nerd_resume
from slhub.builtin.nerd.model import NerdLayout

mujoco = pytest.importorskip("mujoco")
gymnasium = pytest.importorskip("gymnasium")

from slhub.sim.contacts import (  # noqa: E402
    COMPONENTS,
    StateContacts,
    contact_geometry,
    contact_geoms,
    slot_names,
)

ANT = REPO / "examples" / "nerd" / "ant" / "sl.train.yaml"
HOPPER = REPO / "examples" / "nerd" / "hopper" / "sl.train.yaml"
#: A tiny Ant model in the body frame that reads the contact geometry.
SMALL = [
    "model.frame=body",
    "model.width=16",
    "model.layers=1",
    "model.heads=2",
    "model.mlp_hidden=32",
    "model.history=4",
    "validation.horizons=[2, 8]",
    "trainer.batch_size=8",
    "trainer.device=cpu",
    "data.split.validation_ratio=0.34",
    "data.features.extra=[contact_geometry]",
]
BUDGET = ["trainer.steps=30", "trainer.validate_every=30", "trainer.save_every=30"]


@pytest.fixture(scope="module")
def ant(tmp_path_factory) -> Path:
    from slhub.sim import collect

    out = tmp_path_factory.mktemp("ant") / "episodes"
    collect(
        out, "gymnasium:Ant-v5", episodes=6, steps=40, actions="smooth", seed=0,
        through_termination=True, contacts="geometry",
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def hopper(tmp_path_factory) -> Path:
    from slhub.sim import collect

    out = tmp_path_factory.mktemp("hopper") / "episodes"
    collect(
        out, "gymnasium:Hopper-v5", episodes=3, steps=60, actions="smooth", seed=0,
        through_termination=True, contacts="force,geometry",
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def run(ant: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "nerd"
    slhub.train(ANT, [*SMALL, *BUDGET, f"data.path={ant}", f"trainer.output_dir={out}"])
    return out


@pytest.fixture(scope="module")
def predictor(run: Path, tmp_path_factory):
    from slhub.export import load
    from slhub.export.writer import run_export

    out = tmp_path_factory.mktemp("export") / "export"
    run_export(run / "last.pt", out)
    return load(out)


# ------------------------------------------------------------------ the slots


def test_the_slots_at_a_known_state_are_mujocos_contacts():
    """Hopper-v5 with its foot pressed 1.5 cm into the floor: the foot's slot is MuJoCo's
    deepest contact of the foot, read directly; every other slot is all zero."""
    model = gymnasium.make("Hopper-v5").unwrapped.model
    data = mujoco.MjData(model)
    foot = model.geom("foot_geom").id
    data.qpos[:] = model.qpos0
    mujoco.mj_forward(model, data)
    bottom = data.geom_xpos[foot][2] - model.geom_size[foot][0]  # a level capsule
    data.qpos[1] -= bottom + 0.015  # rootz: the foot 1.5 cm into the floor, the leg above it
    mujoco.mj_forward(model, data)
    geoms = contact_geoms(model)
    assert slot_names(model) == ("torso_geom", "thigh_geom", "leg_geom", "foot_geom")
    slots = contact_geometry(model, data, geoms).reshape(len(geoms), len(COMPONENTS))
    touching = [
        data.contact[i]
        for i in range(data.ncon)
        if foot in (data.contact[i].geom1, data.contact[i].geom2)
        and data.contact[i].efc_address >= 0
    ]
    assert touching
    deepest = min(touching, key=lambda c: c.dist)
    assert deepest.geom2 == foot and deepest.geom1 == model.geom("floor").id
    normal = np.array(deepest.frame[:3])
    point = np.array(deepest.pos) + 0.5 * deepest.dist * normal
    wanted = np.concatenate([point, normal, [-deepest.dist, 1.0]])
    assert np.array_equal(slots[geoms.index(foot)], wanted)
    # the point is on the foot's surface, the floor at z = 0: depth below it; normal up
    assert math.isclose(slots[geoms.index(foot), 2], -slots[geoms.index(foot), 6], abs_tol=1e-9)
    assert np.array_equal(slots[geoms.index(foot), 3:6], [0.0, 0.0, 1.0])
    assert slots[geoms.index(foot), 6] > 0.01
    others = [i for i, g in enumerate(geoms) if g != foot]
    assert np.array_equal(slots[others], np.zeros((len(others), len(COMPONENTS))))


def test_collect_records_the_slots_and_names_them(ant: Path, hopper: Path):
    from slhub.data import open_dataset

    dataset = open_dataset(ant)
    source = dataset.source
    assert source["contacts"] == ["geometry"]
    slots = source["contact_geometry"]["slots"]
    assert slots[0] == "torso_geom" and len(slots) == 13
    assert "contact" not in dataset.features
    names = dataset.features["contact_geometry"].names
    assert names[:8] == tuple(f"torso_geom_{c}" for c in COMPONENTS)
    values = dataset.read("contact_geometry", 0, 0, 40).reshape(40, len(slots), 8)
    active = values[..., 7]
    assert set(np.unique(active)) == {0.0, 1.0} and active.sum() > 0
    assert np.array_equal(values[active == 0], np.zeros(((active == 0).sum(), 8)))
    normals = values[active == 1][:, 3:6]
    assert np.allclose(np.linalg.norm(normals, axis=-1), 1.0)
    assert (values[..., 6] >= 0).all()
    both = open_dataset(hopper)
    assert both.source["contacts"] == ["force", "geometry"]
    assert {"contact", "contact_geometry"} <= set(both.features)


def test_contacts_computed_at_the_true_states_equal_the_recorded_ones(hopper: Path):
    """The same computation repeated at the recorded qpos gives the recorded geometry bit
    for bit; the forces (which also depend on the solver's warm start) agree closely."""
    from slhub.data import open_dataset

    dataset = open_dataset(hopper)
    source = dataset.source
    qpos, qvel = (dataset.features[f].names for f in ("qpos", "qvel"))
    states = [f"qpos.{n}" for n in qpos] + [f"qvel.{n}" for n in qvel]
    actions = dataset.features["action"].names
    geometry = [f"contact_geometry.{n}" for n in dataset.features["contact_geometry"].names]
    forces = [f"contact.{n}" for n in dataset.features["contact"].names]
    computed = StateContacts(source["env"], states, actions, geometry + forces)
    length = int(dataset.lengths[0])
    state = np.concatenate([dataset.read(f, 0, 0, length) for f in ("qpos", "qvel")], -1)
    action = dataset.read("action", 0, 0, length)
    previous = np.concatenate([np.zeros_like(action[:1]), action[:-1]])
    found = computed(state, previous)
    recorded = dataset.read("contact_geometry", 0, 0, length)
    assert np.array_equal(found[:, : len(geometry)], recorded)
    assert recorded[:, 7::8].sum() > 0
    force = dataset.read("contact", 0, 0, length)
    assert np.allclose(found[:, len(geometry) :], force, rtol=1e-3, atol=1e-3 * force.max())


# ------------------------------------------------------------------ the model


def test_the_layout_carries_the_slots_and_a_layout_without_them_reads_as_before(
    predictor,
):
    layout = predictor.layout
    assert len(layout.contact_slots) == 13 and layout.frame == "body"
    assert layout.contact_slots[0] == tuple(f"torso_geom_{c}" for c in COMPONENTS)
    assert NerdLayout.from_dict(layout.to_dict()) == layout
    plain = NerdLayout(("a", "b"), ("u",), ("c",))
    assert "contact_slots" not in plain.to_dict()
    assert NerdLayout.from_dict(plain.to_dict()) == plain


def _turn(points: np.ndarray, yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    turn = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    return points @ turn.T


def _turned_tokens(tokens: np.ndarray, layout: NerdLayout, yaw: float) -> np.ndarray:
    """``tokens`` of the whole episode turned by ``yaw`` about the vertical through a
    shifted origin: base position, orientation, linear velocity, contact points and
    normals (the angular velocity is in the body frame, the joints are unchanged)."""
    names = layout.input_names
    out = tokens.copy()
    shift = np.array([3.0, -2.0, 0.0])

    def cols(parts: list[str]) -> list[int]:
        return [names.index(p) for p in parts]

    base = layout.base
    out[..., cols(list(base.position))] = _turn(tokens[..., cols(list(base.position))], yaw) + shift
    out[..., cols(list(base.linear_velocity))] = _turn(
        tokens[..., cols(list(base.linear_velocity))], yaw
    )
    half = np.array([math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)])
    q = tokens[..., cols(list(base.orientation))]
    w, x, y, z = np.moveaxis(q, -1, 0)
    hw, _, _, hz = half
    out[..., cols(list(base.orientation))] = np.stack(
        [hw * w - hz * z, hw * x - hz * y, hw * y + hz * x, hw * z + hz * w], -1
    )
    for slot in layout.contact_slots:
        active = tokens[..., names.index(slot[7])] > 0.5
        point = _turn(tokens[..., cols(list(slot[0:3]))], yaw) + shift
        out[..., cols(list(slot[0:3]))] = np.where(active[..., None], point, 0.0)
        out[..., cols(list(slot[3:6]))] = _turn(tokens[..., cols(list(slot[3:6]))], yaw)
    return out


def test_a_geometry_model_does_not_care_where_the_robot_stands_or_faces(ant: Path, predictor):
    """Turning a whole episode about the vertical (and moving it) changes neither what
    the body-frame model sees nor its prediction, beyond float error."""
    from slhub.data import open_dataset

    dataset = open_dataset(ant)
    features = ("qpos", "qvel", "action", "contact_geometry")
    rows = np.concatenate([dataset.read(f, 1, 0, 12) for f in features], -1)
    tokens = np.stack([rows[0:4], rows[4:8], rows[8:12]])
    layout = predictor.layout
    model = predictor.model.double()
    turned = _turned_tokens(tokens, layout, 1.1)
    assert not np.allclose(turned, tokens)

    def seen(values: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(values)
        t = model.contacts.to_body(t, *model.frame.pose(t))
        inputs, gravity = model.frame.inputs(t)
        return torch.cat([inputs, gravity], -1)

    with torch.no_grad():
        assert torch.allclose(seen(turned), seen(tokens), atol=1e-9)
        plain = model.predict_delta(torch.from_numpy(tokens))
        moved = model.predict_delta(torch.from_numpy(turned))
    assert torch.allclose(plain, moved, atol=1e-9)
    model.float()


@pytest.mark.slow
def test_a_geometry_onnx_graph_predicts_what_torch_does(ant: Path, run: Path, tmp_path: Path):
    pytest.importorskip("onnxruntime")
    import onnxruntime

    from slhub.data import open_dataset
    from slhub.export import load
    from slhub.export.writer import run_export

    run_export(run / "last.pt", tmp_path / "export")
    predictor = load(tmp_path / "export")
    graph = predictor.write_onnx(tmp_path / "export")
    session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    dataset = open_dataset(ant)
    features = ("qpos", "qvel", "action", "contact_geometry")
    rows = np.concatenate([dataset.read(f, 1, 0, 12) for f in features], -1)
    tokens = torch.from_numpy(np.stack([rows[:4], rows[4:8], rows[8:12]])).float()
    expected = predictor(tokens, input_names=predictor.input_names).numpy()
    (found,) = session.run(["next_state"], {"tokens": tokens.numpy()})
    assert np.allclose(found, expected, atol=1e-4 * (1 + np.abs(expected).max()))


def test_a_world_frame_geometry_model_sees_the_slots_as_recorded(ant: Path, tmp_path: Path):
    from slhub.export import load
    from slhub.export.writer import run_export

    out = tmp_path / "run"
    budget = ["trainer.steps=2", "trainer.validate_every=2", "trainer.save_every=2"]
    world = [*SMALL[1:], "model.frame=world", *budget]
    slhub.train(ANT, [*world, f"data.path={ant}", f"trainer.output_dir={out}"])
    run_export(out / "last.pt", out / "export")
    predictor = load(out / "export")
    assert predictor.layout.frame == "world" and len(predictor.layout.contact_slots) == 13
    assert predictor.model.contacts is None
    (record,) = [
        r for r in slhub.read_metrics(out / "metrics.jsonl") if "validation/rollout_mse_8" in r
    ]
    assert math.isfinite(record["validation/selfcontact_mse_8"])
    # a slot never active in training is left unscaled; others keep their spread
    model = predictor.model
    offset = len(predictor.state_names) + len(predictor.action_names)
    std = model.input_std[offset:].reshape(13, 8)
    assert (std[:, 7] > 1e-6).any() and (std == 1.0).any()


# ------------------------------------------------------------------ validation


def test_validation_reports_teacher_forced_and_self_computed_figures(run: Path):
    (record,) = [
        r for r in slhub.read_metrics(run / "metrics.jsonl") if "validation/rollout_mse_8" in r
    ]
    for name in ("mse_8", "base_position_8", "base_orientation_8", "joint_position_8"):
        assert math.isfinite(record[f"validation/rollout_{name}"])
        assert math.isfinite(record[f"validation/selfcontact_{name}"])
    assert record["validation/selfcontact_mse_8"] != record["validation/rollout_mse_8"]


def test_given_the_recorded_contacts_the_self_computed_rollout_is_the_rollout(ant: Path, predictor):
    """The stepwise rollout slides its window as the model's rollout does: fed the
    recorded contacts, its states are the teacher-forced ones bit for bit."""
    from slhub.builtin.nerd.loss import self_contact_rollout
    from slhub.data import open_dataset

    dataset = open_dataset(ant)
    features = ("qpos", "qvel", "action", "contact_geometry")
    rows = torch.from_numpy(np.concatenate([dataset.read(f, 2, 0, 20) for f in features], -1))
    model, layout = predictor.model, predictor.layout
    size, actions = len(layout.state_names), len(layout.action_names)
    tokens = rows[None, :4]
    controls = rows[None, 4:20, size:]
    expected = model.rollout(tokens.float(), controls[:, :-1].float())
    given = iter(controls[0, :-1, actions:].numpy()[:, None])

    def recorded(states: np.ndarray, previous: np.ndarray) -> np.ndarray:
        return next(given)

    found = self_contact_rollout(
        model, tokens, rows[None, 3:19, size : size + actions], recorded, torch.float32,
        torch.device("cpu"),
    )  # fmt: skip
    assert torch.equal(found, expected)


def test_a_dataset_that_names_no_env_skips_the_self_computed_figures(ant: Path, tmp_path: Path):
    recorded = tmp_path / "recorded"
    shutil.copytree(ant, recorded)
    meta = json.loads((recorded / "meta.json").read_text())
    del meta["source"]["env"]
    (recorded / "meta.json").write_text(json.dumps(meta))
    out = tmp_path / "run"
    slhub.train(ANT, [*SMALL, *BUDGET, f"data.path={recorded}", f"trainer.output_dir={out}"])
    records = slhub.read_metrics(out / "metrics.jsonl")
    names = {k for r in records for k in r}
    assert "validation/rollout_mse_8" in names
    assert not [n for n in names if "selfcontact" in n]


def test_a_geometry_run_resumes_exactly(ant: Path, tmp_path: Path):
    check_nerd_resume(ANT, [*SMALL, f"data.path={ant}"], tmp_path)


@pytest.mark.slow
def test_a_geometry_run_on_two_gloo_workers_resumes_exactly(ant: Path, tmp_path: Path):
    check_nerd_resume(ANT, [*SMALL, f"data.path={ant}"], tmp_path, workers=2)


# ------------------------------------------------------------------ exports


def test_the_export_simulator_computes_its_own_contacts(ant: Path, predictor):
    from slhub.data import open_dataset

    dataset = open_dataset(ant)
    layout = predictor.layout
    computed = StateContacts(
        dataset.source["env"], layout.state_names, layout.action_names, layout.extra_names
    )
    features = ("qpos", "qvel", "action", "contact_geometry")
    rows = torch.from_numpy(np.concatenate([dataset.read(f, 0, 0, 12) for f in features], -1))
    size, actions = len(layout.state_names), len(layout.action_names)
    names = predictor.input_names
    history, state = rows[None, :3].float(), rows[None, 3, :size].float()
    own = predictor.simulator(history, state, input_names=names, contacts=computed.tensor)
    told = predictor.simulator(history, state, input_names=names)
    for k in range(3, 9):
        action = rows[None, k, size : size + actions].float()
        extra = computed.tensor(told.state, None if k == 3 else told.previous)
        told.previous = action
        assert torch.equal(own.step(action), told.step(torch.cat([action, extra], -1)))
    first = computed.tensor(rows[None, 3, :size], None)
    assert torch.equal(first, rows[None, 3, size + actions :])


def test_eval_collects_the_contact_geometry_the_run_trained_on(run: Path):
    """``slhub eval --env`` on a geometry model: fresh episodes with the same contact
    slots, teacher-forced and self-computed figures both."""
    from slhub.evaluation import run_eval

    found = run_eval(run / "last.pt", env="gymnasium:Ant-v5", episodes=2, steps=20, seed=3)
    assert math.isfinite(found["rollout_mse_8"]) and math.isfinite(found["selfcontact_mse_8"])


def test_a_planar_geometry_model_does_not_care_where_along_x_the_robot_stands(
    hopper: Path, tmp_path: Path
):
    """Hopper's planar base: moving a whole episode along x (base and contact points)
    changes neither what the body-frame model sees nor its prediction; its slots are
    turned by the pitch, so what it sees differs from the recorded slots."""
    from slhub.data import open_dataset
    from slhub.export import load
    from slhub.export.writer import run_export

    out = tmp_path / "nerd"
    settings = [*SMALL, "model.angles=[]", *BUDGET, "trainer.steps=4"]
    slhub.train(HOPPER, [*settings, f"data.path={hopper}", f"trainer.output_dir={out}"])
    run_export(out / "last.pt", tmp_path / "export")
    predictor = load(tmp_path / "export")
    layout, model = predictor.layout, predictor.model.double()
    assert layout.base is not None and layout.base.kind == "planar"
    assert model.contacts is not None and len(layout.contact_slots) == 4
    dataset = open_dataset(hopper)
    features = ("qpos", "qvel", "action", "contact_geometry")
    rows = np.concatenate([dataset.read(f, 0, 20, 28) for f in features], -1)
    tokens = np.stack([rows[0:4], rows[4:8]])
    names = layout.input_names
    moved = tokens.copy()
    x_columns = [names.index(layout.base.position[0])]
    for slot in layout.contact_slots:
        active = tokens[..., names.index(slot[7])] > 0.5
        x_columns_slot = names.index(slot[0])
        moved[..., x_columns_slot] = np.where(active, tokens[..., x_columns_slot] + 5.0, 0.0)
    moved[..., x_columns] += 5.0
    assert tokens[..., [names.index(s[7]) for s in layout.contact_slots]].any()

    def seen(values: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(values)
        t = model.contacts.to_body(t, *model.frame.pose(t))
        inputs, gravity = model.frame.inputs(t)
        return torch.cat([inputs, gravity], -1)

    with torch.no_grad():
        assert torch.allclose(seen(moved), seen(tokens), atol=1e-9)
        assert not torch.allclose(seen(tokens)[..., :-2], torch.from_numpy(tokens), atol=1e-6)
        plain = model.predict_delta(torch.from_numpy(tokens))
        shifted = model.predict_delta(torch.from_numpy(moved))
    assert torch.allclose(plain, shifted, atol=1e-9)
    model.float()
