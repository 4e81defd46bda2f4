"""What ``slhub data collect`` and evaluation rollouts need of a simulator, and how one is found.

A simulator is named ``PREFIX:ENV`` (``gymnasium:Hopper-v5``). The prefix picks a
factory: ``gymnasium`` is built in; a package adds another by registering
``factory(env: str, *, max_steps: int | None) -> Simulator`` under its prefix in
the entry-point group :data:`SIMULATOR_GROUP` (``slhub.simulators``). The built-in
prefix cannot be replaced by a package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import entry_points
from typing import Protocol, runtime_checkable

import numpy as np

from slhub.errors import SimulatorError, one_line

#: Entry-point group mapping a prefix to a simulator factory.
SIMULATOR_GROUP = "slhub.simulators"
_BUILTIN = {"gymnasium": "slhub.sim.gymnasium_mujoco:GymnasiumMujoco"}


@dataclass(frozen=True)
class Step:
    """What one control step returns: gymnasium's five-tuple, of ``info`` only the
    success flag."""

    observation: np.ndarray
    reward: float
    terminated: bool
    truncated: bool
    #: ``info["is_success"]`` where the env reports it (robomimic's convention), else None.
    success: bool | None = None


@runtime_checkable
class Simulator(Protocol):
    """A MuJoCo simulation stepped at a fixed control period :attr:`dt`.

    :meth:`state` and :meth:`restore` are exact: restoring a state taken before a
    step and applying the same action gives bit-identical ``qpos`` and ``qvel``.
    """

    #: The ``PREFIX:ENV`` this simulator was opened from.
    name: str
    #: Seconds of simulated time per :meth:`step` (the dataset's fps is ``1 / dt``).
    dt: float
    joint_names: tuple[str, ...]
    qpos_names: tuple[str, ...]
    qvel_names: tuple[str, ...]
    action_names: tuple[str, ...]
    #: The bodies :meth:`contact` reports on, or None when no two geoms can collide.
    contact_names: tuple[str, ...] | None
    #: ``(nu, 2)`` low/high of each control; rows of unlimited actuators are ``-inf, inf``.
    ctrl_range: np.ndarray
    #: Library versions that decide the dynamics (recorded with a dataset).
    versions: dict[str, str]

    def reset(self, seed: int) -> np.ndarray:
        """Start an episode from the env's seeded initial-state distribution; the
        observation."""

    def step(self, action: np.ndarray) -> Step:
        """Apply ``action`` (float64, ``nu``) for one control period."""

    def state(self) -> np.ndarray:
        """The full integration state (float64): what :meth:`restore` takes."""

    def restore(self, state: np.ndarray) -> None:
        """Put the simulation in ``state``, exactly."""

    @property
    def qpos(self) -> np.ndarray: ...

    @property
    def qvel(self) -> np.ndarray: ...

    def contact(self) -> np.ndarray | None:
        """Per body of :attr:`contact_names`, the normal contact force now (or None).

        ``slhub data collect --contacts geometry`` also needs the optional members
        ``contact_slots`` (slot names, or None) and ``contact_geometry()`` (the slots
        now, :mod:`slhub.sim.contacts`), which :class:`GymnasiumMujoco` has."""

    def render(self, camera: str = "follow", size: int = 64) -> np.ndarray:
        """A ``size x size x 3`` uint8 frame of the current state, rendered offscreen."""

    def close(self) -> None:
        """Release the env and any rendering context."""


def simulators() -> dict[str, Callable[..., Simulator] | str]:
    """Prefix -> factory (a ``module:object`` string for what is not loaded yet)."""
    found: dict[str, Callable[..., Simulator] | str] = dict(_BUILTIN)
    for ep in entry_points(group=SIMULATOR_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def open_simulator(spec: str, *, max_steps: int | None = None) -> Simulator:
    """Open ``PREFIX:ENV``; ``max_steps`` makes the env truncate its episodes there.

    :raises SimulatorError: no prefix, an unknown prefix, a factory that does not
        load, or whatever the factory refuses (an unknown env, a missing library).
    """
    prefix, sep, env = spec.partition(":")
    known = simulators()
    if not sep or not prefix or not env:
        raise SimulatorError(
            f"--env {spec!r}: name a simulator and env as PREFIX:ENV, e.g. gymnasium:Hopper-v5 "
            f"(prefixes: {', '.join(sorted(known))})"
        )
    if prefix not in known:
        raise SimulatorError(
            f"--env {spec!r}: unknown simulator {prefix!r} (prefixes: {', '.join(sorted(known))}; "
            f"a package adds one in the entry-point group {SIMULATOR_GROUP})"
        )
    factory = known[prefix]
    if isinstance(factory, str):
        try:
            module, _, attribute = factory.partition(":")
            factory = getattr(import_module(module), attribute)
        except Exception as exc:  # noqa: BLE001 - reported as one line
            raise SimulatorError(
                f"simulator {prefix!r} ({factory}) fails to import: {one_line(exc)}"
            ) from None
    return factory(env, max_steps=max_steps)
