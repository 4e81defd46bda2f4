"""Window throughput and per-rank memory of slhub's dataset readers, against h5py by hand.

    OMP_NUM_THREADS=1 python benchmarks/dataset_windows.py                    # 0.2 GiB, both parts
    OMP_NUM_THREADS=1 python benchmarks/dataset_windows.py --part memory --gigabytes 1

A synthetic robot dataset is made deterministically (numpy generators seeded by
``--seed``, the episode and the feature): episodes of 100..300 steps of a state
(``obs/state``, 64 float32), an action (``actions``, 8 float32) and, unless
``--no-image``, an image (``obs/image``, 84x84x3 uint8), as many steps as fill
``--gigabytes`` GiB. It is written

- as slhub's store with ``slhub.data.write_store`` (from ``ArrayEpisodes`` below
  1 GiB; from a streaming dataset that makes each episode when it is read above,
  so the whole dataset is never in memory);
- in robomimic's HDF5 layout with h5py (``data/demo_N/obs/state``, ``obs/image``,
  ``actions``; ``num_samples``; contiguous, uncompressed);
- as a diffusion_policy zarr replay buffer (``data/<key>``, ``meta/episode_ends``;
  zarr format 2, uncompressed; low-dim chunks of 1024 steps, image chunks of 1 step).

**Throughput** (``--part throughput``): the same anchors (drawn once with a
``torch.Generator`` through ``slhub.data.sample_anchors``) and the same padded
window (state, and image, at offsets -1 and 0; action chunk 0..15) are read in
batches of ``--batch`` by every contestant, in rotating order, ``--repeats``
times; medians. Contestants: slhub's ``Window.batch`` over the store, over the
robomimic file (slhub's reader) and over the zarr store; the hand-written baseline
(the robomimic file opened once with h5py, its datasets looked up once, and per
window ``demo[key][start:stop]`` clamped to the episode, indexed and stacked); and,
as a reference for what the store allows, one numpy fancy index per feature and
batch into the memory-mapped arrays (not slhub code). Every contestant's first
batches are checked equal to the store's before timing. The page cache is warm
(the files were just written).

**Memory** (``--part memory``): 1 and then 2 worker processes (multiprocessing
spawn) each open the dataset, read ``--windows`` random windows (image included)
over the whole of it with slhub's ``Window.batch``, wait for each other, and read
``/proc/self/smaps_rollup`` and ``/proc/self/status`` while all are alive: RSS,
PSS (shared pages divided among the processes mapping them), the shared part of
RSS, anonymous memory (the process's own copies), the RSS of the dataset's mapped
files, and the peak RSS (``VmHWM``), next to the RSS before opening (imports only).
For slhub's store and ``--memory-formats`` (default also ``robomimic``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import slhub.data as sd  # noqa: E402
from slhub.data.episodes import EpisodeDataset, Feature  # noqa: E402

STATE, ACTION, IMAGE = "obs/state", "actions", "obs/image"
ZARR_KEYS = {STATE: "state", ACTION: "action", IMAGE: "image"}
SPECS = {
    STATE: Feature((64,), "float32"),
    ACTION: Feature((8,), "float32"),
    IMAGE: Feature((84, 84, 3), "uint8"),
}
FPS = 20.0
MIN_LEN, MAX_LEN = 100, 300
GIB = 2**30


# ------------------------------------------------------------------ the synthetic dataset


def step_bytes(image: bool) -> int:
    names = [STATE, ACTION] + ([IMAGE] if image else [])
    return sum(int(np.prod(SPECS[n].shape)) * np.dtype(SPECS[n].dtype).itemsize for n in names)


def episode_lengths(gigabytes: float, image: bool, seed: int) -> np.ndarray:
    """Episode lengths (100..300 steps) until the dataset holds ``gigabytes`` GiB."""
    target = int(np.ceil(gigabytes * GIB / step_bytes(image)))
    rng = np.random.default_rng([seed, 0])
    lengths: list[int] = []
    total = 0
    while total < target:
        lengths.append(int(rng.integers(MIN_LEN, MAX_LEN + 1)))
        total += lengths[-1]
    return np.asarray(lengths, dtype=np.int64)


def make_feature(name: str, seed: int, episode: int, length: int) -> np.ndarray:
    """One whole episode of one feature: a pure function of (seed, episode, feature)."""
    index = list(SPECS).index(name)
    rng = np.random.default_rng([seed, 1 + episode, index])
    spec = SPECS[name]
    if spec.dtype == "uint8":
        size = length * int(np.prod(spec.shape))
        return np.frombuffer(rng.bytes(size), np.uint8).reshape(length, *spec.shape).copy()
    return rng.standard_normal((length, *spec.shape), dtype=np.float32)


class SyntheticEpisodes(EpisodeDataset):
    """The synthetic dataset, each episode made when it is read (never all in memory)."""

    format = "synthetic"

    def __init__(self, lengths: np.ndarray, image: bool, seed: int) -> None:
        names = [STATE, ACTION] + ([IMAGE] if image else [])
        super().__init__(
            path=Path("<synthetic>"),
            features={n: SPECS[n] for n in names},
            lengths=np.asarray(lengths, dtype=np.int64),
            fps=FPS,
        )
        self.seed = seed

    @classmethod
    def detect(cls, path: Path) -> bool:
        return False

    @classmethod
    def open(cls, path: Path) -> SyntheticEpisodes:
        raise NotImplementedError

    def read(self, feature: str, episode: int, start: int, stop: int) -> np.ndarray:
        whole = make_feature(feature, self.seed, episode, int(self.lengths[episode]))
        return whole[start:stop]


def write_slhub(source: SyntheticEpisodes, destination: Path, gigabytes: float) -> None:
    if gigabytes < 1:
        held = sd.ArrayEpisodes(list(source), fps=source.fps)
        sd.write_store(held, destination)
    else:
        sd.write_store(source, destination)


def write_robomimic(source: SyntheticEpisodes, destination: Path) -> None:
    import h5py

    with h5py.File(destination, "w") as handle:
        data = handle.create_group("data")
        data.attrs["total"] = source.num_steps
        data.attrs["env_args"] = json.dumps(
            {"env_name": "Synthetic", "type": 1, "env_kwargs": {"control_freq": int(FPS)}}
        )
        for episode in range(source.num_episodes):
            demo = data.create_group(f"demo_{episode}")
            demo.attrs["num_samples"] = int(source.lengths[episode])
            for name in source.features:
                demo.create_dataset(name, data=source.read(name, episode, 0, 10**9))


def write_zarr(source: SyntheticEpisodes, destination: Path) -> None:
    import zarr

    root = zarr.open_group(str(destination), mode="w", zarr_format=2)
    data = root.require_group("data")
    meta = root.require_group("meta")
    total = source.num_steps
    arrays = {}
    for name, spec in source.features.items():
        chunk = 1 if spec.is_image else 1024
        arrays[name] = data.create_array(
            ZARR_KEYS[name],
            shape=(total, *spec.shape),
            chunks=(chunk, *spec.shape),
            dtype=spec.dtype,
            compressors=None,
        )
    ends = np.cumsum(source.lengths)
    # Write whole low-dim chunks at once (a partial chunk write reads the chunk back).
    for name, array in arrays.items():
        buffer: list[np.ndarray] = []
        written = held = 0
        for episode in range(source.num_episodes):
            block = source.read(name, episode, 0, int(source.lengths[episode]))
            buffer.append(block)
            held += len(block)
            if held >= 8192 or episode == source.num_episodes - 1:
                array[written : written + held] = np.concatenate(buffer)
                written, held, buffer = written + held, 0, []
    episode_ends = meta.create_array(
        "episode_ends", shape=ends.shape, chunks=ends.shape, dtype="int64", compressors=None
    )
    episode_ends[:] = ends


def build(folder: Path, formats: list[str], gigabytes: float, image: bool, seed: int) -> dict:
    """Write the dataset in every format of ``formats``; their paths and sizes."""
    source = SyntheticEpisodes(episode_lengths(gigabytes, image, seed), image, seed)
    writers = {
        "slhub": (folder / "store", lambda p: write_slhub(source, p, gigabytes)),
        "robomimic": (folder / "demos.hdf5", lambda p: write_robomimic(source, p)),
        "zarr": (folder / "replay.zarr", lambda p: write_zarr(source, p)),
    }
    out = {}
    for fmt in formats:
        path, write = writers[fmt]
        began = time.perf_counter()
        write(path)
        seconds = time.perf_counter() - began
        out[fmt] = {"path": path, "mib": _size(path) / 2**20, "write_s": seconds}
    return {"source": source, "files": out}


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------ throughput


def make_window(image: bool, names: dict[str, str] | None = None) -> sd.Window:
    names = names or {n: n for n in SPECS}
    offsets = {names[STATE]: (-1, 0), names[ACTION]: tuple(range(16))}
    if image:
        offsets[names[IMAGE]] = (-1, 0)
    return sd.Window(offsets, pad=True)


class HandH5:
    """The hand-written baseline: robomimic's layout read with h5py, window by window."""

    def __init__(self, path: Path, offsets: dict[str, tuple[int, ...]]) -> None:
        import h5py

        self.file = h5py.File(path, "r")
        data = self.file["data"]
        demos = sorted(data, key=lambda name: int(name.split("_")[1]))
        self.arrays = [{key: data[demo][key] for key in offsets} for demo in demos]
        self.lengths = [int(data[demo].attrs["num_samples"]) for demo in demos]
        self.offsets = {key: np.asarray(o, dtype=np.int64) for key, o in offsets.items()}

    def batch(self, anchors: np.ndarray) -> dict[str, np.ndarray]:
        out: dict[str, list[np.ndarray]] = {}
        for episode, step in anchors.tolist():
            length, arrays = self.lengths[episode], self.arrays[episode]
            for key, offsets in self.offsets.items():
                wanted = step + offsets
                low = max(int(wanted[0]), 0)
                high = min(int(wanted[-1]) + 1, length)
                block = arrays[key][low:high]
                out.setdefault(key, []).append(block[np.clip(wanted, 0, length - 1) - low])
                out.setdefault(key + "_is_pad", []).append((wanted < 0) | (wanted >= length))
        return {key: np.stack(values) for key, values in out.items()}

    def close(self) -> None:
        self.file.close()


