"""NeRD with a planar floating base (Hopper, Walker2d, HalfCheetah: slide x, slide z,
hinge y): the frame against MuJoCo's, what collect records, the layout and measures
that carry it, a body-frame Hopper model's exports and exact resume."""

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
from slhub import DatasetError
from slhub.builtin.nerd.base import (
    FloatingBase,
    PlanarBase,
    base_from_dict,
    free_joint_base,
    planar_base,
)
from slhub.builtin.nerd.frame import frame_of
from slhub.builtin.nerd.loss import loss_mask
from slhub.builtin.nerd.measures import MeasureColumns, step_errors
from slhub.builtin.nerd.model import NerdArch, NerdLayout
from slhub.builtin.nerd.planar_frame import PlanarFrame
from slhub.builtin.nerd.sections import LossSection

HOPPER = REPO / "examples" / "nerd" / "hopper" / "sl.train.yaml"
ANT = REPO / "examples" / "nerd" / "ant" / "sl.train.yaml"
ENV = "gymnasium:Hopper-v5"
JOINTS = ["rootx", "rootz", "rooty"]
BASE = planar_base(JOINTS)
#: Hopper's state as ``slhub data collect`` names it (qpos, then qvel).
HINGES = ["thigh_joint", "leg_joint", "foot_joint"]
STATE = [f"qpos.{j}" for j in JOINTS + HINGES] + [f"qvel.{j}" for j in JOINTS + HINGES]
#: A tiny Hopper model on a few short episodes, in the body frame.
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
]


def _frame() -> PlanarFrame:
    frame = frame_of(BASE, tuple(STATE))
    assert isinstance(frame, PlanarFrame)
    return frame


def test_to_world_undoes_to_body_and_the_inputs_hold_the_base_frame():
    frame = _frame()
    generator = torch.Generator().manual_seed(0)
    before = torch.randn(64, len(STATE), generator=generator, dtype=torch.float64)
    after = before + 0.3 * torch.randn(64, len(STATE), generator=generator, dtype=torch.float64)
    pitch = STATE.index("qpos.rooty")
    before[:, pitch] = 3.0
    after[:, pitch] = -3.1  # across pi: the change is the short way round
    change = frame.to_body(before, after)
    short = torch.full((64,), 2 * math.pi - 6.1, dtype=torch.float64)
    assert torch.allclose(change[:, pitch], short)
    back = frame.to_world(before, change)
    turned = after.clone()
    turned[:, pitch] = after[:, pitch] + 2 * math.pi
    assert torch.allclose(back, turned, atol=1e-12)
    # a change within (-pi, pi) comes back as it was
    after[:, pitch] = 2.5
    assert torch.allclose(frame.to_world(before, frame.to_body(before, after)), after, atol=1e-12)
    # the hinges change additively; the pitch rate's change is as recorded
    for name in ["qpos.thigh_joint", "qvel.foot_joint", "qvel.rooty"]:
        i = STATE.index(name)
        assert torch.equal(change[:, i], after[:, i] - before[:, i])
    controls = torch.randn(64, 3, generator=generator, dtype=torch.float64)
    tokens, gravity = frame.inputs(torch.cat([before, controls], -1))
    for name in ["qpos.rootx", "qpos.rooty"]:
        assert torch.equal(tokens[:, STATE.index(name)], torch.zeros(64, dtype=torch.float64))
    for i in [STATE.index("qpos.rootz"), STATE.index("qvel.rooty"), *range(len(STATE), 15)]:
        assert torch.equal(tokens[:, i], torch.cat([before, controls], -1)[:, i])
    assert gravity.shape == (64, 2)
    assert torch.allclose(gravity.norm(dim=-1), torch.ones(64, dtype=torch.float64))
    level = torch.zeros((), dtype=torch.float64)
    assert torch.equal(frame.gravity(level), torch.tensor([0.0, -1.0], dtype=torch.float64))
    # the speed is the same in either frame
    vx, vz = STATE.index("qvel.rootx"), STATE.index("qvel.rootz")
    assert torch.allclose(tokens[:, [vx, vz]].norm(dim=-1), before[:, [vx, vz]].norm(dim=-1))


