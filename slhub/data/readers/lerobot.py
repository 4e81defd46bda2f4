"""LeRobot datasets (codebase v3.0 and v2.x) read with pyarrow and PyAV, not the lerobot package.

LeRobot keeps vectors in parquet files (v3.0: several episodes per file, located by
the episode metadata's ``dataset_from_index``; v2.x: one file per episode) and cameras
either as PNG bytes in those files or as mp4 videos (v3.0: episodes concatenated in a
file, starting at ``from_timestamp``). Frames are decoded the way LeRobot's PyAV path
does (seek to the keyframe before the first wanted time, decode forward, take the
frame within 1e-4 s of each wanted time ``from_timestamp + timestamp``), so a frame
here equals LeRobot's ``float / 255`` tensor bit for bit. pyarrow and av are imported
inside :meth:`LeRobotDataset.open` and ``read`` so a missing one names the extra.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from slhub.data.episodes import EpisodeDataset, Feature
from slhub.errors import DatasetError, one_line

#: LeRobot's default ``tolerance_s``: a decoded frame must lie this close to the wanted time.
TOLERANCE_S = 1e-4
#: Open parquet files and video containers kept at once (oldest closed first).
MAX_OPEN = 32
#: Decode forward from the current position, rather than seek, when the next wanted time is
#: at most this far ahead (a sequential read; seeking would re-decode from the keyframe).
FORWARD_S = 0.5
#: Decoded frames a video keeps after a read, for the next window that overlaps it.
KEEP = 8
_MEDIA = ("video", "image")
_CHANNELS_FIRST = ("channel", "channels", "c")


@dataclass(frozen=True)
class _Episode:
    """Where one episode lives: its data file and first row there, and per video its file
    and start time inside that file."""

    data_file: Path
    first_row: int
    videos: dict[str, tuple[Path, float]]


@contextmanager
def _reading(path: Path, what: str) -> Iterator[None]:
    """Turn a library's error about ``path`` into one line naming it."""
    import av
    import pyarrow as pa

    try:
        yield
    except DatasetError:
        raise
    except (OSError, ValueError, KeyError, EOFError, pa.ArrowException, av.FFmpegError) as exc:
        raise DatasetError(f"{path}: cannot read {what} ({one_line(exc, limit=200)})") from None


def _names(spec: dict[str, Any], shape: tuple[int, ...]) -> tuple[str, ...] | None:
    """Component names of a vector: a list, or the list(s) inside LeRobot's dict form."""
    names = spec.get("names")
    if isinstance(names, dict):
        names = [n for part in names.values() for n in (part if isinstance(part, list) else [])]
    if not isinstance(names, list) or len(names) != int(np.prod(shape)):
        return None
    return tuple(str(n) for n in names)


def _feature(spec: dict[str, Any]) -> tuple[Feature, str] | None:
    """The contract's feature for one info.json entry and its kind, or None (strings)."""
    shape = tuple(int(n) for n in spec.get("shape", ()))
    dtype = spec.get("dtype")
    if dtype in _MEDIA:
        names = spec.get("names") or []
        if len(shape) == 3 and names and str(names[0]).lower() in _CHANNELS_FIRST:
            shape = (shape[1], shape[2], shape[0])
        return Feature(shape, "uint8"), str(dtype)
    try:
        kind = np.dtype(dtype)
    except TypeError:
        return None
    if kind.kind not in "biuf":
        return None
    return Feature(shape, str(kind), _names(spec, shape)), "vector"


def _required_stats(version: str) -> str:
    """The statistics file every LeRobot dataset of ``version`` holds, written last by
    LeRobot's writers and slhub's: v2.1 and later v2.x ``meta/episodes_stats.jsonl``,
    v2.0 and v3.x ``meta/stats.json``. Without it a dataset is unfinished."""
    major, _, rest = version.lstrip("v").partition(".")
    minor = rest.partition(".")[0]
    later_v2 = major == "2" and minor.isdigit() and int(minor) >= 1
    return "meta/episodes_stats.jsonl" if later_v2 else "meta/stats.json"


