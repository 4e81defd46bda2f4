"""A NeRD export used where the simulator's step was, and its ONNX form.

``slhub.export.load(DIR)`` stepped along held-out episodes reproduces the trained
run's validation rollouts bit for bit; ``slhub export --onnx`` writes a graph whose
onnxruntime outputs equal the torch export's within float32 rounding; bad cases are
one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import slhub
from helpers import REPO, cli_error, metrics_of, write_recipe
from slhub import ExportError, checkpoint
from slhub.builtin.nerd.model import NerdArch, NerdLayout, NerdModel
from slhub.builtin.nerd.plugin import NerdPlugin
from slhub.builtin.nerd.predictor import NerdPredictor, write_export
from slhub.data import ArrayEpisodes, open_dataset, write_store
from slhub.export import load
from slhub.testing import StandInTrainer, build

NERD = REPO / "examples" / "nerd" / "cartpole" / "sl.train.yaml"
HISTORY, HORIZONS = 4, [2, 9]
VALIDATION = [1, 3, 4, 6, 8]  # 6 is too short for the longest horizon: left out
LENGTHS = (30, 24, 28, 19, 26, 31, 11, 22, 25, 27)
#: The robot's features: which role each plays, its component names, its width.
FEATURES = {"q": ("hip", "knee", "ankle"), "qd": None, "u": None, "contact": None}
WIDTHS = {"q": 3, "qd": 3, "u": 2, "contact": 1}
ROLES = {"state": ["q", "qd"], "action": ["u"], "extra": ["contact"]}


def _robot(path: Path) -> Path:
    """A made-up robot (a 3-joint chain, two actuators, a contact flag), in slhub's store:
    no MuJoCo needed, and an angle, extra inputs and episodes of several lengths."""
    rng = np.random.default_rng(7)
    episodes = []
    for n in LENGTHS:
        u = rng.uniform(-1, 1, size=(n, 2))
        qd = np.cumsum(0.1 * u @ rng.normal(size=(2, 3)), axis=0)
        q = np.cumsum(0.05 * qd, axis=0) + rng.uniform(-3, 3, size=3)
        contact = (q[:, :1] < 0).astype(np.float32)
        episodes.append({"q": q, "qd": qd.astype(np.float32), "u": u, "contact": contact})
    names = {k: v for k, v in FEATURES.items() if v}
    return write_store(ArrayEpisodes(episodes, names=names), path)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny NeRD run on the made-up robot (the knee an angle); its directory."""
    tmp = tmp_path_factory.mktemp("nerd_export_api")
    recipe = write_recipe(
        tmp / "robot.yaml",
        base=NERD,
        trainer__steps=6,
        trainer__batch_size=8,
        trainer__validate_every=3,
        trainer__save_every=3,
        trainer__device="cpu",
        trainer__output_dir=str(tmp / "run"),
        model__history=HISTORY,
        model__width=16,
        model__layers=2,
        model__heads=2,
        model__mlp_hidden=32,
        model__angles=["knee"],
        validation__horizons=HORIZONS,
        loss__features=None,
    )
    raw = yaml.safe_load(recipe.read_text())
    raw["data"] = {
        "path": str(_robot(tmp / "robot")),
        "split": {"validation": VALIDATION},
        "features": ROLES,
    }
    recipe.write_text(yaml.safe_dump(raw))
    slhub.train(recipe)
    return tmp / "run"


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory) -> Path:
    """``slhub export --onnx`` of the run's last checkpoint."""
    from slhub import cli

    out = tmp_path_factory.mktemp("exports") / "robot"
    code = cli.main(["export", "--checkpoint", str(run / "last.pt"), "--out", str(out), "--onnx"])
    assert code == 0
    return out


