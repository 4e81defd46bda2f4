"""A run records the datasets its plugins train on; a resume against changed data is
refused in one line naming what changed, or accepted and recorded on request."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import SL_DDP, cli_error
from slhub import cli, train
from slhub.data import ArrayEpisodes, fingerprint, open_dataset, write_store

RECIPE = ["plugin=slhub_testplugins:DatasetProbe", "trainer.steps=4", "trainer.save_every=2"]


def _store(path: Path, seed: int, lengths=(6, 4, 5, 7)) -> Path:
    rng = np.random.default_rng(seed)
    episodes = [{"state": rng.normal(size=(n, 3)).astype(np.float32)} for n in lengths]
    return write_store(ArrayEpisodes(episodes), path)


@pytest.fixture
def run(tmp_path: Path, monkeypatch) -> Path:
    data = _store(tmp_path / "data", seed=0)
    monkeypatch.setenv("SLHUB_PROBE_DATASET", str(data))
    out = tmp_path / "run"
    train(str(SL_DDP), [*RECIPE, f"trainer.output_dir={out}"])
    return out


def test_run_json_records_the_dataset_fingerprint_and_split(run: Path):
    recorded = json.loads((run / "run.json").read_text())["datasets"]["demos"]
    data = open_dataset(run.parent / "data")
    assert recorded["fingerprint"] == fingerprint(data)
    assert sorted(recorded["split"]["train"] + recorded["split"]["validation"]) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("content", "dataset demos: content changed"),
        ("episodes", "dataset demos: episodes 4 -> 3"),
        ("split", "dataset demos: split changed"),
    ],
)
def test_a_resume_against_changed_data_is_refused_naming_the_change(
    run: Path, tmp_path: Path, monkeypatch, capsys, change: str, expected: str
):
    data = run.parent / "data"
    if change == "split":
        monkeypatch.setenv("SLHUB_PROBE_SPLIT_SEED", "5")
    else:
        other = _store(tmp_path / "other", 1, (6, 4, 5) if change == "episodes" else (6, 4, 5, 7))
        monkeypatch.setenv("SLHUB_PROBE_DATASET", str(other))
    args = ["train", "--config", str(SL_DDP), *(f"--set={s}" for s in RECIPE)]
    args += [f"--set=trainer.output_dir={tmp_path / 'resumed'}", "--resume", str(run / "step_2.pt")]
    capsys.readouterr()
    line = cli_error(capsys, *args)
    assert expected in line and "--allow-dataset-change" in line
    assert not (tmp_path / "resumed").exists() or not any((tmp_path / "resumed").iterdir())
    assert data.exists()
    assert cli.main([*args, "--allow-dataset-change"]) == 0
    resumed = json.loads((tmp_path / "resumed" / "run.json").read_text())
    assert expected.split(": ", 1)[1] in " ".join(resumed["resumed_from"]["dataset_changes"])
