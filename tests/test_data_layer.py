"""The episode-dataset layer: slhub's store, windows, anchors, statistics, identity,
splits, and ``slhub data info|check|convert`` with its bad-data lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import cli_error
from slhub import cli
from slhub.data import (
    ArrayEpisodes,
    StoreDataset,
    Window,
    feature_statistics,
    fingerprint,
    open_dataset,
    sample_anchors,
    split_episodes,
    write_store,
)
from slhub.data.dataset_fingerprint import differences
from slhub.errors import DatasetError

LENGTHS = (7, 3, 12, 5)


def _episodes(seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "state": rng.normal(size=(n, 4)).astype(np.float32),
            "action": rng.uniform(-1, 1, size=(n, 2)).astype(np.float64),
            "done": (np.arange(n) == n - 1),
            "image": rng.integers(0, 256, size=(n, 6, 5, 3), dtype=np.uint8),
        }
        for n in LENGTHS
    ]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    source = ArrayEpisodes(
        _episodes(), fps=50.0, names={"state": ("x", "y", "vx", "vy")}, splits={"valid": (3,)}
    )
    return write_store(source, tmp_path / "store")


def test_the_store_returns_every_array_exactly_and_its_layout(store: Path):
    episodes = _episodes()
    dataset = open_dataset(store)
    assert isinstance(dataset, StoreDataset) and dataset.format == "slhub"
    assert dataset.lengths.tolist() == list(LENGTHS) and dataset.fps == 50.0
    assert dataset.features["state"].names == ("x", "y", "vx", "vy")
    assert dataset.features["image"].is_image and dataset.splits == {"valid": (3,)}
    for index, episode in enumerate(episodes):
        for name, expected in episode.items():
            got = dataset.read(name, index, 0, len(expected))
            assert got.dtype == expected.dtype and np.array_equal(got, expected), (name, index)
    assert np.array_equal(dataset.read("state", 2, 4, 9), episodes[2]["state"][4:9])


def test_a_failed_convert_leaves_nothing_behind(tmp_path: Path):
    def fail(written: int) -> None:
        raise KeyboardInterrupt  # as a kill mid-convert would stop it

    with pytest.raises(KeyboardInterrupt):
        write_store(ArrayEpisodes(_episodes()), tmp_path / "out", progress=fail)
    assert list(tmp_path.iterdir()) == []


def test_padded_windows_clamp_to_the_episode_edge_and_say_so(store: Path):
    dataset = open_dataset(store)
    state = _episodes()[1]["state"]  # 3 steps
    window = Window({"state": (-2, -1, 0), "action": (0, 1, 2, 3)}, pad=True)
    got = window.at(dataset, 1, 0)
    assert np.array_equal(got["state"], state[[0, 0, 0]])
    assert got["state_is_pad"].tolist() == [True, True, False]
    assert got["action_is_pad"].tolist() == [False, False, False, True]
    assert len(window.anchors(dataset.lengths)) == sum(LENGTHS)


def test_unpadded_windows_only_anchor_where_the_whole_window_fits(store: Path):
    dataset = open_dataset(store)
    window = Window({"state": tuple(range(-3, 1)), "action": (1,)})
    anchors = window.anchors(dataset.lengths)
    expected = [(e, s) for e, n in enumerate(LENGTHS) for s in range(3, n - 1)]
    assert [tuple(a) for a in anchors] == expected  # episode 1 (3 steps) has none
    episode, step = anchors[-1]
    got = window.at(dataset, int(episode), int(step))
    assert np.array_equal(got["state"], _episodes()[3]["state"][0:4])
    assert "state_is_pad" not in got
    with pytest.raises(DatasetError, match="leaves the episode"):
        window.at(dataset, 1, 0)


@pytest.mark.parametrize("by", ["step", "episode"])
def test_anchors_are_drawn_only_with_the_generator_given(store: Path, by: str):
    anchors = Window({"state": (-1, 0)}).anchors(open_dataset(store).lengths)
    generator = torch.Generator().manual_seed(7)
    first = sample_anchors(anchors, 64, generator, by=by)
    saved = generator.get_state()
    second = sample_anchors(anchors, 64, generator, by=by)
    generator.set_state(saved)  # a resume restores the stream and draws the same
    assert np.array_equal(sample_anchors(anchors, 64, generator, by=by), second)
    assert not np.array_equal(first, second)
    assert {tuple(a) for a in first} <= {tuple(a) for a in anchors}


def test_statistics_equal_numpy_over_the_chosen_episodes_in_float64(store: Path):
    dataset = open_dataset(store)
    stats = feature_statistics(dataset, ["state", "image"], episodes=[0, 2])
    rows = np.concatenate([_episodes()[e]["state"] for e in (0, 2)]).astype(np.float64)
    assert np.allclose(stats["state"]["mean"], rows.mean(0), rtol=0, atol=1e-15)
    assert np.allclose(stats["state"]["std"], rows.std(0), rtol=0, atol=1e-15)
    assert np.array_equal(stats["state"]["min"], rows.min(0))
    assert np.array_equal(stats["state"]["q50"], np.quantile(rows, 0.5, axis=0))
    assert stats["state"]["count"].tolist() == [19]
    pixels = np.concatenate([_episodes()[e]["image"] for e in (0, 2)]).reshape(-1, 3)
    assert np.allclose(stats["image"]["mean"], pixels.mean(0), rtol=0, atol=1e-12)
    assert "q50" not in stats["image"]


def test_the_fingerprint_changes_with_the_content_and_says_what(tmp_path: Path):
    a = write_store(ArrayEpisodes(_episodes(0)), tmp_path / "a")
    b = write_store(ArrayEpisodes(_episodes(1)), tmp_path / "b")
    same = write_store(ArrayEpisodes(_episodes(0)), tmp_path / "same")
    fa, fb = fingerprint(open_dataset(a)), fingerprint(open_dataset(b))
    assert fa["content_sha256"] != fb["content_sha256"]
    assert differences(fa, fb) == ["content changed"]
    assert fingerprint(open_dataset(same)) == fa  # the same files under another name
    assert differences(fa, fa) == []


def test_splits_are_by_episode_and_never_overlap(store: Path):
    dataset = open_dataset(store)
    split = split_episodes(dataset, validation_ratio=0.25, seed=3)
    assert len(split.validation) == 1 and set(split.train) | set(split.validation) == {0, 1, 2, 3}
    assert split == split_episodes(dataset, validation_ratio=0.25, seed=3)
    named = split_episodes(dataset, validation="valid")
    assert named.validation == (3,) and named.train == (0, 1, 2)
    with pytest.raises(DatasetError, match="in both"):
        split_episodes(dataset, train=[0, 1], validation=[1])
    with pytest.raises(DatasetError, match="no split named 'test'"):
        split_episodes(dataset, validation="test")


def test_data_info_check_and_convert(store: Path, tmp_path: Path, capsys):
    assert cli.main(["data", "info", str(store)]) == 0
    text = capsys.readouterr().out
    assert "format:   slhub" in text and "episodes: 4 (27 steps" in text
    assert "state: vector float32 [4] names=x,y,vx,vy" in text
    assert "image: image uint8 [6, 5, 3]" in text
    assert cli.main(["data", "check", str(store)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    copy = tmp_path / "copy"
    assert cli.main(["data", "convert", str(store), str(copy)]) == 0
    assert np.array_equal(open_dataset(copy).read("image", 2, 0, 12), _episodes()[2]["image"])


def test_a_non_finite_value_is_one_line_naming_feature_episode_and_step(tmp_path: Path, capsys):
    episodes = _episodes()
    episodes[2]["state"][5, 1] = np.nan
    store = write_store(ArrayEpisodes(episodes), tmp_path / "nan")
    line = cli_error(capsys, "data", "check", str(store))
    assert line.endswith("feature state is not finite at episode 2, step 5")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "no such dataset file or directory"),
        ("unknown", "cannot tell the dataset format"),
        ("truncated", "damaged feature file"),
        ("exists", "exists; convert writes a new directory"),
        ("short", "episode 1 has 3 steps, fewer than 4"),
    ],
)
def test_bad_data_is_one_line_and_exit_2(store: Path, tmp_path: Path, capsys, case, expected):
    args = ["data", "check", str(store)]
    if case == "missing":
        args = ["data", "info", str(tmp_path / "nowhere")]
    elif case == "unknown":
        (tmp_path / "foreign").mkdir()
        (tmp_path / "foreign" / "x.txt").write_text("hello")
        args = ["data", "info", str(tmp_path / "foreign")]
    elif case == "truncated":
        meta = json.loads((store / "meta.json").read_text())
        victim = store / meta["features"]["state"]["file"]
        victim.write_bytes(victim.read_bytes()[:-40])
    elif case == "exists":
        args = ["data", "convert", str(store), str(store)]
    elif case == "short":
        args = ["data", "check", str(store), "--min-length", "4"]
    line = cli_error(capsys, *args)
    assert expected in line


@pytest.mark.parametrize("pad", [True, False])
def test_a_batch_equals_its_windows_one_by_one(store: Path, pad: bool):
    dataset = open_dataset(store)
    window = Window({"state": (-2, 0), "image": (0,), "action": (0, 1, 2)}, pad=pad)
    anchors = sample_anchors(window.anchors(dataset.lengths), 40, torch.Generator())
    batch = window.batch(dataset, anchors)
    one_by_one = [window.at(dataset, int(e), int(s)) for e, s in anchors]
    assert set(batch) == set(one_by_one[0])
    for key, values in batch.items():
        expected = np.stack([w[key] for w in one_by_one])
        assert values.dtype == expected.dtype and np.array_equal(values, expected), key
    base = ArrayEpisodes(_episodes())  # the base class's episode-by-episode read_rows
    generic = window.batch(base, anchors)
    assert all(np.array_equal(generic[key], batch[key]) for key in batch)


def test_statistics_agree_with_lerobots_own_on_its_dataset():
    """min and max are LeRobot's exactly; mean and std differ only by LeRobot computing
    them in float32 per episode (slhub: float64 over every step, one pass), which costs
    its std of a component with a large mean and a small spread (rootz.pos: 1.21 +-
    0.017) about 1e-4 relative."""
    root = Path(__file__).parent / "data" / "datasets"
    oracle = np.load(root / "oracle" / "lerobot_v30.npz")
    names = ["observation.state", "action", "next.reward"]
    stats = feature_statistics(open_dataset(root / "lerobot_v30"), names)
    for name in names:
        for key in ("min", "max"):
            assert np.array_equal(stats[name][key], oracle[f"stats/{name}/{key}"]), (name, key)
        for key, rtol in (("mean", 1e-6), ("std", 1e-3)):
            expected = oracle[f"stats/{name}/{key}"]
            assert np.allclose(stats[name][key], expected, rtol=rtol, atol=1e-7), (name, key)
        assert stats[name]["count"].tolist() == oracle[f"stats/{name}/count"].tolist()
