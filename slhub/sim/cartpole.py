"""The cart-pole simulated in numpy: data without a simulator library or a download.

NeRD, the world model of ``slhub-rwm`` and the expert of ``slhub-bc`` all learn
the same system, so its dynamics live here once (plugins import it as
``from slhub.sim import cartpole``; it needs neither mujoco nor gymnasium).
Classic cart-pole (Barto, Sutton & Anderson 1983, as in Gym's ``CartPole``):
cart mass 1, pole mass 0.1, pole half-length 0.5, g = 9.8, dt = 0.02,
integrated with **semi-implicit Euler** (velocities first, then positions with
the new velocities). The pole angle is wrapped to [-pi, pi) and theta = 0 is
upright. Initial states and per-step forces are random and continuous.

A split is made deterministically from its arguments and cached on disk with
:func:`slhub.data.cache.cached_arrays` (atomic files, memory-mapped reads).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slhub.data.angles import wrap_angle
from slhub.data.cache import cached_arrays

STATE_NAMES: tuple[str, ...] = ("x", "theta", "x_dot", "theta_dot")
ACTION_NAMES: tuple[str, ...] = ("force",)
#: Index of the pole angle, the one wrapped state feature, in a state.
THETA = STATE_NAMES.index("theta")

CART_MASS = 1.0
POLE_MASS = 0.1
HALF_LENGTH = 0.5
GRAVITY = 9.8
DT = 0.02
#: Recorded in every cached split's ``meta.json``; bump when the data would change.
FORMAT = "slhub.cartpole/1"


def cartpole_step(state: np.ndarray, force: np.ndarray | float) -> np.ndarray:
    """Advance states ``[..., 4]`` by one step under forces ``[...]`` (semi-implicit Euler)."""
    x, theta, x_dot, theta_dot = np.moveaxis(state, -1, 0)
    total_mass = CART_MASS + POLE_MASS
    pole_mass_length = POLE_MASS * HALF_LENGTH
    sin, cos = np.sin(theta), np.cos(theta)
    temp = (force + pole_mass_length * theta_dot**2 * sin) / total_mass
    theta_acc = (GRAVITY * sin - cos * temp) / (
        HALF_LENGTH * (4.0 / 3.0 - POLE_MASS * cos**2 / total_mass)
    )
    x_acc = temp - pole_mass_length * theta_acc * cos / total_mass
    x_dot = x_dot + DT * x_acc
    theta_dot = theta_dot + DT * theta_acc
    x = x + DT * x_dot
    theta = wrap_angle(theta + DT * theta_dot)
    return np.stack([x, theta, x_dot, theta_dot], axis=-1)


def generate_trajectories(
    num_trajectories: int, length: int, seed: int, max_force: float = 10.0
) -> tuple[np.ndarray, np.ndarray]:
    """Simulate random trajectories.

    :returns: ``states`` of shape ``[N, length + 1, 4]`` and ``actions`` of shape
        ``[N, length, 1]`` (float64); ``states[:, t + 1]`` follows from
        ``states[:, t]`` under ``actions[:, t]``.
    """
    rng = np.random.default_rng(seed)
    low = np.array([-1.0, -np.pi, -1.0, -2.0])
    high = np.array([1.0, np.pi, 1.0, 2.0])
    states = np.empty((num_trajectories, length + 1, 4), dtype=np.float64)
    states[:, 0] = rng.uniform(low, high, size=(num_trajectories, 4))
    states[:, 0, 1] = wrap_angle(states[:, 0, 1])
    actions = rng.uniform(-max_force, max_force, size=(num_trajectories, length, 1))
    for t in range(length):
        states[:, t + 1] = cartpole_step(states[:, t], actions[:, t, 0])
    return states, actions


def state_deltas(states: np.ndarray) -> np.ndarray:
    """Per-step state changes ``s[t+1] - s[t]`` along axis -2, the angle change wrapped."""
    delta = np.diff(states, axis=-2)
    delta[..., THETA] = wrap_angle(delta[..., THETA])
    return delta


@dataclass(frozen=True)
class CartpoleData:
    """A memory-mapped split: ``states [N, T+1, 4]`` and ``actions [N, T, 1]``."""

    states: np.ndarray
    actions: np.ndarray

    @property
    def num_trajectories(self) -> int:
        return int(self.states.shape[0])

    @property
    def length(self) -> int:
        return int(self.actions.shape[1])


def ensure_dataset(
    cache_dir: str | Path,
    split: str,
    num_trajectories: int,
    length: int,
    seed: int,
    max_force: float = 10.0,
) -> CartpoleData:
    """Create a split under ``cache_dir/split`` on first use, then open it memory-mapped.

    A cache whose recorded parameters differ from the requested ones is made
    again, so a recipe change never trains on stale data.
    """
    meta = {
        "format": FORMAT,
        "num_trajectories": num_trajectories,
        "length": length,
        "seed": seed,
        "max_force": max_force,
        "integrator": "semi-implicit euler",
        "dt": DT,
    }

    def make() -> dict[str, np.ndarray]:
        states, actions = generate_trajectories(num_trajectories, length, seed, max_force)
        return {"states": states, "actions": actions}

    arrays = cached_arrays(Path(cache_dir) / split, meta, ("states", "actions"), make)
    return CartpoleData(states=arrays["states"], actions=arrays["actions"])


def cartpole_store(
    cache_dir: str | Path,
    splits: Mapping[str, tuple[int, int, int]],
    max_force: float = 10.0,
) -> Path:
    """Generated cart-pole episodes as a dataset in slhub's store, made once under
    ``cache_dir`` (keyed by every parameter) and reused: how NeRD, RWM and BC train on
    the cart-pole through the same data layer as on recorded robots.

    :param splits: split name -> ``(episodes, length, seed)``, in episode order; the
        store names each split (``data.split.train: train`` selects one).
    :returns: the store's directory. Each episode has ``length + 1`` steps of ``state``
        (:data:`STATE_NAMES`) and ``action`` (``force``); the last step's action is 0,
        since no step follows it.
    """
    from slhub.data.episodes import ArrayEpisodes
    from slhub.data.store import write_store
    from slhub.errors import DatasetError

    params = {
        "format": FORMAT,
        "max_force": max_force,
        "splits": {k: list(v) for k, v in splits.items()},
    }
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    destination = Path(cache_dir) / f"cartpole-{key}"
    if destination.is_dir():
        return destination
    episodes: list[dict[str, np.ndarray]] = []
    named: dict[str, tuple[int, ...]] = {}
    for name, (count, length, seed) in splits.items():
        states, actions = generate_trajectories(count, length, seed, max_force)
        last = np.zeros_like(actions[:, :1])
        named[name] = tuple(range(len(episodes), len(episodes) + count))
        for state, action in zip(states, np.concatenate([actions, last], axis=1)):
            episodes.append({"state": state, "action": action})
    source = ArrayEpisodes(
        episodes, fps=1.0 / DT, names={"state": STATE_NAMES, "action": ACTION_NAMES}, splits=named
    )
    try:
        write_store(source, destination)
    except DatasetError:
        if not destination.is_dir():  # otherwise another rank or run finished it first
            raise
    return destination
