"""A floating-base robot's state in the base frame of one step, and back to world.

A body-frame NeRD model sees every token of its window in the base frame of that
token's own step (upstream's ``anchor_frame_step="every"``, full rotation), with
gravity's direction in that frame as an input, and predicts the state change in
the frame of the step it starts from. MuJoCo's free joint holds position and
linear velocity in world coordinates, the orientation as a unit quaternion
(w, x, y, z; body to world) and the angular velocity in the body frame.

- :meth:`BaseFrame.inputs`: a token in its own step's base frame. The position
  relative to the step's own base is zero, so the ``x`` and ``y`` slots hold 0 and
  the ``z`` slot the base's height (on flat ground it is what tells the model
  where the ground is; contact geometry inputs tell it too,
  :mod:`slhub.builtin.nerd.contacts`); the orientation slots hold the identity;
  the linear velocity is rotated into the base frame; the angular velocity
  already is in it.
- :meth:`BaseFrame.to_body`: the change from a state to the next in the first
  state's base frame: position and linear velocity changes rotated into it; the
  orientation change as a rotation vector ``log(q_t^-1 q_t+1)`` in the ``qx qy
  qz`` slots (``qw`` holds 0, never supervised); the next angular velocity
  rotated into frame ``t`` minus the current one.
- :meth:`BaseFrame.to_world`: its inverse: ``q_t+1 = normalize(q_t exp(dθ))``, so a
  rollout's quaternion stays a unit one.

Components other than the base's change as in the world frame. Every function is
plain torch arithmetic (no in-place writes, no ``linalg``), so the ONNX graph of
``next_state`` holds the same math. A planar base's frame is
:class:`slhub.builtin.nerd.planar_frame.PlanarFrame`; :func:`frame_of` picks the one
of a base's kind.
"""

from __future__ import annotations

import torch

from slhub.builtin.nerd.base import FloatingBaseIndices, PlanarBaseIndices, RobotBase
from slhub.builtin.nerd.columns import BaseColumns
from slhub.builtin.nerd.planar_frame import PlanarFrame

#: Gravity's direction in world coordinates (MuJoCo's z axis points up).
GRAVITY = (0.0, 0.0, -1.0)
#: Below this rotation angle (radians) ``exp`` uses its Taylor series.
SMALL_ANGLE = 1e-3


def cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ax, ay, az = a.unbind(-1)
    bx, by, bz = b.unbind(-1)
    return torch.stack([ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx], dim=-1)


def quat_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product of (w, x, y, z) quaternions: rotate by ``b``, then ``a``."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        dim=-1,
    )


def conjugate(q: torch.Tensor) -> torch.Tensor:
    return q * q.new_tensor([1.0, -1.0, -1.0, -1.0])


def normalize(q: torch.Tensor) -> torch.Tensor:
    return q / torch.sqrt((q * q).sum(-1, keepdim=True))


