"""The HDF5 readers (robomimic, NeRD) against what the formats' own readers returned.

``oracle/robomimic.npz`` holds robomimic 0.3.0 ``SequenceDataset`` items (frame_stack 2,
seq_length 5, both paddings, pad masks, obs keys front_image/qpos/qvel, filter keys
train/valid): each item is our padded window of offsets -1..4 at the matching anchor,
and robomimic's ``pad_mask`` is True on *real* rows, the negation of ``<feature>_is_pad``.
``oracle/nerd.npz`` holds NeRD's ``TrajectoryDataset`` windows (8 steps, whole windows
only) and ``BatchTransitionDataset`` batches (the (B, T) flattening, filler included).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import DATASETS, assert_exact, one_line_naming, oracle
from slhub.data.episodes import open_dataset
from slhub.data.readers.nerd import NerdTrajectoryDataset
from slhub.data.readers.robomimic import RobomimicDataset
from slhub.data.windows import Window
from slhub.errors import DatasetError

h5py = pytest.importorskip("h5py")

DATA = DATASETS
ROBOMIMIC = DATA / "robomimic.hdf5"
NERD = DATA / "nerd_trajectories.hdf5"
LENGTHS = [50, 47, 23, 45]
INSTALL_LINE = "pip install 'slhub[hdf5]'"

#: robomimic's item rows: frame_stack - 1 = 1 step back, seq_length = 5 steps on.
ROBOMIMIC_OFFSETS = tuple(range(-1, 5))
ROBOMIMIC_KEYS = (
    "actions",
    "rewards",
    "dones",
    "obs/front_image",
    "obs/qpos",
    "obs/qvel",
    "next_obs/front_image",
    "next_obs/qpos",
    "next_obs/qvel",
)


@pytest.fixture(scope="module")
def robomimic():
    with RobomimicDataset.open(ROBOMIMIC) as ds:
        yield ds


@pytest.fixture(scope="module")
def nerd():
    with NerdTrajectoryDataset.open(NERD) as ds:
        yield ds


def write_robomimic(path: Path, demos: dict[str, int], **num_samples: int) -> Path:
    """A small robomimic-layout file: ``demos`` maps a demo name to its length."""
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        for name, n in demos.items():
            g = data.create_group(name)
            g.attrs["num_samples"] = num_samples.get(name, n)
            g.create_dataset("obs/x", data=np.arange(n * 2, dtype=np.float32).reshape(n, 2) + n)
            g.create_dataset("actions", data=np.full((n, 1), n, np.float64))
            g.create_dataset("rewards", data=np.zeros(n))
    return path


# ------------------------------------------------------------------ robomimic


def test_robomimic_layout(robomimic):
    assert robomimic.format == "robomimic"
    assert robomimic.lengths.dtype == np.int64
    assert robomimic.lengths.tolist() == LENGTHS
    assert robomimic.demos == ("demo_0", "demo_1", "demo_2", "demo_3")
    assert robomimic.fps is None  # the file records no control rate
    assert robomimic.splits == {"train": (0, 1, 2), "valid": (3,)}
    shapes = {name: (f.shape, f.dtype) for name, f in robomimic.features.items()}
    assert shapes == {
        "actions": ((3,), "float32"),
        "rewards": ((), "float64"),
        "dones": ((), "int64"),
        "states": ((12,), "float64"),
        "obs/front_image": ((48, 48, 3), "uint8"),
        "obs/qpos": ((6,), "float64"),
        "obs/qvel": ((6,), "float64"),
        "next_obs/front_image": ((48, 48, 3), "uint8"),
        "next_obs/qpos": ((6,), "float64"),
        "next_obs/qvel": ((6,), "float64"),
    }
    assert robomimic.features["obs/front_image"].is_image


def test_robomimic_reads_equal_h5py(robomimic):
    with h5py.File(ROBOMIMIC, "r") as f:
        for episode, demo in enumerate(robomimic.demos):
            for name in robomimic.features:
                whole = f[f"data/{demo}/{name}"][()]
                assert_exact(robomimic.read(name, episode, 0, len(whole)), whole, name)
                assert_exact(robomimic.read(name, episode, 3, 7), whole[3:7], name)
                assert robomimic.read(name, episode, 5, 5).shape == (0, *whole.shape[1:])


@pytest.mark.parametrize("split", ["train", "valid"])
def test_robomimic_equals_sequence_dataset(robomimic, split):
    want = oracle("robomimic")
    episodes = robomimic.splits[split]
    assert [robomimic.demos[e] for e in episodes] == want[f"{split}/demos"].tolist()
    # SequenceDataset with both paddings: one sample per step of the filtered demos, in order.
    starts = np.concatenate([[0], np.cumsum(robomimic.lengths[list(episodes)])])
    assert starts[-1] == want[f"{split}/len"]
    window = Window({key: ROBOMIMIC_OFFSETS for key in ROBOMIMIC_KEYS}, pad=True)
    queries = want[f"{split}/query_indices"]
    assert len(queries) >= 5
    for row, index in enumerate(queries):
        k = int(np.searchsorted(starts, index, side="right")) - 1
        episode, step = episodes[k], int(index - starts[k])
        got = window.at(robomimic, episode, step)
        for key in ROBOMIMIC_KEYS:
            assert_exact(got[key], want[f"{split}/item/{key}"][row], f"{split}[{index}] {key}")
        for mask, key in (("pad_mask", "actions"), ("obs/pad_mask", "obs/qpos")):
            real = ~got[f"{key}_is_pad"][:, None]
            assert_exact(real, want[f"{split}/item/{mask}"][row], f"{split}[{index}] {mask}")
        real = ~got["next_obs/qpos_is_pad"][:, None]
        assert_exact(real, want[f"{split}/item/next_obs/pad_mask"][row], "next_obs/pad_mask")
    # The queries do reach both edges: rows padded at the start and 4 at the end.
    pads = want[f"{split}/item/pad_mask"][..., 0]
    assert (~pads[:, 0]).any() and (~pads[:, -4:]).all(axis=1).any()


def test_robomimic_orders_demos_numerically(tmp_path):
    path = write_robomimic(tmp_path / "d.hdf5", {"demo_10": 3, "demo_2": 4, "demo_1": 5})
    with RobomimicDataset.open(path) as ds:
        assert ds.demos == ("demo_1", "demo_2", "demo_10")
        assert ds.lengths.tolist() == [5, 4, 3]
        assert ds.read("actions", 2, 0, 3).ravel().tolist() == [3.0, 3.0, 3.0]
        assert ds.splits == {}


def test_robomimic_num_samples_mismatch_names_the_demo(tmp_path):
    path = write_robomimic(tmp_path / "d.hdf5", {"demo_0": 3, "demo_1": 4}, demo_1=5)
    with pytest.raises(DatasetError) as exc:
        RobomimicDataset.open(path)
    assert "demo_1" in one_line_naming(exc, path)


def test_robomimic_no_demos(tmp_path):
    path = tmp_path / "empty.hdf5"
    with h5py.File(path, "w") as f:
        f.create_group("data")
    assert not RobomimicDataset.detect(path)
    with pytest.raises(DatasetError) as exc:
        RobomimicDataset.open(path)
    assert "no demo" in one_line_naming(exc, path)


def test_robomimic_filter_key_naming_a_missing_demo(tmp_path):
    path = write_robomimic(tmp_path / "d.hdf5", {"demo_0": 3})
    with h5py.File(path, "a") as f:
        f.create_dataset("mask/train", data=np.array([b"demo_0", b"demo_7"]))
    with pytest.raises(DatasetError) as exc:
        RobomimicDataset.open(path)
    assert "demo_7" in one_line_naming(exc, path)


def test_robomimic_pickles_into_workers(robomimic):
    clone = pickle.loads(pickle.dumps(robomimic))
    try:
        assert clone.lengths.tolist() == LENGTHS
        assert_exact(
            clone.read("obs/front_image", 1, 10, 12),
            robomimic.read("obs/front_image", 1, 10, 12),
            "obs/front_image",
        )
    finally:
        clone.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_robomimic_reads_after_fork(robomimic):
    """A forked data-loader worker opens its own handle instead of sharing the parent's."""
    want = robomimic.read("obs/qpos", 3, 0, 45)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        os._exit(0 if np.array_equal(robomimic.read("obs/qpos", 3, 0, 45), want) else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert_exact(robomimic.read("obs/qpos", 3, 0, 45), want, "obs/qpos")


def test_robomimic_fps_from_control_freq(tmp_path):
    path = write_robomimic(tmp_path / "d.hdf5", {"demo_0": 2})
    with h5py.File(path, "a") as f:
        f["data"].attrs["env_args"] = json.dumps(
            {"env_name": "Lift", "type": 1, "env_kwargs": {"control_freq": 20}}
        )
    with RobomimicDataset.open(path) as ds:
        assert ds.fps == 20.0


# ------------------------------------------------------------------ NeRD


def test_nerd_layout(nerd):
    assert nerd.format == "nerd"
    assert nerd.lengths.dtype == np.int64
    assert nerd.lengths.tolist() == LENGTHS
    assert nerd.fps is None and nerd.splits == {}
    shapes = {name: (f.shape, f.dtype) for name, f in nerd.features.items()}
    assert shapes == {
        "states": ((12,), "float32"),
        "next_states": ((12,), "float32"),
        "joint_acts": ((6,), "float32"),
        "gravity_dir": ((3,), "float32"),
        "root_body_q": ((7,), "float32"),
    }


def test_nerd_reads_equal_h5py(nerd):
    with h5py.File(NERD, "r") as f:
        for name in nerd.features:
            whole = f[f"data/{name}"][()]
            for b, n in enumerate(LENGTHS):
                assert_exact(nerd.read(name, b, 0, n), whole[:n, b], name)
                assert_exact(nerd.episode(b)[name], whole[:n, b], name)
                assert not whole[n:, b].any()  # the steps we leave out are filler


def test_nerd_equals_trajectory_dataset(nerd):
    want = oracle("nerd")
    assert want["trajectory/traj_lengths"].tolist() == nerd.lengths.tolist()
    window = Window({name: tuple(range(8)) for name in nerd.features})  # whole windows only
    anchors = window.anchors(nerd.lengths)
    assert len(anchors) == want["trajectory/len"]
    queries = want["trajectory/query_indices"]
    assert_exact(anchors[queries], want["trajectory/index_to_traj_step"], "anchors")
    for row, (episode, step) in enumerate(anchors[queries]):
        got = window.at(nerd, int(episode), int(step))
        for name in nerd.features:
            assert_exact(got[name], want[f"trajectory/item/{name}"][row], f"[{row}] {name}")


def test_nerd_equals_batch_transition_dataset(nerd):
    """NeRD's batches are the (B, T) flattening of every column, filler steps included:
    row r is step r % T of trajectory r // T, zero past the trajectory's length."""
    want = oracle("nerd")
    steps = int(nerd.lengths.max())
    batch = want["batch_transition/item/states"].shape[1]
    assert want["batch_transition/len"] == len(LENGTHS) * steps // batch
    for row, index in enumerate(want["batch_transition/query_indices"]):
        for name, spec in nerd.features.items():
            for j, r in enumerate(range(index * batch, (index + 1) * batch)):
                episode, step = divmod(r, steps)
                wanted = want[f"batch_transition/item/{name}"][row, j]
                if step < nerd.lengths[episode]:
                    got = nerd.read(name, episode, step, step + 1)[0]
                else:
                    got = np.zeros(spec.shape, spec.dtype)
                assert_exact(got, wanted, f"batch {index} row {j} {name}")


def test_nerd_without_traj_lengths_uses_every_step(tmp_path):
    path = tmp_path / "n.hdf5"
    states = np.arange(5 * 3 * 2, dtype=np.float32).reshape(5, 3, 2)
    with h5py.File(path, "w") as f:
        f.create_dataset("data/states", data=states)
        f.create_dataset("data/contact_depths", data=np.ones((5, 3, 4, 1), np.float32))
        f.create_dataset("data/other", data=np.ones((7,)))
        f["data"].attrs["mode"] = "trajectory"
    assert NerdTrajectoryDataset.detect(path)
    with NerdTrajectoryDataset.open(path) as ds:
        assert ds.lengths.tolist() == [5, 5, 5]
        assert sorted(ds.features) == ["contact_depths", "states"]
        assert ds.features["contact_depths"].shape == (4, 1)
        assert_exact(ds.read("states", 2, 1, 4), states[1:4, 2], "states")


def test_nerd_transition_mode_is_refused(tmp_path):
    path = tmp_path / "t.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data/states", data=np.zeros((10, 4), np.float32))
        f.create_dataset("data/next_states", data=np.zeros((10, 4), np.float32))
        f["data"].attrs["mode"] = "transition"
    assert NerdTrajectoryDataset.detect(path)  # recognized, so auto says why it is refused
    with pytest.raises(DatasetError) as exc:
        open_dataset(path)
    assert "only trajectory mode" in one_line_naming(exc, path)


