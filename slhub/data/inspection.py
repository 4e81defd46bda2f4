"""A dataset described (``slhub data info``) or checked value by value (``slhub data
check``). Each returns text for people and raises :class:`DatasetError` (one line, exit 2)
for anything wrong with the data."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from slhub.data.episodes import EpisodeDataset, open_dataset, refuse_short_episodes
from slhub.data.statistics import feature_statistics
from slhub.errors import DatasetError

#: Steps read at a time by ``check``.
BLOCK = 4096


def info(path: str | Path, format: str = "auto") -> str:  # noqa: A002
    """Format, episodes, steps, fps, every feature (shape, dtype, names), splits and
    the statistics of the non-image features over every episode."""
    with open_dataset(path, format) as dataset:
        lengths = dataset.lengths
        lines = [
            f"dataset:  {dataset.path}",
            f"format:   {dataset.format}",
            f"episodes: {dataset.num_episodes} ({dataset.num_steps} steps; length min "
            f"{lengths.min()}, max {lengths.max()})"
            if dataset.num_episodes
            else "episodes: 0",
            f"fps:      {dataset.fps if dataset.fps is not None else 'not recorded'}",
            "features:",
        ]
        for name, spec in dataset.features.items():
            kind = "image" if spec.is_image else "vector" if spec.shape else "scalar"
            names = f" names={','.join(spec.names)}" if spec.names else ""
            lines.append(f"  {name}: {kind} {spec.dtype} {list(spec.shape)}{names}")
        for split, episodes in dataset.splits.items():
            lines.append(f"split {split}: {len(episodes)} episodes {list(episodes)[:8]}")
        numeric = [
            n
            for n, s in dataset.features.items()
            if not s.is_image and np.issubdtype(np.dtype(s.dtype), np.number)
        ]
        if numeric and dataset.num_steps:
            lines.append("statistics (every episode):")
            for name, stats in feature_statistics(dataset, numeric).items():
                lines.append(
                    f"  {name}: mean {_short(stats['mean'])} std {_short(stats['std'])} "
                    f"min {_short(stats['min'])} max {_short(stats['max'])}"
                )
    return "\n".join(lines)


def check(path: str | Path, format: str = "auto", min_length: int = 1) -> str:  # noqa: A002
    """Read every step of every feature once: one line for the first problem (a
    non-finite value with its feature, episode and step; an empty or too short
    episode; a wrong shape or dtype; a file that cannot be read), else a summary."""
    with open_dataset(path, format) as dataset:
        if dataset.num_episodes == 0:
            raise DatasetError(f"{dataset.path}: holds no episodes")
        refuse_short_episodes(dataset, min_length)
        for name in dataset.features:
            _check_feature(dataset, name)
    return (
        f"ok: {dataset.path}: {dataset.format}, {dataset.num_episodes} episodes, "
        f"{dataset.num_steps} steps, {len(dataset.features)} features, every value finite"
    )


def _check_feature(dataset: EpisodeDataset, name: str) -> None:
    spec = dataset.features[name]
    floating = np.issubdtype(np.dtype(spec.dtype), np.floating)
    for episode, length in enumerate(dataset.lengths):
        for start in range(0, int(length), BLOCK):
            stop = min(int(length), start + BLOCK)
            block = dataset.read(name, episode, start, stop)
            if block.shape != (stop - start, *spec.shape) or str(block.dtype) != spec.dtype:
                raise DatasetError(
                    f"{dataset.path}: feature {name} of episode {episode} reads as "
                    f"{block.dtype} {list(block.shape[1:])} per step, the dataset declares "
                    f"{spec.dtype} {list(spec.shape)}"
                )
            if floating:
                bad = ~np.isfinite(block.reshape(block.shape[0], -1)).all(axis=1)
                if bad.any():
                    step = start + int(np.argmax(bad))
                    raise DatasetError(
                        f"{dataset.path}: feature {name} is not finite at episode {episode}, "
                        f"step {step}"
                    )


def _short(values: np.ndarray) -> str:
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    shown = " ".join(f"{v:.4g}" for v in flat[:4])
    return f"[{shown}{' ...' if flat.size > 4 else ''}]"
