"""NeRD without the trainer: data, model, normalization, loss mask, export and inference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from safetensors import safe_open

from slhub import Trainer, checkpoint, testing
from slhub.builtin.nerd.model import NerdArch, NerdModel
from slhub.builtin.nerd.plugin import NerdPlugin
from slhub.builtin.nerd.predictor import load_export
from slhub.builtin.nerd.sections import (
    LossSection,
    ModelSection,
    NerdDataSection,
    ValidationSection,
)
from slhub.checkpoint import Checkpoint
from slhub.data import wrap_angle
from slhub.export import load
from slhub.sim import cartpole
from slhub.sim.cartpole import state_deltas
from slhub.testing import StandInTrainer, hooks_of

TINY_DATA = {
    "generated_train": {"num_trajectories": 24, "length": 30, "seed": 0},
    "generated_validation": {"num_trajectories": 6, "length": 20, "seed": 1},
}


def stand_in(tmp_path: Path, batch_size: int = 8, **sections: dict) -> Trainer:
    """A stand-in trainer with tiny nerd sections, validated by the plugin's own models."""
    raw = {
        "model": {"history": 5, "width": 16, "layers": 1, "heads": 2},
        "data": {"cache_dir": str(tmp_path / "cache"), **TINY_DATA},
        "loss": {},
        "validation": {"horizons": [3, 12]},
    }
    for name, values in sections.items():
        raw[name] = {**raw[name], **values}
    return StandInTrainer(
        NerdPlugin(), raw, batch_size=batch_size, lr=1e-2, output_dir=str(tmp_path / "run")
    )


def build(tmp_path: Path, **sections: dict) -> tuple[NerdPlugin, Trainer, NerdModel]:
    """The plugin and its model, built as the loop builds it (torch seeded from trainer.seed)."""
    plugin = NerdPlugin()
    trainer = stand_in(tmp_path, **sections)
    model = testing.build(trainer, plugin)
    return plugin, trainer, model


def train_a_little(plugin, trainer, model, steps: int = 5) -> None:
    """A few Adam updates with the stand-in's optimizer, hooks called as the loop calls them."""
    assert trainer.model is model
    hooks = hooks_of(plugin)
    generator = torch.Generator().manual_seed(0)
    for step in range(1, steps + 1):
        batch = hooks.sample(trainer=trainer, generator=generator, step=step)
        result = hooks.objective(trainer=trainer, model=model, batch=batch, step=step)
        trainer.optimizer.zero_grad()
        result.loss.backward()
        trainer.optimizer.step()
    model.eval()


def split_arrays(plugin: NerdPlugin, which: str) -> tuple[np.ndarray, np.ndarray]:
    """The generated cart-pole split as the generator made it: ``states [N, T + 1, 4]`` and
    ``actions [N, T, 1]`` (read back from the store the plugin trains from)."""
    data = plugin._data
    episodes = data.episodes(which)
    states = np.stack([data.dataset.read("state", e, 0, data.dataset.lengths[e]) for e in episodes])
    actions = np.stack(
        [data.dataset.read("action", e, 0, data.dataset.lengths[e]) for e in episodes]
    )
    return states, actions[:, :-1]


def export_v1(model: NerdModel, tmp_path: Path, name: str = "export") -> Path:
    path = tmp_path / f"{name}.pt"
    torch.save({"step": 5, "model": model.state_dict(), "optimizer": {}, "rng": {}}, path)
    out = tmp_path / name
    out.mkdir()
    result = NerdPlugin().export(
        checkpoint=checkpoint.load(path), checkpoint_path=path, out_dir=out
    )
    assert result == out
    return out


# --------------------------------------------------------------------------- data


def test_cartpole_data_is_deterministic_memory_mapped_and_wrapped(tmp_path):
    first = cartpole.ensure_dataset(tmp_path / "a", "train", 5, 12, seed=3)
    second = cartpole.ensure_dataset(tmp_path / "b", "train", 5, 12, seed=3)
    other = cartpole.ensure_dataset(tmp_path / "a", "val", 5, 12, seed=4)
    assert isinstance(first.states, np.memmap) and isinstance(first.actions, np.memmap)
    assert first.states.shape == (5, 13, 4) and first.actions.shape == (5, 12, 1)
    np.testing.assert_array_equal(first.states, second.states)
    assert not np.array_equal(first.states, other.states)
    theta = np.asarray(first.states[..., 1])
    assert theta.min() >= -np.pi and theta.max() < np.pi
    step = cartpole.cartpole_step(first.states[:, 4], first.actions[:, 4, 0])
    np.testing.assert_array_equal(step, first.states[:, 5])