def _splits(info: dict[str, Any], positions: dict[int, int]) -> dict[str, tuple[int, ...]]:
    """info.json's ``splits`` (``"start:stop"`` episode indices) as episode positions."""
    out: dict[str, tuple[int, ...]] = {}
    for name, spec in (info.get("splits") or {}).items():
        start, _, stop = str(spec).partition(":")
        if start.isdigit() and stop.isdigit():
            wanted = range(int(start), int(stop))
            out[str(name)] = tuple(positions[e] for e in wanted if e in positions)
    return out


class _Video:
    """One open video file. Reads that move forward (sequential windows) continue decoding
    from where the last one stopped and reuse its last :data:`KEEP` frames; any other read
    seeks to the keyframe before it, as LeRobot does for every read. Both give the same
    frames, since decoding from a keyframe does not depend on where it started."""

    def __init__(self, path: Path) -> None:
        import av
        from av.video.reformatter import VideoReformatter

        self.path = path
        # One converter for every frame: the same conversion as ``frame.to_ndarray(format=)``
        # (LeRobot's), without building a new swscale context per frame (~40x slower).
        self.reformatter = VideoReformatter()
        self.container = av.open(str(path))
        self.stream = self.container.streams.video[0]
        self.time_base = float(self.stream.time_base)
        self._frames: Iterator[Any] | None = None
        self._kept: list[tuple[float, np.ndarray]] = []  # every frame decoded after _floor
        self._floor = -np.inf  # time of the last frame dropped

    def frames(self, times: np.ndarray, pixels: str) -> np.ndarray:
        """The frames nearest ``times`` (seconds, within :data:`TOLERANCE_S`), ``(n, H, W, C)``."""
        low = float(times.min())
        reached = self._kept[-1][0] if self._kept else self._floor
        if self._frames is not None and self._floor < low - TOLERANCE_S <= reached + FORWARD_S:
            found = self._decode(times, pixels)
            if found is not None:
                return found
        self.container.seek(
            int(max(low - 1e-3, 0) / self.time_base),
            stream=self.stream,
            backward=True,
            any_frame=False,
        )
        self._frames, self._kept, self._floor = self.container.decode(self.stream), [], -np.inf
        found = self._decode(times, pixels)
        if found is None:
            stamps = ", ".join(f"{t:.6f}" for t, _ in self._kept[:4]) or "none"
            raise DatasetError(
                f"{self.path}: no video frame within {TOLERANCE_S} s of each of "
                f"{float(times.min()):.6f}..{float(times.max()):.6f} s (decoded near: {stamps})"
            )
        return found

    def _decode(self, times: np.ndarray, pixels: str) -> np.ndarray | None:
        """Decode forward past ``times``; their frames, or None where one is missing."""
        low, high = float(times.min()) - TOLERANCE_S, float(times.max()) + TOLERANCE_S
        while self._kept and self._kept[0][0] < low:
            self._floor = self._kept.pop(0)[0]
        while not self._kept or self._kept[-1][0] <= high:
            frame = next(self._frames, None) if self._frames is not None else None
            if frame is None:
                break
            stamp = frame.pts * self.time_base
            if stamp < low:
                self._floor = stamp
            else:
                rgb = self.reformatter.reformat(frame, format=pixels)
                self._kept.append((stamp, rgb.to_ndarray()))
        if not self._kept:
            return None
        decoded = np.asarray([stamp for stamp, _ in self._kept])
        nearest = np.abs(times[:, None] - decoded[None, :]).argmin(axis=1)
        if (np.abs(decoded[nearest] - times) >= TOLERANCE_S).any():
            return None
        found = np.stack([self._kept[i][1] for i in nearest])
        if len(self._kept) > KEEP:
            self._floor = self._kept[-KEEP - 1][0]
            del self._kept[:-KEEP]
        return found

    def close(self) -> None:
        self.container.close()


