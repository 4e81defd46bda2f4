"""Unit tests of the rwm plugin on the cart-pole store, calling its hooks with a stand-in
trainer."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from slhub import DatasetError, LossResult
from slhub.data import wrap_angle
from slhub.sim.cartpole import STATE_NAMES, cartpole_step
from slhub.testing import build, check_resume_and_revalidate, hooks_of

from slhub_rwm.data import window_offsets
from slhub_rwm.model import LAYOUT_KEY, RwmLayout, WorldModel
from slhub_rwm.plugin import RwmPlugin
from slhub_rwm.sections import RwmDataSection, RwmSection

HISTORY, HORIZON = 4, 3


@pytest.fixture
def section():
    return RwmSection(history=HISTORY, horizon=HORIZON, hidden=16)


@pytest.fixture
def data(tmp_path):
    return RwmDataSection(
        cache_dir=str(tmp_path / "cache"),
        generated_train={"num_trajectories": 6, "length": 12, "seed": 0},
        generated_validation={"num_trajectories": 2, "length": 12, "seed": 1},
    )


def _built(section, data, make_trainer, batch_size=8):
    plugin, trainer = RwmPlugin(), make_trainer(section, data, batch_size)
    return plugin, trainer, build(trainer, plugin)  # torch seeded as the loop seeds it


def _follows_dynamics(states: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Per window: does every state follow from the one before under its action?"""
    nxt = cartpole_step(states[:, :-1], actions[..., 0])
    return np.isclose(nxt, states[:, 1:], rtol=0, atol=1e-9).all(axis=(1, 2))


def test_windows_never_cross_an_episode_reset(section, data, make_trainer):
    plugin, trainer, _ = _built(section.model_copy(update={"precision": "float64"}), data,
                                make_trainer, batch_size=4000)  # fmt: skip
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(0))
    states, actions = batch["states"].numpy(), batch["inputs"].numpy()
    assert states.shape == (4000, HISTORY + HORIZON, 4) and actions.shape == (4000, 6, 1)
    assert _follows_dynamics(states, actions).all()
    # every legal window of the 13-step episodes is drawn, none beyond them
    firsts = {tuple(np.round(s[0], 12)) for s in states}
    assert len(firsts) == 6 * (13 + 1 - HISTORY - HORIZON)
    # The check is meaningful: a window over two episodes laid end to end fails it.
    whole = plugin._data.read({"state": range(13), "action": range(12)}, np.array([[0, 0]]))
    other = plugin._data.read({"state": range(13), "action": range(12)}, np.array([[1, 0]]))
    joined = np.concatenate([whole["state"][:, -4:], other["state"][:, :3]], axis=1)
    acts = np.concatenate([whole["action"][:, -3:], np.zeros((1, 1, 1)), other["action"][:, :2]], 1)
    follows = cartpole_step(joined[0, :-1], acts[0, :, 0])
    steps = np.isclose(follows, joined[0, 1:], rtol=0, atol=1e-9).all(-1)
    assert steps.tolist() == [True, True, True, False, True, True]  # only across the reset
    assert not _follows_dynamics(joined, acts).any()


def test_windows_longer_than_the_episodes_are_refused_in_one_line(section, data, make_trainer):
    long = section.model_copy(update={"history": 10, "horizon": 4})  # 14 > 13 steps
    with pytest.raises(DatasetError, match="every train episode is shorter than the window"):
        _built(long, data, make_trainer)
    val = {"num_trajectories": 2, "length": 5, "seed": 1}
    short_val = RwmDataSection.model_validate({**data.model_dump(), "generated_validation": val})
    with pytest.raises(DatasetError) as caught:
        _built(section, short_val, make_trainer)
    assert "rwm.history 4 + rwm.horizon 3 need validation episodes of 7 steps; the longest " \
        "has 6" in str(caught.value) and "\n" not in str(caught.value)  # fmt: skip
    with pytest.raises(ValidationError):
        RwmSection(unknown=1)
    with pytest.raises(ValidationError, match="belongs to the cart-pole generator"):
        RwmDataSection(path="somewhere", max_force=3.0)
    with pytest.raises(ValidationError, match="split applies to a dataset path"):
        RwmDataSection(split={"validation_ratio": 0.5})


def test_defaults_are_rwm_s_history_and_forecast():
    assert (RwmSection().history, RwmSection().horizon) == (32, 8)


