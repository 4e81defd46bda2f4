"""Minari datasets (Farama), both storage backends: HDF5 (h5py) and Arrow (pyarrow).

Where the dataset is. Minari keeps dataset ``<namespace>/<name>-v<N>`` at
``$MINARI_DATASETS_PATH/<namespace>/<name>-v<N>/data/``. The path given may be that
``data/`` folder, the dataset folder above it, or a ``MINARI_DATASETS_PATH``-style
root holding exactly one dataset (found by walking for ``data/metadata.json``;
several are refused, listing them, since silently picking one would train on the
wrong data).

Storage. HDF5: ``data/main_data.hdf5`` with one group ``episode_<id>`` per
episode. Arrow: ``data/<id>/part-<k>.arrow`` per episode (IPC file or stream;
the magic bytes tell which), with T+1 rows where the last row of every field but
the observations is filler. Episodes are ordered by id.

Observations. Minari records T+1 observations for T steps (the last is the
observation after the final step). A step-indexed contract cannot hold T+1 rows,
so the reader exposes two features over the same stored rows:
``observations`` (steps 0..T-1, the observation each action was taken in) and
``next_observations`` (steps 1..T, the observation each step led to), the
robomimic/D4RL convention, so no observation is lost and a window never reads
another episode. ``actions``, ``rewards``, ``terminations`` and ``truncations``
are per step (rewards and flags are scalars, shape ``()``); an episode's length is
its number of actions. Dict/Tuple observation (or action) spaces are flattened to
``observations/<key>`` (``next_observations/<key>``). ``infos`` are not exposed:
they are optional in Minari, ragged in practice, and not training inputs.
"""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from slhub.data.episodes import EpisodeDataset, Feature, missing_library
from slhub.data.hdf5_file import damaged_hdf5
from slhub.errors import DatasetError, one_line

HDF5_FILE = "main_data.hdf5"
METADATA = "metadata.json"
OBSERVATIONS = "observations"
NEXT_OBSERVATIONS = "next_observations"
#: Fields with T+1 stored rows (the rest have T, or T+1 with a filler row in Arrow).
_WITH_FINAL = (OBSERVATIONS,)
_SKIPPED = ("infos",)
#: How deep a root is searched for datasets (namespaces may nest).
_MAX_DEPTH = 8
#: Arrow episode tables kept memory-mapped per process (each holds a file descriptor).
_ARROW_CACHE = 32
_ARROW_FILE_MAGIC = b"ARROW1"
_EPISODE_GROUP = re.compile(r"episode_(\d+)")
_PART = re.compile(r"part-(\d+)\.arrow")


@dataclass(frozen=True)
class _Source:
    """Where a feature's rows are stored: a field path in the episode and a row shift
    (1 for ``next_observations``: step t is stored row t + 1)."""

    column: tuple[str, ...]
    shift: int = 0


