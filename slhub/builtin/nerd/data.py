"""NeRD's view of the cart-pole data: its splits, history windows and normalization.

The plugin, its evaluation and the tests all cut trajectories into the same
windows of ``history`` tokens, so the windowing lives here once; the data
itself (simulator, cache) is :mod:`slhub.data`'s.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from slhub.builtin.nerd.sections import DataSection, SplitSection
from slhub.data import (
    CARTPOLE_FORMAT,
    CartpoleData,
    cached_arrays,
    ensure_dataset,
    state_deltas,
)

#: The arrays :func:`training_statistics` returns, as cached by :func:`cached_statistics`.
STATISTICS = ("token_mean", "token_std", "delta_mean", "delta_std")


def open_splits(cfg: DataSection) -> tuple[CartpoleData, CartpoleData]:
    """The train and validation splits of ``cfg``, made on first use, memory-mapped."""

    def open_split(name: str, split: SplitSection) -> CartpoleData:
        return ensure_dataset(
            cfg.cache_dir, name, split.num_trajectories, split.length, split.seed, cfg.max_force
        )

    return open_split("train", cfg.train), open_split("val", cfg.val)


def cached_statistics(cfg: DataSection, data: CartpoleData) -> tuple[np.ndarray, ...]:
    """:func:`training_statistics` of the train split ``data`` of ``cfg``, computed once
    and cached beside the split (``cache_dir/train-statistics``).

    Computing them reads the whole split and makes float64 copies several times its
    size; cached, every later rank and run reads four small arrays instead, so a
    node's ranks share the memory-mapped split and hold no copy of it, even briefly.
    The cached values are the computed ones, bit for bit.
    """
    split = cfg.train
    meta = {
        "statistics": list(STATISTICS),
        "data_format": CARTPOLE_FORMAT,
        "num_trajectories": split.num_trajectories,
        "length": split.length,
        "seed": split.seed,
        "max_force": cfg.max_force,
    }
    arrays = cached_arrays(
        Path(cfg.cache_dir) / "train-statistics",
        meta,
        STATISTICS,
        lambda: dict(zip(STATISTICS, training_statistics(data), strict=True)),
    )
    return tuple(np.array(arrays[name]) for name in STATISTICS)


def window_batch(
    data: CartpoleData, traj: np.ndarray, start: np.ndarray, history: int
) -> tuple[np.ndarray, np.ndarray]:
    """Tokens ``[B, history, S + A]`` and raw state changes ``[B, history, S]`` (float64).

    ``delta[:, t]`` is ``state[t + 1] - state[t]`` with the angle difference wrapped.
    """
    offsets = np.arange(history + 1)
    rows = traj[:, None]
    states = np.asarray(data.states[rows, start[:, None] + offsets], dtype=np.float64)
    actions = np.asarray(data.actions[rows, start[:, None] + offsets[:-1]], dtype=np.float64)
    tokens = np.concatenate([states[:, :-1], actions], axis=-1)
    return tokens, state_deltas(states)


def training_statistics(data: CartpoleData) -> tuple[np.ndarray, ...]:
    """Per-feature mean and std of input tokens and of state changes over a whole split."""
    states = np.asarray(data.states, dtype=np.float64)
    tokens = np.concatenate([states[:, :-1], np.asarray(data.actions, dtype=np.float64)], -1)
    tokens = tokens.reshape(-1, tokens.shape[-1])
    delta = state_deltas(states).reshape(-1, states.shape[-1])
    floor = 1e-6
    return (
        tokens.mean(0),
        np.maximum(tokens.std(0), floor),
        delta.mean(0),
        np.maximum(delta.std(0), floor),
    )
