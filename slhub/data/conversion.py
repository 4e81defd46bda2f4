"""A dataset of any readable format copied into slhub's store or a LeRobot v3.0 dataset
(``slhub data convert``), atomically, with a progress bar on a terminal."""

from __future__ import annotations

import sys
from pathlib import Path

from slhub.data.episodes import open_dataset
from slhub.data.store import write_store
from slhub.errors import DatasetError

#: What ``convert --to`` writes.
WRITERS = ("slhub", "lerobot")


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
