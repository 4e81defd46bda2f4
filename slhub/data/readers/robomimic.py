"""robomimic's HDF5 layout (``data/demo_N/...``, ``mask/<filter key>``) as an episode dataset.

Every ``demo_N`` group is one episode, in demo-number order (``demo_2`` before
``demo_10``, as robomimic's own ``SequenceDataset`` sorts them), its length the
group's ``num_samples``. Every dataset inside a demo whose first axis runs over its
steps is a feature, named by its path inside the demo: ``obs/<key>``,
``next_obs/<key>``, ``actions``, ``rewards``, ``dones``, ``states`` (and, in newer
files, ``action_dict/<key>``). The filter keys under ``mask/`` become ``splits``.

This module also holds :class:`Hdf5Dataset`, what every HDF5 reader shares: the
signature check in ``detect``, one line for a file h5py cannot open or read, and a
file handle opened lazily per process, so a dataset can be pickled into data-loader
workers (an h5py handle cannot be pickled nor shared across ``fork``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from slhub.data.episodes import EpisodeDataset, Feature, missing_library
from slhub.data.hdf5_file import damaged_hdf5, probe_hdf5
from slhub.errors import DatasetError, one_line

_DEMO = re.compile(r"demo_(\d+)")


def text_attr(value: Any) -> str | None:
    """An HDF5 string attribute (``str``, ``bytes`` or a 0-d numpy string) as ``str``."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, bytes | np.bytes_):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return None


