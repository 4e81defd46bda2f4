"""Any readable dataset written as a LeRobot v3.0 dataset, with pyarrow and PyAV (no lerobot).

So that users of LeRobot get their own format back from ``slhub data collect`` (through
``slhub data convert SRC DST --to lerobot``), and slhub's LeRobot reader reads it back:

==============================================  =========================================
file                                            holds
==============================================  =========================================
``meta/info.json``                              the schema: fps, features, paths, totals
``meta/stats.json``                             min, max, mean, std, count and quantiles
                                                per feature (images per channel, in [0, 1])
``meta/tasks.parquet``                          the task strings, as LeRobot's pandas
                                                frame indexed by the task
``meta/episodes/chunk-000/file-000.parquet``    per episode: its tasks, length, row range,
                                                video span
``data/chunk-000/file-000.parquet``             every step's vectors (``float64`` kept
                                                ``float64``: they read back exactly), and
                                                LeRobot's ``timestamp``, ``frame_index``,
                                                ``episode_index``, ``index``, ``task_index``
``videos/<key>/chunk-000/file-000.mp4``         each image feature's frames, the episodes
                                                one after another (``from_timestamp``)
==============================================  =========================================

The fps is the source's, or the one given where the source records none (robomimic,
zarr, Minari, NeRD); a source without one and no fps given is refused before anything
is written. Each step keeps its task where the source records tasks (a LeRobot
dataset, or slhub's store made from one): the tasks are numbered in order of first
appearance, as LeRobot numbers them while recording, and each episode lists its own.
A source without tasks gets one, its folder name (or ``task=``), for every step.

A scalar feature (shape ``()``) is a plain column of shape ``[1]``, as LeRobot writes
one. Video is lossy: H.264 (``libx264``) in ``yuv444p`` (no chroma subsampling, which
at 64 x 64 would smear the colours of thin parts) at :data:`CRF`, a keyframe every
:data:`GOP` frames (LeRobot's ``g=2``: a window decodes from a nearby keyframe) and no
B-frames, so decoded times are the frames' own. Every step goes to one data file and
one video per image feature, however large (LeRobot splits at
``data_files_size_in_mb``; its readers take one file as well). The files are written
under a temporary name and renamed into place (the next write of the same destination
removes one a SIGKILL left: :mod:`slhub.data.temporary`), and the same source gives the
same bytes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from slhub.data.episodes import EpisodeDataset, Feature
from slhub.data.statistics import feature_statistics
from slhub.data.temporary import finish_building, remove_stale, start_building
from slhub.errors import DatasetError

#: LeRobot's codebase version this writer follows.
VERSION = "v3.0"
#: Columns LeRobot adds to every step; a source feature of one of these names is
#: left out (they are made anew from the episode layout and fps).
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")
#: The video codec, its pixel format, quality (x264's constant rate factor: 0 lossless,
#: 18 visually lossless) and keyframe interval.
CODEC = "libx264"
PIX_FMT = "yuv444p"
CRF = 10
GOP = 2
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"


def write_lerobot(
    source: EpisodeDataset,
    destination: str | Path,
    *,
    task: str | None = None,
    fps: float | None = None,
    crf: int = CRF,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Write every episode of ``source`` as a new LeRobot v3.0 dataset at ``destination``.

    :param task: the task string every step gets (default: each step's own where the
        source records tasks, else the source's folder name).
    :param fps: the control rate, for a source that records none (one that does must
        agree with it).
    :param crf: x264's constant rate factor for the videos (lower is closer, larger).
    :param progress: called with the number of steps written after each episode.
    :raises DatasetError: no fps (or one that is not finite and above 0, or that differs
        from the source's), ``destination`` exists, ``source`` has no episodes, or an
        image feature is not 3-channel; all before anything is written.
    """
    destination = Path(destination)
    rate = control_rate(source, fps, "fps=")
    if destination.exists():
        remove_stale(destination)
        raise DatasetError(f"{destination}: exists; convert writes a new directory")
    if source.num_episodes == 0:
        raise DatasetError(f"{source.path}: holds no episodes")
    features = {n: f for n, f in source.features.items() if n not in BOOKKEEPING}
    for name, spec in features.items():
        if spec.is_image and spec.shape[2] != 3:
            raise DatasetError(
                f"{source.path}: image feature {name!r} has {spec.shape[2]} channels; the "
                "LeRobot writer encodes RGB video only"
            )
    building = start_building(destination)  # a dead writer's .DST.tmp-PID goes first
    try:
        _fill(source, features, building, rate, task, crf, progress)
        try:
            finish_building(building, destination)
        except OSError:
            if not destination.is_dir():
                raise
            raise DatasetError(f"{destination}: exists; convert writes a new directory") from None
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return destination


