"""Unit tests of the bc plugin, calling its hooks with a stand-in trainer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from slhub import LossResult
from slhub.data import cartpole_step
from slhub.testing import check_resume_and_revalidate, hooks_of

from slhub_bc.expert import demonstrations, expert_action, linearize, lqr_gain
from slhub_bc.model import StatePolicy, VisualPolicy
from slhub_bc.plugin import BcPlugin, BcSection
from slhub_bc.render import render

SMALL = {
    "data": {"train_episodes": 6, "val_episodes": 2, "length": 30},
    "rollouts": 2,
    "rollout_steps": 20,
}


def _built(make_trainer, batch_size=8, **changes):
    section = BcSection.model_validate({**SMALL, **changes})
    plugin, trainer = BcPlugin(), make_trainer(section, batch_size)
    return plugin, trainer, trainer.build(plugin)  # torch seeded as the loop seeds it


def test_lqr_expert_stabilizes_the_cartpole():
    a, b = linearize()
    assert np.abs(np.linalg.eigvals(a - b @ lqr_gain())).max() < 1.0
    demos = demonstrations(16, 250, seed=0, noise=0.0, max_force=10.0)
    assert np.abs(demos.states[:, -1]).max() < 0.05  # back to rest, nonlinear dynamics
    assert np.abs(demos.states[..., 1]).max() < 0.5


def test_demonstrations_are_labelled_by_the_clean_expert():
    demos = demonstrations(4, 20, seed=1, noise=2.0, max_force=10.0)
    np.testing.assert_array_equal(demos.actions, expert_action(demos.states, 10.0))
    # The applied force was noisy: the states do not follow the clean labels.
    clean = cartpole_step(demos.states[:, :-1], demos.actions[:, :-1, 0])
    assert not np.allclose(clean, demos.states[:, 1:])
    again = demonstrations(4, 20, seed=1, noise=2.0, max_force=10.0)
    np.testing.assert_array_equal(again.states, demos.states)


def test_render_draws_cart_and_pole_without_a_display():
    frames = render(np.array([[0.0, 0.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0], [0.0, 0.3, 0.0, 0.0]]))
    assert frames.shape == (3, 64, 64) and frames.dtype == np.float32
    assert frames.min() == 0.0 and frames.max() == 1.0
    columns = frames.sum(axis=1)  # ink per image column
    assert columns[1].argmax() > columns[0].argmax()  # the cart moved right
    top = frames[:, 20:32].sum(axis=1).argmax(-1)  # where the upper pole is (y 0.7-1.2 m)
    assert top[2] > top[0]  # leaning right (theta > 0) puts the pole tip right
    assert not np.array_equal(render(np.array([0.0, 0.01, 0, 0])), frames[0])  # sub-pixel


@pytest.mark.parametrize("observation", ["state", "visual"])
def test_sample_objective_validate(make_trainer, observation):
    plugin, trainer, model = _built(make_trainer, batch_size=5, observation=observation)
    assert isinstance(model, StatePolicy if observation == "state" else VisualPolicy)
    hooks = hooks_of(plugin)  # called as the loop calls it, at two different updates
    batch = hooks.sample(trainer=trainer, generator=torch.Generator().manual_seed(0), step=1)
    again = hooks.sample(trainer=trainer, generator=torch.Generator().manual_seed(0), step=2)
    assert all(torch.equal(batch[k], again[k]) for k in batch)
    shape = (5, 4) if observation == "state" else (5, 2, 64, 64)
    assert batch["obs"].shape == shape and batch["action"].shape == (5, 1)
    result = plugin.objective(trainer=trainer, model=model, batch=batch)
    assert isinstance(result, LossResult) and result.weight == 5
    torch.testing.assert_close(result.loss, (model(batch["obs"]) - batch["action"]).square().mean())
    with torch.no_grad():
        metrics = plugin.validate(trainer=trainer, model=model.eval(), step=1)
    assert set(metrics) == {"mse", "balanced"}
    assert 0.0 <= metrics["balanced"] <= 1.0


def test_visual_observation_is_two_frames_frame_gap_apart(make_trainer):
    plugin, trainer, _ = _built(make_trainer, batch_size=4, observation="visual", frame_gap=2)
    demos = plugin._demos(trainer.section("bc"), "train")
    gen = torch.Generator().manual_seed(5)
    batch = plugin.sample(trainer=trainer, generator=gen)
    gen = torch.Generator().manual_seed(5)
    episode = torch.randint(0, demos.num_episodes, (4,), generator=gen).numpy()
    t = torch.randint(2, demos.length + 1, (4,), generator=gen).numpy()
    expected = render(np.stack([demos.states[episode, t - 2], demos.states[episode, t]], 1))
    np.testing.assert_array_equal(batch["obs"].numpy(), expected)


def test_an_expert_policy_balances_in_closed_loop(make_trainer):
    plugin, trainer, _ = _built(make_trainer, rollouts=4, rollout_steps=100)
    gain = torch.as_tensor(lqr_gain(), dtype=torch.float32)
    expert = lambda states: -(states @ gain.T)  # noqa: E731 - the LQR as a "policy"
    with torch.no_grad():
        assert plugin.validate(trainer=trainer, model=expert, step=1)["balanced"] == 1.0
        zero = lambda states: states[:, :1] * 0  # noqa: E731 - no control: the pole falls
        assert plugin.validate(trainer=trainer, model=zero, step=1)["balanced"] == 0.0


# ------------------------------------------------------------------ the example recipe


def test_example_recipe_resumes_bit_exactly(tmp_path, repo):
    """examples/bc/state.yaml, made tiny, stopped after update 2 and resumed on one
    process, ends bit for bit where the uninterrupted run ends (model, optimizer, every
    rank's state); the checkpoint is this package's model and logs its validation."""
    check_resume_and_revalidate(
        repo / "examples/bc/state.yaml",
        BcPlugin(),
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
            "bc.hidden=16",
            "bc.data.train_episodes=4",
            "bc.data.val_episodes=2",
            "bc.data.length=20",
            "bc.rollouts=2",
            "bc.rollout_steps=10",
        ],
    )