@dataclass
class LeRobotDataset(EpisodeDataset):
    """A LeRobot dataset (v3.0 or v2.x) as episodes of vectors and uint8 ``H x W x C`` frames."""

    format: ClassVar[str] = "lerobot"
    extra: ClassVar[str | None] = "lerobot"

    version: str = ""
    #: Task strings by ``task_index`` (not a feature: they are not arrays).
    tasks: tuple[str, ...] = ()
    _kinds: dict[str, str] = field(default_factory=dict, repr=False)
    _episodes: list[_Episode] = field(default_factory=list, repr=False)
    _columns: dict[tuple[Path, str], np.ndarray] = field(default_factory=dict, repr=False)
    _open: dict[Path, Any] = field(default_factory=dict, repr=False)
    #: Per image feature, the last row group read: (file, group, its cells).
    _groups: dict[str, tuple[Path, int, Any]] = field(default_factory=dict, repr=False)
    _pid: int = field(default_factory=os.getpid, repr=False)

    # ------------------------------------------------------------ layout

    @classmethod
    def detect(cls, path: Path) -> bool:
        info = Path(path) / "meta" / "info.json"
        if not info.is_file():
            return False
        try:
            version = json.loads(info.read_text(encoding="utf-8")).get("codebase_version", "")
        except (ValueError, AttributeError):
            return False
        return str(version).startswith(("v2", "v3"))

    @classmethod
    def open(cls, path: Path) -> LeRobotDataset:
        import av  # noqa: F401 - imported here so that a missing library names the extra
        import pyarrow  # noqa: F401

        path = Path(path)
        info_file = path / "meta" / "info.json"
        with _reading(info_file, "LeRobot's info.json"):
            info = json.loads(info_file.read_text(encoding="utf-8"))
            version = str(info["codebase_version"])
            fps = float(info["fps"])
            specs = dict(info["features"])
        if not version.startswith(("v2", "v3")):
            raise DatasetError(f"{info_file}: unsupported LeRobot codebase_version {version!r}")
        required = _required_stats(version)
        if not (path / required).is_file():
            raise DatasetError(
                f"{path}: not a complete LeRobot {version} dataset: {required} is missing (a "
                "convert or recording that did not finish?)"
            )
        ds = cls(path, fps=fps, version=version)
        for name, spec in specs.items():
            found = _feature(spec)
            if found is not None:
                ds.features[name], ds._kinds[name] = found
        videos = [name for name, kind in ds._kinds.items() if kind == "video"]
        v3 = version.startswith("v3")
        listing = path / "meta" / ("episodes" if v3 else "episodes.jsonl")
        indices, lengths = (ds._layout_v3 if v3 else ds._layout_v2)(info, videos)
        ds.lengths = np.asarray(lengths, dtype=np.int64)
        counts = (len(indices), ds.num_steps)
        if counts != (info.get("total_episodes", counts[0]), info.get("total_frames", counts[1])):
            raise DatasetError(
                f"{listing}: lists {counts[0]} episodes of {counts[1]} frames, but info.json says "
                f"{info.get('total_episodes')} of {info.get('total_frames')} (incomplete metadata?)"
            )
        ds.splits = _splits(info, {e: i for i, e in enumerate(indices)})
        ds.tasks = ds._read_tasks()
        return ds

    def _layout_v3(self, info: dict[str, Any], videos: list[str]) -> tuple[list[int], list[int]]:
        """Episodes from ``meta/episodes/chunk-*/file-*.parquet``: lengths and file locations."""
        import pyarrow.parquet as pq

        wanted = ["episode_index", "length", "data/chunk_index", "data/file_index"]
        wanted += ["dataset_from_index"]
        for key in videos:
            wanted += [f"videos/{key}/{c}" for c in ("chunk_index", "file_index", "from_timestamp")]
        rows: list[dict[str, Any]] = []
        files = sorted((self.path / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        if not files:
            raise DatasetError(f"{self.path / 'meta' / 'episodes'}: no episode metadata files")
        for file in files:
            with _reading(file, "LeRobot episode metadata"):
                rows += pq.ParquetFile(file).read(columns=wanted).to_pylist()
        rows.sort(key=lambda row: row["episode_index"])
        first: dict[tuple[int, int], int] = {}
        for row in rows:
            place = (row["data/chunk_index"], row["data/file_index"])
            first[place] = min(
                first.get(place, row["dataset_from_index"]), row["dataset_from_index"]
            )
        for row in rows:
            place = (row["data/chunk_index"], row["data/file_index"])
            data = info["data_path"].format(chunk_index=place[0], file_index=place[1])
            where = {
                key: (
                    self.path
                    / info["video_path"].format(
                        video_key=key,
                        chunk_index=row[f"videos/{key}/chunk_index"],
                        file_index=row[f"videos/{key}/file_index"],
                    ),
                    float(row[f"videos/{key}/from_timestamp"]),
                )
                for key in videos
            }
            first_row = row["dataset_from_index"] - first[place]
            self._episodes.append(_Episode(self.path / data, first_row, where))
        return [row["episode_index"] for row in rows], [row["length"] for row in rows]

    def _layout_v2(self, info: dict[str, Any], videos: list[str]) -> tuple[list[int], list[int]]:
        """Episodes from ``meta/episodes.jsonl``: one data file and one video per episode."""
        listing = self.path / "meta" / "episodes.jsonl"
        with _reading(listing, "LeRobot episode metadata"):
            rows = [json.loads(line) for line in listing.read_text("utf-8").splitlines() if line]
            rows.sort(key=lambda row: row["episode_index"])
            size = int(info.get("chunks_size", 1000))
            for row in rows:
                index = int(row["episode_index"])
                at = {"episode_index": index, "episode_chunk": index // size}
                where = {
                    key: (self.path / info["video_path"].format(video_key=key, **at), 0.0)
                    for key in videos
                }
                data = self.path / info["data_path"].format(**at)
                self._episodes.append(_Episode(data, 0, where))
        return [row["episode_index"] for row in rows], [row["length"] for row in rows]

    def _read_tasks(self) -> tuple[str, ...]:
        """Task strings by index (v3.0 ``tasks.parquet``, v2.x ``tasks.jsonl``), if present."""
        import pyarrow.parquet as pq

        meta = self.path / "meta"
        if (meta / "tasks.parquet").is_file():
            with _reading(meta / "tasks.parquet", "LeRobot tasks"):
                table = pq.read_table(meta / "tasks.parquet").to_pydict()
                text = table.get("task") or table.get("__index_level_0__") or []
                pairs = zip(table["task_index"], text, strict=True)
        elif (meta / "tasks.jsonl").is_file():
            with _reading(meta / "tasks.jsonl", "LeRobot tasks"):
                lines = (meta / "tasks.jsonl").read_text("utf-8").splitlines()
                pairs = ((r["task_index"], r["task"]) for r in map(json.loads, filter(None, lines)))
        else:
            return ()
        return tuple(task for _, task in sorted(pairs))

    # ------------------------------------------------------------ reading

    def episode_tasks(self, episode: int) -> np.ndarray | None:
        """Each step's task string: its ``task_index`` in the task table (None without
        either)."""
        if not self.tasks or "task_index" not in self.features:
            return None
        index = self.read("task_index", episode, 0, int(self.lengths[episode])).reshape(-1)
        bad = index[(index < 0) | (index >= len(self.tasks))]
        if bad.size:
            raise DatasetError(
                f"{self.path}: episode {episode} has task_index {int(bad[0])}, but the task "
                f"table holds {len(self.tasks)} tasks"
            )
        return np.asarray(self.tasks, dtype=object)[index.astype(np.int64)]

    def read(self, feature: str, episode: int, start: int, stop: int) -> np.ndarray:
        spec = self.check_feature(feature, for_what="the read")
        if stop <= start:
            return np.zeros((0, *spec.shape), dtype=spec.dtype)
        where = self._episodes[episode]
        kind = self._kinds[feature]
        if kind == "vector":
            column = self._column(where.data_file, feature, spec)
            rows = column[where.first_row + start : where.first_row + stop]
            return rows.reshape(stop - start, *spec.shape).astype(spec.dtype, copy=False)
        if kind == "image":
            return self._images(where, feature, spec, start, stop)
        video, offset = where.videos[feature]
        if "timestamp" in self._kinds:
            stamps = self.read("timestamp", episode, start, stop).reshape(-1).astype(np.float64)
        else:
            stamps = np.arange(start, stop, dtype=np.float64) / float(self.fps or 1.0)
        with _reading(video, f"video {feature!r}"):
            frames = self._handle(video, _Video).frames(offset + stamps, _pixels(spec))
        return _fit(frames.reshape(len(frames), *frames.shape[1:3], -1), spec, video)

    def _column(self, file: Path, name: str, spec: Feature) -> np.ndarray:
        """One vector column of one data file, read once and kept (vectors are small)."""
        key = (file, name)
        if key not in self._columns:
            with _reading(file, f"column {name!r}"):
                table = self._handle(file, _parquet).read(columns=[name])
                column = table.column(name).combine_chunks()
                while hasattr(column, "flatten") and hasattr(column.type, "value_type"):
                    column = column.flatten()
                flat = np.asarray(column.to_numpy(zero_copy_only=False))
                self._columns[key] = flat.reshape(table.num_rows, *spec.shape)
        return self._columns[key]

    def _images(
        self, where: _Episode, name: str, spec: Feature, start: int, stop: int
    ) -> np.ndarray:
        """PNG (or other still) frames of rows ``start .. stop - 1``, read by row group (the
        last one kept per feature, since windows mostly stay inside one episode's group)."""
        file, low, high = where.data_file, where.first_row + start, where.first_row + stop
        out = np.empty((stop - start, *spec.shape), dtype=np.uint8)
        with _reading(file, f"image column {name!r}"):
            parquet = self._handle(file, _parquet)
            begin = 0
            for group in range(parquet.metadata.num_row_groups):
                end = begin + parquet.metadata.row_group(group).num_rows
                if end > low and begin < high:
                    cells = self._group(parquet, file, group, name)
                    first, last = max(low, begin), min(high, end)
                    for row, cell in enumerate(cells[first - begin : last - begin].to_pylist()):
                        data = cell["bytes"] or (self.path / cell["path"]).read_bytes()
                        out[first - low + row] = _still(data, spec, file)
                begin = end
        return out

    def _group(self, parquet: Any, file: Path, group: int, name: str) -> Any:
        """One row group's cells of an image column (the previous read's, when the same)."""
        held = self._groups.get(name)
        if held is None or held[:2] != (file, group):
            held = (file, group, parquet.read_row_group(group, columns=[name]).column(name))
            self._groups[name] = held
        return held[2]

    def _handle(self, file: Path, opener: Any) -> Any:
        """The open parquet file or video container for ``file`` (reopened after a fork, since
        a forked worker must not share the parent's file offsets)."""
        if self._pid != os.getpid():
            self._open, self._pid = {}, os.getpid()
        if file not in self._open:
            if len(self._open) >= MAX_OPEN:
                self._open.pop(next(iter(self._open))).close()
            self._open[file] = opener(file)
        return self._open[file]

    def close(self) -> None:
        self._groups.clear()
        while self._open:
            self._open.popitem()[1].close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for data-loader workers without open files (each reopens its own)."""
        state = dict(self.__dict__)
        state["_open"], state["_groups"] = {}, {}
        return state


def _parquet(file: Path) -> Any:
    import pyarrow.parquet as pq

    return pq.ParquetFile(file)


def _pixels(spec: Feature) -> str:
    """PyAV's pixel format for a feature's channel count."""
    return {1: "gray", 3: "rgb24", 4: "rgba"}[spec.shape[-1]]


def _still(data: bytes, spec: Feature, file: Path) -> np.ndarray:
    """One encoded still (LeRobot writes PNG) decoded with PyAV, ``H x W x C`` uint8."""
    import av

    with av.open(io.BytesIO(data)) as still:
        frame = next(still.decode(video=0), None)
    if frame is None:
        raise DatasetError(f"{file}: an image cell holds no frame")
    pixels = frame.to_ndarray(format=_pixels(spec))
    return _fit(pixels.reshape(*pixels.shape[:2], -1), spec, file)


def _fit(frames: np.ndarray, spec: Feature, file: Path) -> np.ndarray:
    """``frames`` when each has the feature's shape, else one line naming the file."""
    if frames.shape[-3:] != spec.shape:
        raise DatasetError(
            f"{file}: frames of shape {frames.shape[-3:]}, but info.json says {spec.shape}"
        )
    return frames
