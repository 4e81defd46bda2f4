"""``slhub data collect`` and slhub.sim: determinism to the byte, atomic writes, true episode
lengths, names from the model, exact restore-and-replay, one-line bad inputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")  # read once, when mujoco is first imported
mujoco = pytest.importorskip("mujoco")
pytest.importorskip("gymnasium")

import collect_policies  # noqa: E402

from helpers import REPO, subprocess_env  # noqa: E402
from slhub.cli import main  # noqa: E402
from slhub.data import open_dataset  # noqa: E402
from slhub.data.inspection import check, info  # noqa: E402
from slhub.sim import (  # noqa: E402
    FORMAT,
    SimulatorError,
    collect,
    open_simulator,
    qpos_names,
    qvel_names,
)

PENDULUM = "gymnasium:InvertedPendulum-v5"
HOPPER = "gymnasium:Hopper-v5"


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def leftovers(parent: Path) -> list[str]:
    """Anything a collect into ``parent`` left behind (the store or its temporary folder)."""
    return sorted(p.name for p in parent.iterdir())


@pytest.fixture(scope="module")
def hopper(tmp_path_factory) -> Path:
    """Hopper under smooth random actions: episodes the env terminates, and full ones."""
    out = tmp_path_factory.mktemp("hopper") / "data"
    collect(out, HOPPER, episodes=4, steps=12, actions="smooth", seed=0)
    return out


# ------------------------------------------------------------------ determinism


def test_one_seed_gives_a_byte_identical_dataset_and_another_seed_differs(tmp_path: Path):
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        collect(tmp_path / name, HOPPER, episodes=3, steps=25, actions="uniform", seed=seed)
    first, again, other = (files_of(tmp_path / n) for n in "abc")
    assert len(first) >= 10 and first == again
    assert first.keys() == other.keys()
    changed = {name for name in first if first[name] != other[name]}
    assert {"meta.json"} < changed  # the data differs, not only the recorded seed


def test_the_command_line_writes_the_same_bytes_as_the_library(tmp_path: Path, capsys):
    argv = ["--env", PENDULUM, "--episodes", "2", "--steps", "20", "--seed", "3"]
    assert main(["data", "collect", str(tmp_path / "cli"), *argv, "--actions", "smooth"]) == 0
    assert capsys.readouterr().out.startswith("collected 2 episodes")
    collect(tmp_path / "lib", PENDULUM, episodes=2, steps=20, actions="smooth", seed=3)
    assert files_of(tmp_path / "cli") == files_of(tmp_path / "lib")


def test_episode_e_is_the_same_whatever_the_number_of_episodes(tmp_path: Path):
    collect(tmp_path / "two", PENDULUM, episodes=2, steps=15, seed=5)
    collect(tmp_path / "three", PENDULUM, episodes=3, steps=15, seed=5)
    two, three = open_dataset(tmp_path / "two"), open_dataset(tmp_path / "three")
    for episode in range(2):
        for name, values in two.episode(episode).items():
            assert np.array_equal(values, three.episode(episode)[name]), name


# ------------------------------------------------------------------ what is recorded


def test_the_dataset_opens_passes_check_and_records_its_source(hopper: Path):
    assert check(hopper).startswith("ok: ")
    assert "qpos: vector float64 [6] names=rootx,rootz,rooty,thigh_joint" in info(hopper)
    dataset = open_dataset(hopper)
    simulator = open_simulator(HOPPER)
    assert dataset.format == "slhub" and dataset.fps == 1.0 / simulator.dt == 125.0
    assert set(dataset.features) == {
        "action", "contact", "observation", "qpos", "qvel", "reward", "sim_state",
        "terminated", "truncated",
    }  # fmt: skip
    spec = dataset.features
    assert spec["qpos"].dtype == spec["qvel"].dtype == spec["action"].dtype == "float64"
    assert spec["terminated"].dtype == "bool" and spec["reward"].shape == ()
    assert spec["action"].names == ("thigh_joint", "leg_joint", "foot_joint")  # unnamed actuators
    assert spec["contact"].names == ("torso", "thigh", "leg", "foot")
    source = json.loads((hopper / "meta.json").read_text())["source"]
    assert source["format"] == FORMAT and source["env"] == HOPPER
    assert (source["seed"], source["episodes"], source["steps"], source["actions"]) == (
        0,
        4,
        12,
        "smooth",
    )
    assert source["versions"]["mujoco"] == mujoco.__version__
    assert source["contacts"] == ["force"] and "contact_geometry" not in source
    assert "contact_geometry" not in spec
    contact = np.concatenate([dataset.episode(e)["contact"] for e in range(4)])
    assert (contact[:, -1] > 0).any() and (contact >= 0).all()  # the foot lands
    simulator.close()


def test_early_terminated_episodes_keep_their_true_length(hopper: Path):
    dataset = open_dataset(hopper)
    lengths = dataset.lengths.tolist()
    assert any(n < 12 for n in lengths) and any(n == 12 for n in lengths), lengths
    for episode, length in enumerate(lengths):
        data = dataset.episode(episode)
        ended = data["terminated"] | data["truncated"]
        assert ended[-1] and not ended[:-1].any()  # the first end is the last step stored
        assert data["truncated"][-1] == (length == 12)
        assert data["terminated"][-1] == (length < 12)


def test_through_termination_keeps_the_falls_and_only_the_time_limit_ends(tmp_path: Path):
    collect(tmp_path / "early", HOPPER, episodes=4, steps=12, actions="smooth", seed=0)
    collect(tmp_path / "all", HOPPER, episodes=4, steps=12, actions="smooth", seed=0,
            through_termination=True)  # fmt: skip
    early, whole = open_dataset(tmp_path / "early"), open_dataset(tmp_path / "all")
    assert whole.lengths.tolist() == [12] * 4 and early.lengths.min() < 12
    for episode, length in enumerate(early.lengths.tolist()):
        kept = whole.episode(episode)
        assert kept["truncated"].tolist() == [False] * 11 + [True]
        if length < 12:  # the fall is marked, and its steps are the early episode's
            assert kept["terminated"][length - 1]
            assert np.array_equal(kept["qpos"][:length], early.episode(episode)["qpos"])


def test_a_steps_qpos_and_qvel_are_those_of_its_sim_state(hopper: Path):
    data = open_dataset(hopper).episode(0)
    simulator = open_simulator(HOPPER)
    simulator.reset(0)
    for t in (0, 5):
        simulator.restore(data["sim_state"][t])
        assert np.array_equal(simulator.qpos, data["qpos"][t])
        assert np.array_equal(simulator.qvel, data["qvel"][t])
    simulator.close()


def test_names_come_from_the_model_joints():
    model = mujoco.MjModel.from_xml_string(
        """<mujoco><worldbody>
        <body name="base"><freejoint name="root"/><geom size="0.1"/>
          <body name="arm"><joint name="shoulder" type="ball"/><geom size="0.1"/>
            <body><joint type="slide"/><joint name="elbow" type="hinge"/><geom size="0.1"/>
        </body></body></body></worldbody></mujoco>"""
    )
    assert qpos_names(model) == (
        "root_x", "root_y", "root_z", "root_qw", "root_qx", "root_qy", "root_qz",
        "shoulder_qw", "shoulder_qx", "shoulder_qy", "shoulder_qz", "joint2", "elbow",
    )  # fmt: skip
    assert qvel_names(model) == (
        "root_vx", "root_vy", "root_vz", "root_wx", "root_wy", "root_wz",
        "shoulder_wx", "shoulder_wy", "shoulder_wz", "joint2", "elbow",
    )  # fmt: skip
    assert len(qpos_names(model)) == model.nq and len(qvel_names(model)) == model.nv


def test_a_model_whose_geoms_cannot_touch_records_no_contact(tmp_path: Path):
    collect(tmp_path / "p", PENDULUM, episodes=1, steps=5, seed=0)
    dataset = open_dataset(tmp_path / "p")
    assert "contact" not in dataset.features
    assert dataset.features["qpos"].names == ("slider", "hinge")


# ------------------------------------------------------------------ exact replay


def test_restoring_a_recorded_state_and_replaying_its_actions_is_bit_exact(hopper: Path):
    dataset = open_dataset(hopper)
    simulator = open_simulator(HOPPER, max_steps=1000)  # a fresh env, never reset
    for episode in range(dataset.num_episodes):
        data = dataset.episode(episode)
        length = len(data["action"])
        for start in (0, length // 2):
            simulator.restore(data["sim_state"][start])
            for t in range(start, length):
                step = simulator.step(data["action"][t])
                assert step.reward == data["reward"][t]
                assert step.terminated == data["terminated"][t]
                if t + 1 < length:
                    assert np.array_equal(simulator.qpos, data["qpos"][t + 1])
                    assert np.array_equal(simulator.qvel, data["qvel"][t + 1])
                    assert np.array_equal(simulator.state(), data["sim_state"][t + 1])
                    assert np.array_equal(step.observation, data["observation"][t + 1])
                    assert np.array_equal(simulator.contact(), data["contact"][t + 1])
    simulator.close()


def test_restore_refuses_a_state_of_another_model():
    simulator = open_simulator(PENDULUM)
    with pytest.raises(SimulatorError, match="integration state has"):
        simulator.restore(np.zeros(3))
    simulator.close()


# ------------------------------------------------------------------ action sources


def test_a_noisy_policy_records_the_clean_action_as_its_label(tmp_path: Path):
    collect(tmp_path / "clean", HOPPER, episodes=2, steps=10, actions="policy",
            policy="collect_policies:linear", seed=1)  # fmt: skip
    collect(tmp_path / "noisy", HOPPER, episodes=2, steps=10, actions="policy",
            policy="collect_policies:linear", noise=0.3, seed=1)  # fmt: skip
    clean, noisy = open_dataset(tmp_path / "clean"), open_dataset(tmp_path / "noisy")
    assert "policy_action" not in clean.features
    assert noisy.features["policy_action"].names == noisy.features["action"].names
    data = noisy.episode(0)
    simulator = open_simulator(HOPPER)
    for t in range(len(data["action"])):
        label = collect_policies.linear(data["observation"][t], simulator)
        assert np.array_equal(data["policy_action"][t], label)
    assert not np.array_equal(data["action"], data["policy_action"])
    assert (np.abs(data["action"]) <= 1.0).all()  # clipped to the ctrlrange
    first = clean.episode(0)
    assert np.array_equal(first["action"][0], collect_policies.linear(first["observation"][0],
                                                                      simulator))  # fmt: skip
    simulator.close()


def test_random_actions_stay_in_the_ctrlrange_and_smooth_ones_are_piecewise_linear(
    tmp_path: Path,
):
    collect(tmp_path / "s", HOPPER, episodes=1, steps=30, actions="smooth", seed=2)
    actions = open_dataset(tmp_path / "s").episode(0)["action"]
    assert (np.abs(actions) <= 1.0).all()
    second = np.diff(actions[:10], n=2, axis=0)  # inside the first knot interval
    assert np.allclose(second, 0.0, atol=1e-12) and not np.allclose(actions[0], actions[9])


def test_zero_actions_give_passive_motion(tmp_path: Path, capsys):
    argv = ["--env", HOPPER, "--episodes", "2", "--steps", "15", "--seed", "0"]
    assert main(["data", "collect", str(tmp_path / "z"), *argv, "--actions", "zero"]) == 0
    dataset = open_dataset(tmp_path / "z")
    assert dataset.source["actions"] == "zero"
    for e in range(2):
        episode = dataset.episode(e)
        assert episode["action"].shape[1] == 3 and (episode["action"] == 0.0).all()
        assert not np.array_equal(episode["qpos"][0], episode["qpos"][-1])  # it still moves


# ------------------------------------------------------------------ rendering


def test_render_records_frames_that_show_the_robot(tmp_path: Path):
    collect(tmp_path / "r", PENDULUM, episodes=1, steps=4, seed=0, render=True, size=32)
    dataset = open_dataset(tmp_path / "r")
    assert dataset.features["image"].shape == (32, 32, 3) and dataset.features["image"].is_image
    frames = dataset.episode(0)["image"].astype(np.int64)
    background = np.median(frames.reshape(-1, 3), axis=0)  # the backdrop slhub adds
    robot = (np.abs(frames - background).max(axis=-1) > 30).mean()
    assert robot > 0.02, f"only {robot:.1%} of the pixels differ from the background"
    collect(tmp_path / "again", PENDULUM, episodes=1, steps=4, seed=0, render=True, size=32)
    assert files_of(tmp_path / "r") == files_of(tmp_path / "again")


# ------------------------------------------------------------------ atomic writes


def test_a_failure_while_writing_leaves_no_dataset_and_no_temporary_folder(
    tmp_path: Path, monkeypatch
):
    from slhub.data import store

    def broken(path: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_fsync", broken)
    parent = tmp_path / "out"
    parent.mkdir()
    with pytest.raises(OSError, match="No space"):
        collect(parent / "data", PENDULUM, episodes=2, steps=5, seed=0)
    assert leftovers(parent) == []


def test_a_policy_that_fails_midway_leaves_nothing(tmp_path: Path, monkeypatch):
    calls = []

    def fails(observation, simulator):
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("policy bug")
        return np.zeros(1)

    monkeypatch.setattr(collect_policies, "fails", fails, raising=False)
    with pytest.raises(
        SimulatorError,
        match="policy collect_policies:fails raised at episode 0 step 3: RuntimeError: policy bug",
    ) as raised:
        collect(tmp_path / "data", PENDULUM, episodes=3, steps=20, actions="policy",
                policy="collect_policies:fails", seed=0)  # fmt: skip
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert leftovers(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_collect_leaves_no_dataset_and_no_temporary_folder(tmp_path: Path, signum):
    parent, marker = tmp_path / "out", tmp_path / "started"
    parent.mkdir()
    argv = ["data", "collect", str(parent / "data"), "--env", PENDULUM, "--episodes", "50",
            "--steps", "200", "--seed", "0", "--actions", "policy",
            "--policy", "collect_policies:slow"]  # fmt: skip
    env = subprocess_env({collect_policies.MARKER_ENV: str(marker)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "slhub", *argv],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (-signal.SIGKILL, 128 + signal.SIGTERM), (proc.returncode, err)
    if signum == signal.SIGTERM:
        assert err.strip().splitlines() == ["slhub: collect stopped by signal 15; nothing written"]
    assert leftovers(parent) == []


# ------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--env", "gymnasium:Nope-v5"], "Environment `Nope` doesn't exist"),
        (["--env", "gymnasium:CartPole-v1"], "CartPoleEnv is not a MuJoCo env"),
        (["--env", "Hopper-v5"], "name a simulator and env as PREFIX:ENV"),
        (["--env", "isaac:Hopper-v5"], "unknown simulator 'isaac'"),
        (["--actions", "policy"], "--actions policy needs --policy module:function"),
        (["--actions", "policy", "--policy", "collect_policies"], "as module:function"),
        (["--actions", "policy", "--policy", "no_such_module_xyz:act"], "failed to import"),
        (["--actions", "policy", "--policy", "collect_policies:nope"], "has no 'nope'"),
        (["--actions", "policy", "--policy", "collect_policies:NOT_CALLABLE"], "not callable"),
        (["--actions", "policy", "--policy", "collect_policies:wrong_shape"], "returned [3]"),
        (["--noise", "0.1"], "--policy and --noise go with --actions policy"),
        (
            ["--actions", "policy", "--policy", "collect_policies:linear", "--noise", "-1"],
            "--noise -1.0",
        ),  # fmt: skip
        (["--episodes", "0"], "--episodes 0: an integer >= 1"),
        (["--seed", "-1"], "--seed -1: an integer >= 0"),
        (["--render", "--camera", "overhead"], "--camera 'overhead': the model has no such"),
        (["--actions", "wild"], "invalid choice: 'wild'"),
        (["--contacts", "torque"], "--contacts 'torque': force, geometry or both"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path: Path, args, expected):
    # argparse keeps the later of two values: ``args`` override the defaults
    argv = ["--env", PENDULUM, "--episodes", "2", "--steps", "5", "--seed", "0", *args]
    try:
        code = main(["data", "collect", str(tmp_path / "data"), *argv])
    except SystemExit as exc:  # argparse's own refusals exit from the parser
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err
    assert leftovers(tmp_path) == []


def test_an_existing_destination_is_refused_untouched(capsys, tmp_path: Path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep").write_text("mine")
    argv = ["--env", PENDULUM, "--episodes", "1", "--steps", "5", "--seed", "0"]
    assert main(["data", "collect", str(tmp_path / "data"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists; collect writes a new directory" in err
    assert (tmp_path / "data" / "keep").read_text() == "mine"


def test_missing_simulator_libraries_name_the_extra(capsys, tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco", None)  # `import mujoco` fails as if absent
    argv = ["--env", PENDULUM, "--episodes", "1", "--steps", "5", "--seed", "0"]
    assert main(["data", "collect", str(tmp_path / "data"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'slhub[sim]'" in err and "mujoco" in err


def test_a_package_adds_a_simulator_prefix_but_cannot_replace_the_built_in(monkeypatch):
    from importlib.metadata import EntryPoint

    from slhub.sim import SIMULATOR_GROUP, simulators
    from slhub.sim import simulator as registry

    points = [
        EntryPoint("toy", "collect_policies:toy_simulator", SIMULATOR_GROUP),
        EntryPoint("gymnasium", "collect_policies:toy_simulator", SIMULATOR_GROUP),
        EntryPoint("broken", "no_such_module_xyz:factory", SIMULATOR_GROUP),
    ]
    monkeypatch.setattr(registry, "entry_points", lambda group: points)
    assert simulators()["gymnasium"] == "slhub.sim.gymnasium_mujoco:GymnasiumMujoco"
    simulator = open_simulator("toy:InvertedPendulum-v5", max_steps=3)
    assert simulator.qpos_names == ("slider", "hinge")
    simulator.close()
    with pytest.raises(SimulatorError, match="simulator 'broken' .* fails to import"):
        open_simulator("broken:Anything-v0")
