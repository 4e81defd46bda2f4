"""A training run never writes into a dataset: an output directory that is, lies inside
or contains a dataset the recipe reads is refused at admission (one line, exit 2,
nothing written), and statistics go to ``data.cache_dir`` or the user's cache, never
into the dataset, so a read-only dataset trains and its fingerprint never changes."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import yaml

import slhub
from helpers import DATASETS, REPO, cli_error, metrics_of, write_recipe
from slhub.data import ArrayEpisodes, write_store

NERD = REPO / "examples" / "nerd" / "cartpole" / "sl.train.yaml"
FEATURES = {"state": ["pos", "vel"], "action": ["u"]}


def _dataset(tmp_path: Path) -> Path:
    """A small store in ``tmp_path/datasets/pusht``: five episodes of 8 to 12 steps."""
    rng = np.random.default_rng(0)
    episodes = [
        {"pos": rng.normal(size=(n, 2)), "vel": rng.normal(size=(n,)), "u": rng.normal(size=(n, 1))}
        for n in (8, 10, 12, 9, 11)
    ]
    return write_store(ArrayEpisodes(episodes), tmp_path / "datasets" / "pusht")


def _recipe(tmp_path: Path, dataset: Path, output_dir: Path, features=FEATURES, **data) -> Path:
    """A NeRD recipe of two tiny updates on ``dataset``, writing into ``output_dir``."""
    recipe = write_recipe(
        tmp_path / "nerd.yaml", base=NERD,
        trainer__steps=2, trainer__batch_size=4, trainer__validate_every=2,
        trainer__save_every=2, trainer__device="cpu", trainer__output_dir=str(output_dir),
        model__history=2, model__width=8, model__layers=1, model__heads=2,
        model__mlp_hidden=8, validation__horizons=[1, 2], loss__features=None,
    )  # fmt: skip
    raw = yaml.safe_load(recipe.read_text())
    raw["data"] = {"path": str(dataset), "split": {"validation": [1]}, "features": features, **data}
    recipe.write_text(yaml.safe_dump(raw))
    return recipe


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (hidden ones too): a file's bytes, None for a folder."""
    if root.is_file():
        return {"": root.read_bytes()}
    return {
        p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def _mtimes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns for p in root.rglob("*")}


# ---------------------------------------------------------------- admission


def _link_to(target: Path, tmp_path: Path) -> Path:
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    return link


@pytest.mark.parametrize(
    ("where", "how", "resume"),
    [
        (lambda data, tmp: data, "is the dataset", None),
        (lambda data, tmp: data, "is the dataset", "auto"),
        (lambda data, tmp: data / "run", "is inside the dataset", None),
        (lambda data, tmp: data / "nested" / "run", "is inside the dataset", "auto"),
        (lambda data, tmp: data.parent, "contains the dataset", None),
        (lambda data, tmp: tmp, "contains the dataset", "auto"),
        (lambda data, tmp: _link_to(data, tmp), "is the dataset", None),
        (lambda data, tmp: _link_to(data, tmp) / "run", "is inside the dataset", "auto"),
    ],
    ids=[
        "equal",
        "equal-auto",
        "inside",
        "inside-auto",
        "parent",
        "ancestor-auto",
        "symlink",
        "through-symlink-auto",
    ],  # fmt: skip
)
def test_an_output_dir_into_a_dataset_is_refused_in_one_line_writing_nothing(
    tmp_path, capsys, where, how, resume
):
    dataset = _dataset(tmp_path)
    out = where(dataset, tmp_path)
    recipe = _recipe(tmp_path, dataset, out)
    existed = out.exists()
    before, around = _tree(dataset), _tree(tmp_path)
    argv = ["train", "--config", str(recipe), *(["--resume", resume] if resume else [])]
    line = cli_error(capsys, *argv)
    real_out, real_data = out.resolve(), dataset.resolve()
    assert f"trainer.output_dir {real_out} {how} data.path {real_data}" in line, line
    assert "never writes into a dataset" in line, line
    assert _tree(dataset) == before  # byte for byte, hidden files included
    assert _tree(tmp_path) == around  # no run directory, lock, run.json or cache anywhere
    assert out.exists() == existed


def test_a_file_dataset_refuses_its_own_path_but_trains_beside_itself(tmp_path, capsys):
    source = DATASETS / "nerd_trajectories.hdf5"
    dataset = tmp_path / "data" / source.name
    dataset.parent.mkdir()
    shutil.copy(source, dataset)
    features = {"state": ["states"], "action": ["joint_acts"]}
    recipe = _recipe(tmp_path, dataset, dataset, features=features, split={})
    line = cli_error(capsys, "train", "--config", str(recipe))
    assert f"trainer.output_dir {dataset.resolve()} is the dataset data.path" in line, line
    before = dataset.read_bytes()
    beside = _recipe(tmp_path, dataset, dataset.parent, features=features, split={})
    assert slhub.train(beside) == dataset.parent  # the file's folder is fine
    assert (dataset.parent / "last.pt").is_file()
    assert dataset.read_bytes() == before


def test_a_cache_dir_inside_the_dataset_is_refused_in_one_line(tmp_path, capsys):
    dataset = _dataset(tmp_path)
    before = _tree(dataset)
    recipe = _recipe(tmp_path, dataset, tmp_path / "run", cache_dir=str(dataset / ".cache"))
    line = cli_error(capsys, "train", "--config", str(recipe))
    assert f"data.cache_dir {dataset.resolve() / '.cache'} is inside the dataset" in line, line
    assert _tree(dataset) == before and not (tmp_path / "run").exists()


# ---------------------------------------------------------------- caches outside


def _read_only(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _writable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def test_a_read_only_dataset_trains_and_its_statistics_go_to_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    dataset = _dataset(tmp_path)
    _read_only(dataset)
    try:
        before = _tree(dataset)  # as root chmod stops no write: compare every path and byte
        slhub.train(_recipe(tmp_path, dataset, tmp_path / "run"))
        assert _tree(dataset) == before
        assert not os.access(dataset, os.W_OK) or os.geteuid() == 0
    finally:
        _writable(dataset)
    statistics = tmp_path / "xdg" / "slhub" / "statistics"
    metas = sorted(statistics.glob("*/meta.json"))
    assert len(metas) == 2  # the roles' statistics and NeRD's state-change statistics
    assert (tmp_path / "run" / "last.pt").is_file()


def test_data_cache_dir_is_honoured_and_reused_by_a_second_run(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    dataset = _dataset(tmp_path)
    before = _tree(dataset)
    cache = tmp_path / "cache"
    slhub.train(_recipe(tmp_path, dataset, tmp_path / "one", cache_dir=str(cache)))
    made = _mtimes(cache)
    assert len(list(cache.glob("statistics/*/meta.json"))) == 2, sorted(made)
    assert not (tmp_path / "xdg" / "slhub" / "statistics").exists()
    slhub.train(_recipe(tmp_path, dataset, tmp_path / "two", cache_dir=str(cache)))
    assert _mtimes(cache) == made  # read, not made again
    assert _tree(dataset) == before
    losses = [[m.get("train/loss") for m in metrics_of(tmp_path / run)] for run in ("one", "two")]
    assert losses[0] == losses[1]


def test_data_info_and_check_write_nothing_into_the_dataset(tmp_path, monkeypatch, capsys):
    from slhub import cli

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    dataset = _dataset(tmp_path)
    before = _tree(dataset)
    for command in ("info", "check"):
        assert cli.main(["data", command, str(dataset)]) == 0
    assert str(dataset) in capsys.readouterr().out
    assert _tree(dataset) == before
