"""Which state components form a robot's floating base: a MuJoCo free joint's seven
``qpos`` and six ``qvel`` components, or a planar base's three joints.

MuJoCo lays a free joint out as position (x, y, z, world frame), unit quaternion
(w, x, y, z, body to world), linear velocity (world frame) and angular velocity (body
frame). A planar robot (Hopper, Walker2d, HalfCheetah) has no free joint: its root
body moves on a slide along x, a slide along z and a hinge about +y (the pitch), and
their ``qvel`` components are the velocities along x and z and the pitch rate.

NeRD expresses a step in that base's frame and judges a rollout by the base's
position and orientation, so the model has to know which of its state components
these are. :func:`free_joint_base` and :func:`planar_base` name them from the
joints' names as ``slhub data collect`` names its features (:mod:`slhub.sim.names`);
``indices`` finds them in a layout's state names. Both kinds satisfy
:class:`RobotBase` and are stored with their ``kind`` (:func:`base_from_dict`; a
stored base without one is a free joint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

#: ``kind`` of a free joint's base (also what a stored base without a kind is).
FREE = "free"
#: ``kind`` of a planar base: slide x, slide z, hinge about +y.
PLANAR = "planar"
#: The four groups of a base's components, in the order a stored base and its
#: indices hold them.
FIELDS = ("position", "orientation", "linear_velocity", "angular_velocity")


@runtime_checkable
class RobotBase(Protocol):
    """What NeRD needs of a floating base of either kind."""

    kind: str

    @property
    def names(self) -> tuple[str, ...]:
        """Every state component of the base."""

    @property
    def angles(self) -> tuple[str, ...]:
        """The components that may be wrapped as angles (``model.angles``)."""

    @property
    def unsupervised(self) -> tuple[str, ...]:
        """Body-frame target slots that hold no change (left out of the loss)."""

    def indices(self, state_names: Sequence[str]) -> Any:
        """Where each component sits in ``state_names`` (ValueError naming a missing one)."""

    def to_dict(self) -> dict[str, Any]: ...


def _indices(names: Sequence[str], state_names: Sequence[str]) -> dict[str, int]:
    where = {name: i for i, name in enumerate(state_names)}
    missing = [name for name in names if name not in where]
    if missing:
        raise ValueError(f"the base's components {missing} are not among the state components")
    return where


class _FourGroups:
    """What both kinds of base do with their four groups of component names
    (:data:`FIELDS`): check each group's size, list, index, store and read them."""

    kind: ClassVar[str]
    #: Each group's number of components, in :data:`FIELDS` order.
    sizes: ClassVar[tuple[int, int, int, int]]
    #: The indices dataclass of this kind (its fields are :data:`FIELDS`).
    index_type: ClassVar[type]

    def __post_init__(self) -> None:
        """Each group holds its kind's number of names (stored as a tuple)."""
        for name, size in zip(FIELDS, self.sizes, strict=True):
            value = tuple(getattr(self, name))
            if len(value) != size:
                raise ValueError(
                    f"{self.kind} base {name} names {size} components, got {list(value)}"
                )
            object.__setattr__(self, name, value)

    @property
    def names(self) -> tuple[str, ...]:
        """Every component: position, orientation, linear and angular velocity."""
        return tuple(name for field in FIELDS for name in getattr(self, field))

    def indices(self, state_names: Sequence[str]) -> Any:
        """Where each component sits in ``state_names``.

        :raises ValueError: a component is missing, naming it.
        """
        where = _indices(self.names, state_names)
        return self.index_type(*(tuple(where[n] for n in getattr(self, f)) for f in FIELDS))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **{field: list(getattr(self, field)) for field in FIELDS}}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Any:
        return cls(*(tuple(value[field]) for field in FIELDS))  # type: ignore[call-arg]


@dataclass(frozen=True)
class FloatingBaseIndices:
    """A :class:`FloatingBase` as indices into a state vector."""

    position: tuple[int, int, int]
    orientation: tuple[int, int, int, int]
    linear_velocity: tuple[int, int, int]
    angular_velocity: tuple[int, int, int]


