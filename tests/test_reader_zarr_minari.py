"""The zarr replay-buffer and Minari readers against what the formats' own readers returned.

``oracle/replay_zarr.npz`` / ``replay_v3_zarr.npz`` hold every ``data/<key>`` array and
``meta/episode_ends`` as zarr 2.18.7 / 3.1.6 read them; our episodes, concatenated, must
equal them element for element. ``oracle/minari_*.npz`` hold what minari 0.5.4's
``iterate_episodes()`` returned: observations with T + 1 rows, which our reader splits
into ``observations`` (steps 0..T-1) and ``next_observations`` (steps 1..T), so
``observations`` followed by the last ``next_observations`` row must equal them.
"""

from __future__ import annotations

import importlib
import pickle
import re
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from helpers import DATASETS, assert_exact, one_line_naming, oracle
from slhub.data.episodes import EpisodeDataset, open_dataset, readers
from slhub.data.readers.minari import MinariDataset
from slhub.data.readers.replay_zarr import ReplayZarrDataset
from slhub.data.windows import Window
from slhub.errors import DatasetError

ROOT = Path(__file__).parent.parent
DATA = DATASETS
LENGTHS = [50, 47, 23, 45]
ZARR = {"replay.zarr": "replay_zarr", "replay_v3.zarr": "replay_v3_zarr"}
MINARI = {"minari_hdf5": "hdf5", "minari_arrow": "arrow"}
DATASET_ID = Path("ref", "hopper", "uniform-v0")
MINARI_FIELDS = ("actions", "rewards", "terminations", "truncations")
#: The format each test dataset is in (the one reader that must claim it).
EXPECTED_FORMAT = {
    "replay.zarr": "zarr",
    "replay_v3.zarr": "zarr",
    "minari_hdf5": "minari",
    "minari_arrow": "minari",
    "lerobot_v21": "lerobot",
    "lerobot_v30": "lerobot",
    "lerobot_v30_images": "lerobot",
    "robomimic.hdf5": "robomimic",
    "nerd_trajectories.hdf5": "nerd",
}