@dataclass
class Hdf5Dataset(EpisodeDataset):
    """What the HDF5 readers share: opening with one-line errors, and a per-process handle."""

    extra: ClassVar[str | None] = "hdf5"

    _handle: Any = field(default=None, init=False, repr=False, compare=False)
    _pid: int = field(default=-1, init=False, repr=False, compare=False)
    #: This process's h5py datasets by path: a path lookup costs more than a small read.
    _arrays: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def _open_file(cls, path: Path) -> Any:
        """``path`` opened with h5py; a missing h5py or an unreadable file is one line."""
        try:
            import h5py
        except ImportError as exc:
            raise DatasetError(missing_library(cls, exc)) from None
        try:
            return h5py.File(path, "r")
        except Exception as exc:  # noqa: BLE001 - truncated, corrupt, not HDF5: all one line
            raise DatasetError(damaged_hdf5(path, exc)) from None

    @property
    def file(self) -> Any:
        """This process's h5py handle, opened on first use (again after a fork or unpickling)."""
        if self._handle is None or self._pid != os.getpid():
            self._adopt(self._open_file(self.path))
        return self._handle

    def _adopt(self, handle: Any) -> None:
        """Use ``handle`` (the one ``open`` read the layout with) for this process's reads."""
        self._handle, self._pid, self._arrays = handle, os.getpid(), {}

    def _slice(self, dataset_path: str, index: tuple[Any, ...], what: str) -> np.ndarray:
        """``file[dataset_path][index]``; a read h5py fails (a damaged chunk) is one line."""
        try:
            handle = self.file
            array = self._arrays.get(dataset_path)
            if array is None:
                array = self._arrays[dataset_path] = handle[dataset_path]
            return np.asarray(array[index])
        except DatasetError:
            raise
        except Exception as exc:  # noqa: BLE001 - corrupt data is one line naming the file
            raise DatasetError(
                f"{self.path}: cannot read {what} ({one_line(exc, limit=200)})"
            ) from None

    def _check_range(self, feature: str, episode: int, start: int, stop: int) -> None:
        self.check_feature(feature, for_what="the read")
        self.check_range(episode, start, stop)

    #: What ``open`` calls the file in its one-line error (``a readable <label> file``).
    label: ClassVar[str] = "HDF5"

    @classmethod
    def open(cls, path: Path) -> Any:
        """Open ``path`` and read its layout (:meth:`_layout`); any failure is one line."""
        path = Path(path)
        handle = cls._open_file(path)
        try:
            dataset = cls._layout(path, handle)
        except DatasetError:
            handle.close()
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged layout is one line naming the file
            handle.close()
            raise DatasetError(
                f"{path}: not a readable {cls.label} file ({one_line(exc, limit=200)})"
            ) from None
        dataset._adopt(handle)
        return dataset

    def close(self) -> None:
        if self._handle is not None and self._pid == os.getpid():
            self._handle.close()
        self._handle, self._pid, self._arrays = None, -1, {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handle"], state["_pid"], state["_arrays"] = None, -1, {}
        return state


@dataclass
class RobomimicDataset(Hdf5Dataset):
    """A robomimic HDF5 file: one episode per ``data/demo_N``, splits from ``mask/``."""

    format: ClassVar[str] = "robomimic"

    demos: tuple[str, ...] = ()

    @classmethod
    def detect(cls, path: Path) -> bool:
        """An HDF5 file whose ``data`` group holds ``demo_*`` groups."""
        handle = probe_hdf5(Path(path))
        if handle is None:
            return False
        try:
            import h5py

            with handle:
                data = handle.get("data")
                if not isinstance(data, h5py.Group):
                    return False
                return any(isinstance(data[name], h5py.Group) for name in _demo_names(data))
        except Exception:  # noqa: BLE001 - detect never raises
            return False

    label: ClassVar[str] = "robomimic"

    @classmethod
    def _layout(cls, path: Path, handle: Any) -> RobomimicDataset:
        import h5py

        data = handle.get("data")
        if not isinstance(data, h5py.Group):
            raise DatasetError(f"{path}: no 'data' group, so not a robomimic file")
        demos = _demo_names(data)
        if not demos:
            raise DatasetError(f"{path}: the 'data' group holds no demo_N groups (no episodes)")
        features: dict[str, Feature] | None = None
        lengths = []
        for demo in demos:
            found, length = _demo_features(path, demo, data[demo], h5py)
            if features is None:
                features = found
            elif found != features:
                raise DatasetError(f"{path}: {_difference(demo, found, demos[0], features)}")
            lengths.append(length)
        index = {demo: i for i, demo in enumerate(demos)}
        return cls(
            path=path,
            features=features or {},
            lengths=np.asarray(lengths, dtype=np.int64),
            fps=_control_rate(data.attrs.get("env_args")),
            splits=_splits(path, handle, index, h5py),
            demos=tuple(demos),
        )

    def read(self, feature: str, episode: int, start: int, stop: int) -> np.ndarray:
        """``data/<demo>/<feature>[start:stop]``: only those steps come off the disk."""
        self._check_range(feature, episode, start, stop)
        demo = self.demos[episode]
        return self._slice(
            f"data/{demo}/{feature}", (slice(start, stop),), f"{demo}/{feature}[{start}:{stop}]"
        )


def _demo_names(data: Any) -> list[str]:
    """The ``demo_N`` members of ``data`` sorted by N (numerically, as robomimic does)."""
    named = [(int(m.group(1)), name) for name in data if (m := _DEMO.fullmatch(name))]
    return [name for _, name in sorted(named)]


def _demo_features(path: Path, demo: str, group: Any, h5py: Any) -> tuple[dict[str, Feature], int]:
    """Every dataset inside one demo as a feature, and the demo's length (``num_samples``,
    checked against every array; without the attribute, the arrays' common length)."""
    if not isinstance(group, h5py.Group):
        raise DatasetError(f"{path}: data/{demo} is not a group")
    arrays: dict[str, Any] = {}
    group.visititems(
        lambda name, obj: arrays.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None
    )
    if not arrays:
        raise DatasetError(f"{path}: data/{demo} holds no arrays")
    stored = group.attrs.get("num_samples")
    length = None if stored is None else int(np.asarray(stored).reshape(-1)[0])
    features = {}
    for name in sorted(arrays):
        shape = arrays[name].shape
        steps = shape[0] if shape else None
        if length is None:
            length = steps
        if steps != length:
            told = "num_samples" if stored is not None else f"{sorted(arrays)[0]} has"
            raise DatasetError(
                f"{path}: data/{demo}/{name} has {steps} steps but {demo}'s {told} {length}"
            )
        features[name] = Feature(tuple(int(n) for n in shape[1:]), str(arrays[name].dtype))
    return features, int(length or 0)


def _difference(
    demo: str, found: dict[str, Feature], first: str, features: dict[str, Feature]
) -> str:
    """The first feature in which ``demo`` differs from the ``first`` demo, as a short
    phrase naming both shapes (never the whole feature lists, which run to hundreds of
    characters in a real file)."""
    for name in sorted(set(found) | set(features)):
        mine, theirs = found.get(name), features.get(name)
        if mine == theirs:
            continue
        if mine is None:
            return f"{demo} lacks {name}, which {first} has; every demo needs the same features"
        if theirs is None:
            return f"{demo} has {name}, which {first} lacks; every demo needs the same features"
        return (
            f"{demo}'s {name} is {_per_step(mine)} per step, {first}'s is {_per_step(theirs)}; "
            "every demo needs the same"
        )
    return f"{demo}'s features differ from {first}'s"  # unreachable: found != features


def _per_step(feature: Feature) -> str:
    return f"{list(feature.shape)} {feature.dtype}"


def _splits(
    path: Path, handle: Any, index: dict[str, int], h5py: Any
) -> dict[str, tuple[int, ...]]:
    """``mask/<name>`` (demo names) as sorted episode indices, robomimic's filter keys."""
    mask = handle.get("mask")
    if not isinstance(mask, h5py.Group):
        return {}
    splits = {}
    for name in sorted(mask):
        if not isinstance(mask[name], h5py.Dataset):
            continue
        episodes = set()
        for entry in np.asarray(mask[name][()]).reshape(-1):
            demo = text_attr(entry)
            if demo not in index:
                raise DatasetError(f"{path}: filter key mask/{name} names {entry!r}, not a demo")
            episodes.add(index[demo])
        splits[name] = tuple(sorted(episodes))
    return splits


def _control_rate(env_args: Any) -> float | None:
    """The control rate robosuite records as ``env_kwargs.control_freq`` in ``data``'s
    ``env_args``; None when the file does not say (robomimic has no fps field)."""
    text = text_attr(env_args)
    if text is None:
        return None
    try:
        rate = json.loads(text).get("env_kwargs", {}).get("control_freq")
    except (ValueError, AttributeError):
        return None
    return float(rate) if isinstance(rate, int | float) and rate > 0 else None