def test_sample_is_a_function_of_the_generator(section, data, make_trainer):
    plugin, trainer, _ = _built(section, data, make_trainer, batch_size=5)
    hooks = hooks_of(plugin)  # called as the loop calls it, at two different updates
    a = hooks.sample(trainer=trainer, generator=torch.Generator().manual_seed(7), step=1)
    b = hooks.sample(trainer=trainer, generator=torch.Generator().manual_seed(7), step=2)
    assert a["states"].shape == (5, 7, 4) and a["inputs"].shape == (5, 6, 1)
    assert a["states"].dtype == torch.float32
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_forecast_feeds_back_its_own_predictions(section, data, make_trainer):
    plugin, trainer, model = _built(section, data, make_trainer)
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(1))
    pred = model(batch["states"], batch["inputs"], 3)
    garbage = batch["states"].clone()
    garbage[:, 4:] = 1e3  # the true future states are never model inputs
    assert torch.equal(model(garbage, batch["inputs"], 3), pred)
    changed = batch["inputs"].clone()
    changed[:, 5] += 1.0  # the true action of forecast step 3 is
    moved = model(batch["states"], changed, 3)
    assert torch.equal(moved[:, :2], pred[:, :2]) and not torch.equal(moved[:, 2], pred[:, 2])


def test_an_angle_is_fed_as_sin_and_cos_and_predicted_wrapped(section, data, make_trainer):
    plugin, trainer, model = _built(section.model_copy(update={"precision": "float64"}), data,
                                    make_trainer)  # fmt: skip
    assert model.layout.angle_names == ("theta",) and model.layout.feature_dim == 6
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(4))
    turned = batch["states"].clone()
    turned[..., 1] += 2 * math.pi  # the same pole, one turn on
    pred, again = (model(s, batch["inputs"], 3) for s in (batch["states"], turned))
    torch.testing.assert_close(again, pred, rtol=0, atol=1e-12)
    assert pred[..., 1].abs().max() <= math.pi
    states = batch["states"][:, :-1]
    features = model.features(states, batch["inputs"])
    theta = states[..., 1]
    assert torch.equal(features[..., 1], torch.sin(theta))
    assert torch.equal(features[..., -1], torch.cos(theta))
    x = (states[..., 0] - model.input_mean[0]) / model.input_std[0]
    assert torch.equal(features[..., 0], x)


def test_no_angle_when_the_recipe_names_none(section, data, make_trainer):
    _, _, model = _built(section.model_copy(update={"angles": []}), data, make_trainer)
    assert model.layout.angles == () and model.layout.feature_dim == 5
    with pytest.raises(DatasetError, match="angle 'phi' is not a state component"):
        _built(section.model_copy(update={"angles": ["phi"]}), data, make_trainer)


def test_normalization_is_the_training_split_s(section, data, make_trainer):
    plugin, _, model = _built(section, data, make_trainer)
    train = plugin._data
    whole = [train.read({"state": range(13)}, np.array([[e, 0]]))["state"][0]
             for e in train.split.train]  # fmt: skip
    delta = np.concatenate([np.diff(s, axis=0) for s in whole])
    delta[:, 1] = wrap_angle(delta[:, 1])
    np.testing.assert_allclose(model.delta_mean.numpy(), delta.mean(0), rtol=1e-6)
    np.testing.assert_allclose(model.delta_std.numpy(), delta.std(0), rtol=1e-5)
    states = np.concatenate(whole)
    np.testing.assert_allclose(model.input_mean[[0, 2, 3]].numpy(), states.mean(0)[[0, 2, 3]],
                               rtol=1e-6)  # fmt: skip
    assert (model.input_mean[1], model.input_std[1]) == (0.0, 1.0)  # theta enters as sin/cos


def test_gradients_flow_through_the_whole_horizon(section, data, make_trainer):
    plugin, trainer, model = _built(section, data, make_trainer)
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(2))

    class Detached(WorldModel):
        def advance(self, state, normalized_delta):
            return super().advance(state.detach(), normalized_delta)

    detached = Detached(model.layout)
    detached.load_state_dict(model.state_dict())

    def last_step_grad(m):
        m.zero_grad()
        err = m.normalized_error(m(batch["states"], batch["inputs"], 3), batch["states"][:, 4:])
        err[:, -1].square().mean().backward()
        return m.head.weight.grad.clone()

    assert not torch.allclose(last_step_grad(model), last_step_grad(detached))


