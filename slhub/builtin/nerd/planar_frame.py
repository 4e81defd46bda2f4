"""A planar robot's state in the base frame of one step, and back to world.

The planar counterpart of :class:`slhub.builtin.nerd.frame.BaseFrame`, for a root
body on a slide along x, a slide along z and a hinge about +y (Hopper, Walker2d,
HalfCheetah). MuJoCo turns the body by ``R_y(θ)`` for a hinge angle ``θ`` about
+y, so a vector ``(x, z)`` of the body frame is ``(c x + s z, -s x + c z)`` in the
world (``c, s = cos θ, sin θ``); :func:`to_world_xz` and :func:`to_base_xz` are that
rotation and its inverse in the xz plane.

- :meth:`PlanarFrame.inputs`: a token in its own step's base frame: the ``x`` slot
  holds 0 (the same motion anywhere along x), the ``z`` slot the height, the pitch
  slot 0, the velocity ``(vx, vz)`` rotated into the base frame, the pitch rate as
  is; gravity's direction in the base frame is two inputs, its x and z (its y is
  always 0 in the plane).
- :meth:`PlanarFrame.to_body`: the change to the next step: position and velocity
  changes rotated into the first step's base frame, the pitch change wrapped to
  [-pi, pi), the pitch rate's change as is.
- :meth:`PlanarFrame.to_world`: its inverse.

Components other than the base's change as in the world frame. Plain torch
arithmetic, no in-place writes: the ONNX graph holds the same math.
"""

from __future__ import annotations

import torch

from slhub.builtin.nerd.base import PlanarBaseIndices
from slhub.builtin.nerd.columns import BaseColumns
from slhub.data import wrap_angle


def to_world_xz(pitch: torch.Tensor, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Base-frame ``(x, z)`` in world coordinates, for a base pitched by ``pitch``
    (radians about +y, MuJoCo's hinge angle)."""
    c, s = torch.cos(pitch), torch.sin(pitch)
    return c * x + s * z, c * z - s * x


def to_base_xz(pitch: torch.Tensor, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """World ``(x, z)`` in the frame of a base pitched by ``pitch``."""
    c, s = torch.cos(pitch), torch.sin(pitch)
    return c * x - s * z, s * x + c * z


class PlanarFrame(BaseColumns):
    """The planar base's columns of a state vector and the conversions between frames."""

    #: Gravity's direction in the base frame: its x and z components.
    gravity_dim = 2

    def __init__(self, base: PlanarBaseIndices, state_dim: int) -> None:
        columns = base.position + base.orientation + base.linear_velocity + base.angular_velocity
        super().__init__(columns, state_dim)

    def _split(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x, z, pitch, vx, vz, pitch rate (each ``[...]``) and the rest ``[..., R]``."""
        base, rest = self._columns(state)
        return (*base.unbind(-1), rest)

    def _join(self, *parts: torch.Tensor) -> torch.Tensor:
        """Six base components (each ``[...]``) and the rest, in the state's order."""
        *base, rest = parts
        return super()._join(torch.stack(base, dim=-1), rest)

    def pose(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The base's position ``[..., 3]`` (x, 0, z) and unit quaternion ``[..., 4]`` (the
        pitch about +y) of each token's state, in world coordinates: what contact slots
        are turned into the base frame by, as for a free joint's
        :meth:`~slhub.builtin.nerd.frame.BaseFrame.pose`."""
        x, z, pitch, *_ = self._split(tokens[..., : self.state_dim])
        zero = torch.zeros_like(x)
        half = 0.5 * pitch
        position = torch.stack([x, zero, z], dim=-1)
        return position, torch.stack([torch.cos(half), zero, torch.sin(half), zero], dim=-1)

    def gravity(self, pitch: torch.Tensor) -> torch.Tensor:
        """Gravity's direction (x, z) in the base frame of ``pitch`` ``[...]`` -> ``[..., 2]``."""
        return torch.stack(to_base_xz(pitch, torch.zeros_like(pitch), -torch.ones_like(pitch)), -1)

    def inputs(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens ``[..., features]`` (world) with each state in its own base frame, and
        gravity's direction in that frame ``[..., 2]``."""
        state, controls = tokens[..., : self.state_dim], tokens[..., self.state_dim :]
        x, z, pitch, vx, vz, rate, rest = self._split(state)
        zero = torch.zeros_like(x)
        body = self._join(zero, z, zero, *to_base_xz(pitch, vx, vz), rate, rest)
        return torch.cat([body, controls], dim=-1), self.gravity(pitch)

    def to_body(self, state: torch.Tensor, next_state: torch.Tensor) -> torch.Tensor:
        """The change from ``state`` to ``next_state`` (world, ``[..., state_dim]``) in
        the base frame of ``state``; the pitch change is wrapped, other angles not."""
        x0, z0, p0, vx0, vz0, w0, r0 = self._split(state)
        x1, z1, p1, vx1, vz1, w1, r1 = self._split(next_state)
        return self._join(
            *to_base_xz(p0, x1 - x0, z1 - z0),
            wrap_angle(p1 - p0),
            *to_base_xz(p0, vx1 - vx0, vz1 - vz0),
            w1 - w0,
            r1 - r0,
        )

    def to_world(self, state: torch.Tensor, change: torch.Tensor) -> torch.Tensor:
        """The next state (world) after ``state`` changes by ``change`` (:meth:`to_body`'s
        form); the pitch is not wrapped here (``model.angles`` wraps it)."""
        x0, z0, p0, vx0, vz0, w0, r0 = self._split(state)
        dx, dz, dp, dvx, dvz, dw, dr = self._split(change)
        wx, wz = to_world_xz(p0, dx, dz)
        vx, vz = to_world_xz(p0, dvx, dvz)
        return self._join(x0 + wx, z0 + wz, p0 + dp, vx0 + vx, vz0 + vz, w0 + dw, r0 + dr)
