"""Where a collected episode's actions come from: ``uniform``, ``smooth``, ``zero`` or a
``policy``.

Every source draws only from the episode's own ``numpy.random.Generator``, so an
episode is a pure function of the seed it was given.

- ``uniform``: each step, each control independently uniform in its ``ctrlrange``.
- ``smooth``: piecewise-linear between knots drawn uniformly in the ``ctrlrange``
  every :data:`KNOT_EVERY` steps (exploration with a time structure a model can
  learn; linear interpolation never leaves the range).
- ``zero``: every control 0, every step: passive motion (the robot moves under
  gravity, contacts and its initial velocity alone), what NeRD's passive motion
  evaluation rolls out; it needs no ``ctrlrange``.
- ``policy``: ``module:function`` called as ``function(observation, simulator)``,
  returning the action. With ``noise`` > 0 a Gaussian of that standard deviation is
  added (DART: the data visits states near the policy's, and the clean action is
  the label); the noisy action is clipped to the range of limited actuators.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from slhub.errors import SimulatorError, one_line
from slhub.sim.simulator import Simulator

#: The action sources ``slhub data collect --actions`` takes.
SOURCES = ("uniform", "smooth", "zero", "policy")
#: Steps between two knots of the ``smooth`` source.
KNOT_EVERY = 10

PolicyFunction = Callable[[np.ndarray, Simulator], Any]


class ActionSource(Protocol):
    def begin(self, rng: np.random.Generator, steps: int) -> None:
        """Start an episode of at most ``steps`` steps drawing from ``rng``."""

    def __call__(
        self, observation: np.ndarray, simulator: Simulator
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The action to apply and, for a noisy policy, the clean one (else None)."""


class Uniform:
    def __init__(self, low: np.ndarray, high: np.ndarray) -> None:
        self.low, self.high = low, high
        self.rng = np.random.default_rng(0)

    def begin(self, rng: np.random.Generator, steps: int) -> None:
        self.rng = rng

    def __call__(self, observation: np.ndarray, simulator: Simulator):
        return self.rng.uniform(self.low, self.high), None


class Smooth:
    def __init__(self, low: np.ndarray, high: np.ndarray) -> None:
        self.low, self.high = low, high
        self.knots = np.zeros((2, len(low)))
        self.step = 0

    def begin(self, rng: np.random.Generator, steps: int) -> None:
        count = steps // KNOT_EVERY + 2
        self.knots = rng.uniform(self.low, self.high, size=(count, len(self.low)))
        self.step = 0

    def __call__(self, observation: np.ndarray, simulator: Simulator):
        knot, into = divmod(self.step, KNOT_EVERY)
        self.step += 1
        start, end = self.knots[knot], self.knots[knot + 1]
        return np.clip(start + (end - start) * (into / KNOT_EVERY), self.low, self.high), None


class Zero:
    def __init__(self, size: int) -> None:
        self.size = size

    def begin(self, rng: np.random.Generator, steps: int) -> None:
        pass

    def __call__(self, observation: np.ndarray, simulator: Simulator):
        return np.zeros(self.size), None


class Policy:
    def __init__(
        self, function: PolicyFunction, spec: str, noise: float, ctrl_range: np.ndarray
    ) -> None:
        self.function, self.spec, self.noise = function, spec, float(noise)
        self.low, self.high = ctrl_range[:, 0], ctrl_range[:, 1]
        self.rng = np.random.default_rng(0)

    def begin(self, rng: np.random.Generator, steps: int) -> None:
        self.rng = rng

    def __call__(self, observation: np.ndarray, simulator: Simulator):
        raw = self.function(observation, simulator)
        try:
            clean = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError):
            clean = None
        if clean is None or clean.shape != self.low.shape:
            shape = list(getattr(clean, "shape", [])) if clean is not None else type(raw).__name__
            raise SimulatorError(
                f"--policy {self.spec}: returned {shape}; {simulator.name} takes "
                f"{len(self.low)} controls ({', '.join(simulator.action_names)})"
            )
        if not np.isfinite(clean).all():
            raise SimulatorError(f"--policy {self.spec}: returned a non-finite action {clean}")
        if self.noise > 0:
            noisy = clean + self.rng.normal(0.0, self.noise, size=clean.shape)
            return np.clip(noisy, self.low, self.high), clean
        return np.clip(clean, self.low, self.high), None


def load_policy(spec: str) -> PolicyFunction:
    """The callable ``module:function`` names (``module:Class.attribute`` works too),
    importable from the current folder as under ``python -m``.

    :raises SimulatorError: a malformed spec, a module that fails to import, a missing
        or non-callable attribute.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise SimulatorError(f"--policy {spec!r}: name a callable as module:function")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does, for the console script too
    try:
        obj: Any = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any import-time failure
        raise SimulatorError(
            f"--policy {spec}: module {module_name} failed to import: {one_line(exc)}"
        ) from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise SimulatorError(f"--policy {spec}: {module_name} has no {attribute!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SimulatorError(
            f"--policy {spec}: {attribute} is a {type(obj).__name__}, not callable"
        )
    return obj


def make_source(
    kind: str, simulator: Simulator, *, policy: str | None = None, noise: float = 0.0
) -> ActionSource:
    """The source ``kind`` for ``simulator``, its arguments checked (one line each)."""
    if kind not in SOURCES:
        raise SimulatorError(f"--actions {kind!r}: choose one of {', '.join(SOURCES)}")
    if not np.isfinite(noise) or noise < 0:
        raise SimulatorError(f"--noise {noise}: a standard deviation >= 0")
    if kind != "policy":
        if policy is not None or noise:
            raise SimulatorError(f"--policy and --noise go with --actions policy, not {kind}")
        if kind == "zero":
            return Zero(len(simulator.action_names))
        unlimited = ~np.isfinite(simulator.ctrl_range).all(axis=1)
        if unlimited.any():
            which = ", ".join(np.asarray(simulator.action_names)[unlimited])
            raise SimulatorError(
                f"--actions {kind}: {simulator.name}'s actuators {which} have no ctrlrange to "
                "draw from; use --actions policy"
            )
        low, high = simulator.ctrl_range[:, 0], simulator.ctrl_range[:, 1]
        return Uniform(low, high) if kind == "uniform" else Smooth(low, high)
    if policy is None:
        raise SimulatorError("--actions policy needs --policy module:function")
    return Policy(load_policy(policy), policy, noise, simulator.ctrl_range)
