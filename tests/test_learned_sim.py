"""The learned simulator as a gymnasium env (slhub.sim.learned): given the true next
states it reproduces the real env exactly (the env's own observation, reward and
termination code run on them), it refuses an export of another robot in one line, and
(slow) a policy trained inside a small learned InvertedPendulum-v5 does as well in MuJoCo
as one trained in MuJoCo with the same number of steps."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from helpers import script_module

gymnasium = pytest.importorskip("gymnasium")
mujoco = pytest.importorskip("mujoco")

from slhub.sim.learned import ENV_ID, LearnedEnv  # noqa: E402
from slhub.sim.names import qpos_names, qvel_names  # noqa: E402


class TruthExport:
    """An export whose prediction is MuJoCo's own: it steps a second copy of the env
    from the state it is given, so a learned env over it must be the real env."""

    history = 3
    causal = True
    dtype = torch.float64

    def __init__(self, env_id: str, *, reverse: bool = False, extra: tuple[str, ...] = ()):
        self.env = gymnasium.make(env_id).unwrapped
        model = self.env.model
        names = [f"qpos.{n}" for n in qpos_names(model)] + [f"qvel.{n}" for n in qvel_names(model)]
        self.order = np.arange(len(names))[::-1] if reverse else np.arange(len(names))
        self.state_names = tuple(names[i] for i in self.order)
        self.action_names = tuple(f"u{i}" for i in range(model.nu))
        self.extra_names = extra
        self.input_names = self.state_names + self.action_names + extra
        self.calls: list[tuple[int, int]] = []

    def simulator(self, past: torch.Tensor, state: torch.Tensor, *, input_names: Any) -> Any:
        assert tuple(input_names) == self.input_names and state.dtype == self.dtype
        self.calls.append((past.shape[1], state.shape[0]))
        return _TruthSimulator(self, state)


class _TruthSimulator:
    def __init__(self, export: TruthExport, state: torch.Tensor) -> None:
        self.export, self.state = export, state

    def step(self, action: torch.Tensor) -> torch.Tensor:
        export, env = self.export, self.export.env
        model, data = env.model, env.data
        ordered = np.empty(len(export.order))
        ordered[export.order] = self.state[0].numpy()
        data.qpos[:], data.qvel[:] = ordered[: model.nq], ordered[model.nq :]
        data.ctrl[:] = action[0, : model.nu].numpy()
        mujoco.mj_step(model, data, nstep=env.frame_skip)
        following = np.concatenate([data.qpos, data.qvel])[export.order]
        self.state = torch.from_numpy(following)[None]
        return self.state


def _episode(env: Any, seed: int, actions: np.ndarray) -> list[tuple]:
    out = [env.reset(seed=seed)[0]]
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        out.append((observation, reward, terminated, truncated))
        if terminated or truncated:
            break
    return out


@pytest.mark.parametrize(
    ("env_id", "reverse"), [("InvertedPendulum-v5", False), ("Hopper-v5", True)]
)
def test_given_the_true_next_states_it_is_the_real_env_exactly(env_id: str, reverse: bool):
    """Same observations, rewards, terminations and truncations as the real env, step
    for step, with the state in another order than MuJoCo's (Hopper)."""
    real = gymnasium.make(env_id, max_episode_steps=60)
    export = TruthExport(env_id, reverse=reverse)
    learned = LearnedEnv(env_id, export, max_episode_steps=60)
    assert learned.observation_space == real.observation_space
    assert learned.action_space == real.action_space
    for seed in (0, 1):
        actions = np.random.default_rng(seed).uniform(-1, 1, (80, real.action_space.shape[0]))
        want, got = _episode(real, seed, actions), _episode(learned, seed, actions)
        assert len(got) == len(want) > 3
        np.testing.assert_array_equal(got[0], want[0])
        for mine, theirs in zip(got[1:], want[1:], strict=True):
            np.testing.assert_array_equal(mine[0], theirs[0])
            assert mine[1:] == theirs[1:]
    assert export.calls == [(0, 1), (0, 1)]  # a causal export starts with no history
    learned.close()


