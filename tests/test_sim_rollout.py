"""slhub.sim.rollout_policy and write_video: fixed reset seeds (collect's), observation
histories, action chunks, success, the time budget, and a decodable mp4."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
import torch

from slhub.data import open_dataset
from slhub.errors import SimulatorError
from slhub.sim import (
    Camera,
    Step,
    collect,
    open_simulator,
    reset_seeds,
    rollout_policy,
    write_video,
)

ENV = "gymnasium:InvertedPendulum-v5"


def _gain(window: dict[str, np.ndarray]) -> np.ndarray:
    """A stabilizing linear feedback on the latest observation."""
    return np.clip([np.array([1.0, 5.0, 0.5, 0.5]) @ window["observation"][-1]], -3, 3)


def test_episodes_start_where_collect_starts_them_and_repeat_exactly(tmp_path):
    collect(tmp_path / "d", ENV, episodes=3, steps=5, seed=4)
    store = open_dataset(tmp_path / "d")
    simulator = open_simulator(ENV, max_steps=200)
    seen: list[np.ndarray] = []

    def act(window: dict[str, np.ndarray]) -> np.ndarray:
        if len(seen) == 0 or window["observation"].shape == (1, 4):
            seen.append(window["observation"][-1])
        return _gain(window)

    try:
        before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
        first = rollout_policy(simulator, act, episodes=3, seed=4, max_steps=200)
        after = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
        again = rollout_policy(simulator, _gain, episodes=3, seed=4, max_steps=200)
    finally:
        simulator.close()
    assert before[0] == after[0] and np.array_equal(before[1], after[1])
    assert torch.equal(before[2], after[2])
    assert first.seeds == tuple(reset_seeds(4, 3)) and reset_seeds(4, 2) == reset_seeds(4, 3)[:2]
    starts = [seen[0]] + [seen[i] for i in np.cumsum(first.lengths)[:-1]]
    for episode, start in enumerate(starts):
        assert np.array_equal(start, store.read("observation", episode, 0, 1)[0])
    assert replace(again, elapsed_s=first.elapsed_s) == first
    assert first.lengths == (200, 200, 200) and first.returns == (200.0, 200.0, 200.0)
    assert first.successes is None and first.metrics() == {
        "env_return": 200.0, "env_length": 200.0, "env_episodes": 3.0,
    }  # fmt: skip


def test_history_repeats_the_first_step_and_chunks_run_in_order():
    simulator = open_simulator(ENV, max_steps=7)
    calls: list[dict[str, np.ndarray]] = []

    def act(window: dict[str, np.ndarray]) -> np.ndarray:
        calls.append(window)
        return np.zeros((3, 1))  # a chunk of three, all applied before asking again

    try:
        done = rollout_policy(simulator, act, episodes=1, features=("observation", "qpos"),
                              history=(-3, 0), max_steps=7)  # fmt: skip
    finally:
        simulator.close()
    assert done.lengths == (7,) and len(calls) == 3  # steps 0, 3 and 6
    assert calls[0]["observation"].shape == (2, 4) and calls[0]["qpos"].shape == (2, 2)
    assert np.array_equal(calls[0]["observation"][0], calls[0]["observation"][1])  # repeated
    for earlier, later in zip(calls, calls[1:], strict=False):  # three steps back: the last ask
        assert np.array_equal(later["observation"][0], earlier["observation"][1])
        assert np.array_equal(later["qpos"][0], earlier["qpos"][1])
    assert not np.array_equal(calls[1]["observation"][0], calls[1]["observation"][1])


def test_a_time_budget_finishes_the_started_episode_only():
    simulator = open_simulator(ENV)
    try:
        done = rollout_policy(simulator, _gain, episodes=5, max_steps=30, time_budget_s=1e-9)
    finally:
        simulator.close()
    assert (done.episodes, done.planned, done.lengths) == (1, 5, (30,))


@dataclass
class _Succeeding:
    """A stand-in simulator whose env reports ``is_success`` from its third step on."""

    name: str = "fake:Succeeds"
    dt: float = 0.1
    action_names: tuple[str, ...] = ("a",)
    ctrl_range: np.ndarray = field(default_factory=lambda: np.array([[-1.0, 1.0]]))
    steps: int = 0

    def reset(self, seed: int) -> np.ndarray:
        self.steps = 0
        return np.array([float(seed % 7)])

    def step(self, action: np.ndarray) -> Step:
        self.steps += 1
        return Step(np.array([float(action[0])]), 1.0, self.steps == 4, False, self.steps >= 3)


def test_success_is_the_envs_flag_at_any_step_and_actions_are_clipped():
    applied: list[float] = []
    fake = _Succeeding()
    step = fake.step

    def record(action: np.ndarray) -> Step:
        applied.append(float(action[0]))
        return step(action)

    fake.step = record  # type: ignore[method-assign]
    done = rollout_policy(fake, lambda w: np.array([5.0]), episodes=2)
    assert done.successes == (True, True) and done.metrics()["env_success"] == 1.0
    assert done.lengths == (4, 4) and set(applied) == {1.0}  # clipped to the ctrlrange


@pytest.mark.parametrize(
    ("act", "match"),
    [
        (lambda w: np.zeros(3), r"shape \[3\]; the simulator takes \[n, 1\]"),
        (lambda w: np.array([np.nan]), "non-finite"),
        (lambda w: "left", "not actions"),
    ],
)
def test_bad_actions_and_arguments_are_one_line(act, match):
    with pytest.raises(SimulatorError, match=match):
        rollout_policy(_Succeeding(), act, episodes=1)
    with pytest.raises(SimulatorError, match="needs a camera"):
        rollout_policy(_Succeeding(), act, episodes=1, features=("image",))
    with pytest.raises(SimulatorError, match="offsets <= 0"):
        rollout_policy(_Succeeding(), act, episodes=1, history=(1,))


def test_the_first_episode_is_a_decodable_video(tmp_path):
    import av

    simulator = open_simulator(ENV, max_steps=12)
    try:
        done = rollout_policy(simulator, _gain, episodes=2, video=Camera("follow", 33))
    finally:
        simulator.close()
    assert done.frames is not None and done.frames.shape == (13, 33, 33, 3)
    path = write_video(tmp_path / "v" / "rollout.mp4", done.frames, 1.0 / done.dt)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert float(stream.average_rate) == pytest.approx(1.0 / done.dt)
    assert len(frames) == 13 and frames[0].shape == (34, 34, 3)  # padded to even sides
    error = np.abs(frames[0][:33, :33].astype(int) - done.frames[0].astype(int)).mean()
    assert error < 12  # lossy, but the same picture
    assert sorted(p.name for p in path.parent.iterdir()) == ["rollout.mp4"]
    with pytest.raises(SimulatorError, match="uint8"):
        write_video(tmp_path / "x.mp4", done.frames.astype(np.float32), 25)
