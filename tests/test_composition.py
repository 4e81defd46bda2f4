"""A run composes one model plugin with further plugins (``plugins:``).

The recipe below adds two extra plugins to the sl_ddp model plugin: ``commit_log``,
installed through an entry point of the fake distribution ``fakeplug``, and
``slhub_testplugins:MetricsTap``, named as ``module:object``. Both must be called,
in the documented order, and their checkpointed state must round-trip on resume
bit for bit, on one process and on two Gloo workers.

Runs on one process are in this process, with ``fakeplug`` put on ``sys.path`` (its
entry points are then found as an installed distribution's); one run is a separate
``slhub`` process with it on ``PYTHONPATH``, end to end.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import slhub
from helpers import REPO, TESTS, cli_error, load, metrics_of, run_cli, write_recipe
from slhub import cli
from slhub.testing import check_resume_exact

FAKE_DISTS = str(TESTS / "fake_dists")
ENV = {"PYTHONPATH": os.pathsep.join([FAKE_DISTS, str(TESTS), str(REPO)])}
EXTRAS = ["commit_log", "slhub_testplugins:MetricsTap"]


@pytest.fixture
def fake_dists(monkeypatch) -> None:
    """``fakeplug`` installed in this process for one test (import caches invalidated;
    ``sys.path`` restored after)."""
    monkeypatch.syspath_prepend(FAKE_DISTS)


def _recipe(tmp_path: Path, plugins: list[str] = EXTRAS, **changes) -> Path:
    keys = {
        "commit_log": {"draws": 4},
        "trainer__steps": 6,
        "trainer__validate_every": 2,
        "trainer__save_every": 3,
        "trainer__output_dir": str(tmp_path / "unused"),
    }
    return write_recipe(tmp_path / "composed.yaml", plugins=plugins, **{**keys, **changes})


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_extra_plugins_are_called_and_resume_bit_exact(tmp_path: Path, workers: int, fake_dists):
    """One worker: the three runs in this process; two: each under torchrun."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **ENV}
    launch = {"in_process": True} if workers == 1 else {"cwd": REPO, "env": env}
    check = check_resume_exact(
        _recipe(tmp_path), stop_at=3, workdir=tmp_path, workers=workers, **launch
    )
    full = check.final("uninterrupted").to_dict()
    assert len(full["ranks"]) == workers
    for rank, entry in enumerate(full["ranks"]):
        assert entry["commit_log"]["commits"] == 6, rank
        assert entry["commit_log"]["draws"].shape == (4,)
        assert entry["metrics_tap"]["steps"].tolist() == [1, 2, 3, 4, 5, 6]
    if workers == 2:  # per-rank streams: the extra plugin's state is each rank's own
        draws = [entry["commit_log"]["draws"] for entry in full["ranks"]]
        assert not bool((draws[0] == draws[1]).all())

    for run in (check.uninterrupted, check.resumed):
        train = [m for m in metrics_of(run) if "train/loss" in m]
        assert [m["train/commit_log_commits"] for m in train] == [1, 2, 3, 4, 5, 6][-len(train) :]
        assert all(m["train/tap_saw_commit_log"] is True for m in train)  # recipe order
        validation = [m for m in metrics_of(run) if "validation/mse" in m]
        assert [m["validation/commit_log_commits"] for m in validation] == [
            float(m["step"]) for m in validation
        ]

    identity = json.loads((check.uninterrupted / "run.json").read_text())
    plugins = identity["source"]["plugins"]
    assert [(p["name"], p["role"]) for p in plugins] == [
        ("examples.sl_ddp.plugin:SlDdpPlugin", "model"),
        ("commit_log", "extra"),
        ("slhub_testplugins:MetricsTap", "extra"),
    ]
    assert (plugins[1]["dist"], plugins[1]["version"]) == ("fakeplug", "1.2")
    assert identity["recipe"]["plugins"] == EXTRAS
    assert load(check.uninterrupted / "last.pt")["run"] == identity


def test_calling_order_follows_the_recipe(tmp_path: Path):
    """Listed before commit_log, the tap runs first and does not see its metric. End to end:
    a separate ``slhub train`` process (helpers.run_cli) finds commit_log's distribution
    on PYTHONPATH."""
    recipe = _recipe(
        tmp_path, plugins=list(reversed(EXTRAS)), trainer__output_dir=str(tmp_path / "o")
    )
    proc = run_cli("train", "--config", str(recipe), env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    train = [m for m in metrics_of(tmp_path / "o") if "train/loss" in m]
    assert train and all(m["train/tap_saw_commit_log"] is False for m in train)


def test_resume_with_another_plugin_set_is_refused(capsys, tmp_path: Path, fake_dists):
    recipe = _recipe(tmp_path, trainer__output_dir=str(tmp_path / "o"), trainer__steps=3)
    slhub.train(str(recipe))
    capsys.readouterr()  # that run's log
    fewer = _recipe(tmp_path, plugins=EXTRAS[:1], trainer__output_dir=str(tmp_path / "p"))
    line = cli_error(
        capsys, "train", "--config", str(fewer), "--resume", str(tmp_path / "o" / "last.pt")
    )
    assert "plugins differ" in line and "MetricsTap" in line
    assert not (tmp_path / "p").exists()


def test_extra_plugin_may_not_implement_a_model_hook(capsys, tmp_path: Path, fake_dists):
    recipe = _recipe(
        tmp_path,
        plugins=["slhub_testplugins:ExtraWithObjective"],
        trainer__output_dir=str(tmp_path / "o"),
    )
    line = cli_error(capsys, "train", "--config", str(recipe))
    assert "ExtraWithObjective" in line and "objective" in line and "only the model plugin" in line
    assert not (tmp_path / "o").exists()


def test_a_plugin_listed_twice_is_refused(capsys, tmp_path: Path, fake_dists):
    recipe = _recipe(
        tmp_path, plugins=["commit_log", "commit_log"], trainer__output_dir=str(tmp_path / "o")
    )
    line = cli_error(capsys, "train", "--config", str(recipe))
    assert "plugins" in line and "commit_log more than once" in line


def test_an_extra_plugins_section_is_validated(capsys, tmp_path: Path, fake_dists):
    recipe = _recipe(tmp_path, trainer__output_dir=str(tmp_path / "o"))
    line = cli_error(capsys, "train", "--config", str(recipe), "--set", "commit_log.draws=0")
    assert "commit_log.draws: must be > 0" in line
    line = cli_error(capsys, "train", "--config", str(recipe), "--set", "plugins=[]")
    assert "commit_log: unknown key" in line


def test_plugins_lists_an_extra_plugin_as_extra(capsys, fake_dists):
    code = cli.main(["plugins"])
    out, err = capsys.readouterr()
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("commit_log "))
    assert row.split()[1] == "extra" and "fakeplug 1.2" in row and "on_commit" in row
