"""``slhub data info | check | convert``: a dataset described, checked, or copied into
slhub's store (or a LeRobot v3.0 dataset). Each returns text for the CLI and raises
:class:`DatasetError` (one line, exit 2) for anything wrong with the data."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from slhub.data.episodes import EpisodeDataset, open_dataset, refuse_short_episodes
from slhub.data.statistics import feature_statistics
from slhub.data.store import write_store
from slhub.errors import DatasetError

#: What ``convert --to`` writes.
WRITERS = ("slhub", "lerobot")
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


def convert(
    source: str | Path,
    destination: str | Path,
    format: str = "auto",  # noqa: A002
    progress: bool = True,
    to: str = "slhub",
    fps: float | None = None,
) -> str:
    """Copy a dataset of any readable format into a new directory ``destination``,
    written atomically, with a progress bar on a terminal: slhub's store, or with
    ``to="lerobot"`` a LeRobot v3.0 dataset with video
    (:func:`slhub.data.writers.lerobot.write_lerobot`), each step keeping its task.

    ``fps`` (``--fps``) is the control rate for a source that records none (robomimic,
    zarr, Minari, NeRD); where the source records one, it must agree. LeRobot needs an
    fps, so ``to="lerobot"`` refuses a source without one unless ``fps`` is given; the
    store records it in ``meta.json`` (None where neither has one). Every refusal is
    one line, before anything is written."""
    if to not in WRITERS:
        raise DatasetError(f"--to {to!r}: choose one of {', '.join(WRITERS)}")
    with open_dataset(source, format) as dataset:
        from slhub.data.writers.lerobot import control_rate

        rate = control_rate(dataset, fps, "--fps", required=to == "lerobot")
        bar = _bar(dataset.num_steps) if progress and sys.stderr.isatty() else None
        done = [0]

        def advance(written: int) -> None:
            if bar is not None:
                bar.update(written - done[0])
            done[0] = written

        try:
            if to == "lerobot":
                from slhub.data.writers.lerobot import write_lerobot

                out = write_lerobot(dataset, destination, fps=rate, progress=advance)
            else:
                out = write_store(dataset, destination, progress=advance, fps=rate)
        finally:
            if bar is not None:
                bar.close()
        return (
            f"converted {dataset.path} ({dataset.format}, {dataset.num_episodes} episodes, "
            f"{dataset.num_steps} steps) to {out}" + (" (LeRobot v3.0)" if to == "lerobot" else "")
        )


def _bar(total: int):
    from tqdm import tqdm

    return tqdm(total=total, unit="step", desc="convert", file=sys.stderr)


def _short(values: np.ndarray) -> str:
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    shown = " ".join(f"{v:.4g}" for v in flat[:4])
    return f"[{shown}{' ...' if flat.size > 4 else ''}]"
