"""slhub's own dataset store: one uncompressed ``.npy`` per feature over every step.

Layout of a store directory::

    meta.json          {"format": "slhub.dataset/1", "fps", "features": {name: {file,
                        shape, dtype, names}}, "splits", "source", and "tasks" (the task
                        strings) where the source records tasks}
    episode_ends.npy   int64, the exclusive end step of each episode
    f000.npy, ...      one array per feature, (total steps, *shape), the episodes in order
    tasks.npy          int64, each step's index into "tasks" (only with "tasks")

It is what ``slhub data convert`` writes from any readable format. Arrays are
memory-mapped, so every rank of a node shares one copy through the page cache and
a window reads only its own steps. Feature names (``observation.state``,
``obs/qpos``) map to numbered files in ``meta.json``, never to paths.

:func:`write_store` builds the store under a temporary name and renames it into
place: a killed convert leaves no half dataset, and the next write of the same
destination removes the temporary a SIGKILL left (:mod:`slhub.data.temporary`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from slhub.data.episodes import EpisodeDataset, Feature
from slhub.data.temporary import finish_building, remove_stale, start_building
from slhub.errors import DatasetError

FORMAT = "slhub.dataset/1"
META = "meta.json"
ENDS = "episode_ends.npy"
TASKS = "tasks.npy"


class StoreDataset(EpisodeDataset):
    """A store written by :func:`write_store`, read memory-mapped."""

    format = "slhub"
    extra = None

    @classmethod
    def detect(cls, path: Path) -> bool:
        meta = path / META
        if not meta.is_file():
            # a store without its meta.json (written last): open says what is missing
            return not (path / META).exists() and (path / ENDS).is_file()
        try:
            return json.loads(meta.read_text(encoding="utf-8")).get("format") == FORMAT
        except (OSError, ValueError, AttributeError):
            return False

    @classmethod
    def open(cls, path: Path) -> StoreDataset:
        if not (path / META).exists() and (path / ENDS).is_file():
            raise DatasetError(
                f"{path}: not a complete slhub dataset store: {META} is missing (a write "
                "that did not finish?)"
            )
        try:
            meta = json.loads((path / META).read_text(encoding="utf-8"))
            ends = np.load(path / ENDS)
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{path}: damaged slhub dataset store ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise DatasetError(f"{path}: not an slhub dataset store ({META} has no {FORMAT})")
        if ends.ndim != 1 or ends.dtype != np.int64 or (np.diff(ends, prepend=0) < 0).any():
            raise DatasetError(f"{path}: damaged slhub dataset store ({ENDS} is not ascending)")
        dataset = cls(
            path=path,
            features={name: Feature.from_dict(spec) for name, spec in meta["features"].items()},
            lengths=np.diff(ends, prepend=0).astype(np.int64),
            fps=meta.get("fps"),
            splits={name: tuple(int(e) for e in eps) for name, eps in meta["splits"].items()},
        )
        dataset._files = {name: spec["file"] for name, spec in meta["features"].items()}
        dataset._starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        dataset._arrays = {}
        dataset.source = meta.get("source")
        dataset._tasks = meta.get("tasks")
        dataset._task_rows = None
        return dataset

    def episode_tasks(self, episode: int) -> np.ndarray | None:
        """Each step's task string, where the store records tasks (:data:`TASKS`)."""
        if not getattr(self, "_tasks", None):
            return None
        if self._task_rows is None:
            path = self.path / TASKS
            try:
                index = np.load(path, mmap_mode="r")
            except (OSError, ValueError) as exc:
                raise DatasetError(f"{path}: damaged task file ({exc})") from None
            fits = index.shape == (self.num_steps,) and index.dtype.kind in "iu"
            if not fits or (index.size and not 0 <= index.min() <= index.max() < len(self._tasks)):
                raise DatasetError(
                    f"{path}: not one index into {META}'s {len(self._tasks)} tasks per step"
                )
            self._task_rows = index
        base, length = int(self._starts[episode]), int(self.lengths[episode])
        rows = self._task_rows[base : base + length]
        return np.asarray(self._tasks, dtype=object)[np.asarray(rows, dtype=np.int64)]

    def _array(self, feature: str) -> np.ndarray:
        array = self._arrays.get(feature)
        if array is None:
            path = self.path / self._files[feature]
            try:
                array = np.load(path, mmap_mode="r")
            except (OSError, ValueError) as exc:
                raise DatasetError(f"{path}: damaged feature file ({exc})") from None
            spec = self.features[feature]
            expected = (self.num_steps, *spec.shape)
            if array.shape != expected or str(array.dtype) != spec.dtype:
                raise DatasetError(
                    f"{path}: holds {array.dtype} {list(array.shape)}, {META} says "
                    f"{spec.dtype} {list(expected)} (a truncated or foreign file)"
                )
            self._arrays[feature] = array
        return array

    def read(self, feature: str, episode: int, start: int, stop: int) -> np.ndarray:
        base = int(self._starts[episode])
        return np.array(self._array(feature)[base + start : base + stop])

    def read_rows(self, feature: str, episodes: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """One gather over the memory-mapped array: only the rows asked for are copied."""
        rows = self._starts[np.asarray(episodes, dtype=np.int64)] + np.asarray(steps, np.int64)
        return self._array(feature)[rows.reshape(-1)]

    def close(self) -> None:
        self._arrays = {}
        self._task_rows = None


def write_store(
    source: EpisodeDataset,
    destination: str | Path,
    *,
    progress: Callable[[int], None] | None = None,
    provenance: Mapping[str, Any] | None = None,
    fps: float | None = None,
) -> Path:
    """Copy every episode of ``source`` into a new store at ``destination``, atomically,
    with each step's task where the source records tasks.

    :param progress: called with the number of steps written after each episode.
    :param fps: the control rate ``meta.json`` records (default: the source's).
    :param provenance: what ``meta.json``'s ``source`` records (JSON values); default
        the source's format and path. A generator (``slhub data collect``) records how
        it made the data there.
    :raises DatasetError: ``destination`` exists, or ``source`` has no episodes.
    """
    destination = Path(destination)
    if destination.exists():
        remove_stale(destination)
        raise DatasetError(f"{destination}: exists; convert writes a new directory")
    if source.num_episodes == 0:
        raise DatasetError(f"{source.path}: holds no episodes")
    parent = destination.parent
    building = start_building(destination)  # a dead writer's .DST.tmp-PID goes first
    try:
        _fill(source, building, progress, provenance, source.fps if fps is None else fps)
        try:
            finish_building(building, destination)
        except OSError:
            if not destination.is_dir():
                raise
            # another writer (a node's other rank) finished it first: the same refusal
            raise DatasetError(f"{destination}: exists; convert writes a new directory") from None
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    _fsync_dir(parent)
    return destination


def _fill(
    source: EpisodeDataset,
    folder: Path,
    progress: Callable[[int], None] | None,
    provenance: Mapping[str, Any] | None,
    fps: float | None,
) -> None:
    ends = np.cumsum(source.lengths).astype(np.int64)
    total = int(ends[-1])
    names = list(source.features)
    files = {name: f"f{index:03d}.npy" for index, name in enumerate(names)}
    arrays = {
        name: np.lib.format.open_memmap(
            folder / files[name],
            mode="w+",
            dtype=np.dtype(source.features[name].dtype),
            shape=(total, *source.features[name].shape),
        )
        for name in names
    }
    written = 0
    for episode, length in enumerate(source.lengths):
        length = int(length)
        for name in names:
            block = source.read(name, episode, 0, length)
            arrays[name][written : written + length] = block
        written += length
        if progress is not None:
            progress(written)
    for name, array in arrays.items():
        array.flush()
        del array
        _fsync(folder / files[name])
    np.save(folder / ENDS, ends)
    _fsync(folder / ENDS)
    tasks = _task_indices(source)
    if tasks is not None:
        np.save(folder / TASKS, tasks[1])
        _fsync(folder / TASKS)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "fps": fps,
        "features": {
            name: {**source.features[name].to_dict(), "file": files[name]} for name in names
        },
        "splits": {name: list(eps) for name, eps in source.splits.items()},
        "source": dict(provenance)
        if provenance is not None
        else {"format": source.format, "path": str(source.path)},
    }
    if tasks is not None:
        meta["tasks"] = tasks[0]
    (folder / META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    _fsync(folder / META)


def _task_indices(source: EpisodeDataset) -> tuple[list[str], np.ndarray] | None:
    """The source's task strings (in order of first appearance) and each step's index
    into them, or None unless every episode records its tasks."""
    table: dict[str, int] = {}
    parts = []
    for episode in range(source.num_episodes):
        steps = source.episode_tasks(episode)
        if steps is None:
            return None
        parts.append(np.asarray([table.setdefault(str(t), len(table)) for t in steps], np.int64))
    return list(table), np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