class MemmapGather:
    """Reference (not slhub code): one fancy index per feature and batch into the store's
    memory-mapped arrays, what a batched ``Window.batch`` over the store could do."""

    def __init__(self, store: sd.StoreDataset, window: sd.Window) -> None:
        self.arrays = {key: store._array(key) for key in window.offsets}
        self.starts = store._starts
        self.lengths = store.lengths
        self.offsets = {key: np.asarray(o, dtype=np.int64) for key, o in window.offsets.items()}

    def batch(self, anchors: np.ndarray) -> dict[str, np.ndarray]:
        episodes, steps = anchors[:, 0], anchors[:, 1]
        length = self.lengths[episodes][:, None]
        base = self.starts[episodes][:, None]
        out = {}
        for key, offsets in self.offsets.items():
            wanted = steps[:, None] + offsets[None, :]
            out[key] = self.arrays[key][base + np.clip(wanted, 0, length - 1)]
            out[key + "_is_pad"] = (wanted < 0) | (wanted >= length)
        return out


def _renamed(batch: dict[str, np.ndarray], names: dict[str, str]) -> dict[str, np.ndarray]:
    back = {}
    for key, value in batch.items():
        for ours, theirs in names.items():
            if key == theirs or key == theirs + sd.PAD_SUFFIX:
                key = ours + key[len(theirs) :]
                break
        back[key] = value
    return back


