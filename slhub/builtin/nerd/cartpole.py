"""Cart-pole trajectories made in numpy: no simulator, no download.

Public data helpers (used by the NeRD plugin and by external packages such as
``slhub-rwm``). Classic cart-pole dynamics (Barto, Sutton & Anderson 1983, as in
Gym's ``CartPole``): cart mass 1, pole mass 0.1, pole half-length 0.5,
g = 9.8, dt = 0.02, integrated with **semi-implicit Euler** (velocities first,
then positions with the new velocities). The pole angle is wrapped to
[-pi, pi). Initial states and per-step forces are random and continuous.

Datasets are stored as ``.npy`` files and opened memory-mapped, so the workers
of one node share a single copy through the page cache. Generation is
deterministic in its arguments; files are written to a temporary name and
renamed, so workers that race to create the same cache all see whole files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

STATE_NAMES: tuple[str, ...] = ("x", "theta", "x_dot", "theta_dot")
ACTION_NAMES: tuple[str, ...] = ("force",)

CART_MASS = 1.0
POLE_MASS = 0.1
HALF_LENGTH = 0.5
GRAVITY = 9.8
DT = 0.02
FORMAT = "slhub.cartpole/1"


def wrap_angle(theta: np.ndarray) -> np.ndarray:
    """Wrap angles to [-pi, pi)."""
    return (theta + np.pi) % (2.0 * np.pi) - np.pi


def cartpole_step(state: np.ndarray, force: np.ndarray) -> np.ndarray:
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


def _atomic_save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        np.save(handle, array)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


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
    folder = Path(cache_dir) / split
    meta = {
        "format": FORMAT,
        "num_trajectories": num_trajectories,
        "length": length,
        "seed": seed,
        "max_force": max_force,
        "integrator": "semi-implicit euler",
        "dt": DT,
    }
    meta_path = folder / "meta.json"
    current = None
    if meta_path.exists():
        try:
            current = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            current = None
    if current != meta:
        folder.mkdir(parents=True, exist_ok=True)
        states, actions = generate_trajectories(num_trajectories, length, seed, max_force)
        _atomic_save(folder / "states.npy", states)
        _atomic_save(folder / "actions.npy", actions)
        tmp = meta_path.with_name(f".meta.json.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(meta, indent=2))
        os.replace(tmp, meta_path)
    return CartpoleData(
        states=np.load(folder / "states.npy", mmap_mode="r"),
        actions=np.load(folder / "actions.npy", mmap_mode="r"),
    )