def test_objective_is_the_mean_over_forecast_steps(section, data, make_trainer):
    plugin, trainer, model = _built(section, data, make_trainer, batch_size=6)
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(3))
    result = plugin.objective(trainer=trainer, model=model, batch=batch)
    assert isinstance(result, LossResult)
    assert result.weight == 6 * 3 * 4
    err = model.normalized_error(model(batch["states"], batch["inputs"], 3), batch["states"][:, 4:])
    per_step = err.square().mean(dim=(0, 2))
    torch.testing.assert_close(result.loss, per_step.mean())
    result.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_validate_reports_rwm_s_relative_error_and_the_held_state(section, data, make_trainer):
    plugin, trainer, model = _built(section.model_copy(update={"val_stride": 2}), data,
                                    make_trainer)  # fmt: skip
    with torch.no_grad():
        metrics = plugin.validate(trainer=trainer, model=model.eval(), step=1)
    assert set(metrics) == {
        "mse", "mse_step1", "mse_step2", "mse_step3", "relative_error", "baseline_relative_error"
    }  # fmt: skip
    # by hand: every 2nd anchor (from the first) of both 13-step validation episodes
    anchors = np.array([[e, a] for e in plugin._data.split.validation for a in range(3, 10, 2)])
    assert np.array_equal(plugin._val_anchors, anchors)
    window = plugin._data.read(window_offsets(model.layout, HISTORY, HORIZON), anchors)
    states = torch.from_numpy(window["state"])
    with torch.no_grad():
        pred = model(states.float(), torch.from_numpy(window["action"]).float(), 3).double()
    truth = states[:, HISTORY:]
    err = pred - truth
    err[..., 1] = wrap_angle(err[..., 1])
    held = states[:, HISTORY - 1 : HISTORY] - truth
    held[..., 1] = wrap_angle(held[..., 1])
    scale = truth.abs().sum()
    assert metrics["relative_error"] == pytest.approx(float(err.abs().sum() / scale), rel=1e-5)
    assert metrics["baseline_relative_error"] == pytest.approx(float(held.abs().sum() / scale))
    assert metrics["baseline_relative_error"] > 0


def test_float64_precision(section, data, make_trainer):
    plugin, trainer, model = _built(section.model_copy(update={"precision": "float64"}), data,
                                    make_trainer)  # fmt: skip
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(0))
    assert batch["states"].dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert model.delta_std.dtype == torch.float64
    assert plugin.objective(trainer=trainer, model=model, batch=batch).loss.dtype == torch.float64


def test_the_state_dict_rebuilds_the_model_with_its_layout(section, data, make_trainer):
    plugin, trainer, model = _built(section, data, make_trainer)
    state = model.state_dict()
    layout = RwmLayout.from_tensor(state[LAYOUT_KEY])
    assert layout.state_names == STATE_NAMES and layout.action_names == ("force",)
    assert layout.angle_names == ("theta",)
    assert (layout.hidden, layout.history, layout.horizon) == (16, HISTORY, HORIZON)
    rebuilt = WorldModel.from_state_dict(state)
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(5))
    assert torch.equal(rebuilt(batch["states"], batch["inputs"], 3),
                       model(batch["states"], batch["inputs"], 3))  # fmt: skip
    for key in ("input_mean", "input_std", "delta_mean", "delta_std"):
        assert torch.equal(getattr(rebuilt, key), getattr(model, key))
    damaged = dict(state, **{LAYOUT_KEY: state[LAYOUT_KEY][:-2]})
    with pytest.raises(ValueError, match="rwm_layout is damaged"):
        WorldModel.from_state_dict(damaged)


# ------------------------------------------------------------------ the example recipe


def test_example_recipe_resumes_bit_exactly(tmp_path, repo):
    """examples/rwm/cartpole.yaml, made tiny, stopped at a random update and resumed on
    one process, ends bit for bit where the uninterrupted run ends (model, optimizer,
    every rank's state); the checkpoint is this package's model and logs its validation."""
    check = check_resume_and_revalidate(
        repo / "examples/rwm/cartpole.yaml",
        RwmPlugin(),
        stop_at=int(np.random.default_rng().integers(2, 4)),
        workdir=tmp_path,
        workers=1,
        in_process=True,
        cwd=repo,
        overrides=[
            "trainer.steps=4",
            "trainer.batch_size=8",
            "trainer.validate_every=2",
            "trainer.save_every=2",
            "trainer.device=cpu",
            "rwm.history=4",
            "rwm.hidden=16",
            f"data.cache_dir={tmp_path / 'cache'}",
            "data.generated_train={num_trajectories: 4, length: 12, seed: 0}",
            "data.generated_validation={num_trajectories: 2, length: 12, seed: 1}",
        ],
    )
    recorded = check.final("resumed").run["datasets"]["data"]
    assert recorded["fingerprint"]["format"] == "slhub"  # the generator's episodes, in the store
    assert Path(recorded["path"]).parent == tmp_path / "cache"
    assert len(recorded["split"]["train"]) == 4 and len(recorded["split"]["validation"]) == 2