def test_data_section_rejects_equal_seeds_and_unknown_keys():
    with pytest.raises(ValidationError, match="must differ"):
        same = TINY_DATA["generated_train"]
        NerdDataSection.model_validate({"generated_train": same, "generated_validation": same})
    for section, raw in [
        (NerdDataSection, {"cache": "x"}),
        (ModelSection, {"dropout": 0.1}),
        (LossSection, {"features": []}),
        (ValidationSection, {"horizon": 3}),
        (ModelSection, {"width": 10, "heads": 4}),
        (ModelSection, {"precision": "float16"}),
    ]:
        with pytest.raises(ValidationError):
            section.model_validate(raw)


def test_build_model_refuses_a_validation_split_too_short_for_the_horizon(tmp_path):
    from slhub.errors import DatasetError

    with pytest.raises(DatasetError, match="horizons up to 100 .* need validation episodes"):
        build(tmp_path, validation={"horizons": [100]})


def test_build_model_names_the_state_components_a_recipe_got_wrong(tmp_path):
    from slhub.errors import DatasetError

    with pytest.raises(DatasetError, match=r"'z' is not a state component .*x, theta"):
        build(tmp_path, loss={"features": ["z"]})
    with pytest.raises(DatasetError, match=r"model.angles: angle 'phi' is not a state"):
        build(tmp_path, model={"angles": ["phi"]})


def test_the_generated_cartpole_is_a_dataset_in_slhubs_store(tmp_path):
    plugin, _, _ = build(tmp_path)
    data = plugin._data
    assert data.dataset.format == "slhub"
    assert data.layouts["state"].names == cartpole.STATE_NAMES
    assert data.layouts["action"].names == cartpole.ACTION_NAMES
    assert (len(data.split.train), len(data.split.validation)) == (24, 6)
    states, actions = split_arrays(plugin, "train")
    made, forces = cartpole.generate_trajectories(24, 30, seed=0)
    assert np.array_equal(states, made) and np.array_equal(actions, forces)


# --------------------------------------------------------------------------- model


def test_arch_and_normalization_travel_in_the_state_dict(tmp_path):
    plugin, trainer, model = build(tmp_path)
    state = model.state_dict()
    assert state["nerd_arch"].dtype == torch.int64
    assert NerdArch.from_tensor(state["nerd_arch"]) == model.arch
    states, actions = split_arrays(plugin, "train")
    # tokens: every step of every training episode (the last step's action is 0)
    padded = np.concatenate([actions, np.zeros_like(actions[:, :1])], axis=1)
    tokens = np.concatenate([states, padded], -1).reshape(-1, 5)
    delta = state_deltas(states).reshape(-1, 4)
    stats = (tokens.mean(0), tokens.std(0), delta.mean(0), delta.std(0))
    for key, value in zip(
        ("input_mean", "input_std", "target_mean", "target_std"), stats, strict=True
    ):
        torch.testing.assert_close(state[key], torch.from_numpy(value).float())
    rebuilt = NerdModel.from_state_dict(state)
    for key, value in rebuilt.state_dict().items():
        assert torch.equal(value, state[key]), key

    _, _, plain = build(tmp_path / "off", model={"normalize": False})
    assert torch.equal(plain.input_mean, torch.zeros(5)) and torch.equal(
        plain.target_std, torch.ones(4)
    )


def test_causal_positions_see_only_the_past_and_full_attention_sees_everything(tmp_path):
    _, _, causal = build(tmp_path)
    _, _, full = build(tmp_path, model={"causal": False})
    tokens = torch.randn(3, 5, 5)
    changed = tokens.clone()
    changed[:, 3:] += 1.0
    with torch.no_grad():
        a, b = causal(tokens), causal(changed)
        torch.testing.assert_close(a[:, :3], b[:, :3], rtol=0, atol=1e-6)
        assert not torch.allclose(a[:, 3:], b[:, 3:])
        # a prefix predicts what the full window predicts at the same positions
        torch.testing.assert_close(causal(tokens[:, :2]), a[:, :2], rtol=0, atol=1e-6)
        assert not torch.allclose(full(tokens)[:, :3], full(changed)[:, :3])