def _fill(
    source: EpisodeDataset,
    features: dict[str, Feature],
    folder: Path,
    fps: float,
    task: str | None,
    crf: int,
    progress: Callable[[int], None] | None,
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tasks, task_index, episode_tasks = _task_table(source, task)
    lengths = [int(n) for n in source.lengths]
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    vectors = [n for n, f in features.items() if not f.is_image]
    images = [n for n, f in features.items() if f.is_image]
    columns: dict[str, list[np.ndarray]] = {name: [] for name in vectors}
    videos = {name: _VideoWriter(folder, name, features[name], fps, crf) for name in images}
    try:
        for episode, length in enumerate(lengths):
            for name in vectors:
                columns[name].append(source.read(name, episode, 0, length))
            for name in images:
                videos[name].write(source.read(name, episode, 0, length))
            if progress is not None:
                progress(int(starts[episode + 1]))
    finally:
        for video in videos.values():
            video.close()
    total = int(starts[-1])
    frame_index = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
    episode_index = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    table: dict[str, Any] = {
        name: _arrow_column(np.concatenate(columns[name]), features[name]) for name in vectors
    }
    table["timestamp"] = pa.array((frame_index / fps).astype(np.float32))
    table["frame_index"] = pa.array(frame_index)
    table["episode_index"] = pa.array(episode_index)
    table["index"] = pa.array(np.arange(total, dtype=np.int64))
    table["task_index"] = pa.array(task_index)
    data = pa.table(table)
    hf = {name: _hf_feature(features[name]) for name in vectors}
    hf["timestamp"] = {"dtype": "float32", "_type": "Value"}
    hf.update({key: {"dtype": "int64", "_type": "Value"} for key in BOOKKEEPING[1:]})
    data = data.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": hf}})})
    _parquet(pq, data, folder / DATA_PATH.format(chunk_index=0, file_index=0))

    episodes: dict[str, Any] = {
        "episode_index": pa.array(np.arange(len(lengths), dtype=np.int64)),
        "tasks": pa.array(episode_tasks, type=pa.list_(pa.string())),
        "length": pa.array(np.asarray(lengths, dtype=np.int64)),
        "data/chunk_index": pa.array(np.zeros(len(lengths), dtype=np.int64)),
        "data/file_index": pa.array(np.zeros(len(lengths), dtype=np.int64)),
        "dataset_from_index": pa.array(starts[:-1]),
        "dataset_to_index": pa.array(starts[1:]),
    }
    for name in images:
        episodes[f"videos/{name}/chunk_index"] = pa.array(np.zeros(len(lengths), dtype=np.int64))
        episodes[f"videos/{name}/file_index"] = pa.array(np.zeros(len(lengths), dtype=np.int64))
        episodes[f"videos/{name}/from_timestamp"] = pa.array(starts[:-1] / fps)
        episodes[f"videos/{name}/to_timestamp"] = pa.array(starts[1:] / fps)
    episodes["meta/episodes/chunk_index"] = pa.array(np.zeros(len(lengths), dtype=np.int64))
    episodes["meta/episodes/file_index"] = pa.array(np.zeros(len(lengths), dtype=np.int64))
    _parquet(pq, pa.table(episodes), folder / "meta/episodes/chunk-000/file-000.parquet")
    _tasks(pa, pq, tasks, folder / "meta/tasks.parquet")

    info_features = {name: _info_feature(features[name], fps) for name in features}
    info_features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for key in BOOKKEEPING[1:]:
        info_features[key] = {"dtype": "int64", "shape": [1], "names": None}
    info = {
        "codebase_version": VERSION,
        "robot_type": None,
        "total_episodes": len(lengths),
        "total_frames": total,
        "total_tasks": len(tasks),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": _number(fps),
        "splits": {"train": f"0:{len(lengths)}", **_ranges(source.splits)},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if images else None,
        "features": info_features,
    }
    _text(folder / "meta/info.json", json.dumps(info, indent=4) + "\n")
    _text(folder / "meta/stats.json", json.dumps(_stats(source, features), indent=4) + "\n")


def control_rate(
    source: EpisodeDataset, fps: float | None, option: str = "fps=", required: bool = True
) -> float | None:
    """The fps to write: ``fps`` where given (finite, above 0, and equal to the source's
    where the source records a usable one), else the source's; None only when neither
    has one and ``required`` is false. ``option`` names the argument in the one-line refusals
    (``--fps`` on the command line)."""
    if fps is not None:
        given = float(fps)
        if not (np.isfinite(given) and given > 0):
            raise DatasetError(
                f"{option} {_number(given)}: give a finite rate above 0 (steps per second)"
            )
    if source.fps is None:
        if fps is None and required:
            raise DatasetError(
                f"{source.path}: this {source.format} dataset records no fps, and a LeRobot "
                f"dataset needs one: give its control rate with {option} HZ"
            )
        return None if fps is None else given
    recorded = float(source.fps)
    if not (np.isfinite(recorded) and recorded > 0):  # unusable: as if it recorded none
        if fps is None and required:
            raise DatasetError(
                f"{source.path}: records fps {source.fps}, and a LeRobot dataset needs one "
                f"above 0: give its control rate with {option} HZ"
            )
        return recorded if fps is None else given
    if fps is not None and not np.isclose(given, recorded, rtol=1e-9, atol=0.0):
        shown = _number(recorded)
        raise DatasetError(
            f"{option} {_number(given)}: {source.path} records fps {shown}; leave {option} out "
            f"or give {shown}"
        )
    return recorded


def _task_table(
    source: EpisodeDataset, task: str | None
) -> tuple[list[str], np.ndarray, list[list[str]]]:
    """Every task string (numbered in order of first appearance, as LeRobot numbers them
    while recording), each step's ``task_index`` and each episode's list of tasks:
    ``task`` for every step where given, else the source's own where it records them,
    else its folder name."""
    table: dict[str, int] = {}
    rows, per_episode = [], []
    for episode, length in enumerate(int(n) for n in source.lengths):
        steps = None if task is not None else source.episode_tasks(episode)
        if steps is None:
            steps = np.full(length, task if task is not None else Path(source.path).name)
        values, first, inverse = np.unique(
            np.asarray(steps).astype(str), return_index=True, return_inverse=True
        )
        order = np.argsort(first, kind="stable")
        codes = np.empty(len(values), dtype=np.int64)
        for at in order:
            codes[at] = table.setdefault(str(values[at]), len(table))
        rows.append(codes[inverse.reshape(-1)])
        per_episode.append([str(values[at]) for at in order])
    return list(table), np.concatenate(rows).astype(np.int64), per_episode


class _VideoWriter:
    """One image feature's mp4: frames appended episode after episode, ``pts`` the
    dataset-wide frame index in a time base of ``1 / fps``."""

    def __init__(self, folder: Path, name: str, spec: Feature, fps: float, crf: int) -> None:
        import av

        path = folder / VIDEO_PATH.format(video_key=name, chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.container = av.open(str(path), "w", format="mp4")
        rate = Fraction(fps).limit_denominator(1_000_000)
        self.stream = self.container.add_stream(CODEC, rate=rate)
        self.stream.height, self.stream.width = spec.shape[0], spec.shape[1]
        self.stream.pix_fmt = PIX_FMT
        self.stream.time_base = 1 / rate
        self.stream.options = {"crf": str(int(crf)), "g": str(GOP), "bf": "0"}
        self.stream.thread_count = 1  # one thread: the same bytes on every machine
        self.frames = 0
        self._av = av

    def write(self, frames: np.ndarray) -> None:
        for pixels in frames:
            frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), "rgb24")
            frame.pts = self.frames
            self.frames += 1
            for packet in self.stream.encode(frame):
                self.container.mux(packet)

    def close(self) -> None:
        for packet in self.stream.encode():
            self.container.mux(packet)
        self.container.close()