def throughput(files: dict, image: bool, args: argparse.Namespace) -> list[dict]:
    """Windows/s of every contestant, medians over repetitions; one row each."""
    store = sd.open_dataset(files["slhub"]["path"], "slhub")
    robo = sd.open_dataset(files["robomimic"]["path"], "robomimic")
    replay = sd.open_dataset(files["zarr"]["path"], "zarr")
    window = make_window(image)
    zarr_window = make_window(image, ZARR_KEYS)
    generator = __import__("torch").Generator().manual_seed(args.seed)
    anchors = sd.sample_anchors(
        window.anchors(store.lengths), args.batch * args.batches, generator
    ).reshape(args.batches, args.batch, 2)
    hand = HandH5(files["robomimic"]["path"], window.offsets)
    gather = MemmapGather(store, window)
    contestants: dict[str, Callable[[np.ndarray], dict]] = {
        "slhub `Window.batch`, slhub store": lambda a: window.batch(store, a),
        "slhub `Window.batch`, robomimic HDF5 (slhub reader)": lambda a: window.batch(robo, a),
        "slhub `Window.batch`, zarr replay buffer (slhub reader)": lambda a: _renamed(
            zarr_window.batch(replay, a), ZARR_KEYS
        ),
        "h5py by hand, robomimic HDF5 (baseline)": hand.batch,
        "numpy gather on the store's memmaps (reference, not slhub)": gather.batch,
    }
    for name, read in contestants.items():  # the same windows, bit for bit
        for batch in anchors[:3]:
            want, got = window.batch(store, batch), read(batch)
            if set(want) != set(got) or any(not np.array_equal(want[k], got[k]) for k in want):
                raise SystemExit(f"{name}: windows differ from the store's")
    names = list(contestants)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            read = contestants[name]
            began = time.perf_counter()
            for batch in anchors:
                read(batch)
            seconds[name].append(time.perf_counter() - began)
    hand.close()
    for dataset in (store, robo, replay):
        dataset.close()
    windows = args.batch * args.batches
    rows = []
    for name in names:
        rates = [windows / s for s in seconds[name]]
        rows.append({"name": name, "rate": statistics.median(rates), "rates": rates})
    return rows


