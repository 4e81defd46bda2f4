"""Which state components form a robot's floating base: a MuJoCo free joint's seven
``qpos`` and six ``qvel`` components.

MuJoCo lays a free joint out as position (x, y, z, world frame), unit quaternion
(w, x, y, z, body to world), linear velocity (world frame) and angular velocity (body
frame). NeRD expresses a step in that base's frame and judges a rollout by the base's
position and orientation, so the model has to know which of its state components
these are. :func:`free_joint_base` names them from the joint's name as
``slhub data collect`` names its features (:mod:`slhub.sim.names`); :meth:`indices`
finds them in a layout's state names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FloatingBase:
    """The state component names of a free joint, each in MuJoCo's frame."""

    position: tuple[str, str, str]
    orientation: tuple[str, str, str, str]
    linear_velocity: tuple[str, str, str]
    angular_velocity: tuple[str, str, str]

    def __post_init__(self) -> None:
        for name, size in (
            ("position", 3),
            ("orientation", 4),
            ("linear_velocity", 3),
            ("angular_velocity", 3),
        ):
            value = tuple(getattr(self, name))
            if len(value) != size:
                raise ValueError(f"base {name} names {size} components, got {list(value)}")
            object.__setattr__(self, name, value)

    @property
    def names(self) -> tuple[str, ...]:
        """All thirteen names: position, orientation, linear and angular velocity."""
        return self.position + self.orientation + self.linear_velocity + self.angular_velocity

    def indices(self, state_names: Sequence[str]) -> FloatingBaseIndices:
        """Where each component sits in ``state_names``.

        :raises ValueError: a component is missing, naming it.
        """
        where = {name: i for i, name in enumerate(state_names)}
        missing = [name for name in self.names if name not in where]
        if missing:
            raise ValueError(f"the base's components {missing} are not among the state components")
        return FloatingBaseIndices(
            tuple(where[n] for n in self.position),  # type: ignore[arg-type]
            tuple(where[n] for n in self.orientation),  # type: ignore[arg-type]
            tuple(where[n] for n in self.linear_velocity),  # type: ignore[arg-type]
            tuple(where[n] for n in self.angular_velocity),  # type: ignore[arg-type]
        )

    def to_dict(self) -> dict[str, list[str]]:
        return {
            "position": list(self.position),
            "orientation": list(self.orientation),
            "linear_velocity": list(self.linear_velocity),
            "angular_velocity": list(self.angular_velocity),
        }

    @classmethod
    def from_dict(cls, value: dict[str, Sequence[str]]) -> FloatingBase:
        return cls(
            tuple(value["position"]),  # type: ignore[arg-type]
            tuple(value["orientation"]),  # type: ignore[arg-type]
            tuple(value["linear_velocity"]),  # type: ignore[arg-type]
            tuple(value["angular_velocity"]),  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class FloatingBaseIndices:
    """A :class:`FloatingBase` as indices into a state vector."""

    position: tuple[int, int, int]
    orientation: tuple[int, int, int, int]
    linear_velocity: tuple[int, int, int]
    angular_velocity: tuple[int, int, int]


def free_joint_base(joint: str, qpos: str = "qpos", qvel: str = "qvel") -> FloatingBase:
    """The base of free joint ``joint`` as ``slhub data collect`` names the components
    of its ``qpos`` and ``qvel`` features (``qpos.root_x`` ... ``qvel.root_wz``)."""
    return FloatingBase(
        tuple(f"{qpos}.{joint}_{c}" for c in ("x", "y", "z")),  # type: ignore[arg-type]
        tuple(f"{qpos}.{joint}_{c}" for c in ("qw", "qx", "qy", "qz")),  # type: ignore[arg-type]
        tuple(f"{qvel}.{joint}_{c}" for c in ("vx", "vy", "vz")),  # type: ignore[arg-type]
        tuple(f"{qvel}.{joint}_{c}" for c in ("wx", "wy", "wz")),  # type: ignore[arg-type]
    )