@dataclass
class MinariDataset(EpisodeDataset):
    """A Minari dataset read straight from its storage, without minari or gymnasium."""

    format: ClassVar[str] = "minari"
    extra: ClassVar[str | None] = "minari"

    #: ``hdf5`` or ``arrow``.
    backend: str = ""
    #: The dataset's ``data/`` folder.
    data_dir: Path | None = None
    #: Minari's id of each episode, in reading order (ascending).
    episode_ids: tuple[int, ...] = ()
    #: ``metadata.json`` (dataset_id, spaces, env_spec, ...) where present.
    metadata: dict[str, Any] = field(default_factory=dict)
    _sources: dict[str, _Source] = field(default_factory=dict, repr=False)
    #: Open handles and the process that opened them: h5py and memory-mapped files
    #: must not be shared with forked loader workers, so each process reopens.
    _h5: Any = field(default=None, repr=False, compare=False)
    _tables: OrderedDict[int, Any] = field(default_factory=OrderedDict, repr=False, compare=False)
    _pid: int | None = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------ detection

    @classmethod
    def detect(cls, path: Path) -> bool:
        """A Minari ``data/`` folder (or its ``main_data.hdf5``), a dataset folder, or a
        root holding datasets, whose backend's library (h5py, pyarrow) is installed."""
        found = _find(Path(path))
        if not found:
            return False
        try:
            if _backend(found[0]) == "hdf5":
                import h5py  # noqa: F401
            else:
                import pyarrow  # noqa: F401
        except (ImportError, DatasetError):
            return False
        return True

    # ------------------------------------------------------------ opening

    @classmethod
    def open(cls, path: Path) -> MinariDataset:
        """Locate the dataset, read its metadata and every episode's field shapes. Without
        the backend's library, one line naming the extra (also when called directly)."""
        try:
            return cls._open(Path(path))
        except ImportError as exc:
            raise DatasetError(missing_library(cls, exc)) from None

    @classmethod
    def _open(cls, path: Path) -> MinariDataset:
        found = _find(path)
        if not found:
            raise DatasetError(
                f"{path}: no Minari dataset here (looked for data/{METADATA} or data/{HDF5_FILE})"
            )
        if len(found) > 1:
            names = ", ".join(str(d.parent.relative_to(path)) for d in found[:20])
            more = f" and {len(found) - 20} more" if len(found) > 20 else ""
            raise DatasetError(
                f"{path}: holds {len(found)} Minari datasets ({names}{more}); give the path of one"
            )
        data_dir = found[0]
        metadata = _metadata(data_dir)
        backend = _backend(data_dir)
        if backend == "hdf5":
            ids, features, sources, lengths = _layout_hdf5(data_dir)
        elif backend == "arrow":
            ids, features, sources, lengths = _layout_arrow(data_dir, metadata)
        else:
            raise DatasetError(f"{data_dir}: unknown Minari data_format {backend!r}")
        return cls(
            path=path,
            features=features,
            lengths=np.asarray(lengths, dtype=np.int64),
            backend=backend,
            data_dir=data_dir,
            episode_ids=tuple(ids),
            metadata=metadata,
            _sources=sources,
        )

    # ------------------------------------------------------------ reading

    def read(self, feature: str, episode: int, start: int, stop: int) -> np.ndarray:
        spec = self.check_feature(feature, for_what="a read")
        self.check_range(episode, start, stop)
        source = self._sources[feature]
        first, count = start + source.shift, stop - start
        episode_id = self.episode_ids[episode]
        where = self._where(episode_id)
        try:
            if self.backend == "hdf5":
                name = "/".join((f"episode_{episode_id}", *source.column))
                rows = np.asarray(self._hdf5()[name][first : first + count])
            else:
                rows = _column(self._table(episode_id), source.column, first, count, spec)
        except DatasetError:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged file is one line naming it
            raise DatasetError(
                f"{where}: cannot read {feature} steps {start}..{stop - 1} of episode "
                f"{episode_id}: {one_line(exc, limit=200)}"
            ) from None
        return rows.astype(spec.dtype, copy=False).reshape((count, *spec.shape))

    def _where(self, episode_id: int) -> Path:
        assert self.data_dir is not None
        return self.data_dir / (HDF5_FILE if self.backend == "hdf5" else str(episode_id))

    def _own(self) -> None:
        """Drop handles opened by another process (a forked worker reopens its own)."""
        if self._pid != os.getpid():
            self._h5, self._tables, self._pid = None, OrderedDict(), os.getpid()

    def _hdf5(self) -> Any:
        import h5py

        self._own()
        if self._h5 is None:
            assert self.data_dir is not None
            self._h5 = h5py.File(self.data_dir / HDF5_FILE, "r")
        return self._h5

    def _table(self, episode_id: int) -> Any:
        self._own()
        table = self._tables.pop(episode_id, None)
        if table is None:
            assert self.data_dir is not None
            table = _read_arrow_episode(self.data_dir / str(episode_id))
        self._tables[episode_id] = table
        while len(self._tables) > _ARROW_CACHE:
            self._tables.popitem(last=False)
        return table

    def close(self) -> None:
        if self._h5 is not None and self._pid == os.getpid():
            self._h5.close()
        self._h5, self._tables = None, OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without open handles (spawned workers reopen the files)."""
        state = dict(self.__dict__)
        state["_h5"], state["_tables"], state["_pid"] = None, OrderedDict(), None
        return state


# ---------------------------------------------------------------- locating


def _is_data_dir(path: Path) -> bool:
    if (path / HDF5_FILE).is_file():
        return True
    try:
        return "data_format" in _metadata(path)
    except DatasetError:
        return False


def _backend(data_dir: Path) -> str:
    """``hdf5`` or ``arrow``: metadata's ``data_format``, else what the files say."""
    backend = str(_metadata(data_dir).get("data_format") or "")
    return backend or ("hdf5" if (data_dir / HDF5_FILE).is_file() else "arrow")