def test_gymnasium_make_and_a_warm_start_of_real_steps():
    export = TruthExport("InvertedPendulum-v5")
    env = gymnasium.make(ENV_ID, env_id="gymnasium:InvertedPendulum-v5", export=export,
                         warm_start=2)  # fmt: skip
    observation, _ = env.reset(seed=3)
    assert env.observation_space.contains(observation.astype(np.float32))
    assert export.calls == [(2, 1)]
    observation, reward, terminated, truncated, _ = env.step(np.zeros(1))
    assert observation.shape == (4,) and reward == 1 and not terminated and not truncated
    env.close()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("state", "needs exactly its qpos and qvel"),
        ("action", "has 1 controls"),
        ("extra", r"\['contact.torso'\] are not contact inputs of a learned InvertedPendulum"),
    ],
)
def test_an_export_of_another_robot_is_refused_in_one_line(change: str, words: str):
    export = TruthExport("InvertedPendulum-v5")
    if change == "state":
        export.state_names = ("x", "theta", "x_dot", "theta_dot")
    elif change == "action":
        export.action_names = ("a", "b")
    else:
        export.extra_names = ("contact.torso",)
    with pytest.raises(ValueError, match=words) as info:
        LearnedEnv("InvertedPendulum-v5", export)
    assert "\n" not in str(info.value)


def _extra_inputs_seen(extra: tuple[str, ...], expected) -> tuple[np.ndarray, np.ndarray]:
    """The extra inputs the learned Hopper-v5 hands its model over 30 zero-action steps,
    and ``expected(model, data)`` at the state each step starts from."""
    export = TruthExport("Hopper-v5", extra=extra)
    seen: list[np.ndarray] = []
    step = _TruthSimulator.step
    learned = LearnedEnv("Hopper-v5", export)
    nu = learned.env.unwrapped.model.nu

    def recording(self: _TruthSimulator, action: torch.Tensor) -> torch.Tensor:
        seen.append(action[0, nu:].numpy().copy())
        return step(self, action)

    learned.reset(seed=0)
    raw = learned.env.unwrapped
    wanted = []
    _TruthSimulator.step = recording
    try:
        for _ in range(30):
            wanted.append(expected(raw.model, raw.data))
            learned.step(np.zeros(3))
    finally:
        _TruthSimulator.step = step
        learned.close()
    return np.array(seen), np.array(wanted)


def test_contact_inputs_are_computed_from_the_state_as_collect_records_them():
    """Hopper-v5 with the contact feature as extra inputs: each step's extra is the
    per-body normal force of the state it starts from (the foot on the floor)."""
    from slhub.sim.gymnasium_mujoco import body_contact_forces
    from slhub.sim.names import body_names

    model = gymnasium.make("Hopper-v5").unwrapped.model
    seen, wanted = _extra_inputs_seen(
        tuple(f"contact.{b}" for b in body_names(model)),
        lambda model, data: body_contact_forces(mujoco, model, data),
    )
    np.testing.assert_array_equal(seen, wanted)
    assert seen[:, -1].max() > 0  # the foot touched the floor


def test_contact_geometry_inputs_are_computed_from_the_state_as_collect_records_them():
    """Hopper-v5 with the contact slots as extra inputs (bare names, as one extra feature
    names them): each step's extra is the slots of the state it starts from."""
    from slhub.sim.contacts import contact_geometry, contact_geoms, geometry_names

    model = gymnasium.make("Hopper-v5").unwrapped.model
    seen, wanted = _extra_inputs_seen(
        geometry_names(model),
        lambda model, data: contact_geometry(model, data, contact_geoms(model)),
    )
    np.testing.assert_array_equal(seen, wanted)
    assert seen[:, -1].max() == 1.0  # the foot's slot became active


@pytest.mark.slow
def test_a_policy_trained_in_the_learned_pendulum_does_as_well_in_mujoco(tmp_path):
    """InvertedPendulum-v5: PPO for the same number of steps inside a small learned
    simulator and in MuJoCo; run in MuJoCo, the first reaches >= 90% of the second's
    return (scripts/policy_in_learned_sim.py at a test's size)."""
    pytest.importorskip("stable_baselines3")
    script = script_module("policy_in_learned_sim")
    table = script.main(["--out", str(tmp_path / "out"), *script.TEST_SIZE])
    learned, real = table["learned"]["mean"], table["mujoco"]["mean"]
    assert learned >= 0.9 * real, table
