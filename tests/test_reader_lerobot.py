"""The LeRobot reader against what LeRobot itself returned for the same files (oracle/*.npz).

Frames are compared exactly: LeRobot hands out ``float32 (C, H, W) / 255`` tensors and
our reader uint8 ``(H, W, C)``, so the test applies LeRobot's conversion and asks for
``torch.equal``. That holds for PNG (lossless) and, with PyAV 18.1 here against the
oracle's PyAV 15.1, for the AV1 videos too (measured maximum difference 0); a future
decoder change would show up here first, as the README of the oracle warns.
"""

from __future__ import annotations

import json
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import DATASETS, one_line_naming
from slhub.data.episodes import EpisodeDataset, open_dataset
from slhub.data.readers.lerobot import LeRobotDataset
from slhub.data.windows import Window
from slhub.errors import DatasetError

DATA = DATASETS
NAMES = ("lerobot_v30", "lerobot_v30_images", "lerobot_v21")
CAMERA = "observation.images.front"
WINDOW = Window(
    {"observation.state": (-2, -1, 0), "action": tuple(range(8)), CAMERA: (-1, 0)}, pad=True
)
INFO_NAMES = {
    "observation.state": (
        "rootz.pos",
        "rooty.pos",
        "thigh_joint.pos",
        "leg_joint.pos",
        "foot_joint.pos",
        "rootx.vel",
        "rootz.vel",
        "rooty.vel",
        "thigh_joint.vel",
        "leg_joint.vel",
        "foot_joint.vel",
    ),
    "action": ("thigh_joint", "leg_joint", "foot_joint"),
}
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")


@pytest.fixture(params=NAMES)
def case(request: pytest.FixtureRequest):
    ds = LeRobotDataset.open(DATA / request.param)
    yield ds, np.load(DATA / "oracle" / f"{request.param}.npz")
    ds.close()


def locate(lengths: np.ndarray, index: int) -> tuple[int, int]:
    """(episode, step) of a global frame index."""
    ends = np.cumsum(lengths)
    episode = int(np.searchsorted(ends, index, side="right"))
    return episode, int(index - (ends[episode] - lengths[episode]))


def as_lerobot(ds: EpisodeDataset, feature: str, values: np.ndarray) -> torch.Tensor:
    """Our array as LeRobot returns it: frames ``float32 (..., C, H, W) / 255``."""
    tensor = torch.from_numpy(np.array(values))
    if ds.features[feature].is_image:
        return tensor.movedim(-1, -3).float() / 255
    return tensor


def test_plain_items_equal_lerobot(case) -> None:
    ds, oracle = case
    assert set(ds.features) == {k.split("/", 1)[1] for k in oracle if k.startswith("plain/")} - {
        "task"
    }
    for row, index in enumerate(oracle["query_indices"]):
        episode, step = locate(ds.lengths, int(index))
        for feature in ds.features:
            want = torch.from_numpy(np.asarray(oracle[f"plain/{feature}"][row]))
            got = as_lerobot(ds, feature, ds.read(feature, episode, step, step + 1)[0])
            assert got.dtype == want.dtype, feature
            assert torch.equal(got.reshape(want.shape), want), (feature, int(index))


def test_windows_equal_lerobot_delta_timestamps(case) -> None:
    ds, oracle = case
    for row, index in enumerate(oracle["query_indices"]):
        window = WINDOW.at(ds, *locate(ds.lengths, int(index)))
        for key, values in window.items():
            want = torch.from_numpy(oracle[f"delta/{key}"][row])
            got = as_lerobot(ds, key, values) if key in ds.features else torch.from_numpy(values)
            assert got.dtype == want.dtype and torch.equal(got, want), (key, int(index))


def test_layout_matches_info_and_oracle(case) -> None:
    ds, oracle = case
    assert ds.fps == float(oracle["fps"])
    assert ds.num_episodes == int(oracle["num_episodes"])
    assert np.array_equal(ds.lengths, oracle["episode_lengths"])
    assert ds.num_steps == int(oracle["len"])
    for name, names in INFO_NAMES.items():
        assert ds.features[name].names == names
    assert ds.features[CAMERA].shape == (48, 48, 3) and ds.features[CAMERA].is_image
    assert ds.features[CAMERA].names is None
    for name in BOOKKEEPING + ("next.reward", "next.done"):
        assert ds.features[name].shape == (1,) and ds.features[name].names is None
    assert ds.splits == {"train": (0, 1, 2, 3)}
    assert ds.tasks == tuple(np.unique(oracle["plain/task"]))


