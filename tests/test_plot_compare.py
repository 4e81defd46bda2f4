"""``slhub plot RUN_DIR RUN_DIR``: several runs on shared axes, each line labelled by its
run's name and the recipe keys that differ; checked on the figure's objects and on the
description stored in the PNG."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import slhub
from helpers import SL_DDP, run_cli
from slhub.artifacts import read_metrics
from slhub.plot import METADATA_KEY
from slhub.plot_compare import plot_runs

pytest.importorskip("matplotlib")

KEYS = ["train/loss", "train/lr", "validation/mse"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny sl_ddp runs differing in the learning rate and the hidden width."""
    root = tmp_path_factory.mktemp("runs")
    for name, lr, hidden in (("slow", 0.001, 16), ("fast", 0.01, 8)):
        slhub.train(
            SL_DDP,
            [
                "trainer.steps=6",
                "trainer.validate_every=3",
                "trainer.save_every=6",
                f"trainer.lr={lr}",
                f"model.hidden={hidden}",
                f"trainer.output_dir={root / name}",
            ],
        )
    return root / "slow", root / "fast"


def _history(run: Path, key: str) -> tuple[list[int], list[float]]:
    records = [r for r in read_metrics(run / "metrics.jsonl") if r.get(key) is not None]
    return [r["step"] for r in records], [float(r[key]) for r in records]


def test_two_runs_share_the_panels_and_are_labelled_by_what_differs(runs, tmp_path: Path):
    slow, fast = runs
    compared = plot_runs([slow, fast], tmp_path / "both.png")
    assert compared.labels == {
        "slow": "slow: model.hidden=16, trainer.lr=0.001",
        "fast": "fast: model.hidden=8, trainer.lr=0.01",
    }  # output_dir differs too, and is left out
    figure = compared.figure
    assert [ax.get_title(loc="left") for ax in figure.axes] == [
        "train/loss", "validation/mse", "train/lr",
    ]  # fmt: skip
    for ax in figure.axes:
        legend = [text.get_text() for text in ax.get_legend().get_texts()]
        assert legend == list(compared.labels.values()), ax.get_title(loc="left")
        lines = [line for line in ax.get_lines() if line.get_gid() != "resume"]
        assert [line.get_color() for line in lines] == ["C0", "C1"]
    for name, run in (("slow", slow), ("fast", fast)):
        for key in KEYS:
            assert compared.series[name][key] == _history(run, key), (name, key)
    assert compared.title.splitlines()[0] == "2 runs: slow, fast"

    from PIL import Image

    with Image.open(tmp_path / "both.png") as image:
        stored = json.loads(image.text[METADATA_KEY])
    assert stored["labels"] == compared.labels
    assert stored["series"]["fast"]["train/lr"] == [list(s) for s in _history(fast, "train/lr")]


def test_runs_of_the_same_name_are_told_apart_by_run_id(runs, tmp_path: Path):
    slow, fast = runs
    shutil.copytree(slow, tmp_path / "a" / "run")
    shutil.copytree(fast, tmp_path / "b" / "run")
    compared = plot_runs([tmp_path / "a" / "run", tmp_path / "b" / "run"], tmp_path / "x.png")
    ids = [json.loads((r / "run.json").read_text())["run_id"] for r in (slow, fast)]
    assert list(compared.labels) == ids
    assert compared.labels[ids[1]] == f"{ids[1]}: model.hidden=8, trainer.lr=0.01"


def test_equal_recipes_give_names_alone(runs, tmp_path: Path):
    slow, _ = runs
    shutil.copytree(slow, tmp_path / "again")
    compared = plot_runs([slow, tmp_path / "again"], tmp_path / "x.png")
    assert compared.labels == {"slow": "slow", "again": "again"}


def test_the_command_line_writes_compare_png(runs):
    slow, fast = runs
    done = run_cli("plot", str(slow), str(fast))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"plotted 2 runs (train/loss, validation/mse, train/lr) to {slow / 'compare.png'}"
    )
    assert (slow / "compare.png").stat().st_size > 1000


@pytest.mark.parametrize("bad", ["not-a-run", "twice", "no-metrics"])
def test_bad_runs_are_one_line(runs, tmp_path: Path, bad: str):
    slow, _ = runs
    other = tmp_path / "other"
    other.mkdir()
    if bad == "no-metrics":
        shutil.copy(slow / "run.json", other / "run.json")
        (other / "metrics.jsonl").write_text("")
    second = slow if bad == "twice" else other
    done = run_cli("plot", str(slow), str(second), "--out", str(tmp_path / "x.png"))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slhub: error: "), done.stderr
    expected = {
        "not-a-run": "holds no metrics.jsonl and run.json: not a run directory",
        "twice": "the same run as",
        "no-metrics": "has no train/loss, validation or lr values to plot",
    }[bad]
    assert expected in lines[0]
    assert not (tmp_path / "x.png").exists()