@pytest.mark.parametrize("precision", ["float32", "float64", "bfloat16"])
def test_precision_is_recipe_owned(tmp_path, precision):
    plugin, trainer, model = build(tmp_path, model={"precision": precision})
    dtype = getattr(torch, precision)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert model.input_mean.dtype == dtype and model.nerd_arch.dtype == torch.int64
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(1))
    assert batch["tokens"].dtype == dtype
    result = plugin.objective(trainer=trainer, model=model, batch=batch)
    assert torch.isfinite(result.loss)


def test_sample_draws_only_with_the_given_generator(tmp_path):
    plugin, trainer, _ = build(tmp_path)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    one = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(7))
    two = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(one["tokens"], two["tokens"]) and torch.equal(one["delta"], two["delta"])
    assert one["tokens"].shape == (8, 5, 5) and one["delta"].shape == (8, 5, 4)
    # the target is the next state's change: token t + 1 minus token t (angle wrapped)
    step = one["tokens"][:, 1:, :4] - one["tokens"][:, :-1, :4]
    step[..., 1] = wrap_angle(step[..., 1])
    torch.testing.assert_close(one["delta"][:, :-1], step)


def test_loss_mask_sets_the_weight_and_hides_masked_targets(tmp_path):
    plugin, trainer, model = build(tmp_path, loss={"features": ["theta", "x_dot"], "skip_first": 2})
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(0))
    result = plugin.objective(trainer=trainer, model=model, batch=batch)
    assert result.weight == 8 * 3 * 2
    corrupted = dict(batch, delta=batch["delta"].clone())
    corrupted["delta"][..., 0] = 1e6  # x is masked
    corrupted["delta"][:, :2] = 1e6  # the first two positions are masked
    assert torch.equal(
        plugin.objective(trainer=trainer, model=model, batch=corrupted).loss, result.loss
    )

    with_mask = dict(batch, mask=torch.zeros(8, 5, 4))
    zero = plugin.objective(trainer=trainer, model=model, batch=with_mask)
    assert zero.weight == 0 and zero.loss.item() == 0.0

    plugin, trainer, model = build(tmp_path, model={"causal": False})
    result = plugin.objective(trainer=trainer, model=model, batch=batch)
    assert result.weight == 8 * 4  # full attention sees the future: last position only


def test_validation_reports_rollouts_and_the_constant_state_baseline(tmp_path):
    plugin, trainer, model = build(tmp_path)
    train_a_little(plugin, trainer, model)
    with torch.no_grad():
        metrics = plugin.validate(trainer=trainer, model=model, step=5)
    assert set(metrics) == {
        "one_step_mse",
        *(f"{kind}_mse_{k}" for kind in ("rollout", "baseline", "linear") for k in (3, 12)),
    }
    assert all(np.isfinite(v) and v > 0 for v in metrics.values())
    assert metrics["baseline_mse_12"] > metrics["baseline_mse_3"] > 0

    # Recomputed here from the validation split: one_step_mse is the training objective
    # on windows tiling every trajectory, the rollouts start after `history` true steps,
    # and the baseline predicts that the state stays the last true one.
    val_states, val_actions = split_arrays(plugin, "validation")
    history = model.arch.history
    starts = np.arange(0, val_actions.shape[1] - history + 1, history)
    windows = [(n, t) for n in range(len(val_states)) for t in starts]
    tokens = np.stack(
        [np.concatenate([val_states[n, t : t + history], val_actions[n, t : t + history]], -1)
         for n, t in windows]
    )  # fmt: skip
    delta = np.stack([state_deltas(val_states[n, t : t + history + 1]) for n, t in windows])
    tiled = {"tokens": torch.from_numpy(tokens).float(), "delta": torch.from_numpy(delta).float()}
    states = torch.from_numpy(val_states)
    actions = torch.from_numpy(val_actions)
    truth = states[:, history : history + 12]
    first = torch.cat([states[:, :history], actions[:, :history]], -1).float()
    with torch.no_grad():
        one_step = plugin.objective(trainer=trainer, model=model, batch=tiled).loss
        rolled = model.rollout(first, actions[:, history : history + 11].float()).double()

    def error(prediction: torch.Tensor) -> torch.Tensor:
        diff = prediction - truth
        diff[..., 1] = wrap_angle(diff[..., 1])
        return diff.square()

    assert metrics["one_step_mse"] == one_step.item()
    for k in (3, 12):
        baseline = error(states[:, history - 1 : history].expand_as(truth))[:, :k].mean()
        assert metrics[f"baseline_mse_{k}"] == baseline.item()
        assert metrics[f"rollout_mse_{k}"] == error(rolled)[:, :k].mean().item()
        last, before = states[:, history - 1 : history], states[:, history - 2 : history - 1]
        change = last - before
        change[..., 1] = wrap_angle(change[..., 1])
        linear = last + torch.arange(1, 13, dtype=torch.float64)[None, :, None] * change
        linear[..., 1] = wrap_angle(linear[..., 1])
        assert metrics[f"linear_mse_{k}"] == error(linear)[:, :k].mean().item()


