"""diffusion_policy's replay buffer in zarr: ``data/<key>`` and ``meta/episode_ends``.

The layout (``diffusion_policy/common/replay_buffer.py``) concatenates every
episode along axis 0 of each array under ``data/`` and records each episode's
exclusive end row in ``meta/episode_ends``. So an episode is a row range, and a
read slices only the rows (hence only the chunks) it needs.

zarr 3's library reads both zarr format 2 (``.zgroup``/``.zarray``, what
diffusion_policy wrote with zarr 2) and format 3 (``zarr.json``) stores, from a
directory or from a ``.zarr.zip`` (diffusion_policy's ``ZipStore`` exports).

Chunks that are absent from the store read as the array's fill value: zarr
itself allows that (zarr 3 skips writing all-fill chunks by default), so a
missing chunk cannot be told from an empty one and is not reported. A chunk that
is present but does not decode is a :class:`~slhub.errors.DatasetError`.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from slhub.data.episodes import EpisodeDataset, Feature, missing_library
from slhub.errors import DatasetError, one_line

#: Entries whose presence marks ``meta/episode_ends`` as a zarr array (format 2, 3).
_ENDS_MARKERS = ("meta/episode_ends/.zarray", "meta/episode_ends/zarr.json")
_ROOT_MARKERS = (".zgroup", "zarr.json")


def _is_zip(path: Path) -> bool:
    return path.is_file() and path.name.endswith(".zip") and zipfile.is_zipfile(path)


@dataclass
class ReplayZarrDataset(EpisodeDataset):
    """A diffusion_policy ``ReplayBuffer`` store; features are the arrays of ``data/``."""

    format: ClassVar[str] = "zarr"
    extra: ClassVar[str | None] = "zarr"

    #: Row where each episode starts in every ``data/`` array (int64, one per episode).
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: The opened ``data`` group, its arrays (opening one reads its metadata, so each is
    #: opened once) and the process that opened them: a zip store's file handle must not
    #: be shared with forked loader workers, so each process reopens.
    _group: Any = field(default=None, repr=False, compare=False)
    _arrays: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    _pid: int | None = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------ detection

    @classmethod
    def detect(cls, path: Path) -> bool:
        """A zarr group (directory or ``.zip``) holding ``meta/episode_ends``."""
        try:
            import zarr  # noqa: F401 - without zarr this reader cannot claim anything
        except ImportError:
            return False
        path = Path(path)
        if path.is_dir():
            return any((path / m).is_file() for m in _ROOT_MARKERS) and any(
                (path / m).is_file() for m in _ENDS_MARKERS
            )
        if _is_zip(path):
            try:
                with zipfile.ZipFile(path) as archive:
                    names = set(archive.namelist())
            except (OSError, zipfile.BadZipFile):
                return False
            return any(m in names for m in _ROOT_MARKERS) and any(m in names for m in _ENDS_MARKERS)
        return False

    # ------------------------------------------------------------ opening

    @classmethod
    def open(cls, path: Path) -> ReplayZarrDataset:
        """Read the array shapes and ``meta/episode_ends``; no data rows. Without zarr,
        one line naming the extra (also when called directly, not via open_dataset)."""
        try:
            return cls._open(Path(path))
        except ImportError as exc:
            raise DatasetError(missing_library(cls, exc)) from None

    @classmethod
    def _open(cls, path: Path) -> ReplayZarrDataset:
        import zarr  # noqa: F401 - imported first, so a missing zarr is the line above

        root = _open_root(path)
        try:
            data, meta = root["data"], root["meta"]
            ends = np.asarray(meta["episode_ends"][:], dtype=np.int64).reshape(-1)
            arrays = {name: data[name] for name in sorted(data.array_keys())}
        except KeyError as exc:
            raise DatasetError(
                f"{path}: not a replay buffer: no {one_line(exc)} (needs data/<key> and "
                "meta/episode_ends)"
            ) from None
        except Exception as exc:  # noqa: BLE001 - a damaged store is one line naming it
            raise DatasetError(f"{path}: damaged zarr store ({one_line(exc, limit=200)})") from None
        if not arrays:
            raise DatasetError(f"{path}: no arrays under data/")
        starts = np.concatenate([[0], ends])[:-1].astype(np.int64)
        lengths = ends - starts
        if (lengths < 0).any():
            raise DatasetError(f"{path}: meta/episode_ends decreases: {ends.tolist()}")
        total = int(ends[-1]) if ends.size else 0
        features: dict[str, Feature] = {}
        for name, array in arrays.items():
            if len(array.shape) == 0 or array.shape[0] < total:
                raise DatasetError(
                    f"{path}: data/{name} has shape {tuple(array.shape)}, fewer rows than "
                    f"meta/episode_ends[-1] = {total}"
                )
            features[name] = Feature(tuple(int(n) for n in array.shape[1:]), str(array.dtype))
        return cls(
            path=path,
            features=features,
            lengths=lengths,
            starts=starts,
            _group=root["data"],
            _arrays=arrays,
            _pid=os.getpid(),
        )

    # ------------------------------------------------------------ reading

    def read(self, feature: str, episode: int, start: int, stop: int) -> np.ndarray:
        spec = self.check_feature(feature, for_what="a read")
        self.check_range(episode, start, stop)
        first = int(self.starts[episode])
        try:
            rows = self._array(feature)[first + start : first + stop]
        except Exception as exc:  # noqa: BLE001 - a chunk that fails to decode is one line
            raise DatasetError(
                f"{self.path}: cannot read data/{feature} rows {first + start}..{first + stop - 1} "
                f"(episode {episode}): {one_line(exc, limit=200)}"
            ) from None
        return np.asarray(rows, dtype=spec.dtype).reshape((stop - start, *spec.shape))

    def read_rows(self, feature: str, episodes: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Every row of a batch in one orthogonal selection: one round trip through zarr's
        event loop per feature and batch instead of one per window."""
        spec = self.check_feature(feature, for_what="a read")
        episodes = np.asarray(episodes, dtype=np.int64).reshape(-1)
        steps = np.asarray(steps, dtype=np.int64).reshape(-1)
        lengths = self.lengths[episodes]
        if ((steps < 0) | (steps >= lengths)).any():
            raise DatasetError(f"{self.path}: a step outside its episode was asked for")
        rows = self.starts[episodes] + steps
        unique, inverse = np.unique(rows, return_inverse=True)  # zarr wants ascending rows
        try:
            values = self._array(feature).get_orthogonal_selection((unique,))
        except Exception as exc:  # noqa: BLE001 - a chunk that fails to decode is one line
            raise DatasetError(
                f"{self.path}: cannot read data/{feature} ({one_line(exc, limit=200)})"
            ) from None
        values = np.asarray(values, dtype=spec.dtype).reshape((len(unique), *spec.shape))
        return values[inverse.reshape(-1)]

    def _array(self, name: str) -> Any:
        if self._group is None or self._pid != os.getpid():
            self._group, self._arrays = _open_root(self.path)["data"], {}
            self._pid = os.getpid()
        if name not in self._arrays:
            self._arrays[name] = self._group[name]
        return self._arrays[name]

    def close(self) -> None:
        group, self._group, self._arrays = self._group, None, {}
        store = getattr(group, "store", None)
        if store is not None and hasattr(store, "close") and self._pid == os.getpid():
            store.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without the open group (spawned workers reopen the store)."""
        state = dict(self.__dict__)
        state["_group"], state["_arrays"], state["_pid"] = None, {}, None
        return state


def _open_root(path: Path) -> Any:
    """The root group, read-only, of a directory store or a ``.zip`` store."""
    import zarr

    try:
        if _is_zip(path):
            return zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r")
        return zarr.open_group(str(path), mode="r")
    except ImportError:
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable metadata is one line naming the path
        raise DatasetError(
            f"{path}: not a readable zarr group ({one_line(exc, limit=200)})"
        ) from None
