"""NeRD's measures in physical units (slhub.builtin.nerd.measures) and their place in
validation: base position and orientation error, wrapped joint error, averaged over
steps and trajectories as NeRD's evaluator does, up to a 500-step horizon."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import slhub
from slhub.builtin.nerd.base import free_joint_base
from slhub.builtin.nerd.loss import measured_base
from slhub.builtin.nerd.measures import (
    MeasureColumns,
    averaged,
    joint_error,
    orientation_error,
    position_error,
    step_errors,
)
from slhub.builtin.nerd.model import NerdLayout

#: A free joint ``root`` and one hinge, named as ``slhub data collect`` names them.
BASE = free_joint_base("root")
QPOS = ["qpos.root_x", "qpos.root_y", "qpos.root_z",
        "qpos.root_qw", "qpos.root_qx", "qpos.root_qy", "qpos.root_qz", "qpos.hinge"]  # fmt: skip
QVEL = ["qvel.root_vx", "qvel.root_vy", "qvel.root_vz",
        "qvel.root_wx", "qvel.root_wy", "qvel.root_wz", "qvel.hinge"]  # fmt: skip


def _about_z(angle: float) -> torch.Tensor:
    return torch.tensor([math.cos(angle / 2), 0.0, 0.0, math.sin(angle / 2)], dtype=torch.float64)


def test_position_error_is_euclidean():
    predicted = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    truth = torch.tensor([[4.0, 6.0, 3.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert position_error(predicted, truth).tolist() == [5.0, 0.0]


@pytest.mark.parametrize("angle", [0.0, 0.25, 1.0, math.pi / 2, 3.0, math.pi])
def test_a_known_rotation_gives_its_angle(angle: float):
    start = _about_z(0.3)
    # truth = start rotated by `angle` about x, in the body frame: start (x) r
    r = torch.tensor([math.cos(angle / 2), math.sin(angle / 2), 0.0, 0.0], dtype=torch.float64)
    w1, v1, w2, v2 = start[0], start[1:], r[0], r[1:]
    truth = torch.cat([(w1 * w2 - v1 @ v2)[None], w1 * v2 + w2 * v1 + torch.linalg.cross(v1, v2)])
    assert float(orientation_error(start, truth)) == pytest.approx(angle, abs=1e-12)
    assert float(orientation_error(truth, start)) == pytest.approx(angle, abs=1e-12)


def test_orientation_error_ignores_sign_and_scale():
    q = _about_z(0.7)
    assert float(orientation_error(q, -q)) == 0.0
    assert float(orientation_error(3 * q, q)) == pytest.approx(0.0, abs=1e-15)
    assert float(orientation_error(_about_z(0.1), 2 * _about_z(-0.3))) == pytest.approx(0.4)
    # the angle of the relative rotation is at most pi: 2 pi - 1.5 about z is 1.5 the other way
    assert float(orientation_error(_about_z(0.0), _about_z(2 * math.pi - 1.5))) == pytest.approx(
        1.5
    )


def test_joint_error_wraps_only_the_angles():
    predicted = torch.tensor([3.0, 3.0, 0.5], dtype=torch.float64)
    truth = torch.tensor([-3.0, -3.0, 0.25], dtype=torch.float64)
    # wrapped: 6 - 2 pi; not wrapped: 6; 0.25
    expected = ((2 * math.pi - 6.0) + 6.0 + 0.25) / 3
    assert float(joint_error(predicted, truth, [True, False, False])) == pytest.approx(
        expected, abs=1e-15
    )


def test_columns_name_the_base_and_the_joints():
    names = [*QPOS, *QVEL]
    columns = MeasureColumns.of(names, [7], BASE)
    assert columns == MeasureColumns((0, 1, 2), (3, 4, 5, 6), (7,), (True,))
    # no base: every qpos component is a joint (the pendulum; Hopper with no base known)
    hopper = ["qpos.rootx", "qpos.rootz", "qpos.rooty", "qvel.rootx"]
    assert MeasureColumns.of(hopper, [2], None) == MeasureColumns(
        (), (), (0, 1, 2), (False, False, True)
    )
    # nothing named qpos: nothing to measure (the cart-pole's x, theta, ...)
    assert MeasureColumns.of(["x", "theta"], [1], None) is None


def test_the_measured_base_is_the_models_else_a_free_joint_found_by_name():
    layout = NerdLayout.from_names([*QPOS, *QVEL], ["a"])
    assert measured_base(layout) == BASE
    without = NerdLayout.from_names([n for n in [*QPOS, *QVEL] if n != "qvel.root_wz"], ["a"])
    assert measured_base(without) is None
    # a model that knows its base (model.base, or the dataset's record) is judged by it
    named = NerdLayout.from_names([*QPOS, *QVEL], ["a"], base=BASE, frame="world")
    assert measured_base(named) is BASE


def test_measures_average_over_steps_and_trajectories_as_nerds_evaluator():
    """Two trajectories of three steps: the K-step measure is the mean of every
    (trajectory, step) error up to K, not the error at step K."""
    columns = MeasureColumns.of([*QPOS, *QVEL], [7], BASE)
    assert columns is not None
    truth = torch.zeros(2, 3, len(QPOS) + len(QVEL), dtype=torch.float64)
    truth[..., 3] = 1.0  # identity orientation
    predicted = truth.clone()
    # base x off by 1, 2, 3 m in trajectory 0 and by 0 in trajectory 1
    predicted[0, :, 0] = torch.tensor([1.0, 2.0, 3.0])
    # trajectory 1 turned by 0.5 rad about z from its second step on
    predicted[1, 1:, 3:7] = _about_z(0.5)
    # the hinge off by 0.1 everywhere, and by 2 pi + 0.1 at the last step of trajectory 0
    predicted[..., 7] = 0.1
    predicted[0, 2, 7] = 2 * math.pi + 0.1
    errors = step_errors(predicted, truth, columns)
    assert set(errors) == {"base_position", "base_orientation", "joint_position"}
    two = averaged(errors, 2)
    assert two["base_position"] == pytest.approx((1 + 2 + 0 + 0) / 4)
    assert two["base_orientation"] == pytest.approx((0 + 0 + 0 + 0.5) / 4)
    three = averaged(errors, 3)
    assert three["base_position"] == pytest.approx((1 + 2 + 3) / 6)
    assert three["base_orientation"] == pytest.approx(1.0 / 6)
    assert three["joint_position"] == pytest.approx(0.1)
    assert averaged(errors, 500) == three  # a horizon past the rollout's end: all of it


def _store(path: Path, episodes: int, length: int) -> Path:
    """A synthetic dataset named like a free joint ``root`` and a hinge: the base
    drifts along x and turns about z, the hinge swings."""
    from slhub.data import ArrayEpisodes, write_store

    rng = np.random.default_rng(0)
    data = []
    for _ in range(episodes):
        t = np.arange(length)[:, None] * 0.01
        speed, turn = rng.uniform(0.5, 1.5, size=2)
        yaw = turn * t[:, 0]
        qpos = np.zeros((length, 8))
        qpos[:, 0] = speed * t[:, 0]
        qpos[:, 2] = 0.5
        qpos[:, 3], qpos[:, 6] = np.cos(yaw / 2), np.sin(yaw / 2)
        qpos[:, 7] = np.sin(3 * t[:, 0] + speed)
        qvel = np.zeros((length, 7))
        qvel[:, 0], qvel[:, 5] = speed, turn
        qvel[:, 6] = 3 * np.cos(3 * t[:, 0] + speed)
        data.append({"qpos": qpos, "qvel": qvel, "action": np.zeros((length, 1))})
    names = {
        "qpos": tuple(n.removeprefix("qpos.") for n in QPOS),
        "qvel": tuple(n.removeprefix("qvel.") for n in QVEL),
        "action": ("motor",),
    }
    write_store(ArrayEpisodes(data, fps=100.0, names=names), path)
    return path


def test_validation_reports_the_measures_up_to_500_steps(tmp_path: Path, capsys):
    """A tiny run on a free-base dataset logs every measure for the model and both
    baselines at every horizon, 500 included, and ``slhub eval`` prints them."""
    from slhub import cli

    data = _store(tmp_path / "episodes", episodes=4, length=506)
    recipe = tmp_path / "sl.train.yaml"
    recipe.write_text(
        "plugin: nerd\n"
        "trainer: {steps: 2, batch_size: 4, lr: 0.001, seed: 0, validate_every: 2, "
        "save_every: 2, device: cpu, "
        f"output_dir: {tmp_path / 'run'}}}\n"
        "model: {history: 4, width: 8, layers: 1, heads: 2, mlp_hidden: 8, angles: [], "
        "base: root}\n"
        f"data: {{path: {data}, split: {{train: [0, 1], validation: [2, 3]}}, "
        "features: {state: [qpos, qvel], action: [action]}}\n"
        "validation: {horizons: [1, 500]}\n"
    )
    slhub.train(recipe, [])
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    last = [json.loads(line) for line in lines if "validation/one_step_mse" in line][-1]
    for kind in ("rollout", "baseline", "linear"):
        for k in (1, 500):
            for name in ("base_position", "base_orientation", "joint_position"):
                value = last[f"validation/{kind}_{name}_{k}"]
                assert math.isfinite(value) and value >= 0, (kind, name, k)
    # the base drifts: holding the state is further off after 500 steps than after 1
    held = {k: last[f"validation/baseline_base_position_{k}"] for k in (1, 500)}
    assert held[500] > held[1] and last["validation/baseline_base_orientation_500"] > 0
    assert cli.main(["eval", "--checkpoint", str(tmp_path / "run" / "last.pt")]) == 0
    printed = capsys.readouterr().out
    assert "rollout_base_orientation_500" in printed and "linear_joint_position_1" in printed
