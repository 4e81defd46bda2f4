"""Unit tests of the rwm plugin, calling its hooks with a stand-in trainer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from slhub import LossResult
from slhub.data import CartpoleData, cartpole_step, generate_trajectories
from slhub.testing import check_resume_and_revalidate, hooks_of

from slhub_rwm.data import Windows
from slhub_rwm.model import WorldModel
from slhub_rwm.plugin import RwmPlugin, RwmSection


@pytest.fixture
def section(tmp_path):
    return RwmSection(
        history=4,
        horizon=3,
        hidden=16,
        data={
            "cache_dir": str(tmp_path),
            "train_trajectories": 6,
            "val_trajectories": 2,
            "length": 12,
        },
    )


def _built(section, make_trainer, batch_size=8):
    plugin, trainer = RwmPlugin(), make_trainer(section, batch_size)
    return plugin, trainer, trainer.build(plugin)  # torch seeded as the loop seeds it


def _follows_dynamics(states: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Per window: does every state follow from the one before under its action?"""
    nxt = cartpole_step(states[:, :-1], actions[..., 0])
    return np.isclose(nxt, states[:, 1:], rtol=0, atol=1e-9).all(axis=(1, 2))


def test_windows_never_cross_an_episode_reset():
    states, actions = generate_trajectories(5, 12, seed=3)
    windows = Windows(CartpoleData(states, actions), span=7)
    episode, start = windows.draw(4000, torch.Generator().manual_seed(0))
    assert start.min() == 0 and start.max() == 12 + 1 - 7  # every legal start, none beyond
    assert _follows_dynamics(*windows.gather(episode, start)).all()
    # The check is meaningful: a window over two episodes laid end to end fails it.
    joined_states = np.concatenate([states[0, -4:], states[1, :3]])[None]
    joined_actions = np.concatenate([actions[0, -3:], np.zeros((1, 1)), actions[1, :2]])[None]
    follows = cartpole_step(joined_states[0, :-1], joined_actions[0, :, 0])
    assert np.isclose(follows, joined_states[0, 1:], rtol=0, atol=1e-9).all(-1).tolist() == [
        True,
        True,
        True,
        False,
        True,
        True,
    ]  # only the step across the reset breaks the dynamics
    assert not _follows_dynamics(joined_states, joined_actions).any()


def test_window_longer_than_an_episode_is_refused(tmp_path):
    with pytest.raises(ValidationError, match="do not fit"):
        RwmSection(history=10, horizon=3, data={"cache_dir": str(tmp_path), "length": 11})
    with pytest.raises(ValidationError):
        RwmSection(unknown=1)


def test_sample_is_a_function_of_the_generator(section, make_trainer):
    plugin, trainer, _ = _built(section, make_trainer, batch_size=5)
    hooks = hooks_of(plugin)  # called as the loop calls it, at two different updates
    a = hooks.sample(trainer=trainer, generator=torch.Generator().manual_seed(7), step=1)
    b = hooks.sample(trainer=trainer, generator=torch.Generator().manual_seed(7), step=2)
    assert a["states"].shape == (5, 7, 4) and a["actions"].shape == (5, 6, 1)
    assert a["states"].dtype == torch.float32
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_forecast_feeds_back_its_own_predictions(section, make_trainer):
    plugin, trainer, model = _built(section, make_trainer)
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(1))
    pred = model(batch["states"], batch["actions"], 3)
    garbage = batch["states"].clone()
    garbage[:, 4:] = 1e3  # the true future states are never model inputs
    assert torch.equal(model(garbage, batch["actions"], 3), pred)
    changed = batch["actions"].clone()
    changed[:, 5] += 1.0  # the true action of forecast step 3 is
    moved = model(batch["states"], changed, 3)
    assert torch.equal(moved[:, :2], pred[:, :2]) and not torch.equal(moved[:, 2], pred[:, 2])


def test_gradients_flow_through_the_whole_horizon(section, make_trainer):
    plugin, trainer, model = _built(section, make_trainer)
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(2))

    class Detached(WorldModel):
        def advance(self, state, normalized_delta):
            return super().advance(state.detach(), normalized_delta)

    detached = Detached(16, 1, {k: v.numpy() for k, v in model.named_buffers()})
    detached.load_state_dict(model.state_dict())

    def last_step_grad(m):
        m.zero_grad()
        err = m.normalized_error(m(batch["states"], batch["actions"], 3), batch["states"][:, 4:])
        err[:, -1].square().mean().backward()
        return m.head.weight.grad.clone()

    assert not torch.allclose(last_step_grad(model), last_step_grad(detached))


def test_objective_is_the_mean_over_forecast_steps(section, make_trainer):
    plugin, trainer, model = _built(section, make_trainer, batch_size=6)
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(3))
    result = plugin.objective(trainer=trainer, model=model, batch=batch)
    assert isinstance(result, LossResult)
    assert result.weight == 6 * 3 * 4
    err = model.normalized_error(
        model(batch["states"], batch["actions"], 3), batch["states"][:, 4:]
    )
    per_step = err.square().mean(dim=(0, 2))
    torch.testing.assert_close(result.loss, per_step.mean())
    result.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_validate_reports_each_forecast_step(section, make_trainer):
    plugin, trainer, model = _built(section, make_trainer)
    with torch.no_grad():
        metrics = plugin.validate(trainer=trainer, model=model.eval(), step=1)
    assert set(metrics) == {"mse", "mse_step1", "mse_step2", "mse_step3"}
    assert all(np.isfinite(v) for v in metrics.values())


def test_float64_precision(section, make_trainer):
    plugin, trainer, model = _built(
        section.model_copy(update={"precision": "float64"}), make_trainer
    )
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(0))
    assert batch["states"].dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert plugin.objective(trainer=trainer, model=model, batch=batch).loss.dtype == torch.float64


# ------------------------------------------------------------------ the example recipe


def test_example_recipe_resumes_bit_exactly(tmp_path, repo):
    """examples/rwm/cartpole.yaml, made tiny, stopped after update 2 and resumed on one
    process, ends bit for bit where the uninterrupted run ends (model, optimizer, every
    rank's state); the checkpoint is this package's model and logs its validation."""
    check_resume_and_revalidate(
        repo / "examples/rwm/cartpole.yaml",
        RwmPlugin(),
        stop_at=2,
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
            f"rwm.data.cache_dir={tmp_path / 'cache'}",
            "rwm.data.train_trajectories=4",
            "rwm.data.val_trajectories=2",
            "rwm.data.length=12",
        ],
    )
