"""NeRD's measures of a rollout in physical units: base position error (m), base
orientation error (rad) and joint position error (rad, or m for a slide).

The normalized state MSE mixes metres, radians and velocities; these three say how
far a simulated robot is from the true one, as the NeRD paper reports its passive
motion results. They are computed on world-frame states as rollouts return them
(unnormalized) and averaged as NeRD's evaluator
(``eval/eval_passive/eval_passive_motion.py`` with ``utils/evaluator.py`` of
NVlabs/neural-robot-dynamics) averages them: every predicted step of the rollout
counts, from the first to the K-th, over every trajectory (the mean over steps and
trajectories, not the error at step K alone).

- base position: Euclidean distance of the base's xyz (a planar base's x and z);
- base orientation: the angle of the rotation from the predicted to the true
  quaternion, ``2 atan2(|v|, |w|)`` of ``q_pred^-1 (x) q_true`` (both normalized
  first), equal to ``2 acos(|<q_pred, q_true>|)`` but exact near 0 and pi; for a
  planar base, the absolute pitch error wrapped to [-pi, pi);
- joint position: absolute error averaged over the ``qpos`` components that are not
  the base's (every one when there is no base), wrapped to [-pi, pi) for the
  components that are angles (``model.angles``), as NeRD wraps its continuous joints.
  A limited hinge or a slide is not wrapped: its error is its difference.

Pure: torch tensors in, tensors out; no trainer, data-loading or model code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from slhub.builtin.nerd.base import RobotBase
from slhub.data import wrap_angle

#: The prefix of the state components that are generalized positions.
QPOS = "qpos."
#: Measure names, in the order they are reported.
NAMES = ("base_position", "base_orientation", "joint_position")


@dataclass(frozen=True)
class MeasureColumns:
    """Where each measure's components sit in a state vector.

    :param position: the base's x, y, z (a planar base's x, z; empty without a base).
    :param orientation: the base's qw, qx, qy, qz (a planar base's pitch; empty
        without a base).
    :param joints: the joint position components.
    :param wrapped: per entry of ``joints``, whether it is an angle to wrap.
    """

    position: tuple[int, ...]
    orientation: tuple[int, ...]
    joints: tuple[int, ...]
    wrapped: tuple[bool, ...]

    @classmethod
    def of(
        cls, state_names: Sequence[str], angles: Sequence[int], base: RobotBase | None
    ) -> MeasureColumns | None:
        """The columns of a state named ``state_names`` whose ``angles`` (indices) wrap;
        None when the state has no ``qpos`` components (nothing to measure).

        :raises ValueError: ``base`` names a component the state lacks.
        """
        if not any(name.startswith(QPOS) for name in state_names):
            return None
        position: tuple[int, ...] = ()
        orientation: tuple[int, ...] = ()
        if base is not None:
            where = base.indices(state_names)
            position, orientation = where.position, where.orientation
        taken = set(position) | set(orientation)
        joints = tuple(
            i for i, name in enumerate(state_names) if name.startswith(QPOS) and i not in taken
        )
        return cls(position, orientation, joints, tuple(i in set(angles) for i in joints))


def position_error(predicted: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Euclidean distance over the last axis (``[..., 3]`` or ``[..., 2]`` -> ``[...]``)."""
    return torch.linalg.vector_norm(predicted - truth, dim=-1)


def orientation_error(predicted: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """The angle (rad, in [0, pi]) of the rotation between quaternions (w, x, y, z)
    over the last axis (``[..., 4]`` -> ``[...]``); both are normalized first."""
    p = predicted / torch.linalg.vector_norm(predicted, dim=-1, keepdim=True).clamp_min(1e-12)
    t = truth / torch.linalg.vector_norm(truth, dim=-1, keepdim=True).clamp_min(1e-12)
    pw, pv = p[..., :1], -p[..., 1:]  # the conjugate: the inverse of a unit quaternion
    tw, tv = t[..., :1], t[..., 1:]
    w = pw * tw - (pv * tv).sum(-1, keepdim=True)
    v = pw * tv + tw * pv + torch.linalg.cross(pv, tv, dim=-1)
    return 2 * torch.atan2(torch.linalg.vector_norm(v, dim=-1), w.squeeze(-1).abs())


def joint_error(
    predicted: torch.Tensor, truth: torch.Tensor, wrapped: Sequence[bool]
) -> torch.Tensor:
    """Mean absolute error over the last axis, the ``wrapped`` entries' differences
    wrapped to [-pi, pi) first (``[..., J]`` -> ``[...]``)."""
    difference = predicted - truth
    mask = torch.tensor(list(wrapped), dtype=torch.bool, device=difference.device)
    difference = torch.where(mask, wrap_angle(difference), difference)
    return difference.abs().mean(-1)


def step_errors(
    predicted: torch.Tensor, truth: torch.Tensor, columns: MeasureColumns
) -> dict[str, torch.Tensor]:
    """Each measure at every step of every trajectory, in float64.

    :param predicted: ``[trajectories, steps, state_dim]`` world-frame states.
    :param truth: the true states, the same shape.
    :returns: measure name (of :data:`NAMES`) -> ``[trajectories, steps]``; the base's
        measures only with a base, the joints' only with joint components.
    """
    predicted, truth = predicted.double(), truth.double()
    out = {}
    if columns.position:
        where = list(columns.position)
        out["base_position"] = position_error(predicted[..., where], truth[..., where])
    if len(columns.orientation) == 1:
        where = columns.orientation[0]
        out["base_orientation"] = wrap_angle(predicted[..., where] - truth[..., where]).abs()
    elif columns.orientation:
        where = list(columns.orientation)
        out["base_orientation"] = orientation_error(predicted[..., where], truth[..., where])
    if columns.joints:
        where = list(columns.joints)
        out["joint_position"] = joint_error(
            predicted[..., where], truth[..., where], columns.wrapped
        )
    return out


def averaged(errors: dict[str, torch.Tensor], horizon: int) -> dict[str, float]:
    """Each measure averaged over the first ``horizon`` steps and every trajectory."""
    return {name: float(error[:, :horizon].mean()) for name, error in errors.items()}
