"""The episode-dataset contract: what every reader presents, whatever the format on disk.

A dataset is a sequence of episodes. Every episode has a length (steps) and the
same named features; a feature has a fixed per-step ``shape`` and ``dtype``
(vectors such as a state or an action, images ``H x W x C`` uint8, scalars with
shape ``()``), and, where the format records them, ``names`` for the components
of a vector (LeRobot's ``names``). ``fps`` is the dataset's control rate where
the format knows it. ``splits`` are the episode lists the file itself names
(robomimic's filter keys), by name.

Readers are classes registered by format name in the entry-point group
``slhub.datasets``; :func:`open_dataset` finds one by name or, with
``format="auto"``, asks each installed reader whether it recognizes the path.
Reading is by episode and step range, never the whole dataset at once, so a
reader can decode one window at a time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from slhub.data.temporary import refuse_temporary
from slhub.errors import DatasetError, one_line

#: Entry-point group mapping a format name to its :class:`EpisodeDataset` subclass.
READER_GROUP = "slhub.datasets"
AUTO = "auto"


@dataclass(frozen=True)
class Feature:
    """One named feature of every step: its shape, dtype and component names."""

    shape: tuple[int, ...]
    dtype: str
    names: tuple[str, ...] | None = None

    @property
    def is_image(self) -> bool:
        """An ``H x W x C`` uint8 frame (C 1, 3 or 4)."""
        return self.dtype == "uint8" and len(self.shape) == 3 and self.shape[2] in (1, 3, 4)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype}
        if self.names is not None:
            out["names"] = list(self.names)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Feature:
        names = data.get("names")
        return cls(
            tuple(int(n) for n in data["shape"]),
            str(np.dtype(data["dtype"])),
            None if names is None else tuple(str(n) for n in names),
        )


@dataclass
class EpisodeDataset(ABC):
    """An opened dataset of one format (the base class of every reader).

    Subclasses set :attr:`format`, implement :meth:`detect` and :meth:`read`, and
    fill ``features``, ``lengths`` (int64, one per episode), ``fps`` and ``splits``
    when they open ``path``.
    """

    format: ClassVar[str] = ""
    #: The extra that installs what this reader needs (``pip install 'slhub[EXTRA]'``).
    extra: ClassVar[str | None] = None

    path: Path
    features: dict[str, Feature] = field(default_factory=dict)
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    fps: float | None = None
    splits: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    @abstractmethod
    def detect(cls, path: Path) -> bool:
        """Whether ``path`` looks like this format (cheap: names and headers only)."""

    @classmethod
    @abstractmethod
    def open(cls, path: Path) -> EpisodeDataset:
        """Open ``path``: read the layout (features, lengths, fps, splits), not the data.
        Imports the format's library here, so a missing one is an ImportError that
        :func:`open_dataset` turns into one line naming the extra."""

    @abstractmethod
    def read(self, feature: str, episode: int, start: int, stop: int) -> np.ndarray:
        """Steps ``start .. stop - 1`` of ``episode``'s ``feature``: an array of shape
        ``(stop - start, *shape)`` and the feature's dtype (``0 <= start <= stop <=
        length``)."""

    def close(self) -> None:  # noqa: B027 - optional: readers holding files override it
        """Release open files."""

    def episode_tasks(self, episode: int) -> np.ndarray | None:
        """The task (a language instruction) of every step of ``episode``: a string array
        of its length, or None where the format records no task (the default). LeRobot
        datasets and slhub stores made from them record one."""
        return None

    # ------------------------------------------------------------ derived

    @property
    def num_episodes(self) -> int:
        return len(self.lengths)

    @property
    def num_steps(self) -> int:
        return int(self.lengths.sum())

    def check_range(self, episode: int, start: int, stop: int) -> None:
        """Refuse a read outside one episode, in one line: in a buffer that concatenates
        episodes it would silently return a neighbour's rows."""
        if not 0 <= episode < self.num_episodes:
            raise DatasetError(
                f"{self.path}: episode {episode} does not exist ({self.num_episodes} episodes)"
            )
        length = int(self.lengths[episode])
        if not 0 <= start <= stop <= length:
            raise DatasetError(
                f"{self.path}: steps {start}..{stop - 1} are outside episode {episode} "
                f"(length {length})"
            )

    def read_steps(self, feature: str, episode: int, steps: np.ndarray) -> np.ndarray:
        """Arbitrary steps of one episode (each in ``0 .. length - 1``), in the order given."""
        steps = np.asarray(steps, dtype=np.int64)
        if steps.size == 0:
            spec = self.features[feature]
            return np.zeros((0, *spec.shape), dtype=spec.dtype)
        low, high = int(steps.min()), int(steps.max()) + 1
        return self.read(feature, episode, low, high)[steps - low]

    def read_rows(self, feature: str, episodes: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Step ``steps[i]`` of episode ``episodes[i]`` for every ``i`` (each step inside its
        episode), stacked: what a batch of windows reads. Readers that can gather in one
        call (slhub's store) override it; this one reads episode by episode."""
        episodes = np.asarray(episodes, dtype=np.int64).reshape(-1)
        steps = np.asarray(steps, dtype=np.int64).reshape(-1)
        spec = self.features[feature]
        out = np.empty((len(steps), *spec.shape), dtype=spec.dtype)
        for episode in np.unique(episodes):
            where = np.flatnonzero(episodes == episode)
            out[where] = self.read_steps(feature, int(episode), steps[where])
        return out

    def episode(self, index: int) -> dict[str, np.ndarray]:
        """Every feature of one whole episode."""
        length = int(self.lengths[index])
        return {name: self.read(name, index, 0, length) for name in self.features}

    def __enter__(self) -> EpisodeDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return (self.episode(i) for i in range(self.num_episodes))

    def check_feature(self, name: str, *, for_what: str = "the recipe") -> Feature:
        """The feature ``name``, or one line listing the features the dataset has."""
        if name not in self.features:
            have = ", ".join(sorted(self.features)) or "none"
            raise DatasetError(
                f"{self.path}: {for_what} names feature {name!r}, which this {self.format} "
                f"dataset does not have (it has: {have})"
            )
        return self.features[name]


def readers() -> dict[str, type[EpisodeDataset]]:
    """The installed readers by format name (entry-point group ``slhub.datasets``); a
    reader whose module fails to import is left out (:func:`open_dataset` names it)."""
    found: dict[str, type[EpisodeDataset]] = {}
    for ep in entry_points(group=READER_GROUP):
        if ep.name not in found:
            try:
                found[ep.name] = ep.load()
            except Exception:  # noqa: BLE001, S112 - named by open_dataset when asked for
                continue
    return found


def _broken(format: str) -> str | None:  # noqa: A002
    """Why the installed reader ``format`` does not load, or None."""
    for ep in entry_points(group=READER_GROUP, name=format):
        try:
            ep.load()
        except Exception as exc:  # noqa: BLE001 - reported as one line
            return f"dataset reader {format!r} fails to import: {one_line(exc)}"
    return None


def open_dataset(path: str | Path, format: str = AUTO) -> EpisodeDataset:  # noqa: A002
    """Open the dataset at ``path`` with the reader for ``format`` (``auto``: detected).

    :raises DatasetError: no such path, an unknown or undetectable format, a reader
        whose library is missing (naming the extra to install), or a file the reader
        cannot read; a path named like a writer's temporary (``.NAME.tmp-PID``).
    """
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such dataset file or directory")
    refuse_temporary(path)  # a writer's .NAME.tmp-PID: an unfinished write, not data
    known = readers()
    if format == AUTO:
        matches = [name for name, reader in sorted(known.items()) if _detects(reader, path)]
        if not matches:
            from slhub.data.hdf5_file import refuse_damaged_hdf5

            refuse_damaged_hdf5(path)  # named as damaged, not as of an unknown format
            raise DatasetError(
                f"{path}: cannot tell the dataset format (readers: {', '.join(sorted(known))}); "
                "name it with format: <reader>"
            )
        if len(matches) > 1:
            raise DatasetError(
                f"{path}: looks like several dataset formats ({', '.join(matches)}); "
                "name one with format: <reader>"
            )
        format = matches[0]  # noqa: A001
    if format not in known:
        broken = _broken(format)
        if broken is not None:
            raise DatasetError(broken)
        raise DatasetError(
            f"unknown dataset format {format!r} (readers: {', '.join(sorted(known))}, or auto)"
        )
    reader = known[format]
    try:
        return reader.open(path)
    except DatasetError:
        raise
    except ImportError as exc:
        raise DatasetError(missing_library(reader, exc)) from None
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise DatasetError(
            f"{path}: not a readable {format} dataset ({one_line(exc, limit=200)})"
        ) from None


def refuse_short_episodes(dataset: EpisodeDataset, min_length: int = 1) -> None:
    """One line for the first episode shorter than ``min_length`` steps (at least 1: an
    empty episode is never data), counting the others; what ``slhub data check`` and
    training both refuse."""
    least = max(1, int(min_length))
    short = np.flatnonzero(np.asarray(dataset.lengths) < least)
    if short.size:
        episode = int(short[0])
        length = int(dataset.lengths[episode])
        what = "is empty (0 steps)" if length == 0 else f"has {length} steps, fewer than {least}"
        more = f" (and {short.size - 1} more episodes)" if short.size > 1 else ""
        raise DatasetError(f"{dataset.path}: episode {episode} {what}{more}")


def missing_library(reader: type[EpisodeDataset], exc: ImportError) -> str:
    """The one line for a reader whose library is not installed."""
    module = getattr(exc, "name", None) or "a library"
    extra = reader.extra or reader.format
    return (
        f"reading {reader.format} datasets needs {module}, which is not installed: "
        f"pip install 'slhub[{extra}]'"
    )


def _detects(reader: type[EpisodeDataset], path: Path) -> bool:
    """A reader that fails while looking (a damaged header, a foreign file) does not
    recognize the path."""
    try:
        return bool(reader.detect(path))
    except Exception:  # noqa: BLE001 - detection is a question, never an error
        return False


class ArrayEpisodes(EpisodeDataset):
    """Episodes held in memory as arrays: what a generator (the cart-pole, a simulator
    rollout) makes before :func:`slhub.data.write_store` puts it on disk."""

    format = "arrays"

    def __init__(
        self,
        episodes: list[Mapping[str, np.ndarray]],
        *,
        fps: float | None = None,
        names: Mapping[str, tuple[str, ...]] | None = None,
        splits: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        if not episodes:
            raise DatasetError("no episodes given")
        first = episodes[0]
        features = {
            key: Feature(tuple(value.shape[1:]), str(value.dtype), (names or {}).get(key))
            for key, value in first.items()
        }
        lengths = []
        for index, episode in enumerate(episodes):
            if set(episode) != set(first):
                raise DatasetError(f"episode {index} has other features than episode 0")
            steps = {len(v) for v in episode.values()}
            if len(steps) != 1:
                raise DatasetError(f"episode {index}: features of different lengths {steps}")
            for key, value in episode.items():
                spec = features[key]
                if tuple(value.shape[1:]) != spec.shape or str(value.dtype) != spec.dtype:
                    raise DatasetError(
                        f"episode {index}: {key} is {value.dtype} {list(value.shape[1:])} per "
                        f"step, episode 0 has {spec.dtype} {list(spec.shape)}"
                    )
            lengths.append(steps.pop())
        super().__init__(
            path=Path("<memory>"),
            features=features,
            lengths=np.asarray(lengths, dtype=np.int64),
            fps=fps,
            splits=dict(splits or {}),
        )
        self._episodes = [dict(e) for e in episodes]

    @classmethod
    def detect(cls, path: Path) -> bool:
        return False

    @classmethod
    def open(cls, path: Path) -> ArrayEpisodes:
        raise DatasetError("in-memory episodes are made, not opened")

    def read(self, feature: str, episode: int, start: int, stop: int) -> np.ndarray:
        return np.array(self._episodes[episode][feature][start:stop])
