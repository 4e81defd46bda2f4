"""Bad inputs reported by users, through the real command line: each is one short stderr
line naming the key facts, exit status 2, no traceback, and no file created, changed or
left behind (a destination, its ``.DST.tmp-*`` folder, a run directory, a cache)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from helpers import DATASETS, REPO, cli_error, one_line_error, run_cli, write_recipe

#: The longest a refusal's line may be (temporary paths included).
SHORT = 300
NERD = REPO / "examples" / "nerd" / "cartpole" / "sl.train.yaml"


def short_line(line: str, *facts: str) -> str:
    assert len(line) < SHORT, (len(line), line[:400])
    for fact in facts:
        assert fact in line, (fact, line)
    return line


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every file's bytes (None for a folder) under ``folder``, by relative path."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


def robomimic(path: Path, lengths: list[int], action_dims: list[int]) -> Path:
    """A small robomimic file: ``demo_i`` has ``lengths[i]`` steps of ``obs/qpos`` (2)
    and ``actions`` (``action_dims[i]``)."""
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as handle:
        for i, (length, dim) in enumerate(zip(lengths, action_dims, strict=True)):
            demo = handle.create_group(f"data/demo_{i}")
            demo.attrs["num_samples"] = length
            demo.create_dataset("obs/qpos", data=rng.normal(size=(length, 2)))
            demo.create_dataset("actions", data=rng.uniform(-1, 1, size=(length, dim)))
    return path


# --- 1: a policy that raises while collecting ---------------------------------------------


def test_a_policy_that_raises_names_itself_and_the_step_and_leaves_nothing(tmp_path: Path):
    pytest.importorskip("mujoco")
    pytest.importorskip("gymnasium")
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli(
        "data", "collect", str(out / "data"), "--env", "gymnasium:InvertedPendulum-v5",
        "--episodes", "2", "--steps", "10", "--seed", "0", "--actions", "policy",
        "--policy", "collect_policies:boom",
        env={"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")},
    )  # fmt: skip
    line = one_line_error(proc)
    short_line(
        line,
        "policy collect_policies:boom raised at episode 0 step 3: ValueError: policy bug",
    )
    assert list(out.iterdir()) == []  # neither DST nor .DST.tmp-PID


# --- 2: a truncated HDF5 file is named as such, whatever the format guess ----------------


def _truncated(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A copy of the test dataset ``name`` whose HDF5 file is cut to half its bytes:
    (the path to open, the damaged file)."""
    target = tmp_path / name
    if (DATASETS / name).is_dir():
        shutil.copytree(DATASETS / name, target)
        damaged = next(target.rglob("*.hdf5"))
    else:
        shutil.copyfile(DATASETS / name, target)
        damaged = target
    os.truncate(damaged, damaged.stat().st_size // 2)
    return target, damaged


@pytest.mark.parametrize(
    ("name", "formats"),
    [
        ("robomimic.hdf5", ["auto", "robomimic", "nerd"]),
        ("nerd_trajectories.hdf5", ["auto", "nerd"]),
        ("minari_hdf5", ["auto", "minari"]),
    ],
)
def test_a_truncated_hdf5_file_is_named_truncated(capsys, tmp_path: Path, name, formats):
    pytest.importorskip("h5py")
    path, damaged = _truncated(tmp_path, name)
    before = tree(tmp_path)
    size = damaged.stat().st_size
    for command in ("check", "info"):
        for fmt in formats:
            line = cli_error(capsys, "data", command, str(path), "--format", fmt)
            short_line(line, str(damaged), "damaged HDF5 file, truncated", f"({size} of its ")
    assert tree(tmp_path) == before


# --- 3: an empty demo is refused by check and by training alike --------------------------


def _nerd_recipe(tmp_path: Path, dataset: Path) -> Path:
    recipe = write_recipe(
        tmp_path / "nerd.yaml", base=NERD, trainer__steps=2, trainer__batch_size=4,
        trainer__validate_every=2, trainer__save_every=2, trainer__device="cpu",
        trainer__output_dir=str(tmp_path / "run"), model__history=2, model__width=8,
        model__layers=1, model__heads=2, model__mlp_hidden=8, validation__horizons=[2],
        loss__features=None,
    )  # fmt: skip
    raw = yaml.safe_load(recipe.read_text())
    raw["data"] = {
        "path": str(dataset),
        "cache_dir": str(tmp_path / "cache"),
        "split": {"validation_ratio": 0.25, "seed": 0},
        "features": {"state": ["obs/qpos"], "action": ["actions"]},
    }
    recipe.write_text(yaml.safe_dump(raw))
    return recipe


def test_an_empty_demo_is_refused_by_check_and_by_training(capsys, tmp_path: Path):
    data = robomimic(tmp_path / "demos.hdf5", [12, 0, 12, 12], [1, 1, 1, 1])
    recipe = _nerd_recipe(tmp_path, data)
    before = tree(tmp_path)
    expected = f"{data}: episode 1 is empty (0 steps)"
    short_line(cli_error(capsys, "data", "check", str(data)), expected)
    short_line(cli_error(capsys, "train", "--config", str(recipe)), expected)
    assert tree(tmp_path) == before  # no run directory, no statistics cache


def test_the_same_file_without_the_empty_demo_trains(capsys, tmp_path: Path):
    """The refusal is the empty demo's: the recipe itself is fine."""
    from slhub import cli

    data = robomimic(tmp_path / "demos.hdf5", [12, 12, 12, 12], [1, 1, 1, 1])
    assert cli.main(["train", "--config", str(_nerd_recipe(tmp_path, data))]) == 0
    assert (tmp_path / "run" / "last.pt").is_file()


# --- 4: a worker count below 1 -----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", "launch: --nproc-per-node must be >= 1 (got 0)"),
        ("-2", "launch: --nproc-per-node must be >= 1 (got -2)"),
        ("two", "--nproc-per-node must be a count >= 1 or one of auto, cpu, gpu, xpu (got 'two')"),
    ],
)
def test_launch_refuses_a_worker_count_below_one_by_name(tmp_path: Path, value, expected):
    recipe = write_recipe(tmp_path / "r.yaml", trainer__output_dir=str(tmp_path / "out"))
    before = tree(tmp_path)
    proc = run_cli(
        "launch", "--standalone", f"--nproc-per-node={value}", "train", "--config", str(recipe)
    )
    short_line(one_line_error(proc), expected)
    assert tree(tmp_path) == before


