"""Policies tests/test_collect.py names as ``--policy collect_policies:NAME``, and a
simulator factory it registers as a package would."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

#: Not callable: ``--policy collect_policies:NOT_CALLABLE`` is refused.
NOT_CALLABLE = 3

#: ``slow`` touches this file (when set) once it has been called, so a test knows the
#: collect is under way before it signals the process.
MARKER_ENV = "SLHUB_TEST_COLLECT_MARKER"


def linear(observation: np.ndarray, simulator) -> np.ndarray:
    """A fixed linear map of the observation, clipped: deterministic, not constant."""
    nu = len(simulator.action_names)
    weights = np.linspace(-1.0, 1.0, nu * observation.size).reshape(nu, observation.size)
    return np.clip(weights @ observation, -1.0, 1.0)


def slow(observation: np.ndarray, simulator) -> np.ndarray:
    marker = os.environ.get(MARKER_ENV)
    if marker:
        Path(marker).touch()
    time.sleep(0.02)
    return np.zeros(len(simulator.action_names))


def wrong_shape(observation: np.ndarray, simulator) -> list[float]:
    return [0.0] * (len(simulator.action_names) + 2)


def toy_simulator(env: str, *, max_steps: int | None = None):
    """A simulator factory as a package registers one in ``slhub.simulators``."""
    from slhub.sim import GymnasiumMujoco

    return GymnasiumMujoco(env, max_steps=max_steps)


def boom(observation: np.ndarray, simulator) -> np.ndarray:
    """A policy with a bug: raises from its fourth call in this process on (step 3 of
    episode 0 of a collect in a fresh process)."""
    boom.calls = getattr(boom, "calls", 0) + 1
    if boom.calls > 3:
        raise ValueError("policy bug at step 3")
    return np.zeros(len(simulator.action_names))