# --------------------------------------------------------------------------- export


@pytest.mark.parametrize("precision", ["float32", "float64", "bfloat16"])
def test_export_predicts_exactly_what_the_trained_model_predicts(tmp_path, precision):
    plugin, trainer, model = build(tmp_path, model={"precision": precision})
    train_a_little(plugin, trainer, model)
    out = export_v1(model, tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "model.safetensors"]
    predictor = load(out)
    dtype = getattr(torch, precision)
    assert predictor.dtype == dtype
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(5))
    tokens = batch["tokens"]
    future = batch["tokens"][:, :4, 4:].contiguous()
    with torch.no_grad():
        assert torch.equal(
            predictor(tokens, input_names=predictor.input_names), model.next_state(tokens)
        )
        assert torch.equal(
            predictor.rollout(tokens, future, input_names=predictor.input_names),
            model.rollout(tokens, future),
        )
    assert predictor.rollout(tokens, future, input_names=predictor.input_names).shape == (8, 5, 4)


def test_export_manifest_describes_inputs_outputs_and_provenance(tmp_path):
    plugin, trainer, model = build(tmp_path)
    out = export_v1(model, tmp_path)
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["format"] == "slhub.export/1" and manifest["kind"] == "nerd"
    assert manifest["dtype"] == "float32"
    assert manifest["input_names"] == ["x", "theta", "x_dot", "theta_dot", "force"]
    assert manifest["output_names"] == ["next_x", "next_theta", "next_x_dot", "next_theta_dot"]
    assert manifest["architecture"]["history"] == 5 and manifest["architecture"]["causal"] is True
    assert manifest["source_run_id"] is None and manifest["step"] == 5
    assert manifest["checkpoint_format"] == "slhub.checkpoint/1"
    assert len(manifest["checkpoint_sha256"]) == 64
    assert len(manifest["normalization"]["input_mean"]) == 5
    with safe_open(out / "model.safetensors", framework="pt") as handle:  # no pickle anywhere
        assert "nerd_arch" in handle.keys() and "target_std" in handle.keys()


def test_same_weights_export_to_identical_bytes(tmp_path):
    plugin, trainer, model = build(tmp_path)
    a = export_v1(model, tmp_path, "a")
    b = export_v1(model, tmp_path, "b")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_predictor_refuses_misordered_or_mistyped_inputs(tmp_path):
    plugin, trainer, model = build(tmp_path)
    predictor = load(export_v1(model, tmp_path))
    tokens = torch.zeros(2, 3, 5)
    names = list(predictor.input_names)
    swapped = [names[1], names[0], *names[2:]]
    with pytest.raises(ValueError, match="wrong order.*expects \\['x', 'theta'"):
        predictor(tokens, input_names=swapped)
    with pytest.raises(ValueError, match="do not match"):
        predictor(tokens, input_names=names[:4])
    with pytest.raises(ValueError, match="dtype torch.float64.*torch.float32"):
        predictor(tokens.double(), input_names=names)
    with pytest.raises(ValueError, match="history length must be 1..5"):
        predictor(torch.zeros(2, 6, 5), input_names=names)
    with pytest.raises(ValueError, match="shape"):
        predictor(torch.zeros(2, 3, 4), input_names=names[:4] + names[4:])
    with pytest.raises(ValueError, match="future_actions have dtype"):
        predictor.rollout(tokens, torch.zeros(2, 3, 1, dtype=torch.float64), input_names=names)
    with pytest.raises(TypeError):
        predictor(tokens)  # the feature order must always be named