def _find(path: Path) -> list[Path]:
    """The ``data/`` folders of the datasets at ``path`` (sorted)."""
    if path.is_file():
        return [path.parent] if path.name == HDF5_FILE and _is_data_dir(path.parent) else []
    if not path.is_dir():
        return []
    if path.name == "data" and _is_data_dir(path):
        return [path]
    if _is_data_dir(path / "data"):
        return [path / "data"]
    found: list[Path] = []
    for top, dirs, _files in os.walk(path):
        here = Path(top)
        depth = len(here.relative_to(path).parts)
        keep = []
        for name in sorted(dirs):
            if name.startswith(".") or depth >= _MAX_DEPTH:
                continue
            if name == "data":
                if _is_data_dir(here / name):
                    found.append(here / name)
                continue  # a data/ folder is a leaf: never search inside one
            keep.append(name)
        dirs[:] = keep
    return sorted(found)


def _metadata(data_dir: Path) -> dict[str, Any]:
    file = data_dir / METADATA
    if not file.is_file():
        return {}
    try:
        loaded = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DatasetError(f"{file}: unreadable Minari metadata ({one_line(exc)})") from None
    if not isinstance(loaded, dict):
        raise DatasetError(f"{file}: Minari metadata is not a JSON object")
    return loaded


def _features_from(
    fields: dict[tuple[str, ...], tuple[tuple[int, ...], str]],
) -> tuple[dict[str, Feature], dict[str, _Source]]:
    """Features (and where each is stored) from stored fields: column -> (shape, dtype)."""
    features: dict[str, Feature] = {}
    sources: dict[str, _Source] = {}
    for column, (shape, dtype) in sorted(fields.items()):
        name = "/".join(column)
        features[name] = Feature(shape, dtype)
        sources[name] = _Source(column)
        if column[0] in _WITH_FINAL:
            following = "/".join((NEXT_OBSERVATIONS, *column[1:]))
            features[following] = Feature(shape, dtype)
            sources[following] = _Source(column, shift=1)
    return features, sources


# ---------------------------------------------------------------- HDF5 backend


def _layout_hdf5(
    data_dir: Path,
) -> tuple[list[int], dict[str, Feature], dict[str, _Source], list[int]]:
    import h5py

    file = data_dir / HDF5_FILE
    try:
        handle = h5py.File(file, "r")
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file is one line
        raise DatasetError(damaged_hdf5(file, exc)) from None
    try:
        with handle as h5:
            ids = sorted(int(m.group(1)) for k in h5 if (m := _EPISODE_GROUP.fullmatch(k)))
            if not ids:
                raise DatasetError(f"{file}: no episode_<id> groups")
            reference: dict[tuple[str, ...], tuple[tuple[int, ...], str]] | None = None
            lengths = []
            for episode_id in ids:
                group = h5[f"episode_{episode_id}"]
                fields, rows = _hdf5_fields(group)
                length = _check_rows(file, episode_id, rows)
                per_step = {col: (shape[1:], dtype) for col, (shape, dtype) in fields.items()}
                if reference is None:
                    reference = per_step
                elif per_step != reference:
                    raise DatasetError(
                        f"{file}: episode_{episode_id}'s fields differ from episode_{ids[0]}'s"
                    )
                lengths.append(length)
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file is one line
        raise DatasetError(f"{file}: not a readable Minari HDF5 file ({one_line(exc)})") from None
    assert reference is not None
    return (ids, *_features_from(reference), lengths)


def _hdf5_fields(
    group: Any,
) -> tuple[dict[tuple[str, ...], tuple[tuple[int, ...], str]], dict[tuple[str, ...], int]]:
    import h5py

    fields: dict[tuple[str, ...], tuple[tuple[int, ...], str]] = {}

    def visit(name: str, node: Any) -> None:
        column = tuple(name.split("/"))
        if column[0] not in _SKIPPED and isinstance(node, h5py.Dataset):
            fields[column] = (tuple(int(n) for n in node.shape), str(node.dtype))

    group.visititems(visit)
    rows = {col: shape[0] if shape else -1 for col, (shape, _) in fields.items()}
    return fields, rows


def _check_rows(where: Path, episode_id: int, rows: dict[tuple[str, ...], int]) -> int:
    """The episode's length T, checking observations have T + 1 rows and the rest T."""
    actions = next((n for col, n in sorted(rows.items()) if col[0] == "actions"), None)
    if actions is None:
        raise DatasetError(f"{where}: episode {episode_id} has no actions")
    for column, count in rows.items():
        want = actions + 1 if column[0] in _WITH_FINAL else actions
        if count != want:
            raise DatasetError(
                f"{where}: episode {episode_id}'s {'/'.join(column)} has {count} rows, "
                f"expected {want} for {actions} actions"
            )
    return actions


# ---------------------------------------------------------------- Arrow backend


