"""What a model plugin trains on (``slhub.data.TrainingData``), and NeRD trained through it
from every reader's format: roles, windows, statistics, identity, bad data, exact resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import slhub
from helpers import DATASETS, REPO, cli_error, write_recipe
from slhub.builtin.nerd.plugin import NerdPlugin
from slhub.data import (
    ArrayEpisodes,
    DatasetSection,
    Role,
    TrainingData,
    open_dataset,
    write_store,
)
from slhub.errors import DatasetError, RecipeError
from slhub.testing import check_resume_and_revalidate

NERD = REPO / "examples" / "nerd" / "cartpole" / "sl.train.yaml"
ROLES = {"state": Role(default=("pos", "vel")), "action": Role(default=("u",))}
LENGTHS = (9, 4, 15, 7, 12)


def _store(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    episodes = [
        {
            "pos": rng.normal(size=(n, 2)),
            "vel": rng.normal(size=(n,)).astype(np.float32),
            "u": rng.uniform(-1, 1, size=(n, 1)),
            "image": rng.integers(0, 256, size=(n, 4, 3, 3), dtype=np.uint8),
        }
        for n in LENGTHS
    ]
    names = {"pos": ("px", "py")}
    return write_store(ArrayEpisodes(episodes, names=names), tmp_path / "store")


def _open(path: Path, roles=ROLES, **section) -> TrainingData:
    return TrainingData.open(DatasetSection.model_validate({"path": str(path), **section}), roles)


def test_roles_concatenate_features_with_their_component_names(tmp_path):
    data = _open(_store(tmp_path), split={"validation": [1]})
    assert data.layouts["state"].names == ("px", "py", "vel")
    assert data.layouts["action"].names == ("u[0]",)
    assert data.split.train == (0, 2, 3, 4) and data.split.validation == (1,)
    dataset = open_dataset(tmp_path / "store")
    anchors = np.array([[0, 3], [2, 14], [4, 0]])
    window = data.read({"state": range(-1, 2), "action": [0]}, anchors[1:2] - [0, 1])
    pos, vel = dataset.read("pos", 2, 12, 15), dataset.read("vel", 2, 12, 15)
    expected = np.concatenate([pos, vel[:, None].astype(np.float64)], axis=1)
    assert window["state"].dtype == np.float64
    assert np.array_equal(window["state"][0], expected)
    assert np.array_equal(window["action"][0], dataset.read("u", 2, 13, 14))


def test_padded_windows_repeat_the_edge_and_report_it(tmp_path):
    data = _open(_store(tmp_path), window={"pad": True})
    window = data.read({"state": range(-2, 1)}, np.array([[1, 0]]))
    first = data.read({"state": [0]}, np.array([[1, 0]]))["state"][0, 0]
    assert window["state_is_pad"].tolist() == [[True, True, False]]
    assert all(np.array_equal(row, first) for row in window["state"][0])


def test_anchors_stay_in_the_split_and_sampling_uses_only_the_generator(tmp_path):
    data = _open(_store(tmp_path), split={"validation": [2]})
    offsets = {"state": range(-3, 2), "action": range(-3, 1)}
    anchors = data.anchors(offsets, "train")
    assert set(anchors[:, 0]) == {0, 3, 4}  # episode 1 (4 steps) is shorter than 5
    for episode, step in anchors:
        assert 3 <= step <= LENGTHS[episode] - 2
    torch.manual_seed(5)
    before = torch.get_rng_state()
    one = data.sample(offsets, 16, torch.Generator().manual_seed(3))
    two = data.sample(offsets, 16, torch.Generator().manual_seed(3))
    assert torch.equal(torch.get_rng_state(), before)
    assert np.array_equal(one["state"], two["state"]) and np.array_equal(
        one["anchors"], two["anchors"]
    )
    assert 2 not in set(one["anchors"][:, 0])


def test_statistics_are_the_training_episodes_and_cached_by_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    store = _store(tmp_path)
    data = _open(store, split={"validation": [0]})
    dataset = open_dataset(store)
    rows = np.concatenate(
        [
            np.concatenate(
                [dataset.read("pos", e, 0, n), dataset.read("vel", e, 0, n)[:, None]], axis=1
            )
            for e, n in enumerate(LENGTHS)
            if e != 0
        ]
    )
    stats = data.statistics["state"]
    np.testing.assert_allclose(stats["mean"], rows.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], rows.std(0), rtol=1e-12)
    assert np.array_equal(stats["min"], rows.min(0)) and np.array_equal(stats["max"], rows.max(0))
    cache = tmp_path / "xdg" / "slhub" / "statistics"
    cached = list(cache.iterdir())
    assert len(cached) == 1 and not (store / ".slhub").exists()  # never inside the dataset
    again = _open(store, split={"validation": [0]})
    for key in stats:
        assert np.array_equal(again.statistics["state"][key], stats[key])
    assert len(list(cache.iterdir())) == 1
    other = _open(store, split={"validation": [1]})
    assert not np.array_equal(other.statistics["state"]["mean"], stats["mean"])


@pytest.mark.parametrize(
    ("section", "roles", "error", "match"),
    [
        ({"features": {"goal": ["pos"]}}, ROLES, RecipeError, "unknown role 'goal'"),
        ({"features": {"state": ["qpos"]}}, ROLES, DatasetError, r"names feature 'qpos'.*pos, u"),
        ({}, {"state": Role()}, RecipeError, "data.features.state: name the dataset features"),
        ({"features": {"state": ["image"]}}, ROLES, DatasetError, "takes vectors or scalars"),
        ({"features": {"cam": "pos"}}, {"cam": Role(image=True)}, DatasetError, "one image"),
        ({"split": {"train": [7]}}, ROLES, DatasetError, r"train episodes \[7\] do not exist"),
        ({"split": {"train": [0], "validation": [0]}}, ROLES, DatasetError, "in both"),
    ],
)
def test_bad_sections_are_one_line(tmp_path, section, roles, error, match):
    with pytest.raises(error, match=match) as caught:
        _open(_store(tmp_path), roles, **section)
    assert "\n" not in str(caught.value)


def test_a_window_longer_than_every_episode_is_refused_at_once(tmp_path):
    data = _open(_store(tmp_path))
    with pytest.raises(DatasetError, match="shorter than the window .* 20 steps; the longest"):
        data.require_anchors({"state": range(-19, 1)}, "train")


def test_non_finite_values_in_the_validation_split_name_where(tmp_path):
    episodes = [{"s": np.zeros((5, 2)), "u": np.zeros((5, 1))} for _ in range(3)]
    episodes[2]["s"][3, 1] = np.nan
    store = write_store(ArrayEpisodes(episodes), tmp_path / "nan")
    roles = {"state": Role(default=("s",)), "action": Role(default=("u",))}
    with pytest.raises(DatasetError, match="feature s is not finite at episode 2, step 3"):
        _open(store, roles, split={"validation": [2]})


# --------------------------------------------------------------------------- NeRD


#: Every reader's format: the copied reference dataset and the features NeRD reads from it.
FORMATS = {
    "lerobot_v30": {"state": ["observation.state"], "action": ["action"]},
    "lerobot_v21": {"state": ["observation.state"], "action": ["action"]},
    "minari_hdf5": {"state": ["observations"], "action": ["actions"]},
    "minari_arrow": {"state": ["observations"], "action": ["actions"]},
    "robomimic.hdf5": {"state": ["obs/qpos", "obs/qvel"], "action": ["actions"]},
    "replay.zarr": {"state": ["state"], "action": ["action"]},
    "replay_v3.zarr": {"state": ["state"], "action": ["action"]},
    "nerd_trajectories.hdf5": {
        "state": ["states"],
        "action": ["joint_acts"],
        "extra": ["gravity_dir"],
    },
}


def _nerd_recipe(tmp_path: Path, dataset: Path, features: dict, **changes) -> Path:
    changes = {
        "trainer__steps": 6,
        "trainer__batch_size": 8,
        "trainer__validate_every": 3,
        "trainer__save_every": 3,
        "trainer__device": "cpu",
        "trainer__output_dir": str(tmp_path / "run"),
        "model__history": 4,
        "model__width": 16,
        "model__layers": 1,
        "model__heads": 2,
        "model__mlp_hidden": 32,
        "validation__horizons": [2, 8],
        "loss__features": None,
        **changes,
    }
    recipe = write_recipe(tmp_path / "nerd.yaml", base=NERD, **changes)
    import yaml

    raw = yaml.safe_load(recipe.read_text())
    raw["data"] = {
        "path": str(dataset),
        "split": {"validation_ratio": 0.25, "seed": 0},
        "features": features,
    }
    recipe.write_text(yaml.safe_dump(raw))
    return recipe


def _copy(name: str, tmp_path: Path) -> Path:
    source, target = DATASETS / name, tmp_path / "data" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy(source, target)
    return target


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_nerd_trains_from_every_format_and_resumes_exactly(tmp_path, name):
    dataset = _copy(name, tmp_path)
    recipe = _nerd_recipe(tmp_path, dataset, FORMATS[name])
    check = check_resume_and_revalidate(
        recipe, NerdPlugin(), stop_at=int(np.random.default_rng().integers(2, 6)),
        workdir=tmp_path / "runs", in_process=True,
    )  # fmt: skip
    final = check.final("resumed")
    assert final.model["nerd_layout"].dtype == torch.uint8
    recorded = final.run["datasets"]["data"]
    assert recorded["fingerprint"]["format"] == open_dataset(dataset).format
    assert len(recorded["split"]["validation"]) == 1


def test_nerd_layout_follows_the_dataset_and_travels_in_the_export(tmp_path):
    from slhub.export import load
    from slhub.export.writer import run_export

    dataset = _copy("nerd_trajectories.hdf5", tmp_path)
    recipe = _nerd_recipe(
        tmp_path, dataset, FORMATS["nerd_trajectories.hdf5"], model__angles=["states[2]"]
    )
    slhub.train(recipe)
    out = tmp_path / "export"
    run_export(tmp_path / "run" / "last.pt", out)
    predictor = load(out)
    states = [f"states[{i}]" for i in range(12)]
    gravity = [f"gravity_dir[{i}]" for i in range(3)]
    assert predictor.input_names == (*states, *(f"joint_acts[{i}]" for i in range(6)), *gravity)
    assert predictor.layout.angle_names == ("states[2]",)
    assert predictor.manifest["layout"]["angles"] == ["states[2]"]


def test_a_dataset_changed_since_the_run_started_is_refused_on_resume(tmp_path, capsys):
    store = _store(tmp_path)
    features = {"state": ["pos", "vel"], "action": ["u"]}
    recipe = _nerd_recipe(tmp_path, store, features, model__history=2, validation__horizons=[1, 2])
    slhub.train(recipe)
    shutil.rmtree(store)
    rng = np.random.default_rng(1)
    changed = [
        {"pos": rng.normal(size=(n, 2)), "vel": rng.normal(size=(n,)).astype(np.float32),
         "u": rng.uniform(-1, 1, size=(n, 1)),
         "image": np.zeros((n, 4, 3, 3), np.uint8)}
        for n in LENGTHS
    ]  # fmt: skip
    write_store(ArrayEpisodes(changed, names={"pos": ("px", "py")}), store)
    capsys.readouterr()
    line = cli_error(
        capsys, "train", "--config", str(recipe), "--resume", str(tmp_path / "run" / "step_3.pt"),
        "--set", f"trainer.output_dir={tmp_path / 'again'}",
    )  # fmt: skip
    assert "content changed" in line, line
    assert not (tmp_path / "again").exists()


def _truncated(tmp_path: Path) -> Path:
    path = _copy("robomimic.hdf5", tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _not_a_dataset(tmp_path: Path) -> Path:
    folder = tmp_path / "data" / "notes"
    folder.mkdir(parents=True)
    (folder / "readme.txt").write_text("not episodes")
    return folder


def _with_nan(tmp_path: Path) -> Path:
    episodes = [{"s": np.zeros((20, 2)), "u": np.zeros((20, 1))} for _ in range(4)]
    episodes[1]["s"][7, 0] = np.inf
    return write_store(ArrayEpisodes(episodes), tmp_path / "data" / "nan")


ZARR = ("replay.zarr", FORMATS["replay.zarr"])
SU = {"state": ["s"], "action": ["u"]}


@pytest.mark.parametrize(
    ("dataset", "features", "changes", "match"),
    [
        (ZARR[0], {"state": ["nope"], "action": ["action"]}, {}, "names feature 'nope'"),
        (ZARR[0], {"state": ["img"], "action": ["action"]}, {}, "takes vectors or scalars"),
        (*ZARR, {"validation__horizons": [60]}, "horizons up to 60"),
        (*ZARR, {"model__history": 60}, "every train episode is shorter than the window"),
        (*ZARR, {"model__angles": ["theta"]}, "angle 'theta' is not a state"),
        (*ZARR, {"data__format": "lerobot"}, "cannot read LeRobot's info.json"),
        (_not_a_dataset, SU, {}, "format"),
        (_truncated, FORMATS["robomimic.hdf5"], {}, "robomimic.hdf5"),
        (_with_nan, SU, {}, "feature s is not finite at episode 1, step 7"),
        (*ZARR, {"data__split": {"train": [0, 1, 2, 3]}}, "the validation split holds no"),
    ],
)
def test_nerd_bad_data_is_one_line_and_leaves_no_run(
    tmp_path, capsys, dataset, features, changes, match
):
    path = dataset(tmp_path) if callable(dataset) else _copy(dataset, tmp_path)
    split = changes.pop("data__split", None)
    fmt = changes.pop("data__format", None)
    recipe = _nerd_recipe(tmp_path, path, features, **changes)
    if split or fmt:
        import yaml

        raw = yaml.safe_load(recipe.read_text())
        raw["data"].update({"split": split} if split else {}, **({"format": fmt} if fmt else {}))
        recipe.write_text(yaml.safe_dump(raw))
    line = cli_error(capsys, "train", "--config", str(recipe))
    assert match in line, line
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- decode ahead


def _video_stream(tmp_path: Path, workers: int, ahead: int = 2):
    dataset = _copy("lerobot_v30", tmp_path / f"w{workers}")
    roles = {"image": Role(default=("observation.images.front",), image=True)}
    data = _open(dataset, roles, decode={"workers": workers, "ahead": ahead})
    return data.stream({"image": range(-1, 1)}, 4)


def test_video_decoded_ahead_on_threads_equals_decoding_inline(tmp_path):
    inline, threaded = _video_stream(tmp_path, 0), _video_stream(tmp_path, 2)
    one, two = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    try:
        for _ in range(4):
            a, b = inline.next(one), threaded.next(two)
            assert np.array_equal(a["anchors"], b["anchors"])
            assert a["image"].dtype == np.uint8 and a["image"].shape == (4, 2, 48, 48, 3)
            assert np.array_equal(a["image"], b["image"])
        assert torch.equal(one.get_state(), two.get_state())
        # the drawn-ahead anchors are the stream's state: a new stream continues exactly
        state, generator = threaded.state_dict(), two.get_state()
        assert state["pending"].shape == (2, 4, 2)
        expected = threaded.next(two)
        resumed = _video_stream(tmp_path / "again", 2)
        resumed.load_state_dict(state)
        again = resumed.next(torch.Generator().set_state(generator))
        assert np.array_equal(again["image"], expected["image"])
    finally:
        for stream in (inline, threaded):
            stream.close()


def test_nerd_with_windows_drawn_ahead_resumes_exactly_whatever_the_workers(tmp_path):
    from slhub import checkpoint
    from slhub.testing import assert_same_state

    dataset = _copy("replay.zarr", tmp_path)
    recipe = _nerd_recipe(tmp_path, dataset, FORMATS["replay.zarr"])
    finals = []
    for workers in (0, 2):
        overrides = [f"data.decode.workers={workers}", "data.decode.ahead=2"]
        check = check_resume_and_revalidate(
            recipe, NerdPlugin(), stop_at=3, workdir=tmp_path / f"runs{workers}",
            in_process=True, overrides=overrides,
        )  # fmt: skip
        finals.append(check.final("resumed"))
        assert finals[-1].ranks[0]["nerd"]["pending"].shape == (2, 8, 2)
    assert_same_state(finals[0], finals[1])
    assert checkpoint is not None


def test_components_named_alike_by_two_features_are_qualified_by_feature(tmp_path):
    episodes = [{"qpos": np.zeros((4, 2)), "qvel": np.ones((4, 2)), "u": np.zeros((4, 1))}]
    names = {"qpos": ("slider", "hinge"), "qvel": ("slider", "hinge")}
    store = write_store(ArrayEpisodes(episodes * 3, names=names), tmp_path / "q")
    roles = {"state": Role(default=("qpos", "qvel")), "action": Role(default=("u",))}
    data = _open(store, roles)
    assert data.layouts["state"].names == ("qpos.slider", "qpos.hinge", "qvel.slider", "qvel.hinge")


def test_nerd_on_a_dataset_resumes_exactly_on_two_gloo_workers(tmp_path):
    from helpers import warm_launcher

    dataset = _copy("robomimic.hdf5", tmp_path)
    recipe = _nerd_recipe(tmp_path, dataset, FORMATS["robomimic.hdf5"])
    check = check_resume_and_revalidate(
        recipe, NerdPlugin(), stop_at=int(np.random.default_rng().integers(2, 6)),
        workdir=tmp_path / "runs", workers=2, launcher=warm_launcher, cwd=REPO,
    )  # fmt: skip
    final = check.final("resumed")
    assert final.world_size == 2 and len(final.ranks) == 2
    # each rank draws its own windows: their sampler streams differ
    assert not torch.equal(final.ranks[0]["sampler"], final.ranks[1]["sampler"])
