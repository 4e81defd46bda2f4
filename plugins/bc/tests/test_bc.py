"""Unit tests of the bc plugin, calling its hooks with a stand-in trainer: the expert and
its demonstration store, windows, the masked loss, validation and the cart-pole rollouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from slhub import LossResult, RecipeError
from slhub.data import ArrayEpisodes, open_dataset, write_store
from slhub.sim.cartpole import cartpole_step
from slhub.testing import build, check_resume_and_revalidate, hooks_of

from slhub_bc.expert import (
    demonstration_store,
    demonstrations,
    expert_action,
    linearize,
    lqr_gain,
)
from slhub_bc.model import StatePolicy, VisualPolicy
from slhub_bc.plugin import BcPlugin, BcSection, balanced_fraction, masked_error
from slhub_bc.render import render

SMALL_DEMOS = {"train_episodes": 6, "val_episodes": 2, "length": 30}


def _built(make_trainer, tmp_path, batch_size=8, data=None, **bc):
    section = BcSection.model_validate({"rollouts": 2, "rollout_steps": 20, **bc})
    data = {"cache_dir": str(tmp_path / "cache"), "demos": SMALL_DEMOS} if data is None else data
    plugin, trainer = BcPlugin(), make_trainer(section, data, batch_size)
    return plugin, trainer, build(trainer, plugin)  # torch seeded as the loop seeds it


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


def test_demonstrations_are_written_once_into_the_store(tmp_path):
    params = {**SMALL_DEMOS, "seed": 3, "noise": 2.0, "max_force": 10.0}
    path = demonstration_store(tmp_path, **params, images=True)
    store = open_dataset(path)
    assert store.format == "slhub"
    assert store.splits == {"train": tuple(range(6)), "validation": (6, 7)}
    assert store.features["image"].shape == (64, 64, 1) and store.features["image"].dtype == "uint8"
    assert store.features["state"].names == ("x", "theta", "x_dot", "theta_dot")
    demos = demonstrations(2, 30, seed=4, noise=2.0, max_force=10.0)  # validation: seed + 1
    assert np.array_equal(store.read("state", 7, 0, 31), demos.states[1])
    assert np.array_equal(store.read("action", 7, 0, 31), demos.actions[1])
    frames = np.round(render(demos.states[1]) * 255).astype(np.uint8)[..., None]
    assert np.array_equal(store.read("image", 7, 0, 31), frames)
    written = (path / "meta.json").stat().st_mtime_ns
    assert demonstration_store(tmp_path, **params, images=True) == path
    assert (path / "meta.json").stat().st_mtime_ns == written  # reused, not rewritten
    states_only = demonstration_store(tmp_path, **params, images=False)
    assert states_only != path and "image" not in open_dataset(states_only).features
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, states_only.name])


@pytest.mark.parametrize("observation", ["state", "visual"])
def test_sample_objective_validate(make_trainer, tmp_path, observation):
    plugin, trainer, model = _built(make_trainer, tmp_path, batch_size=5, observation=observation,
                                    history=2, frame_gap=2, chunk=3)  # fmt: skip
    assert isinstance(model, StatePolicy if observation == "state" else VisualPolicy)
    hooks = hooks_of(plugin)  # called as the loop calls it, at two different updates
    batch = hooks.sample(trainer=trainer, generator=torch.Generator().manual_seed(0), step=1)
    again = hooks.sample(trainer=trainer, generator=torch.Generator().manual_seed(0), step=2)
    assert all(torch.equal(batch[k], again[k]) for k in batch)
    state = observation == "state"
    key, shape = ("observation", (5, 2, 4)) if state else ("image[0]", (5, 2, 64, 64, 1))
    assert batch[key].shape == shape and batch["action"].shape == (5, 3, 1)
    assert not batch["action_is_pad"].any()  # data.window.pad is false: whole windows only
    result = plugin.objective(trainer=trainer, model=model, batch=batch)
    assert isinstance(result, LossResult) and result.weight == 5 * 3
    net = model
    target = (batch["action"] - net.action_mean) / net.action_std
    torch.testing.assert_close(result.loss, (model(batch) - target).square().mean())
    with torch.no_grad():
        metrics = plugin.validate(trainer=trainer, model=model.eval(), step=1)
        assert plugin.validate(trainer=trainer, model=model, step=2) == metrics  # deterministic
    assert set(metrics) == {"mse", "balanced"}
    assert 0.0 <= metrics["balanced"] <= 1.0


def test_normalization_is_the_training_statistics_in_buffers(make_trainer, tmp_path):
    _, trainer, model = _built(make_trainer, tmp_path, observation="state")
    store = open_dataset(next((tmp_path / "cache").glob("demos-*")))  # statistics/ beside it
    states = np.concatenate([store.read("state", e, 0, 31) for e in range(6)])
    actions = np.concatenate([store.read("action", e, 0, 31) for e in range(6)])
    np.testing.assert_allclose(model.observation_mean.double().numpy(), states.mean(0), rtol=1e-6)
    np.testing.assert_allclose(model.observation_std.double().numpy(), states.std(0), rtol=1e-6)
    np.testing.assert_allclose(model.action_mean.double().numpy(), actions.mean(0), rtol=1e-6)
    assert {"observation_mean", "observation_std", "action_mean", "action_std"} <= set(
        model.state_dict()
    )


def test_visual_observation_is_frames_frame_gap_apart(make_trainer, tmp_path):
    plugin, trainer, _ = _built(make_trainer, tmp_path, batch_size=4, observation="visual",
                                history=2, frame_gap=2)  # fmt: skip
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(5))
    store = open_dataset(next((tmp_path / "cache").glob("demos-*")))  # statistics/ beside it
    data = plugin._data
    offsets = {"image[0]": range(-2, 1, 2), "action": range(1)}
    anchors = data.sample(offsets, 4, torch.Generator().manual_seed(5))["anchors"]
    for row, (episode, t) in enumerate(anchors):
        states = store.read("state", int(episode), int(t) - 2, int(t) + 1)[[0, 2]]
        expected = np.round(render(states) * 255).astype(np.uint8)[..., None]
        assert np.array_equal(batch["image[0]"][row].numpy(), expected)
        assert t >= 2  # the whole history is inside the episode


def test_an_expert_policy_balances_in_closed_loop():
    cfg = BcSection(rollouts=4, rollout_steps=100, history=3, frame_gap=2)
    starts = demonstrations(4, 1, seed=1, noise=0.0, max_force=10.0).states[:, 0]
    seen = []

    def expert(history: np.ndarray) -> np.ndarray:
        seen.append(history)
        return expert_action(history[:, -1], 10.0)[:, 0]

    assert balanced_fraction(cfg, starts, expert, 10.0) == 1.0
    assert seen[0].shape == (4, 3, 4) and np.array_equal(seen[0][:, 0], starts)  # start repeats
    assert np.array_equal(seen[4][:, 0], starts) and not np.array_equal(seen[5][:, 0], starts)
    assert balanced_fraction(cfg, starts, lambda h: np.zeros(len(h)), 10.0) == 0.0  # falls


def _short_episodes(tmp_path):
    rng = np.random.default_rng(0)
    episodes = [
        {"obs": rng.normal(size=(n, 3)), "act": rng.normal(size=(n, 2)).astype(np.float32)}
        for n in (5, 9, 4, 7)
    ]
    return write_store(ArrayEpisodes(episodes), tmp_path / "short")


def test_padded_targets_do_not_count(make_trainer, tmp_path):
    data = {
        "path": str(_short_episodes(tmp_path)),
        "window": {"pad": True},
        "split": {"validation": [3]},
        "features": {"observation": "obs", "action": "act"},
    }
    plugin, trainer, model = _built(make_trainer, tmp_path, batch_size=32, data=data,
                                    rollouts=0, history=2, chunk=4)  # fmt: skip
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(1))
    pad = batch["action_is_pad"]
    assert pad.any() and not pad[:, 0].any()  # the anchor's own action is always real
    result = plugin.objective(trainer=trainer, model=model, batch=batch)
    assert result.weight == int((~pad).sum()) * 2  # real steps x action components
    corrupted = dict(batch, action=batch["action"].clone())
    corrupted["action"][pad] = 1e6
    again = plugin.objective(trainer=trainer, model=model, batch=corrupted)
    assert torch.equal(again.loss, result.loss) and again.weight == result.weight
    corrupted["action"][~pad] += 1.0  # a real target does count
    assert not torch.equal(plugin.objective(trainer=trainer, model=model, batch=corrupted).loss,
                           result.loss)  # fmt: skip
    error, count = masked_error(model, batch)
    assert count == result.weight and torch.equal(error / count, result.loss)


def test_without_padding_only_whole_windows_are_drawn(make_trainer, tmp_path):
    data = {"path": str(_short_episodes(tmp_path)), "split": {"validation": [3]},
            "features": {"observation": "obs", "action": "act"}}  # fmt: skip
    plugin, trainer, _ = _built(make_trainer, tmp_path, batch_size=64, data=data, rollouts=0,
                                history=2, chunk=4)  # fmt: skip
    anchors = plugin._data.sample({"observation": range(-1, 1), "action": range(4)}, 64,
                                  torch.Generator().manual_seed(0))["anchors"]  # fmt: skip
    lengths = {0: 5, 1: 9, 2: 4}
    assert all(1 <= t <= lengths[int(e)] - 4 for e, t in anchors)
    assert set(anchors[:, 0].tolist()) == {0, 1}  # episode 2 (4 steps) fits no window


@pytest.mark.parametrize(
    ("bc", "data", "match"),
    [
        ({"rollouts": 2}, {"features": {"observation": "obs", "action": "act"}}, "bc.rollouts"),
        ({"observation": "visual", "rollouts": 0}, {"features": {"action": "act", "image": []}},
         "data.features.image: name the camera"),
        ({"observation": "visual", "rollouts": 0}, {"features": {"action": "act", "image": "obs"}},
         r"data.features.image\[0\] takes one image feature"),
        ({"rollouts": 0}, {"features": {"observation": "obs", "action": "act", "image": "obs"}},
         "unknown role 'image'"),
    ],
)  # fmt: skip
def test_bad_recipes_are_one_line(make_trainer, tmp_path, bc, data, match):
    data = {"path": str(_short_episodes(tmp_path)), **data}
    with pytest.raises(Exception, match=match) as caught:
        _built(make_trainer, tmp_path, data=data, **bc)
    assert "\n" not in str(caught.value)


def test_generator_keys_do_not_mix_with_a_dataset_path(make_trainer, tmp_path):
    with pytest.raises(ValueError, match="demos belongs to the expert's demonstrations"):
        make_trainer(BcSection(), {"path": "x", "demos": {"length": 3}})
    with pytest.raises(ValueError, match="split applies to a dataset path"):
        make_trainer(BcSection(), {"split": {"validation_ratio": 0.5}})
    assert RecipeError  # the plugin's own refusals are RecipeErrors (above: bc.rollouts)


# ------------------------------------------------------------------ the example recipe


@pytest.mark.parametrize("name", ["state", "visual"])
def test_example_recipe_resumes_bit_exactly(tmp_path, repo, name):
    """examples/bc/{state,visual}.yaml, made tiny, stopped after update 2 and resumed on
    one process, end bit for bit where the uninterrupted run ends (model, optimizer,
    every rank's state); the checkpoint is this package's model and logs its validation."""
    check = check_resume_and_revalidate(
        repo / f"examples/bc/{name}.yaml",
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
            "bc.channels=4",
            f"data.cache_dir={tmp_path / 'cache'}",
            "data.demos.train_episodes=4",
            "data.demos.val_episodes=2",
            "data.demos.length=20",
            "bc.rollouts=2",
            "bc.rollout_steps=10",
        ],
    )
    recorded = check.final("resumed").run["datasets"]["data"]
    assert recorded["split"]["train"] == [0, 1, 2, 3]