def test_load_refuses_inconsistent_or_foreign_exports(tmp_path):
    plugin, trainer, model = build(tmp_path)
    out = export_v1(model, tmp_path)
    manifest = json.loads((out / "export.json").read_text())
    with pytest.raises(ValueError, match="no export.json"):
        load(tmp_path / "cache")
    tampered = dict(manifest, input_names=list(reversed(manifest["input_names"])))
    with pytest.raises(ValueError, match="input_names"):
        load_export(out, tampered)
    (out / "export.json").write_text(json.dumps(dict(manifest, format="other/9")))
    with pytest.raises(ValueError, match="export format 'other/9'"):
        load(out)


def test_inference_needs_no_training_code(tmp_path):
    plugin, trainer, model = build(tmp_path)
    out = export_v1(model, tmp_path)
    code = (
        "import pickle, sys, torch\n"
        "unpickled = []\n"
        "def spy(name, real):\n"
        "    def call(*args, **kwargs):\n"
        "        unpickled.append(name)\n"
        "        return real(*args, **kwargs)\n"
        "    return call\n"
        "torch.load = spy('torch.load', torch.load)\n"
        "for name in ('load', 'loads', 'Unpickler'):\n"
        "    setattr(pickle, name, spy(f'pickle.{name}', getattr(pickle, name)))\n"
        "import slhub.export as e\n"
        f"p = e.load({str(out)!r})\n"
        "p(torch.zeros(1, 2, 5), input_names=p.input_names)\n"
        "assert not unpickled, unpickled\n"
        "training = ('slhub.trainer', 'slhub.run', 'slhub.checkpoint', 'slhub.registry',"
        " 'slhub.builtin.nerd.plugin', 'slhub.builtin.nerd.data', 'slhub.builtin.nerd.loss')\n"
        "bad = [m for m in training if m in sys.modules]\n"
        "assert not bad, bad\n"
        "assert 'slhub.builtin.nerd.predictor' in sys.modules  # the loader that did run\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_export_hook_ignores_other_checkpoints(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    raw = {"step": 1, "model": {"weight": torch.zeros(2)}, "optimizer": {}, "rng": {}}
    other = Checkpoint.from_dict(raw, tmp_path / "other.pt")
    assert NerdPlugin().export(checkpoint=other, checkpoint_path=tmp_path, out_dir=out) is None
    assert not any(out.iterdir())


def test_models_made_before_layouts_still_load_export_and_predict(tmp_path):
    """A state dict with a version-1 ``nerd_arch`` and the compiled-in cart-pole names
    (what every NeRD checkpoint held before layouts) rebuilds to the same model."""
    torch.manual_seed(0)
    legacy = NerdModel(NerdArch(history=3, width=8, layers=1, heads=2, mlp_hidden=16, version=1))
    state = legacy.state_dict()
    assert state["nerd_arch"].tolist()[0] == 1 and "nerd_layout" not in state
    rebuilt = NerdModel.from_state_dict(state)
    assert rebuilt.layout.input_names == ("x", "theta", "x_dot", "theta_dot", "force")
    assert rebuilt.layout.angle_names == ("theta",)
    tokens = torch.randn(2, 3, 5)
    assert torch.equal(rebuilt.next_state(tokens), legacy.next_state(tokens))
    predictor = load(export_v1(legacy, tmp_path))
    assert torch.equal(
        predictor(tokens, input_names=predictor.input_names), legacy.eval().next_state(tokens)
    )


def test_validation_groups_report_each_measure_alone(tmp_path):
    plugin, trainer, model = build(
        tmp_path, validation={"groups": {"cart": ["x", "x_dot"], "pole": ["theta", "theta_dot"]}}
    )
    with torch.no_grad():
        metrics = plugin.validate(trainer=trainer, model=model, step=1)
    for kind in ("rollout", "baseline", "linear"):
        for k in (3, 12):
            cart, pole = metrics[f"{kind}_cart_mse_{k}"], metrics[f"{kind}_pole_mse_{k}"]
            # two halves of the state: the whole-state error is their mean
            assert metrics[f"{kind}_mse_{k}"] == pytest.approx((cart + pole) / 2, rel=1e-12)
            assert cart != pole
    from slhub.errors import DatasetError

    with pytest.raises(DatasetError, match=r"validation.groups.base: 'rootx' is not a state"):
        build(tmp_path / "bad", validation={"groups": {"base": ["rootx"]}})