def print_throughput(rows: list[dict], image: bool, args: argparse.Namespace) -> None:
    what = "state + image" if image else "state only"
    print(
        f"\nWindow throughput, {what}: {args.batches} batches of {args.batch}, "
        f"medians of {args.repeats}"
    )
    hand = next(r["rate"] for r in rows if r["name"].startswith("h5py"))
    print("\n| contestant | windows/s (median) | per repetition | vs h5py by hand |")
    print("|---|---:|---|---:|")
    for row in rows:
        each = ", ".join(f"{r:,.0f}" for r in row["rates"])
        print(f"| {row['name']} | {row['rate']:,.0f} | {each} | {row['rate'] / hand:.2f} |")
    store = rows[0]["rate"]
    print(f"\nratio slhub store / h5py by hand: {store / hand:.2f}", flush=True)


# ------------------------------------------------------------------ memory


def _kib(text: str, key: str) -> int:
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def memory_now(data_path: str) -> dict[str, float]:
    """This process's memory in MiB from /proc (Linux)."""
    rollup = Path("/proc/self/smaps_rollup").read_text()
    status = Path("/proc/self/status").read_text()
    data_rss = 0
    current = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            current = fields[5] if len(fields) > 5 else ""
        elif fields and fields[0] == "Rss:" and current.startswith(data_path):
            data_rss += int(fields[1])
    return {
        "rss": _kib(rollup, "Rss") / 1024,
        "pss": _kib(rollup, "Pss") / 1024,
        "shared": (_kib(rollup, "Shared_Clean") + _kib(rollup, "Shared_Dirty")) / 1024,
        "anon": _kib(rollup, "Anonymous") / 1024,
        "data_rss": data_rss / 1024,
        "peak": _kib(status, "VmHWM") / 1024,
    }


def _worker(fmt, path, windows, batch, seed, rank, barrier, results) -> None:  # noqa: ANN001
    import torch

    before = memory_now(str(path))["rss"]
    dataset = sd.open_dataset(path, fmt)
    names = ZARR_KEYS if fmt == "zarr" else None
    window = make_window(IMAGE in dataset.features or "image" in dataset.features, names)
    generator = torch.Generator().manual_seed(seed + 1000 + rank)
    anchors = sd.sample_anchors(window.anchors(dataset.lengths), windows, generator)
    began = time.perf_counter()
    for at in range(0, windows, batch):
        window.batch(dataset, anchors[at : at + batch])
    rate = windows / (time.perf_counter() - began)
    barrier.wait()  # every worker alive and done reading: PSS divides the shared pages
    record = {"rank": rank, "before": before, "rate": rate, **memory_now(str(path))}
    results.put(record)
    barrier.wait()
    dataset.close()