@dataclass(frozen=True)
class FloatingBase(_FourGroups):
    """The state component names of a free joint, each in MuJoCo's frame."""

    position: tuple[str, str, str]
    orientation: tuple[str, str, str, str]
    linear_velocity: tuple[str, str, str]
    angular_velocity: tuple[str, str, str]
    kind: ClassVar[str] = FREE
    sizes: ClassVar[tuple[int, int, int, int]] = (3, 4, 3, 3)
    index_type: ClassVar[type] = FloatingBaseIndices

    @property
    def angles(self) -> tuple[str, ...]:
        """None: the orientation is a quaternion."""
        return ()

    @property
    def unsupervised(self) -> tuple[str, ...]:
        """The quaternion's ``qw`` slot: the body-frame change is a rotation vector."""
        return self.orientation[:1]


def free_joint_base(joint: str, qpos: str = "qpos", qvel: str = "qvel") -> FloatingBase:
    """The base of free joint ``joint`` as ``slhub data collect`` names the components
    of its ``qpos`` and ``qvel`` features (``qpos.root_x`` ... ``qvel.root_wz``)."""
    return FloatingBase(
        tuple(f"{qpos}.{joint}_{c}" for c in ("x", "y", "z")),  # type: ignore[arg-type]
        tuple(f"{qpos}.{joint}_{c}" for c in ("qw", "qx", "qy", "qz")),  # type: ignore[arg-type]
        tuple(f"{qvel}.{joint}_{c}" for c in ("vx", "vy", "vz")),  # type: ignore[arg-type]
        tuple(f"{qvel}.{joint}_{c}" for c in ("wx", "wy", "wz")),  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class PlanarBaseIndices:
    """A :class:`PlanarBase` as indices into a state vector."""

    position: tuple[int, int]
    orientation: tuple[int]
    linear_velocity: tuple[int, int]
    angular_velocity: tuple[int]


@dataclass(frozen=True)
class PlanarBase(_FourGroups):
    """The state component names of a planar base: the slides along x and z and the
    hinge about +y (pitch), each a ``qpos`` and a ``qvel`` component.

    Fields mirror :class:`FloatingBase`'s: ``position`` (x, z), ``orientation``
    (pitch), ``linear_velocity`` (vx, vz, world frame) and ``angular_velocity``
    (the pitch rate).
    """

    position: tuple[str, str]
    orientation: tuple[str]
    linear_velocity: tuple[str, str]
    angular_velocity: tuple[str]
    kind: ClassVar[str] = PLANAR
    sizes: ClassVar[tuple[int, int, int, int]] = (2, 1, 2, 1)
    index_type: ClassVar[type] = PlanarBaseIndices

    @property
    def angles(self) -> tuple[str, ...]:
        """The pitch: it turns freely once the robot falls."""
        return self.orientation

    @property
    def unsupervised(self) -> tuple[str, ...]:
        return ()


def planar_base(joints: Sequence[str], qpos: str = "qpos", qvel: str = "qvel") -> PlanarBase:
    """The base of planar ``joints`` (slide x, slide z, hinge y, in that order) as
    ``slhub data collect`` names the components of its ``qpos`` and ``qvel`` features
    (a slide's or hinge's component is its joint's name: ``qpos.rootx``)."""
    x, z, pitch = joints
    return PlanarBase(
        (f"{qpos}.{x}", f"{qpos}.{z}"),
        (f"{qpos}.{pitch}",),
        (f"{qvel}.{x}", f"{qvel}.{z}"),
        (f"{qvel}.{pitch}",),
    )


def base_from_dict(value: Mapping[str, Any]) -> FloatingBase | PlanarBase:
    """A stored base (``to_dict``'s form) of its ``kind``; without one, a free joint.

    :raises ValueError: an unknown kind.
    """
    kind = value.get("kind", FREE)
    if kind == FREE:
        return FloatingBase.from_dict(value)
    if kind == PLANAR:
        return PlanarBase.from_dict(value)
    raise ValueError(f"unknown floating base kind {kind!r} (known: {FREE}, {PLANAR})")