# ------------------------------------------------------------------ both


def test_detectors_tell_the_formats_apart(tmp_path):
    assert RobomimicDataset.detect(ROBOMIMIC) and not RobomimicDataset.detect(NERD)
    assert NerdTrajectoryDataset.detect(NERD) and not NerdTrajectoryDataset.detect(ROBOMIMIC)
    minari = DATA / "minari_hdf5" / "ref" / "hopper" / "uniform-v0" / "data" / "main_data.hdf5"
    not_hdf5 = tmp_path / "x.hdf5"
    not_hdf5.write_bytes(b"not an hdf5 file at all")
    for other in (minari, DATA / "replay.zarr", DATA, not_hdf5, tmp_path / "missing.hdf5"):
        assert not RobomimicDataset.detect(other), other
        assert not NerdTrajectoryDataset.detect(other), other


@pytest.mark.parametrize(
    ("path", "reader"), [(ROBOMIMIC, RobomimicDataset), (NERD, NerdTrajectoryDataset)]
)
def test_open_dataset_detects_through_entry_points(path, reader):
    with open_dataset(path) as ds:
        assert type(ds) is reader
        assert ds.lengths.tolist() == LENGTHS
    with open_dataset(path, format=reader.format) as ds:
        assert type(ds) is reader


@pytest.mark.parametrize(
    ("path", "reader"), [(ROBOMIMIC, RobomimicDataset), (NERD, NerdTrajectoryDataset)]
)
def test_truncated_file_is_one_line(tmp_path, path, reader):
    broken = tmp_path / path.name
    shutil.copyfile(path, broken)
    with broken.open("r+b") as fh:
        fh.truncate(broken.stat().st_size // 2)
    assert not reader.detect(broken)
    with pytest.raises(DatasetError) as exc:
        reader.open(broken)
    one_line_naming(exc, broken)
    with pytest.raises(DatasetError) as exc:
        open_dataset(broken, format=reader.format)
    one_line_naming(exc, broken)


def test_corrupt_chunk_is_one_line_on_read(tmp_path):
    """A file whose layout is intact but whose image chunk is garbage opens, and the read
    that meets the damage is one line naming the file."""
    broken = tmp_path / "robomimic.hdf5"
    shutil.copyfile(ROBOMIMIC, broken)
    with h5py.File(ROBOMIMIC, "r") as f:
        chunk = f["data/demo_1/obs/front_image"].id.get_chunk_info(0)
        offset = chunk.byte_offset + chunk.size // 2
    with broken.open("r+b") as fh:
        fh.seek(offset)
        fh.write(b"\xff" * 64)
    with RobomimicDataset.open(broken) as ds:
        assert_exact(ds.read("actions", 1, 0, 47), ds.read("actions", 1, 0, 47), "actions")
        with pytest.raises(DatasetError) as exc:
            ds.read("obs/front_image", 1, 0, 2)
        assert "demo_1/obs/front_image" in one_line_naming(exc, broken)


@pytest.mark.parametrize(
    ("path", "reader"), [(ROBOMIMIC, RobomimicDataset), (NERD, NerdTrajectoryDataset)]
)
def test_missing_h5py_is_one_line(monkeypatch, path, reader):
    monkeypatch.setitem(sys.modules, "h5py", None)
    assert reader.detect(path) is False
    with pytest.raises(DatasetError) as exc:
        reader.open(path)
    assert str(exc.value).endswith(INSTALL_LINE) and "\n" not in str(exc.value)
    with pytest.raises(DatasetError) as exc:
        open_dataset(path, format=reader.format)
    assert str(exc.value).endswith(INSTALL_LINE) and "h5py" in str(exc.value)


def test_reads_outside_the_episode_are_refused(robomimic, nerd):
    for ds in (robomimic, nerd):
        name = next(iter(ds.features))
        with pytest.raises(DatasetError):
            ds.read(name, 2, 0, 24)
        with pytest.raises(DatasetError):
            ds.read(name, 4, 0, 1)
        with pytest.raises(DatasetError):
            ds.read("nope", 0, 0, 1)