def declared_readers() -> dict[str, type[EpisodeDataset]]:
    """The readers pyproject.toml registers whose modules exist now (others are still
    being written), loaded directly, so the check does not depend on a fresh install."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # no tomllib on 3.10
    section = text.split('[project.entry-points."slhub.datasets"]', 1)[1].split("\n[", 1)[0]
    found = {}
    for name, module, attr in re.findall(r'^(\w+)\s*=\s*"([\w.]+):(\w+)"', section, re.M):
        try:
            found[name] = getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module + ".").startswith(exc.name + "."):
                continue  # the reader's own module is not there yet
            raise
    return found


def opened(path: Path, reader: type[EpisodeDataset]) -> EpisodeDataset:
    """Through open_dataset where the entry point is installed, else the reader itself."""
    if reader.format in readers():
        return open_dataset(path, format=reader.format)
    return reader.open(path)


def installed(format_: str) -> None:
    if format_ not in readers():
        pytest.skip(
            f"entry point {format_!r} not installed: pip install --no-deps -e {ROOT} "
            "(the installed metadata predates it)"
        )


# ------------------------------------------------------------------ zarr


@pytest.fixture(scope="module", params=sorted(ZARR))
def replay(request):
    with ReplayZarrDataset.open(DATA / request.param) as ds:
        yield request.param, ds


def test_zarr_layout(replay):
    name, ds = replay
    want = oracle(ZARR[name])
    assert ds.format == "zarr" and ds.extra == "zarr"
    assert ds.lengths.dtype == np.int64 and ds.lengths.tolist() == LENGTHS
    assert np.diff(np.concatenate([[0], want["meta/episode_ends"]])).tolist() == LENGTHS
    keys = sorted(k.removeprefix("data/") for k in want if k.startswith("data/"))
    assert sorted(ds.features) == keys
    for key in keys:
        assert ds.features[key].shape == want[f"data/{key}"].shape[1:], key
        assert ds.features[key].dtype == str(want[f"data/{key}"].dtype), key
    assert ds.features["img"].is_image


def test_zarr_equals_the_zarr_library_element_for_element(replay):
    name, ds = replay
    want = oracle(ZARR[name])
    for key in ds.features:
        episodes = [ds.read(key, e, 0, n) for e, n in enumerate(LENGTHS)]
        assert_exact(np.concatenate(episodes), want[f"data/{key}"], f"{name} data/{key}")
        ends = np.cumsum(LENGTHS)
        for e, n in enumerate(LENGTHS):  # partial reads, across chunk boundaries too
            first = int(ends[e]) - n
            assert_exact(
                ds.read(key, e, 3, n - 1), want[f"data/{key}"][first + 3 : first + n - 1], key
            )
    steps = np.array([44, 0, 16, 15])
    assert_exact(ds.read_steps("state", 3, steps), want["data/state"][120 + steps], "steps")
    assert ds.read("img", 1, 5, 5).shape == (0, 48, 48, 3)


def test_zarr_zip_store(tmp_path):
    """A ``.zarr.zip`` (diffusion_policy's ZipStore export) reads like the directory."""
    archive = tmp_path / "replay.zarr.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as out:
        for file in sorted((DATA / "replay.zarr").rglob("*")):
            if file.is_file():
                out.write(file, file.relative_to(DATA / "replay.zarr").as_posix())
    assert ReplayZarrDataset.detect(archive)
    want = oracle("replay_zarr")
    with ReplayZarrDataset.open(archive) as ds:
        assert ds.lengths.tolist() == LENGTHS
        assert_exact(ds.read("sim_state", 2, 0, 23), want["data/sim_state"][97:120], "zip")


def test_zarr_pickles_into_workers(replay):
    _, ds = replay
    ds.read("state", 0, 0, 1)
    copy = pickle.loads(pickle.dumps(ds))
    assert_exact(copy.read("img", 3, 40, 45), ds.read("img", 3, 40, 45), "pickled")


def test_zarr_corrupt_chunk_is_one_line_on_read(tmp_path):
    """v2: a truncated uncompressed chunk; v3: a zstd chunk of garbage. The store opens;
    only the read that meets the damage fails, one line naming the store and array."""
    for name, chunk, damage in (
        ("replay.zarr", "data/state/1.0", lambda b: b[: len(b) // 2]),
        ("replay_v3.zarr", "data/state/c/1/0", lambda b: b"\x00" * len(b)),
    ):
        broken = tmp_path / name
        shutil.copytree(DATA / name, broken)
        target = broken / chunk
        target.write_bytes(damage(target.read_bytes()))
        with opened(broken, ReplayZarrDataset) as ds:
            assert ds.read("state", 0, 0, 50).shape == (50, 11)  # chunk 0 is intact
            with pytest.raises(DatasetError) as exc:
                ds.read("state", 1, 0, 47)  # rows 50..96 need chunk 1
            assert "data/state" in one_line_naming(exc, broken)


def test_zarr_damaged_or_foreign_stores_are_one_line(tmp_path):
    broken = tmp_path / "replay.zarr"
    shutil.copytree(DATA / "replay.zarr", broken)
    (broken / "data" / "state" / ".zarray").write_text("{not json")
    with pytest.raises(DatasetError) as exc:
        opened(broken, ReplayZarrDataset)
    one_line_naming(exc, broken)

    no_ends = tmp_path / "no_ends.zarr"
    shutil.copytree(DATA / "replay_v3.zarr", no_ends)
    shutil.rmtree(no_ends / "meta" / "episode_ends")
    assert not ReplayZarrDataset.detect(no_ends)
    with pytest.raises(DatasetError) as exc:
        ReplayZarrDataset.open(no_ends)
    one_line_naming(exc, no_ends)

    for other in (DATA / "robomimic.hdf5", DATA / "minari_hdf5", DATA, tmp_path / "missing"):
        assert not ReplayZarrDataset.detect(other), other


def test_zarr_missing_library_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "zarr", None)
    path = DATA / "replay.zarr"
    assert ReplayZarrDataset.detect(path) is False
    for opener in (ReplayZarrDataset.open, lambda p: open_dataset(p, format="zarr")):
        if opener is not ReplayZarrDataset.open:
            installed("zarr")
        with pytest.raises(DatasetError) as exc:
            opener(path)
        message = str(exc.value)
        assert "\n" not in message and "zarr" in message
        assert message.endswith("pip install 'slhub[zarr]'")


# ------------------------------------------------------------------ Minari


@pytest.fixture(scope="module", params=sorted(MINARI))
def minari(request):
    with MinariDataset.open(DATA / request.param) as ds:
        yield request.param, ds


def test_minari_layout(minari):
    name, ds = minari
    want = oracle(name)
    assert ds.format == "minari" and ds.extra == "minari"
    assert ds.backend == MINARI[name]
    assert ds.data_dir == DATA / name / DATASET_ID / "data"
    assert ds.metadata["dataset_id"] == "ref/hopper/uniform-v0"
    assert ds.lengths.dtype == np.int64 and ds.lengths.tolist() == LENGTHS
    assert ds.num_episodes == int(want["total_episodes"]) and ds.num_steps == want["total_steps"]
    assert list(ds.episode_ids) == want["episode_indices"].tolist()
    assert sorted(ds.features) == sorted(("observations", "next_observations", *MINARI_FIELDS))
    for key in ("observations", "next_observations"):
        assert ds.features[key].shape == (11,) and ds.features[key].dtype == "float64"
    assert ds.features["actions"].shape == (3,) and ds.features["actions"].dtype == "float32"
    assert ds.features["rewards"].shape == () and ds.features["rewards"].dtype == "float64"
    for flag in ("terminations", "truncations"):
        assert ds.features[flag].shape == () and ds.features[flag].dtype == "bool"


def test_minari_equals_iterate_episodes_element_for_element(minari):
    name, ds = minari
    want = oracle(name)
    for e, episode_id in enumerate(ds.episode_ids):
        got = ds.episode(e)
        prefix = f"episode_{episode_id}"
        assert int(want[f"{prefix}/id"]) == episode_id
        observations = np.concatenate([got["observations"], got["next_observations"][-1:]])
        assert_exact(observations, want[f"{prefix}/observations"], f"{name} {prefix} obs")
        assert_exact(got["next_observations"], want[f"{prefix}/observations"][1:], "next obs")
        for key in MINARI_FIELDS:
            assert_exact(got[key], want[f"{prefix}/{key}"], f"{name} {prefix}/{key}")
        n = LENGTHS[e]
        assert_exact(
            ds.read("next_observations", e, n - 3, n), want[f"{prefix}/observations"][-3:], "tail"
        )
    assert ds.read("rewards", 2, 7, 7).shape == (0,)


def test_minari_windows_stay_in_the_episode(minari):
    name, ds = minari
    want = oracle(name)["episode_2/observations"]
    window = Window({"observations": (-1, 0), "next_observations": (0,), "actions": (0, 1)}, True)
    got = window.at(ds, 2, 22)  # the last step of episode 2
    assert_exact(got["observations"], want[21:23], "window obs")
    assert_exact(got["next_observations"], want[23:24], "window next obs")
    assert got["actions_is_pad"].tolist() == [False, True]


@pytest.mark.parametrize(
    "where", [Path(), DATASET_ID, DATASET_ID / "data", DATASET_ID / "data" / "main_data.hdf5"]
)
def test_minari_paths_it_accepts(where):
    for name in MINARI:
        path = DATA / name / where
        if not path.exists():
            continue  # main_data.hdf5 is the HDF5 backend's alone
        assert MinariDataset.detect(path), path
        with MinariDataset.open(path) as ds:
            assert ds.data_dir == DATA / name / DATASET_ID / "data"
            assert ds.lengths.tolist() == LENGTHS


def test_minari_root_with_several_datasets_is_refused(tmp_path):
    shutil.copytree(DATA / "minari_hdf5", tmp_path, dirs_exist_ok=True)
    shutil.copytree(DATA / "minari_arrow" / DATASET_ID, tmp_path / "ref" / "hopper" / "other-v0")
    assert MinariDataset.detect(tmp_path)
    with pytest.raises(DatasetError) as exc:
        MinariDataset.open(tmp_path)
    message = one_line_naming(exc, tmp_path)
    assert "ref/hopper/uniform-v0" in message and "ref/hopper/other-v0" in message


def test_minari_arrow_stream_files_read_alike(tmp_path):
    """Arrow IPC *stream* files (no footer) are read as well as IPC files."""
    import pyarrow.ipc as ipc

    root = tmp_path / "stream"
    shutil.copytree(DATA / "minari_arrow", root)
    for part in sorted((root / DATASET_ID / "data").glob("*/part-0.arrow")):
        table = ipc.open_file(str(part)).read_all()
        with ipc.new_stream(str(part), table.schema) as writer:
            writer.write_table(table)
        assert not part.read_bytes().startswith(b"ARROW1")
    with MinariDataset.open(root) as ds, MinariDataset.open(DATA / "minari_arrow") as file:
        assert ds.lengths.tolist() == LENGTHS and ds.features == file.features
        for e in range(ds.num_episodes):
            for key in ds.features:
                assert_exact(ds.read(key, e, 0, LENGTHS[e]), file.read(key, e, 0, LENGTHS[e]), key)


def test_minari_pickles_into_workers(minari):
    _, ds = minari
    ds.read("actions", 0, 0, 1)
    copy = pickle.loads(pickle.dumps(ds))
    assert_exact(copy.read("observations", 1, 10, 20), ds.read("observations", 1, 10, 20), "pkl")


def test_minari_truncated_files_are_one_line(tmp_path):
    for name, damaged in (
        ("minari_hdf5", DATASET_ID / "data" / "main_data.hdf5"),
        ("minari_arrow", DATASET_ID / "data" / "2" / "part-0.arrow"),
    ):
        root = tmp_path / name
        shutil.copytree(DATA / name, root)
        target = root / damaged
        with target.open("r+b") as fh:
            fh.truncate(target.stat().st_size // 2)
        for opener in (MinariDataset.open, lambda p: opened(p, MinariDataset)):
            with pytest.raises(DatasetError) as exc:
                opener(root)
            one_line_naming(exc, target)


@pytest.mark.parametrize(
    ("name", "library"), [("minari_hdf5", "h5py"), ("minari_arrow", "pyarrow")]
)
def test_minari_missing_library_is_one_line(monkeypatch, name, library):
    monkeypatch.setitem(sys.modules, library, None)
    path = DATA / name
    assert MinariDataset.detect(path) is False
    for opener in (MinariDataset.open, lambda p: open_dataset(p, format="minari")):
        if opener is not MinariDataset.open:
            installed("minari")
        with pytest.raises(DatasetError) as exc:
            opener(path)
        message = str(exc.value)
        assert "\n" not in message and library in message
        assert message.endswith("pip install 'slhub[minari]'")


def test_reads_outside_the_episode_are_refused(replay, minari):
    for _, ds in (replay, minari):
        name = next(iter(ds.features))
        with pytest.raises(DatasetError):
            ds.read(name, 2, 0, 24)  # episode 2 has 23 steps; step 23 is episode 3's
        with pytest.raises(DatasetError):
            ds.read(name, 4, 0, 1)
        with pytest.raises(DatasetError):
            ds.read(name, 0, 3, 2)
        with pytest.raises(DatasetError):
            ds.read("nope", 0, 0, 1)


# ------------------------------------------------------------------ detection


def test_each_test_dataset_is_claimed_by_exactly_its_reader():
    """Among every reader present now, exactly the right one claims each test dataset."""
    known = declared_readers()
    assert {"zarr", "minari"} <= set(known)
    for entry in sorted(DATA.iterdir()):
        if entry.name not in EXPECTED_FORMAT:
            continue
        claims = [name for name, reader in sorted(known.items()) if reader.detect(entry)]
        expected = EXPECTED_FORMAT[entry.name]
        assert claims == ([expected] if expected in known else []), (entry.name, claims)


@pytest.mark.parametrize(
    ("name", "reader"),
    [(n, ReplayZarrDataset) for n in sorted(ZARR)] + [(n, MinariDataset) for n in sorted(MINARI)],
)
def test_open_dataset_detects_through_entry_points(name, reader):
    installed(reader.format)
    assert readers()[reader.format] is reader
    with open_dataset(DATA / name) as ds:
        assert type(ds) is reader and ds.lengths.tolist() == LENGTHS
    with open_dataset(DATA / name, format=reader.format) as ds:
        assert type(ds) is reader


@pytest.mark.parametrize("store", ["replay.zarr", "replay_v3.zarr"])
def test_zarr_batches_equal_their_windows_one_by_one(store: str):
    import torch

    from slhub.data import Window, open_dataset, sample_anchors

    dataset = open_dataset(Path(__file__).parent / "data" / "datasets" / store)
    window = Window({"img": (-1, 0), "action": tuple(range(8))}, pad=True)
    anchors = sample_anchors(window.anchors(dataset.lengths), 50, torch.Generator())
    batch = window.batch(dataset, anchors)
    for key, values in batch.items():
        expected = np.stack([window.at(dataset, int(e), int(s))[key] for e, s in anchors])
        assert values.dtype == expected.dtype and np.array_equal(values, expected), key