def _episodes(run: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The held-out episodes validation rolls out, read from the store directly (not
    through NeRD's data code): first ``history`` true tokens, the later actions and
    extra inputs, and the true states after the history, in float32."""
    recorded = json.loads((run / "run.json").read_text())["datasets"]["data"]
    assert list(recorded["split"]["validation"]) == VALIDATION
    dataset = open_dataset(run.parent / "robot")
    steps = HISTORY + max(HORIZONS)
    chosen = [e for e in VALIDATION if LENGTHS[e] >= steps]
    assert chosen == [1, 3, 4, 8]

    def role(name: str) -> np.ndarray:
        parts = [
            np.stack([dataset.read(f, e, 0, steps) for e in chosen]).reshape(len(chosen), steps, -1)
            for f in ROLES[name]
        ]
        return np.concatenate([p.astype(np.float64) for p in parts], axis=-1)

    states = torch.from_numpy(role("state")).float()
    controls = torch.from_numpy(np.concatenate([role("action"), role("extra")], -1)).float()
    tokens = torch.cat([states, controls], dim=-1)
    return tokens[:, :HISTORY], controls[:, HISTORY : steps - 1], states[:, HISTORY:]


def _validation_rollouts(run: Path, monkeypatch) -> tuple[list[tuple], dict[str, float]]:
    """What the run's validation rolled out at its last update: every ``NerdModel.rollout``
    call (history, future inputs, predicted states) made while validating ``last.pt``'s
    weights as the recipe builds the model, and the metrics that validation gives."""
    ckpt = torch.load(run / "last.pt", map_location="cpu", weights_only=True)
    recipe = ckpt["run"]["recipe"]
    plugin = NerdPlugin()
    sections = {name: recipe[name] for name in plugin.recipe_sections()}
    trainer = StandInTrainer(
        plugin, sections, seed=recipe["trainer"]["seed"], batch_size=recipe["trainer"]["batch_size"]
    )
    model = build(trainer, plugin)
    model.load_state_dict(ckpt["model"])
    calls: list[tuple] = []
    real = NerdModel.rollout

    def spy(self, tokens, future_actions):
        states = real(self, tokens, future_actions)
        calls.append((tokens.clone(), future_actions.clone(), states.clone()))
        return states

    monkeypatch.setattr(NerdModel, "rollout", spy)
    with torch.no_grad():
        metrics = plugin.validate(trainer=trainer, model=model.eval(), step=ckpt["step"])
    monkeypatch.setattr(NerdModel, "rollout", real)
    return calls, metrics


def _stepped(predictor: NerdPredictor, tokens: torch.Tensor, future: torch.Tensor) -> torch.Tensor:
    """``predictor`` used as a simulator: started after the first ``history - 1`` true steps
    in the last true state, then fed the recorded actions one step at a time."""
    states = predictor.state_names
    sim = predictor.simulator(
        tokens[:, :-1], tokens[:, -1, : len(states)], input_names=predictor.input_names
    )
    actions = [tokens[:, -1, len(states) :], *future.unbind(1)]
    return torch.stack([sim.step(action) for action in actions], dim=1)


def test_stepping_the_export_reproduces_the_runs_validation_rollouts(run, exported, monkeypatch):
    calls, metrics = _validation_rollouts(run, monkeypatch)
    logged = [m for m in metrics_of(run) if "validation/one_step_mse" in m][-1]
    assert metrics == {k.removeprefix("validation/"): v for k, v in logged.items() if k != "step"}

    tokens, future, truth = _episodes(run)
    (history, inputs, expected), *_ = calls
    assert torch.equal(history, tokens) and torch.equal(inputs, future)
    assert expected.shape == truth.shape and not torch.equal(expected, truth)

    predictor = load(exported)
    assert predictor.input_names == (
        "hip", "knee", "ankle", "qd[0]", "qd[1]", "qd[2]", "u[0]", "u[1]", "contact[0]",
    )  # fmt: skip
    assert torch.equal(_stepped(predictor, tokens, future), expected)
    for history, inputs, states in calls:  # every rollout validation made
        assert torch.equal(_stepped(predictor, history, inputs), states)

    # the stateless step, with a history the caller keeps (longer than the model's)
    width = len(predictor.state_names)
    past, state, stepped = tokens[:, :-1], tokens[:, -1, :width], []
    for action in [tokens[:, -1, width:], *future.unbind(1)]:
        after = predictor.step(past, state, action, input_names=predictor.input_names)
        past = torch.cat([past, torch.cat([state, action], -1).unsqueeze(1)], dim=1)
        state = after
        stepped.append(after)
    assert past.shape[1] > predictor.history
    assert torch.equal(torch.stack(stepped, 1), expected)
    names = predictor.input_names
    assert torch.equal(predictor.rollout(tokens, future, input_names=names), expected)


def _model(**arch) -> NerdModel:
    torch.manual_seed(0)
    layout = NerdLayout.from_names(["a", "b"], ["u"], ["g"], angles=["b"])
    fields = dict(state_dim=2, action_dim=1, extra_dim=1, width=8, layers=1, heads=2)
    full = NerdArch(feature_set=0, angle_index=-1, mlp_hidden=16, **{**fields, **arch})
    model = NerdModel(full, layout)
    model.set_normalization(
        torch.tensor([0.5, 0.0, 0.2, 1.0]), torch.tensor([2.0, 1.5, 0.5, 0.3]),
        torch.tensor([0.1, -0.1]), torch.tensor([0.3, 0.2]),
    )  # fmt: skip
    return model


def _predictor(model: NerdModel, tmp_path: Path) -> NerdPredictor:
    out = tmp_path / "export"
    out.mkdir(parents=True)
    return load(write_export(model, out, {"source_run_id": None, "step": 1}))


def _checkpoint(model: NerdModel, tmp_path: Path) -> Path:
    """``model`` in a v1 checkpoint (the layout a checkpoint without a recipe has)."""
    path = tmp_path / "model.pt"
    torch.save({"step": 2, "model": model.state_dict(), "optimizer": {}, "rng": {}}, path)
    return path


def test_a_step_uses_the_last_history_tokens_and_may_start_from_none(tmp_path):
    model = _model(history=3)
    predictor = _predictor(model, tmp_path)
    names = predictor.input_names
    g = torch.Generator().manual_seed(1)
    past, state, action = torch.randn(5, 6, 4, generator=g), torch.randn(5, 2), torch.randn(5, 2)
    token = torch.cat([state, action], -1)[:, None]
    with torch.no_grad():
        assert torch.equal(
            predictor.step(past, state, action, input_names=names),
            model.next_state(torch.cat([past[:, -2:], token], 1)),
        )
        first = predictor.step(past[:, :0], state, action, input_names=names)
        assert torch.equal(first, model.next_state(token))
    sim = predictor.simulator(past[:, :0], state, input_names=names)
    assert torch.equal(sim.step(action), first) and torch.equal(sim.state, first)
    for _ in range(4):
        sim.step(action)
    assert sim.tokens.shape == (5, 3, 4)
    assert float(sim.state[:, 1].abs().max()) <= torch.pi  # the angle stays wrapped


def test_steps_refuse_misordered_mistyped_or_misshaped_inputs(tmp_path):
    predictor = _predictor(_model(history=3), tmp_path)
    names = list(predictor.input_names)
    past, state, action = torch.zeros(2, 2, 4), torch.zeros(2, 2), torch.zeros(2, 2)
    cases = [
        ((past, state, action), {"input_names": names[::-1]}, "wrong order"),
        ((past.double(), state, action), {"input_names": names}, "history has dtype"),
        ((past, state, action[:, :1]), {"input_names": names}, r"action must have shape .*'g'"),
        ((past, state[:1], action[:1]), {"input_names": names}, "2 batch rows, the state 1"),
        ((past[..., :3], state, action), {"input_names": names}, "history must have shape"),
        ((past, state.numpy(), action), {"input_names": names}, "must be a torch.Tensor"),
    ]
    for args, kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            predictor.step(*args, **kwargs)
    with pytest.raises(ValueError, match="state has dtype"):
        predictor.simulator(past, state.double(), input_names=names)
    sim = predictor.simulator(past, state, input_names=names)
    with pytest.raises(ValueError, match="action has dtype"):
        sim.step(action.double())
    with pytest.raises(TypeError):
        predictor.step(past, state, action)  # the token order must always be named

    full = _predictor(_model(history=3, causal=0), tmp_path / "full")
    with pytest.raises(ValueError, match="needs at least 2 history tokens"):
        full.step(past[:, :1], state, action, input_names=names)


# --------------------------------------------------------------------------- ONNX


def test_onnx_export_is_written_beside_the_weights_and_recorded(exported):
    assert sorted(p.name for p in exported.iterdir()) == [
        "export.json",
        "model.onnx",
        "model.safetensors",
    ]
    manifest = json.loads((exported / "export.json").read_text())
    entry = manifest["onnx"]
    assert entry["file"] == "model.onnx" and entry["dtype"] == "float32"
    assert entry["inputs"] == {"tokens": ["batch", "length", 9]}
    assert entry["outputs"] == {"next_state": ["batch", 6]}
    assert entry["length"] == [1, HISTORY]
    import onnx

    graph = onnx.load(str(exported / "model.onnx"))
    props = {p.key: p.value for p in graph.metadata_props}
    assert json.loads(props["input_names"]) == manifest["input_names"]
    assert load(exported).manifest["onnx"] == entry


def test_onnxruntime_predicts_what_the_torch_export_predicts(run, exported):
    """Every batch size and history length (1..history) on real and on random tokens.

    A runtime fuses LayerNorm, GELU and attention and sums in its own order, so the
    results are not bitwise the torch ones: rtol=1e-5 allows some 80 float32 ulps of
    the value (outputs here reach a few units, ulp ~ 2.4e-7), atol=1e-6 the same for
    outputs near 0 (a state that barely moves). A wrong graph is off by ~1e-2 or more.
    """
    import onnxruntime

    predictor = load(exported)
    session = onnxruntime.InferenceSession(
        str(exported / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    tokens, future, _ = _episodes(run)
    g = torch.Generator().manual_seed(2)
    mean, std = predictor.model.input_mean, predictor.model.input_std
    random = mean + std * 3 * torch.randn(7, HISTORY, len(mean), generator=g)
    for sample in (tokens, random, random[:1]):
        for length in range(1, HISTORY + 1):
            window = sample[:, -length:].contiguous()
            (found,) = session.run(["next_state"], {"tokens": window.numpy()})
            expected = predictor(window, input_names=predictor.input_names)
            torch.testing.assert_close(torch.from_numpy(found), expected, rtol=1e-5, atol=1e-6)
    # a simulator loop in the runtime alone follows the torch rollout as closely
    rolled = predictor.rollout(tokens, future, input_names=predictor.input_names)
    window, states = tokens.numpy(), []
    for k in range(rolled.shape[1]):
        (state,) = session.run(["next_state"], {"tokens": window[:, -HISTORY:]})
        states.append(state)
        if k < future.shape[1]:
            token = np.concatenate([state, future[:, k].numpy()], -1)[:, None]
            window = np.concatenate([window, token], 1)
    torch.testing.assert_close(torch.from_numpy(np.stack(states, 1)), rolled, rtol=1e-4, atol=1e-5)


def test_a_non_causal_model_takes_exactly_its_history_in_onnx(tmp_path):
    """Full attention sees the whole window, so the graph's length is fixed; written
    from Python into the export's own directory, and refused into another."""
    import onnxruntime

    model = _model(history=3, causal=0)
    predictor = _predictor(model, tmp_path)
    path = predictor.write_onnx(tmp_path / "export")
    assert predictor.manifest["onnx"]["length"] == [3, 3]
    assert json.loads((tmp_path / "export" / "export.json").read_text()) == predictor.manifest
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (shape,) = [i.shape for i in session.get_inputs()]
    assert shape[1:] == [3, 4]
    tokens = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(3))
    (found,) = session.run(["next_state"], {"tokens": tokens.numpy()})
    expected = predictor(tokens, input_names=predictor.input_names)
    torch.testing.assert_close(torch.from_numpy(found), expected, rtol=1e-5, atol=1e-6)
    other = _predictor(_model(history=4), tmp_path / "other")
    with pytest.raises(ExportError, match="holds another export"):
        other.write_onnx(tmp_path / "export")


@pytest.mark.parametrize("precision", ["bfloat16", "float64"])
def test_onnx_of_other_dtypes_is_one_line_and_leaves_nothing(tmp_path, capsys, precision):
    model = _model(history=3).to(getattr(torch, precision))
    ckpt = _checkpoint(model, tmp_path)
    out = tmp_path / "new"
    line = cli_error(capsys, "export", "--checkpoint", str(ckpt), "--out", str(out), "--onnx")
    assert f"ONNX export needs float32 weights; this NeRD model is {precision}" in line
    assert not out.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    cli_error(capsys, "export", "--checkpoint", str(ckpt), "--out", str(empty), "--onnx")
    assert list(empty.iterdir()) == []
    predictor = _predictor(model, tmp_path)  # the Python call says the same
    with pytest.raises(ExportError, match="needs float32"):
        predictor.write_onnx(tmp_path / "export")
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == [
        "export.json",
        "model.safetensors",
    ]


@pytest.mark.parametrize("missing", ["onnx", "onnxscript", "onnxruntime"])
def test_a_missing_onnx_extra_is_one_line_naming_it(tmp_path, capsys, monkeypatch, missing):
    ckpt = _checkpoint(_model(history=3), tmp_path)
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` raises ImportError
    out = tmp_path / "out"
    line = cli_error(capsys, "export", "--checkpoint", str(ckpt), "--out", str(out), "--onnx")
    assert line.endswith(f"ONNX export needs {missing}, which is not installed: "
                         "pip install 'slhub[onnx]'")  # fmt: skip
    assert not out.exists()


def test_an_export_without_an_onnx_form_is_refused(tmp_path, capsys, monkeypatch):
    import slhub.export.writer as writer

    ckpt = _checkpoint(_model(history=3), tmp_path)
    monkeypatch.setattr(writer, "load", lambda directory: object())
    out = tmp_path / "out"
    line = cli_error(capsys, "export", "--checkpoint", str(ckpt), "--out", str(out), "--onnx")
    assert "exports of kind 'nerd'" in line and "have no ONNX form" in line
    assert not out.exists()
    assert checkpoint.load(ckpt).step == 2  # the checkpoint itself was fine