def test_any_read_order_gives_the_same_frames(case) -> None:
    """Windows read in order (decoding forward, reusing kept frames and row groups) and
    shuffled (seeking) equal each episode decoded whole by a fresh reader."""
    ds, _ = case
    offsets = np.array([-3, -1, 0, 2])
    window = Window({CAMERA: tuple(offsets)}, pad=True)
    with LeRobotDataset.open(ds.path) as fresh:
        whole = [fresh.read(CAMERA, e, 0, int(n)) for e, n in enumerate(ds.lengths)]
    anchors = window.anchors(ds.lengths)
    shuffled = anchors[np.random.default_rng(0).permutation(len(anchors))]
    for episode, step in np.concatenate([anchors, shuffled]):
        steps = np.clip(step + offsets, 0, ds.lengths[episode] - 1)
        got = window.at(ds, int(episode), int(step))[CAMERA]
        assert np.array_equal(got, whole[episode][steps]), (episode, step)
    copy = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(copy.read(CAMERA, 2, 3, 9), whole[2][3:9])
    copy.close()


def test_dict_names_and_channels_first_shapes(tmp_path: Path) -> None:
    """Older LeRobot info.json files give names as {"motors": [...]} and (C, H, W) shapes."""
    root = copy_of("lerobot_v21", tmp_path)
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"]["action"]["names"] = {"motors": list(INFO_NAMES["action"])}
    info["features"][CAMERA].update(shape=[3, 48, 48], names=["channels", "height", "width"])
    info["features"]["language"] = {"dtype": "string", "shape": [1], "names": None}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    with LeRobotDataset.open(root) as ds:
        assert ds.features["action"].names == INFO_NAMES["action"]
        assert ds.features[CAMERA].shape == (48, 48, 3) and "language" not in ds.features
        assert ds.read(CAMERA, 0, 0, 2).shape == (2, 48, 48, 3)


@pytest.mark.parametrize("name", NAMES)
def test_open_dataset_detects_lerobot(name: str) -> None:
    with open_dataset(DATA / name) as ds:
        assert ds.format == "lerobot" and isinstance(ds, LeRobotDataset)
    assert not LeRobotDataset.detect(DATA / "oracle")


def copy_of(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / name, tmp_path / name))


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("lerobot_v30", "data/chunk-000/file-000.parquet"),
        ("lerobot_v30_images", "data/chunk-000/file-000.parquet"),
        ("lerobot_v21", "data/chunk-000/episode_000002.parquet"),
    ],
)
def test_truncated_data_parquet_names_the_file(name: str, data: str, tmp_path: Path) -> None:
    root = copy_of(name, tmp_path)
    truncate(root / data)
    with LeRobotDataset.open(root) as ds, pytest.raises(DatasetError) as error:
        ds.read("action", 2, 0, 4)
    one_line_naming(error, root / data)
    if name == "lerobot_v30_images":
        with LeRobotDataset.open(root) as ds, pytest.raises(DatasetError) as error:
            ds.read(CAMERA, 0, 0, 1)
        one_line_naming(error, root / data)


@pytest.mark.parametrize(
    ("name", "meta"),
    [
        ("lerobot_v30", "meta/episodes/chunk-000/file-000.parquet"),
        ("lerobot_v21", "meta/episodes.jsonl"),
    ],
)
def test_truncated_metadata_names_the_file(name: str, meta: str, tmp_path: Path) -> None:
    root = copy_of(name, tmp_path)
    truncate(root / meta)
    with pytest.raises(DatasetError) as error:
        LeRobotDataset.open(root)
    one_line_naming(error, root / meta)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
@pytest.mark.parametrize(
    ("name", "video", "episode"),
    [
        ("lerobot_v30", "videos/observation.images.front/chunk-000/file-000.mp4", 3),
        ("lerobot_v21", "videos/chunk-000/observation.images.front/episode_000001.mp4", 1),
    ],
)
def test_damaged_video_names_the_file(
    name: str, video: str, episode: int, damage: str, tmp_path: Path
) -> None:
    root = copy_of(name, tmp_path)
    if damage == "garbage":
        (root / video).write_bytes(b"not an mp4 file")
    else:
        truncate(root / video)  # the frames that are left decode; the episode's last do not
    with LeRobotDataset.open(root) as ds, pytest.raises(DatasetError) as error:
        ds.read(CAMERA, episode, 0, int(ds.lengths[episode]))
    one_line_naming(error, root / video)


@pytest.mark.parametrize("library", ["av", "pyarrow"])
def test_missing_library_names_the_extra(library: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, library, None)
    with pytest.raises(DatasetError) as error:
        open_dataset(DATA / "lerobot_v30", format="lerobot")
    message = str(error.value)
    assert "\n" not in message and "pip install 'slhub[lerobot]'" in message, message
    assert library in message