@pytest.mark.parametrize("env", ["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5"])
def test_the_frame_turns_as_mujoco_turns_the_root_body(env: str):
    """The root body's ``xmat`` from ``mj_kinematics`` at random base coordinates: its
    x and z axes in the world are :func:`to_world_xz`'s, and gravity in the body frame
    is ``xmatᵀ (0, 0, -1)``."""
    mujoco = pytest.importorskip("mujoco")
    from slhub.sim import open_simulator
    from slhub.sim.names import planar_root

    simulator = open_simulator(f"gymnasium:{env}")
    try:
        model = simulator.model
        assert planar_root(model) == ("rootx", "rootz", "rooty")
        data = mujoco.MjData(model)
        body = int(model.jnt_bodyid[model.joint("rooty").id])
        qpos = [model.jnt_qposadr[model.joint(j).id] for j in JOINTS]
        names = tuple(f"qpos.{n}" for n in simulator.qpos_names) + tuple(
            f"qvel.{n}" for n in simulator.qvel_names
        )
        frame = frame_of(BASE, names)
        rng = np.random.default_rng(0)
        for pitch in [*rng.uniform(-math.pi, math.pi, 6), 0.0, math.pi / 2]:
            data.qpos[:] = model.qpos0
            data.qpos[qpos] = [rng.uniform(-3, 3), rng.uniform(-1, 1), pitch]
            mujoco.mj_kinematics(model, data)
            xmat = data.xmat[body].reshape(3, 3)
            angle = torch.tensor(pitch, dtype=torch.float64)
            one, zero = torch.ones((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
            from slhub.builtin.nerd.planar_frame import to_world_xz

            x_axis = torch.stack(to_world_xz(angle, one, zero)).numpy()
            z_axis = torch.stack(to_world_xz(angle, zero, one)).numpy()
            assert np.allclose(xmat[[0, 2], 0], x_axis, atol=1e-12)
            assert np.allclose(xmat[[0, 2], 2], z_axis, atol=1e-12)
            assert np.allclose(xmat[1], [0.0, 1.0, 0.0], atol=1e-12)
            down = xmat.T @ np.array([0.0, 0.0, -1.0])
            assert np.allclose(frame.gravity(angle).numpy(), down[[0, 2]], atol=1e-12)
            assert abs(down[1]) < 1e-12
    finally:
        simulator.close()


def test_a_planar_root_is_found_by_type_and_axis_not_name():
    mujoco = pytest.importorskip("mujoco")
    from slhub.sim.names import planar_root

    def model(axes: tuple[str, str, str], kinds=("slide", "slide", "hinge")) -> object:
        joints = "".join(
            f'<joint name="j{i}" type="{k}" axis="{a}"/>'
            for i, (k, a) in enumerate(zip(kinds, axes, strict=True))
        )
        xml = (
            '<mujoco><worldbody><body name="torso">'
            f'{joints}<geom type="sphere" size="0.1"/>'
            '<body name="leg"><joint name="knee" axis="0 1 0"/><geom type="sphere" size="0.1"/>'
            "</body></body></worldbody></mujoco>"
        )
        return mujoco.MjModel.from_xml_string(xml)

    assert planar_root(model(("1 0 0", "0 0 1", "0 1 0"))) == ("j0", "j1", "j2")
    assert planar_root(model(("1 0 0", "0 0 1", "0 0 1"))) is None  # turns about z
    assert planar_root(model(("1 0 0", "0 0 1", "0 -1 0"))) is None  # the other way round
    assert planar_root(model(("0 0 1", "1 0 0", "0 1 0"))) is None  # z before x
    assert planar_root(model(("1 0 0", "0 0 1", "0 1 0"), ("slide", "hinge", "hinge"))) is None


def test_a_planar_layout_stores_its_kind_and_a_free_one_without_a_kind_still_reads():
    layout = NerdLayout.from_names(STATE, HINGES, angles=["qpos.rooty"], base=BASE, frame="body")
    stored = layout.to_dict()
    assert stored["base"] == {
        "kind": "planar",
        "position": ["qpos.rootx", "qpos.rootz"],
        "orientation": ["qpos.rooty"],
        "linear_velocity": ["qvel.rootx", "qvel.rootz"],
        "angular_velocity": ["qvel.rooty"],
    }
    back = NerdLayout.from_dict(json.loads(json.dumps(stored)))
    assert back == layout and isinstance(back.base, PlanarBase)
    free = free_joint_base("root")
    old = {k: v for k, v in free.to_dict().items() if k != "kind"}
    assert base_from_dict(old) == free and isinstance(base_from_dict(old), FloatingBase)
    assert free.to_dict()["kind"] == "free"
    with pytest.raises(ValueError, match="unknown floating base kind 'spherical'"):
        base_from_dict({**BASE.to_dict(), "kind": "spherical"})
    with pytest.raises(ValueError, match=r"qpos\.rootx"):  # a slide is no angle
        NerdLayout.from_names(STATE, HINGES, angles=["qpos.rootx"], base=BASE, frame="body")
    with pytest.raises(ValueError, match="planar base position names 2"):
        PlanarBase(("a",), ("b",), ("c", "d"), ("e",))  # type: ignore[arg-type]


def test_a_planar_body_frame_model_supervises_every_component_and_reads_two_gravity_inputs():
    from slhub.builtin.nerd.model import NerdModel

    layout = NerdLayout.from_names(STATE, HINGES, angles=["qpos.rooty"], base=BASE, frame="body")
    arch = NerdArch(
        feature_set=0, state_dim=len(STATE), action_dim=3, history=4, width=16, layers=1,
        heads=2, mlp_hidden=32, angle_index=-1,
    )  # fmt: skip
    model = NerdModel(arch, layout)
    assert model.gravity_mean.shape == (2,)
    assert model.embed.in_features == len(STATE) + 3 + 2 + 2  # tokens, sin/cos, gravity
    assert torch.equal(loss_mask(arch, layout, LossSection()), torch.ones(4, len(STATE)))


def test_planar_measures_are_xz_distance_and_wrapped_pitch_and_leave_the_base_out_of_joints():
    columns = MeasureColumns.of(STATE, [STATE.index("qpos.rooty")], BASE)
    assert columns is not None
    assert columns.position == (0, 1) and columns.orientation == (2,)
    assert columns.joints == (3, 4, 5) and columns.wrapped == (False, False, False)
    truth = torch.zeros(1, 2, len(STATE), dtype=torch.float64)
    predicted = truth.clone()
    predicted[0, 0, :3] = torch.tensor([3.0, 4.0, 3.0])
    predicted[0, 1, :3] = torch.tensor([0.0, 0.0, -0.5])
    truth[0, 0, 2] = -3.0  # 6 rad apart the long way: 2 pi - 6 the short way
    predicted[0, :, 3:6] = 0.3
    errors = step_errors(predicted, truth, columns)
    assert errors["base_position"].tolist() == [[5.0, 0.0]]
    assert torch.allclose(
        errors["base_orientation"], torch.tensor([[2 * math.pi - 6.0, 0.5]], dtype=torch.float64)
    )
    assert torch.allclose(errors["joint_position"], torch.full((1, 2), 0.3, dtype=torch.float64))


def test_a_bad_model_base_is_one_line():
    from slhub.builtin.nerd.sections import ModelSection

    assert ModelSection(base={"planar": JOINTS}).base.planar == JOINTS  # type: ignore[union-attr]
    for bad in ("", {"planar": ["a", "a", "b"]}, {"planar": ["a", "b"]}, {"joint": "x"}, 3):
        with pytest.raises(ValueError, match=r"name a free joint \(root\) or \{planar:"):
            ModelSection(base=bad)


# ------------------------------------------------------------------ on Hopper-v5


@pytest.fixture(scope="module")
def hopper(tmp_path_factory) -> Path:
    pytest.importorskip("mujoco")
    pytest.importorskip("gymnasium")
    from slhub.sim import collect

    out = tmp_path_factory.mktemp("hopper") / "episodes"
    collect(out, ENV, episodes=6, steps=40, actions="smooth", seed=0, through_termination=True)
    return out


@pytest.fixture(scope="module")
def body_run(hopper: Path, tmp_path_factory) -> Path:
    """The published recipe as it is: the body frame of the base collect recorded, with
    no recipe key naming it."""
    run = tmp_path_factory.mktemp("run") / "nerd"
    budget = ["trainer.steps=30", "trainer.validate_every=30", "trainer.save_every=30"]
    data = [f"data.path={hopper}", f"trainer.output_dir={run}"]
    slhub.train(HOPPER, [*SMALL[1:], *budget, *data])
    return run


def test_collect_records_the_planar_base_and_the_model_picks_it_up(hopper: Path, body_run: Path):
    source = json.loads((hopper / "meta.json").read_text())["source"]
    assert source["floating_base"] == {
        "kind": "planar", "joints": JOINTS, "qpos": "qpos", "qvel": "qvel",
    }  # fmt: skip
    from slhub.export import load
    from slhub.export.writer import run_export

    run_export(body_run / "last.pt", body_run / "export")
    predictor = load(body_run / "export")
    assert predictor.layout.frame == "body" and predictor.layout.base == BASE
    assert predictor.manifest["layout"]["base"] == BASE.to_dict()
    assert predictor.manifest["output"].endswith("learned in the floating base's frame")
    records = [json.loads(line) for line in (body_run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "validation/one_step_mse" in r][-1]
    for kind in ("rollout", "baseline", "linear"):
        for measure in ("base_position", "base_orientation", "joint_position"):
            assert math.isfinite(last[f"validation/{kind}_{measure}_8"])


@pytest.mark.slow
def test_a_planar_body_frame_export_rolls_out_as_its_simulator_and_onnx_graph(
    hopper: Path, body_run: Path, tmp_path: Path
):
    from slhub.data import open_dataset
    from slhub.export import load
    from slhub.export.writer import run_export

    run_export(body_run / "last.pt", tmp_path / "export")
    predictor = load(tmp_path / "export")
    dataset = open_dataset(hopper)
    length = int(dataset.lengths[0])
    state = np.concatenate([dataset.read(f, 0, 0, length) for f in ("qpos", "qvel")], -1)
    controls = np.concatenate([dataset.read(f, 0, 0, length) for f in ("action", "contact")], -1)
    history = predictor.history
    tokens = torch.from_numpy(np.concatenate([state, controls], -1)[None, :history]).float()
    steps = 60
    future = torch.from_numpy(np.resize(controls[history:], (steps - 1, controls.shape[1])))
    future = future[None].float()
    names = predictor.input_names
    rolled = predictor.rollout(tokens, future, input_names=names)
    assert rolled.shape == (1, steps, len(predictor.state_names))
    assert bool(torch.isfinite(rolled).all())
    pitch = predictor.state_names.index("qpos.rooty")
    assert float(rolled[0, :, pitch].abs().max()) <= math.pi
    size = len(predictor.state_names)
    sim = predictor.simulator(tokens[:, :-1], tokens[:, -1, :size], input_names=names)
    stepped = [sim.step(tokens[:, -1, size:])] + [sim.step(future[:, k]) for k in range(20)]
    assert torch.equal(torch.stack(stepped, 1), rolled[:, :21])

    pytest.importorskip("onnxruntime")
    import onnxruntime

    graph = predictor.write_onnx(tmp_path / "export")
    session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    rows = np.concatenate([state, controls], -1)[:12]
    windows = torch.from_numpy(np.stack([rows[:4], rows[4:8], rows[8:12]])).float()
    expected = predictor(windows, input_names=names).numpy()
    (found,) = session.run(["next_state"], {"tokens": windows.numpy()})
    assert np.allclose(found, expected, atol=1e-4 * (1 + np.abs(expected).max()))


def test_a_recorded_dataset_names_its_planar_joints_in_model_base(hopper: Path, tmp_path: Path):
    recorded = tmp_path / "recorded"
    shutil.copytree(hopper, recorded)
    meta = json.loads((recorded / "meta.json").read_text())
    del meta["source"]["floating_base"]
    (recorded / "meta.json").write_text(json.dumps(meta))
    common = [*SMALL[1:], "trainer.steps=1", f"data.path={recorded}", "model.frame=null"]
    run = tmp_path / "a"
    slhub.train(HOPPER, [*common, f"trainer.output_dir={run}"])
    from slhub.export import load
    from slhub.export.writer import run_export

    run_export(run / "last.pt", run / "export")
    layout = load(run / "export").layout
    assert (layout.base, layout.frame) == (None, "world")  # nothing recorded, nothing named
    run = tmp_path / "b"
    slhub.train(HOPPER, [*common, "model.base={planar: [rootx, rootz, rooty]}",
                         f"trainer.output_dir={run}"])  # fmt: skip
    run_export(run / "last.pt", run / "export")
    layout = load(run / "export").layout
    assert (layout.base, layout.frame) == (BASE, "body")
    with pytest.raises(DatasetError, match=r"model\.base: the state lacks planar joints") as caught:
        slhub.train(HOPPER, [*common, "model.base={planar: [rootx, rootz, hip]}",
                             f"trainer.output_dir={tmp_path / 'c'}"])  # fmt: skip
    assert "\n" not in str(caught.value) and "qpos.hip" in str(caught.value)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("recipe", [HOPPER, ANT], ids=["hopper", "ant"])
def test_the_published_recipes_leave_the_frame_to_the_recorded_base(recipe: Path):
    """No ``model.frame`` key: their runs learn in the base frame slhub data collect
    recorded (the default), as NeRD does."""
    import yaml

    from slhub.builtin.nerd.sections import ModelSection

    model = yaml.safe_load(recipe.read_text())["model"]
    assert "frame" not in model and "base" not in model
    assert ModelSection.model_validate(model).frame is None


def test_a_planar_body_frame_run_resumes_exactly(hopper: Path, tmp_path: Path):
    check_nerd_resume(HOPPER, [*SMALL, f"data.path={hopper}"], tmp_path)


@pytest.mark.slow
def test_a_planar_body_frame_run_on_two_gloo_workers_resumes_exactly(hopper: Path, tmp_path: Path):
    check_nerd_resume(HOPPER, [*SMALL, f"data.path={hopper}"], tmp_path, workers=2)


@pytest.mark.slow
def test_the_body_frame_beats_the_world_frame_on_a_hopper_moved_along_x(tmp_path: Path):
    """The same small model and budget, trained on Hopper-v5 episodes as the env starts
    them (near x = 0) and validated on other episodes of the robot moved 5 to 20 m
    along x: the body frame's base position and orientation errors are well under the
    world frame's (on a CPU without AVX-512, over trainer seeds 0 to 2: 0.09 to 0.28
    of them 10 steps out, 0.38 to 0.63 100 steps out)."""
    pytest.importorskip("mujoco")
    from slhub.data import ArrayEpisodes, open_dataset, write_store
    from slhub.sim import collect

    recorded = tmp_path / "recorded"
    collect(recorded, ENV, episodes=24, steps=120, actions="smooth", seed=0,
            through_termination=True)  # fmt: skip
    source = open_dataset(recorded)
    features = ("qpos", "qvel", "action", "contact")
    episodes = [
        {f: np.asarray(source.read(f, e, 0, int(source.lengths[e]))) for f in features}
        for e in range(24)
    ]
    rng = np.random.default_rng(0)
    x = source.features["qpos"].names.index("rootx")
    for episode in episodes[18:]:
        episode["qpos"] = episode["qpos"].copy()
        episode["qpos"][:, x] += rng.uniform(5.0, 20.0)
    data = tmp_path / "episodes"
    names = {f: source.features[f].names for f in features}
    write_store(ArrayEpisodes(episodes, fps=source.fps, names=names), data,
                provenance=dict(source.source))  # fmt: skip
    metrics = {}
    for frame in ("body", "world"):
        run = tmp_path / frame
        slhub.train(HOPPER, [
            f"model.frame={frame}", "model.width=32", "model.layers=1", "model.heads=2",
            "model.mlp_hidden=64", "trainer.steps=1500", "trainer.validate_every=1500",
            "trainer.save_every=1500", "trainer.batch_size=32", "trainer.device=cpu",
            "validation.horizons=[10, 100]", f"data.split.train={list(range(18))}",
            f"data.split.validation={list(range(18, 24))}", f"data.path={data}",
            f"trainer.output_dir={run}",
        ])  # fmt: skip
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        metrics[frame] = [r for r in records if "validation/one_step_mse" in r][-1]
    for k, margin in ((10, 0.5), (100, 0.8)):
        for measure in ("base_position", "base_orientation"):
            key = f"validation/rollout_{measure}_{k}"
            assert metrics["body"][key] < margin * metrics["world"][key], (key, metrics)