# --- 5: a huge --set value is cut where it is echoed -------------------------------------

HUGE = "a" * 100_000


@pytest.mark.parametrize(
    ("override", "facts"),
    [
        (f"trainer.lr={HUGE}", ["--set trainer.lr=aaa", "(100011 characters)", "must be a number"]),
        (f"modle.x={HUGE}", ["--set modle.x=aaa", "(100008 characters)", "modle: unknown key"]),
        (f"trainer.{HUGE}=1", ["(100010 characters)", "unknown key"]),
        (HUGE, ["--set 'aaa", "(100000 characters)", "expected KEY.PATH=VALUE"]),
        (f"trainer.lr=[{HUGE}", ["(100012 characters)", "value is not valid YAML"]),
        (f"trainer.lr.x={HUGE}", ["(100013 characters)", "lr is not a section"]),
        (f"plugin={HUGE}", ['slhub plugin "aaa', "(100000 characters)", "is not installed"]),
        ("trainer.lr=one\ntwo", ["--set trainer.lr=one\\ntwo", "must be a number"]),
    ],
    ids=["value", "section", "key", "no-equals", "bad-yaml", "not-a-section", "plugin", "newline"],
)
def test_a_huge_set_value_is_cut_where_it_is_echoed(capsys, tmp_path: Path, override, facts):
    recipe = write_recipe(tmp_path / "r.yaml", trainer__output_dir=str(tmp_path / "out"))
    before = tree(tmp_path)
    line = cli_error(capsys, "train", "--config", str(recipe), "--set", override)
    short_line(line, *facts)
    assert tree(tmp_path) == before


def test_the_cut_keeps_a_short_value_whole():
    from slhub.errors import shown

    assert shown("trainer.lr=3") == "trainer.lr=3"
    assert shown("x" * 100) == "x" * 80 + "… (100 characters)"
    assert shown("a\nb", quote=True) == "'a\\\\nb'"


# --- 6: demos whose action dimension differs ---------------------------------------------


def test_an_action_dimension_that_differs_between_demos_is_one_short_line(capsys, tmp_path: Path):
    data = robomimic(tmp_path / "demos.hdf5", [10, 10, 10], [3, 4, 3])
    before = tree(tmp_path)
    for command in ("check", "info"):
        line = cli_error(capsys, "data", command, str(data))
        short_line(
            line,
            f"{data}: demo_1's actions is [4] float64 per step, demo_0's is [3] float64",
        )
    assert tree(tmp_path) == before


def test_a_real_file_with_a_wider_action_names_only_the_feature(capsys, tmp_path: Path):
    """The reported case: the test file's many features are not all listed."""
    h5py = pytest.importorskip("h5py")
    data = tmp_path / "robomimic.hdf5"
    shutil.copyfile(DATASETS / "robomimic.hdf5", data)
    with h5py.File(data, "a") as handle:
        length = handle["data/demo_1/actions"].shape[0]
        del handle["data/demo_1/actions"]
        handle["data/demo_1/actions"] = np.zeros((length, 4), dtype=np.float32)
    line = cli_error(capsys, "data", "check", str(data))
    short_line(line, "demo_1's actions is [4] float32 per step, demo_0's is [3] float32")
    assert "obs/" not in line


def test_a_reader_that_stops_reading_ends_the_command_quietly():
    """``slhub data info ... | head``: a closed pipe ends the command as SIGPIPE would
    (status 141), with no traceback on stderr."""
    import subprocess
    import sys

    from helpers import subprocess_env

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "slhub", "data", "info", str(DATASETS / "lerobot_v30")],
            cwd=REPO, env=subprocess_env(), stdout=write, stderr=subprocess.PIPE, text=True,
            timeout=120,
        )  # fmt: skip
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""