def memory(files: dict, formats: list[str], args: argparse.Namespace) -> None:
    context = mp.get_context("spawn")
    print(
        f"\nPer-rank memory: each worker reads {args.windows} random windows (state, image "
        "unless --no-image, action chunk) over the whole dataset; MiB"
    )
    print(
        "\n| format | dataset (MiB) | workers | rank | RSS before open | RSS | PSS | shared "
        "| anon | data files RSS | peak RSS | windows/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for fmt in formats:
        info = files[fmt]
        for workers in args.workers:
            barrier, results = context.Barrier(workers), context.Queue()
            procs = [
                context.Process(
                    target=_worker,
                    args=(fmt, info["path"], args.windows, args.batch, args.seed, rank)
                    + (barrier, results),
                )
                for rank in range(workers)
            ]
            for proc in procs:
                proc.start()
            records = sorted((results.get() for _ in procs), key=lambda r: r["rank"])
            for proc in procs:
                proc.join()
                if proc.exitcode != 0:
                    raise SystemExit(f"{fmt}: a worker exited with status {proc.exitcode}")
            for m in records:
                print(
                    f"| {fmt} | {info['mib']:.0f} | {workers} | {m['rank']} | {m['before']:.0f} "
                    f"| {m['rss']:.0f} | {m['pss']:.0f} | {m['shared']:.0f} | {m['anon']:.0f} "
                    f"| {m['data_rss']:.0f} | {m['peak']:.0f} | {m['rate']:,.0f} |",
                    flush=True,
                )


# ------------------------------------------------------------------ driver


def _machine() -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs, load average {load}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gigabytes", type=float, default=0.2, help="dataset size, GiB (0.2)")
    parser.add_argument("--part", default="throughput,memory", help="throughput,memory (both)")
    parser.add_argument("--no-image", action="store_true", help="state and action only")
    parser.add_argument("--batch", type=int, default=32, help="windows per batch (32)")
    parser.add_argument("--batches", type=int, default=300, help="batches per repetition (300)")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions (3)")
    parser.add_argument("--windows", type=int, default=10000, help="windows per worker (10000)")
    parser.add_argument("--workers", default="1,2", help="worker counts of the memory part (1,2)")
    parser.add_argument(
        "--memory-formats", default="slhub,robomimic", help="slhub,robomimic,zarr (slhub,robomimic)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary dir)")
    parser.add_argument("--keep", action="store_true", help="keep the written files")
    args = parser.parse_args(argv)
    args.workers = [int(w) for w in args.workers.split(",")]
    parts = set(args.part.split(","))
    image = not args.no_image
    formats = []
    if "throughput" in parts:
        formats = ["slhub", "robomimic", "zarr"]
    memory_formats = args.memory_formats.split(",")
    if "memory" in parts:
        formats += [f for f in memory_formats if f not in formats]
    folder = Path(tempfile.mkdtemp(prefix="slhub-windows-", dir=args.dir))
    print(f"machine: {_machine()}; data in {folder}")
    try:
        built = build(folder, formats, args.gigabytes, image, args.seed)
        source = built["source"]
        print(
            f"dataset: {source.num_episodes} episodes, {source.num_steps} steps, "
            f"{step_bytes(image)} bytes a step, features {', '.join(source.features)}"
        )
        print("\n| format | on disk (MiB) | write (s) |\n|---|---:|---:|")
        for fmt, info in built["files"].items():
            print(f"| {fmt} | {info['mib']:.0f} | {info['write_s']:.1f} |")
        if "throughput" in parts:
            for with_image in [False, True] if image else [False]:
                rows = throughput(built["files"], with_image, args)
                print_throughput(rows, with_image, args)
        if "memory" in parts:
            memory(built["files"], memory_formats, args)
        print(f"\nmachine at the end: {_machine()}")
    finally:
        if args.keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