def _episode_dirs(data_dir: Path) -> list[tuple[int, Path]]:
    dirs = [(int(p.name), p) for p in data_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(dirs)


def _read_arrow_episode(episode_dir: Path) -> Any:
    """The episode's table, memory-mapped (zero copy) from its IPC file(s) or stream(s)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    parts = sorted(
        (int(m.group(1)), p) for p in episode_dir.iterdir() if (m := _PART.fullmatch(p.name))
    )
    if not parts:
        raise DatasetError(f"{episode_dir}: no part-<k>.arrow file")
    tables = []
    for _, part in parts:
        try:
            source = pa.memory_map(str(part), "r")
            is_file = source.read(len(_ARROW_FILE_MAGIC)) == _ARROW_FILE_MAGIC
            source.seek(0)
            reader = ipc.open_file(source) if is_file else ipc.open_stream(source)
            tables.append(reader.read_all())
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign file is one line
            raise DatasetError(f"{part}: not a readable Arrow IPC file ({one_line(exc)})") from None
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def _layout_arrow(
    data_dir: Path, metadata: dict[str, Any]
) -> tuple[list[int], dict[str, Feature], dict[str, _Source], list[int]]:
    episodes = _episode_dirs(data_dir)
    if not episodes:
        raise DatasetError(f"{data_dir}: no episode folders <id>/part-0.arrow")
    spaces = {
        OBSERVATIONS: _space_shape(metadata.get("observation_space")),
        "actions": _space_shape(metadata.get("action_space")),
    }
    reference: dict[tuple[str, ...], tuple[tuple[int, ...], str]] | None = None
    lengths = []
    for episode_id, episode_dir in episodes:
        table = _read_arrow_episode(episode_dir)
        fields = {}
        for name in table.column_names:
            if name not in _SKIPPED:
                fields.update(_arrow_fields((name,), table.schema.field(name).type, spaces))
        if reference is None:
            reference = fields
        elif fields != reference:
            raise DatasetError(
                f"{episode_dir}: episode {episode_id}'s fields differ from episode "
                f"{episodes[0][0]}'s"
            )
        if not any(col[0] == "actions" for col in fields):
            raise DatasetError(f"{episode_dir}: episode {episode_id} has no actions")
        if table.num_rows < 1:
            raise DatasetError(f"{episode_dir}: episode {episode_id} has no rows")
        lengths.append(table.num_rows - 1)  # T + 1 rows: the final observation's
    assert reference is not None
    return ([i for i, _ in episodes], *_features_from(reference), lengths)


def _space_shape(serialized: Any) -> tuple[int, ...] | None:
    """A Box space's shape from Minari's serialized space (JSON text), else None."""
    try:
        space = json.loads(serialized) if isinstance(serialized, str) else serialized
        if isinstance(space, dict) and space.get("type") == "Box":
            return tuple(int(n) for n in space["shape"])
    except (ValueError, TypeError, KeyError):
        pass
    return None


def _arrow_fields(
    column: tuple[str, ...], kind: Any, spaces: dict[str, tuple[int, ...] | None]
) -> dict[tuple[str, ...], tuple[tuple[int, ...], str]]:
    """Stored fields of one Arrow column: a struct (Dict/Tuple space) is one per member;
    fixed-size lists (Box spaces) are flattened, reshaped to the space's shape when known."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        out = {}
        for index in range(kind.num_fields):
            member = kind.field(index)
            out.update(_arrow_fields((*column, member.name), member.type, {}))
        return out
    size, listed = 1, False
    while pa.types.is_fixed_size_list(kind):
        size, listed = size * kind.list_size, True
        kind = kind.value_type
    if pa.types.is_nested(kind) or pa.types.is_binary(kind) or pa.types.is_string(kind):
        raise DatasetError(
            f"Minari Arrow column {'/'.join(column)} of type {kind} is not supported "
            "(numeric and fixed-size list columns are)"
        )
    declared = spaces.get(column[0]) if len(column) == 1 else None
    if declared is not None and int(np.prod(declared)) == size:
        shape = declared
    else:
        shape = (size,) if listed else ()
    return {column: (shape, str(np.dtype(kind.to_pandas_dtype())))}


def _column(table: Any, column: tuple[str, ...], first: int, count: int, spec: Feature) -> Any:
    """Rows ``first .. first + count - 1`` of a (possibly nested) column as numpy."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = table.column(column[0]).slice(first, count).combine_chunks()
    for member in column[1:]:
        values = pc.struct_field(values, member)  # honours the slice's offset
    while pa.types.is_fixed_size_list(values.type):
        values = values.flatten()
    return values.to_numpy(zero_copy_only=False).reshape((count, *spec.shape))