def _arrow_column(values: np.ndarray, spec: Feature) -> Any:
    """A scalar column for shape ``()`` (and ``(1,)``), else a fixed-size list per row
    (a feature of more dimensions flattened row-major, its shape in info.json)."""
    import pyarrow as pa

    rows = len(values)
    size = int(np.prod(spec.shape)) if spec.shape else 1
    flat = np.ascontiguousarray(values.reshape(rows, size))
    if spec.shape in ((), (1,)):
        return pa.array(flat[:, 0])
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), size)


def _hf_feature(spec: Feature) -> dict[str, Any]:
    """The Hugging Face ``datasets`` feature LeRobot records in the parquet metadata."""
    value = {"dtype": spec.dtype, "_type": "Value"}
    if spec.shape in ((), (1,)):
        return value
    return {"feature": value, "length": int(np.prod(spec.shape)), "_type": "List"}


def _info_feature(spec: Feature, fps: float) -> dict[str, Any]:
    if spec.is_image:
        height, width, channels = spec.shape
        return {
            "dtype": "video",
            "shape": [height, width, channels],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": height,
                "video.width": width,
                "video.codec": "h264",
                "video.pix_fmt": PIX_FMT,
                "video.is_depth_map": False,
                "video.fps": _number(fps),
                "video.channels": channels,
                "has_audio": False,
            },
        }
    shape = list(spec.shape) or [1]
    names = list(spec.names) if spec.names is not None else None
    return {"dtype": spec.dtype, "shape": shape, "names": names}


