"""``--init random``: states drawn around the env's reset (slhub.sim.initial_states), as
NeRD starts its episodes: within the stated ranges, clear of the floor, reproducible
from the seed, and recorded by ``slhub data collect`` and judged by ``slhub eval``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")  # read once, when mujoco is first imported
mujoco = pytest.importorskip("mujoco")
gymnasium = pytest.importorskip("gymnasium")

from slhub.cli import main  # noqa: E402
from slhub.data import open_dataset  # noqa: E402
from slhub.sim import collect  # noqa: E402
from slhub.sim.initial_states import (  # noqa: E402
    FREE,
    HINGE,
    RANGES,
    _deepest_into_world,
    random_state,
)
from slhub.sim.names import planar_root  # noqa: E402


def drawn(env_id: str, seed: int) -> tuple[object, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The env after a reset (seed 0) and a random state drawn around it with ``seed``:
    the raw env, the reset qpos/qvel and the drawn ones."""
    env = gymnasium.make(env_id)
    env.reset(seed=0)
    raw = env.unwrapped
    qpos0, qvel0 = raw.data.qpos.copy(), raw.data.qvel.copy()
    qpos, qvel = random_state(mujoco, raw.model, raw.data, np.random.default_rng(seed))
    return raw, qpos0, qvel0, qpos, qvel


def turn_angle(a: np.ndarray, b: np.ndarray) -> float:
    """The angle (rad) of the rotation taking quaternion ``a`` to ``b`` (a reset's
    quaternion carries the env's noise, so it is normalized first, as MuJoCo does)."""
    cosine = abs(float(np.dot(a / np.linalg.norm(a), b / np.linalg.norm(b))))
    return float(2 * np.arccos(min(1.0, cosine)))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_free_base_is_turned_within_the_tilt_moving_and_clear_of_the_floor(seed: int):
    raw, qpos0, _, qpos, qvel = drawn("Ant-v5", seed)
    model = raw.model
    assert int(model.jnt_type[0]) == FREE
    quaternion = qpos[3:7]
    assert abs(np.linalg.norm(quaternion) - 1.0) < 1e-12
    angle = turn_angle(qpos0[3:7], quaternion)
    assert 0.0 < angle <= RANGES["tilt"] + 1e-9
    assert np.array_equal(qpos[:2], qpos0[:2])  # the horizontal position is kept
    assert np.all(np.abs(qvel[:3]) <= RANGES["linear"])
    assert np.all(np.abs(qvel[3:6]) <= RANGES["angular"]) and np.any(qvel[3:6] != 0)
    assert _deepest_into_world(model, raw.data) <= 0.0
    for joint in range(1, model.njnt):  # the legs: within their ranges, moving
        p, v = int(model.jnt_qposadr[joint]), int(model.jnt_dofadr[joint])
        low, high = model.jnt_range[joint]
        assert bool(model.jnt_limited[joint]) and low <= qpos[p] <= high
        assert abs(qvel[v]) <= RANGES["joint_speed"]
    assert np.array_equal(raw.data.qpos, qpos) and np.array_equal(raw.data.qvel, qvel)


def test_the_same_seed_draws_the_same_state_and_another_seed_another():
    _, _, _, qpos_a, qvel_a = drawn("Ant-v5", 5)
    _, _, _, qpos_b, qvel_b = drawn("Ant-v5", 5)
    _, _, _, qpos_c, _ = drawn("Ant-v5", 6)
    assert np.array_equal(qpos_a, qpos_b) and np.array_equal(qvel_a, qvel_b)
    assert not np.array_equal(qpos_a, qpos_c)


def test_a_planar_base_is_turned_about_its_hinge_and_lifted_clear():
    for seed in range(4):
        raw, qpos0, _, qpos, qvel = drawn("Hopper-v5", seed)
        model = raw.model
        x, z, hinge = (int(model.joint(name).qposadr[0]) for name in planar_root(model))
        assert int(model.jnt_type[model.joint(planar_root(model)[2]).id]) == HINGE
        assert qpos[x] == qpos0[x]
        assert abs(qpos[hinge] - qpos0[hinge]) <= RANGES["tilt"]
        assert qpos[z] >= qpos0[z] - 1e-12  # never pushed into the floor
        assert _deepest_into_world(model, raw.data) <= 0.0
        assert abs(qvel[hinge]) <= RANGES["angular"] and np.any(qvel != 0)


def test_a_robot_without_a_base_is_not_lifted():
    raw, _, _, qpos, qvel = drawn("InvertedPendulum-v5", 0)
    for joint in range(raw.model.njnt):
        low, high = raw.model.jnt_range[joint]
        assert low <= qpos[int(raw.model.jnt_qposadr[joint])] <= high
    assert np.all(np.abs(qvel) <= RANGES["joint_speed"])


def test_collect_init_random_starts_each_episode_from_its_own_draw(tmp_path: Path):
    argv = ["--env", "gymnasium:Hopper-v5", "--episodes", "2", "--steps", "30", "--seed", "4"]
    argv += ["--actions", "zero", "--through-termination"]
    for name, init in (("a", "random"), ("b", "random"), ("reset", "reset")):
        assert main(["data", "collect", str(tmp_path / name), *argv, "--init", init]) == 0
    a, b, reset = (open_dataset(tmp_path / n) for n in ("a", "b", "reset"))
    for episode in range(2):
        for key in ("qpos", "qvel", "action", "sim_state"):
            assert np.array_equal(a.episode(episode)[key], b.episode(episode)[key]), key
    starts = [a.episode(e)["qpos"][0] for e in range(2)]
    assert not np.array_equal(starts[0], starts[1])
    assert not np.array_equal(starts[0], reset.episode(0)["qpos"][0])
    # passive motion from a drop: the torso falls in the first steps
    assert a.episode(0)["qvel"][10, 1] < 0
    source = json.loads((tmp_path / "a" / "meta.json").read_text())["source"]
    assert source["init"] == "random" and source["init_ranges"] == RANGES
    assert json.loads((tmp_path / "reset" / "meta.json").read_text())["source"]["init"] == "reset"


def test_episode_e_of_a_random_start_is_the_same_whatever_the_number_of_episodes(tmp_path):
    options = dict(steps=10, seed=9, actions="zero", init="random")
    collect(tmp_path / "one", "gymnasium:Ant-v5", episodes=1, **options)
    collect(tmp_path / "two", "gymnasium:Ant-v5", episodes=2, **options)
    one, two = open_dataset(tmp_path / "one"), open_dataset(tmp_path / "two")
    for name, values in one.episode(0).items():
        assert np.array_equal(values, two.episode(0)[name]), name


def test_a_bad_init_is_one_line_and_exit_2(capsys, tmp_path: Path):
    argv = ["--env", "gymnasium:Hopper-v5", "--episodes", "1", "--steps", "5", "--seed", "0"]
    with pytest.raises(SystemExit) as exc:
        main(["data", "collect", str(tmp_path / "data"), *argv, "--init", "sideways"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'sideways'" in err
    assert list(tmp_path.iterdir()) == []
