"""The scripted expert: an LQR controller on the linearized cart-pole, and its demonstrations.

The dynamics are slhub's public cart-pole step
(:func:`slhub.sim.cartpole.cartpole_step`, theta = 0 is upright). The
expert linearizes that discrete step around the upright rest state by central
differences, solves the discrete algebraic Riccati equation by fixed-point
iteration and applies ``u = clip(-K s, -max_force, max_force)``.

Demonstrations (DART-style): episodes start near upright, the *applied* force is
the expert's plus Gaussian noise so that the data covers the states a slightly
wrong policy visits, and the *label* is always the expert's clean action.
:func:`demonstration_store` writes them (and, for visual BC, their rendered frames)
into slhub's store once, so BC trains on them through the same data layer as on any
recorded dataset.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from slhub import DatasetError
from slhub.data import ArrayEpisodes, split_seed, write_store
from slhub.sim import cartpole

from slhub_bc.render import render

#: State cost on (x, theta, x_dot, theta_dot) and force cost of the expert's LQR.
Q = np.diag([1.0, 10.0, 1.0, 1.0])
R = np.array([[0.1]])


def linearize(eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """Discrete ``A [4, 4]`` and ``B [4, 1]`` of the cart-pole step at the upright rest state."""
    zero = np.zeros(4)
    a = np.empty((4, 4))
    for i in range(4):
        d = np.zeros(4)
        d[i] = eps
        a[:, i] = (
            cartpole.cartpole_step(zero + d, 0.0) - cartpole.cartpole_step(zero - d, 0.0)
        ) / (2 * eps)
    b = (cartpole.cartpole_step(zero, eps) - cartpole.cartpole_step(zero, -eps))[:, None] / (
        2 * eps
    )
    return a, b


@lru_cache(maxsize=1)
def lqr_gain() -> np.ndarray:
    """The LQR gain ``K [1, 4]`` (u = -K s) from the discrete Riccati equation."""
    a, b = linearize()
    p = Q.copy()
    for _ in range(5000):
        k = np.linalg.solve(R + b.T @ p @ b, b.T @ p @ a)
        p_next = Q + a.T @ p @ (a - b @ k)
        if np.max(np.abs(p_next - p)) < 1e-10:
            p = p_next
            break
        p = p_next
    return np.linalg.solve(R + b.T @ p @ b, b.T @ p @ a)


def expert_action(states: np.ndarray, max_force: float) -> np.ndarray:
    """The expert's force ``[..., 1]`` for states ``[..., 4]``."""
    return np.clip(-(states @ lqr_gain().T), -max_force, max_force)


@dataclass(frozen=True)
class Demonstrations:
    """Expert episodes: ``states [N, T + 1, 4]``, clean expert labels ``actions [N, T + 1, 1]``."""

    states: np.ndarray
    actions: np.ndarray

    @property
    def num_episodes(self) -> int:
        return int(self.states.shape[0])

    @property
    def length(self) -> int:
        return int(self.states.shape[1]) - 1


#: Half-widths of the initial-state box around upright: x, theta, x_dot, theta_dot.
INITIAL_SPREAD = np.array([0.5, 0.25, 0.5, 0.5])


def demonstrations(
    num_episodes: int, length: int, seed: int, noise: float, max_force: float
) -> Demonstrations:
    """Roll out the noisy expert; deterministic in its arguments."""
    rng = np.random.default_rng(seed)
    states = np.empty((num_episodes, length + 1, 4))
    states[:, 0] = rng.uniform(-INITIAL_SPREAD, INITIAL_SPREAD, size=(num_episodes, 4))
    for t in range(length):
        applied = expert_action(states[:, t], max_force)[:, 0]
        applied = applied + noise * rng.standard_normal(num_episodes)
        states[:, t + 1] = cartpole.cartpole_step(
            states[:, t], np.clip(applied, -max_force, max_force)
        )
    return Demonstrations(states=states, actions=expert_action(states, max_force))


#: Recorded in the store's provenance and its cache key; bump when the data would change.
FORMAT = "slhub_bc.demonstrations/1"


def demonstration_store(
    cache_dir: str | Path,
    *,
    train_episodes: int,
    val_episodes: int,
    length: int,
    seed: int,
    noise: float,
    max_force: float,
    images: bool,
) -> Path:
    """The expert's demonstrations as a dataset in slhub's store, made once under
    ``cache_dir`` (keyed by every parameter, written atomically) and reused.

    Features per step: ``state`` (:data:`slhub.sim.cartpole.STATE_NAMES`), the expert's clean
    ``action`` (``force``) and, with ``images``, ``image``: the rendered frame as
    ``64 x 64 x 1`` uint8. Splits ``train`` (``seed``) and ``validation`` (``seed + 1``).
    """
    params = {
        "format": FORMAT,
        "train_episodes": train_episodes,
        "val_episodes": val_episodes,
        "length": length,
        "seed": seed,
        "noise": noise,
        "max_force": max_force,
        "images": images,
    }
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    destination = Path(cache_dir) / f"demos-{key}"
    if destination.is_dir():
        return destination
    episodes: list[dict[str, np.ndarray]] = []
    splits: dict[str, tuple[int, ...]] = {}
    parts = (("train", "train", train_episodes), ("validation", "val", val_episodes))
    for name, split, count in parts:
        demos = demonstrations(count, length, split_seed(seed, split), noise, max_force)
        splits[name] = tuple(range(len(episodes), len(episodes) + count))
        for states, actions in zip(demos.states, demos.actions, strict=True):
            episode = {"state": states, "action": actions}
            if images:
                episode["image"] = np.round(render(states) * 255).astype(np.uint8)[..., None]
            episodes.append(episode)
    source = ArrayEpisodes(
        episodes,
        fps=1.0 / cartpole.DT,
        names={"state": cartpole.STATE_NAMES, "action": cartpole.ACTION_NAMES},
        splits=splits,
    )
    try:
        write_store(source, destination, provenance={"generator": "slhub_bc.expert", **params})
    except (DatasetError, OSError):  # exists already, or the rename found it there
        if not destination.is_dir():  # otherwise another rank or run finished it first
            raise
    return destination