def _number(value: float) -> int | float:
    """An integral fps as an int (LeRobot writes ``"fps": 30``)."""
    return int(value) if float(value).is_integer() else float(value)


def _stats(source: EpisodeDataset, features: dict[str, Feature]) -> dict[str, Any]:
    """LeRobot's stats.json: per feature a list per statistic (images ``(C, 1, 1)`` in
    [0, 1], as LeRobot keeps them)."""
    out: dict[str, Any] = {}
    for name, values in feature_statistics(source, list(features)).items():
        spec = features[name]
        entry: dict[str, Any] = {}
        for key, value in values.items():
            array = np.asarray(value, dtype=np.float64)
            if key == "count":
                entry[key] = [int(array.reshape(-1)[0])]
            elif spec.is_image:
                entry[key] = (array / 255.0).reshape(-1, 1, 1).tolist()
            else:
                entry[key] = array.reshape(-1).tolist()
        out[name] = entry
    return out


def _ranges(splits: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """The source's splits that are runs of consecutive episodes, as ``"start:stop"``
    (LeRobot's form; others cannot be written and are left out)."""
    out = {}
    for name, episodes in splits.items():
        runs = list(episodes)
        if runs and runs == list(range(runs[0], runs[-1] + 1)):
            out[str(name)] = f"{runs[0]}:{runs[-1] + 1}"
    return out


def _tasks(pa: Any, pq: Any, tasks: list[str], path: Path) -> None:
    """``tasks.parquet`` as LeRobot writes its frame with pandas (the task strings its
    index, ``task_index`` 0, 1, ... its one column; the schema and pandas metadata of
    lerobot 0.4.4's files), so ``pandas.read_parquet`` gives LeRobot what it expects;
    written without pandas."""
    table = pa.table(
        {
            "task_index": pa.array(np.arange(len(tasks), dtype=np.int64)),
            "__index_level_0__": pa.array(tasks, type=pa.large_string()),
        }
    )
    meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "str",
             "metadata": {"encoding": "UTF-8"}},
        ],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
             "numpy_type": "int64", "metadata": None},
            {"name": None, "field_name": "__index_level_0__", "pandas_type": "object",
             "numpy_type": "str", "metadata": None},
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "3.1.1",
    }  # fmt: skip
    _parquet(pq, table.replace_schema_metadata({"pandas": json.dumps(meta)}), path)


def _parquet(pq: Any, table: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