def rotate(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``v`` rotated by unit quaternion ``q`` (body to world for a base's orientation)."""
    w, u = q[..., :1], q[..., 1:]
    t = 2.0 * cross(u, v)
    return v + w * t + cross(u, t)


def rotate_inverse(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``v`` rotated by the inverse of unit quaternion ``q`` (world to body)."""
    return rotate(conjugate(q), v)


def quat_exp(theta: torch.Tensor) -> torch.Tensor:
    """The unit quaternion of rotation vector ``theta`` (axis times angle)."""
    square = (theta * theta).sum(-1, keepdim=True)
    angle = torch.sqrt(square)
    small = angle < SMALL_ANGLE
    safe = torch.where(small, torch.ones_like(angle), angle)
    scale = torch.where(small, 0.5 - square / 48.0, torch.sin(0.5 * safe) / safe)
    w = torch.where(small, 1.0 - square / 8.0, torch.cos(0.5 * safe))
    return normalize(torch.cat([w, scale * theta], dim=-1))


def quat_log(q: torch.Tensor) -> torch.Tensor:
    """The rotation vector of unit quaternion ``q``, the shorter way round (angle <= pi)."""
    q = torch.where(q[..., :1] < 0, -q, q)
    w, u = q[..., :1], q[..., 1:]
    norm = torch.sqrt((u * u).sum(-1, keepdim=True))
    small = norm < 1e-12
    safe = torch.where(small, torch.ones_like(norm), norm)
    scale = torch.where(small, 2.0 / w, 2.0 * torch.atan2(norm, w) / safe)
    return scale * u


class BaseFrame(BaseColumns):
    """A free joint's columns of a state vector and the conversions between frames."""

    #: Gravity's direction in the base frame: x, y and z.
    gravity_dim = 3

    def __init__(self, base: FloatingBaseIndices, state_dim: int) -> None:
        columns = base.position + base.orientation + base.linear_velocity + base.angular_velocity
        super().__init__(columns, state_dim)
        self.quaternion_column = base.orientation[0]

    def _split(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        base, rest = self._columns(state)
        return base[..., 0:3], base[..., 3:7], base[..., 7:10], base[..., 10:13], rest

    def gravity(self, q: torch.Tensor) -> torch.Tensor:
        """Gravity's direction in the base frame of orientation ``q``."""
        return rotate_inverse(q, q.new_tensor(GRAVITY).expand(q.shape[:-1] + (3,)))

    def pose(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The base's position ``[..., 3]`` and unit quaternion ``[..., 4]`` of each
        token's state (world; what the contact slots are turned into the frame by)."""
        p, q, _, _, _ = self._split(tokens[..., : self.state_dim])
        return p, normalize(q)

    def inputs(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens ``[..., features]`` (world) with each state in its own base frame, and
        gravity's direction in that frame ``[..., 3]``."""
        state, controls = tokens[..., : self.state_dim], tokens[..., self.state_dim :]
        p, q, v, w, rest = self._split(state)
        q = normalize(q)
        height = p * p.new_tensor([0.0, 0.0, 1.0])
        identity = q.new_tensor([1.0, 0.0, 0.0, 0.0]).expand(q.shape)
        body = self._join(height, identity, rotate_inverse(q, v), w, rest)
        return torch.cat([body, controls], dim=-1), self.gravity(q)

    def to_body(self, state: torch.Tensor, next_state: torch.Tensor) -> torch.Tensor:
        """The change from ``state`` to ``next_state`` (world, ``[..., state_dim]``) in
        the base frame of ``state``; angle components are not wrapped here."""
        p0, q0, v0, w0, r0 = self._split(state)
        p1, q1, v1, w1, r1 = self._split(next_state)
        q0 = normalize(q0)
        turn = normalize(quat_mul(conjugate(q0), normalize(q1)))
        zero = torch.zeros_like(q0[..., :1])
        return self._join(
            rotate_inverse(q0, p1 - p0),
            torch.cat([zero, quat_log(turn)], dim=-1),
            rotate_inverse(q0, v1 - v0),
            rotate(turn, w1) - w0,
            r1 - r0,
        )

    def to_world(self, state: torch.Tensor, change: torch.Tensor) -> torch.Tensor:
        """The next state (world) after ``state`` changes by ``change`` (:meth:`to_body`'s
        form); its quaternion is a unit one."""
        p0, q0, v0, w0, r0 = self._split(state)
        dp, dq, dv, dw, dr = self._split(change)
        q0 = normalize(q0)
        turn = quat_exp(dq[..., 1:])
        return self._join(
            p0 + rotate(q0, dp),
            normalize(quat_mul(q0, turn)),
            v0 + rotate(q0, dv),
            rotate_inverse(turn, w0 + dw),
            r0 + dr,
        )


def frame_of(base: RobotBase, state_names: tuple[str, ...]) -> BaseFrame | PlanarFrame:
    """The frame conversions of ``base`` (either kind) in a state named ``state_names``."""
    where = base.indices(state_names)
    if isinstance(where, PlanarBaseIndices):
        return PlanarFrame(where, len(state_names))
    return BaseFrame(where, len(state_names))
