"""``slhub sweep``: the sweep file's schema, bad inputs refused with one line before any
artifact, trial values drawn from the stored trials alone, and (slow) a sweep killed
with SIGKILL mid-trial that, rerun, ends with the trials of an uninterrupted one."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import REPO, cli_error, metrics_of, one_line_error, run_cli, subprocess_env

optuna = pytest.importorskip("optuna")

CARTPOLE = REPO / "examples" / "nerd" / "cartpole" / "sl.train.yaml"
METRIC = "validation/rollout_mse_10"


def tiny_sweep(tmp_path: Path, name: str = "sweep", **changes: Any) -> Path:
    """A sweep of 6 short trials over two keys of examples/nerd/cartpole."""
    data: dict[str, Any] = {
        "recipe": str(CARTPOLE),
        "output_dir": str(tmp_path / name),
        "trials": 6,
        "seed": 0,
        "objective": {"metric": METRIC, "direction": "minimize"},
        "set": {
            "trainer.steps": 40,
            "trainer.validate_every": 10,
            "trainer.save_every": 10,
            "data.generated_train.num_trajectories": 16,
            "data.generated_validation.num_trajectories": 8,
            "data.cache_dir": str(tmp_path / f"cache_{name}"),  # one sweep writes it
        },
        "space": {
            "trainer.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True},
            "model.width": {"choices": [32, 64]},
        },
        "sampler": {"name": "tpe", "n_startup_trials": 3},
        # pruning from update 30: the third trial, killed after its update 20, is running
        "pruner": {"name": "median", "n_startup_trials": 2, "n_warmup_steps": 30},
    }
    data.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# --- the sweep file ------------------------------------------------------------------


def test_the_example_sweep_file_validates_against_its_recipe():
    from slhub.sweep import load_sweep
    from slhub.sweep.space import checked_recipe

    sweep = load_sweep(REPO / "examples" / "nerd" / "cartpole" / "sweep.yaml")
    assert sweep.recipe.resolve() == CARTPOLE
    assert sweep.study == "sweep"
    assert sweep.storage == f"sqlite:///{sweep.output_dir / 'study.db'}"
    recipe = checked_recipe(sweep)
    assert recipe.trainer.steps == 300
    assert set(sweep.spec.space) == {"trainer.lr", "model.width"}


def test_overrides_give_back_every_value_bit_for_bit(tmp_path):
    from slhub.recipe import load_recipe
    from slhub.sweep import load_sweep

    sweep = load_sweep(tiny_sweep(tmp_path))
    lr = 0.0012520653814999472
    recipe = load_recipe(CARTPOLE, sweep.overrides({"trainer.lr": lr, "model.width": 32}))
    assert recipe.trainer.lr == lr and recipe.data["model"]["width"] == 32
    assert recipe.trainer.steps == 40


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"sampler": {"name": "grid"}}, "sampler.name: must be one of 'tpe' or 'random'"),
        ({"pruner": {"name": "hyperband"}}, "pruner.name: must be one of"),
        ({"pruner": {"name": "none", "n_warmup_steps": 3}}, "the pruner none takes no settings"),
        ({"trials": 0}, "trials: must be > 0"),
        ({"objective": {"metric": "rollout_mse_10"}}, "objective.metric: must name a validation"),
        ({"colour": "blue"}, "colour: unknown key"),
        ({"space": {"trainer.lr": {"type": "float", "low": 1, "high": 0.5}}}, "low 1 exceeds"),
        ({"space": {"trainer.lr": {"type": "float", "low": 0, "high": 1, "log": True}}}, "log"),
        ({"space": {"model.width": {"choices": [32, 32]}}}, "choices must be distinct"),
        ({"space": {"model.width": {"type": "int", "low": 1.5, "high": 4}}}, "an integer"),
        ({"space": {"model.width": {"choices": [1], "low": 0}}}, "choices take no low"),
        ({"space": {"trainer.output_dir": {"choices": ["a"]}}}, "is the sweep's"),
        ({"study": "../x"}, "study: letters, digits"),
    ],
)
def test_a_bad_sweep_file_is_one_line_and_exit_2(tmp_path, capsys, change, expected):
    path = tiny_sweep(tmp_path, **change)
    line = cli_error(capsys, "sweep", "--config", str(path))
    assert expected in line, line
    assert str(path) in line
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize(
    ("space", "expected"),
    [
        (
            {"model.widht": {"choices": [32, 64]}},
            "space: model.widht: no such recipe key (model has: history, width,",
        ),
        (
            {"trainer.lrate": {"type": "float", "low": 0.1, "high": 1}},
            "trainer.lrate: no such recipe key (trainer has: steps",
        ),
        (
            {"optimizer.lr": {"type": "float", "low": 0.1, "high": 1}},
            "optimizer.lr: no such recipe key (the recipe has: plugin, trainer,",
        ),
        # a bound the recipe refuses: refused before any trial, not in the trial that draws it
        ({"model.width": {"type": "int", "low": 0, "high": 64}}, "model.width"),
    ],
)
def test_a_space_key_the_recipe_lacks_is_refused_before_anything_is_written(
    tmp_path, capsys, space, expected
):
    path = tiny_sweep(tmp_path, space=space)
    line = cli_error(capsys, "sweep", "--config", str(path))
    assert expected in line, line
    assert not (tmp_path / "sweep").exists()
    assert not (tmp_path / "cache_sweep").exists()  # no trial started, no data made


def test_a_recipe_that_never_validates_is_refused(tmp_path, capsys):
    path = tiny_sweep(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["set"]["trainer.validate_every"] = 0
    path.write_text(yaml.safe_dump(data))
    line = cli_error(capsys, "sweep", "--config", str(path))
    assert "never validates (trainer.validate_every is 0)" in line
    assert not (tmp_path / "sweep").exists()


def test_without_optuna_the_line_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    line = cli_error(capsys, "sweep", "--config", str(tiny_sweep(tmp_path)))
    assert "pip install 'slhub[sweep]'" in line
    line = cli_error(capsys, "sweep", "--config", str(tiny_sweep(tmp_path)), "--summary")
    assert "pip install 'slhub[sweep]'" in line
    assert not (tmp_path / "sweep").exists()


def test_a_summary_of_a_sweep_not_started_is_one_line(tmp_path, capsys):
    path = tiny_sweep(tmp_path)
    line = cli_error(capsys, "sweep", "--config", str(path), "--summary")
    assert "no sweep here yet; run: slhub sweep --config" in line
    assert not (tmp_path / "sweep").exists()


def test_a_study_of_another_sweep_is_not_continued(tmp_path, capsys):
    path = tiny_sweep(tmp_path)
    out = tmp_path / "sweep"
    out.mkdir()
    study = optuna.create_study(study_name="sweep", storage=f"sqlite:///{out / 'study.db'}")
    study.set_user_attr("slhub_sweep", {"space": {"trainer.lr": {}}})
    line = cli_error(capsys, "sweep", "--config", str(path))
    assert "runs another sweep" in line and "space" in line, line
    assert sorted(p.name for p in out.iterdir()) == [".sweep.lock", "study.db"]


def test_an_output_dir_another_sweep_runs_in_or_owns_is_refused(tmp_path, capsys):
    import fcntl

    path = tiny_sweep(tmp_path)
    out = tmp_path / "sweep"
    out.mkdir()
    with open(out / ".sweep.lock", "w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        line = cli_error(capsys, "sweep", "--config", str(path))
    assert "another sweep, or a trial of a killed one, still runs here" in line
    (out / "trial_000").mkdir()
    line = cli_error(capsys, "sweep", "--config", str(path))
    assert "holds trial folders but no sweep.json" in line
    (out / "sweep.json").write_text(json.dumps({"study": "other", "storage": None}))
    line = cli_error(capsys, "sweep", "--config", str(path))
    assert "holds the trials of study 'other'" in line
    assert not (out / "study.db").exists()


def test_the_summary_writes_the_best_trials_recipe_bit_for_bit(tmp_path, capsys):
    """From a stored study (no trial trains here): the table, and best.yaml with the
    best complete trial's values, which loads as a recipe writing into OUTPUT_DIR/best."""
    from slhub import cli
    from slhub.recipe import load_recipe
    from slhub.sweep import load_sweep

    sweep = load_sweep(tiny_sweep(tmp_path))
    sweep.output_dir.mkdir()

    def trial_dir(number: int) -> Path:
        return sweep.output_dir / f"trial_{number:03d}"

    study = optuna.create_study(study_name="sweep", storage=sweep.storage)
    space = {k: p.distribution() for k, p in sweep.spec.space.items()}
    state = optuna.trial.TrialState
    stored = [(0.0012520653814999472, 32, 0.5), (0.007236067528015895, 64, 0.125), (1e-4, 32, None)]
    for lr, width, value in stored:
        study.add_trial(
            optuna.trial.create_trial(
                params={"trainer.lr": lr, "model.width": width},
                distributions=space,
                value=value,
                intermediate_values={10: 0.9 if value is None else value},
                state=state.PRUNED if value is None else state.COMPLETE,
            )
        )
    assert cli.main(["sweep", "--config", str(sweep.path), "--summary"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "trial",
        "state",
        "trainer.lr",
        "model.width",
        METRIC,
        "update",
        "dir",
    ]
    assert out[1].split()[:6] == ["0", "complete", "0.00125207", "32", "0.5", "10"]
    assert out[2].split()[:6] == ["1", "complete", "0.00723607", "64", "0.125", "10"]
    assert out[3].split() == ["2", "pruned", "0.0001", "32", "(0.9)", "10", str(trial_dir(2))]
    best = sweep.output_dir / "best.yaml"
    assert out[4] == (
        f"best: trial 1, {METRIC}=0.125; recipe: {best} (train it: slhub train --config {best})"
    )
    assert out[5].startswith("plot: not drawn (") and len(out) == 6  # no run in the folders
    best = load_recipe(sweep.output_dir / "best.yaml")
    assert best.trainer.lr == 0.007236067528015895 and best.data["model"]["width"] == 64
    assert best.trainer.steps == 40 and best.trainer.output_dir == str(sweep.output_dir / "best")


@pytest.mark.slow
def test_a_metric_never_logged_stops_the_first_trial_and_keeps_nothing(tmp_path):
    """Which metrics a run validates is known once it validates: the first trial's first
    validation decides, and the sweep that began then takes back what it made."""
    path = tiny_sweep(tmp_path, objective={"metric": "validation/rollout_mse_7"})
    proc = run_cli("sweep", "--config", str(path), timeout=240)
    line = one_line_error(proc)
    assert "validation/rollout_mse_7 is never logged" in line, line
    assert "validation/rollout_mse_10" in line  # what the run does log
    assert "the sweep was not started" in line
    assert not (tmp_path / "sweep").exists()


# --- trial values depend on the stored trials alone -------------------------------------


def _drawn(spec, values: list[float], storage: str, restart_at: int | None = None):
    """Ask and tell ``len(values)`` trials; at ``restart_at`` the study is loaded afresh
    from its storage, as a rerun of a killed sweep loads it."""
    from slhub.sweep.study import ask

    study = optuna.create_study(storage=storage, study_name="s", direction="minimize")
    distributions = {k: p.distribution() for k, p in spec.space.items()}
    drawn = []
    for number, value in enumerate(values):
        if number == restart_at:
            study = optuna.load_study(storage=storage, study_name="s")
        trial = ask(study, spec, distributions)
        assert trial.number == number
        drawn.append(dict(trial.params))
        study.tell(trial.number, value)
    return drawn


def test_each_trial_draws_from_the_seed_its_number_and_the_stored_trials(tmp_path):
    from slhub.sweep import load_sweep

    spec = load_sweep(tiny_sweep(tmp_path)).spec
    values = [0.5, 0.25, 0.125, 0.3, 0.2, 0.1]
    db = iter(f"sqlite:///{tmp_path / f'{i}.db'}" for i in range(10))
    first = _drawn(spec, values, next(db))
    assert len({json.dumps(p, sort_keys=True) for p in first}) == len(values)
    for restart_at in (2, 4):
        assert _drawn(spec, values, next(db), restart_at) == first, restart_at
    # after results ranked otherwise, TPE (n_startup_trials 3) draws otherwise
    other = _drawn(spec, [0.1, 8.0, 9.0, 0.1, 0.1, 0.1], next(db))
    assert other[:3] == first[:3] and other[3] != first[3]
    spec.seed += 1
    assert _drawn(spec, values, next(db))[0] != first[0]


# --- the done-when scenario --------------------------------------------------------------


def _sweep_process(path: Path) -> subprocess.Popen[str]:
    """``python -m slhub sweep`` in a process group of its own, so that a SIGKILL of the
    group kills the sweep and its trial together, as a job's kill does."""
    return subprocess.Popen(
        [sys.executable, "-m", "slhub", "sweep", "--config", str(path)],
        cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip


def _trials(path: Path) -> list[tuple[Any, ...]]:
    from slhub.sweep import load_sweep
    from slhub.sweep.study import load_study

    study = load_study(load_sweep(path))
    return [
        (t.number, t.state.name, t.params, t.value, dict(t.intermediate_values))
        for t in study.get_trials()
    ]


def _killed_in_trial(path: Path, run_dir: Path, after_update: int) -> None:
    """Start the sweep and SIGKILL its process group once ``run_dir`` has logged an
    update past ``after_update`` (its checkpoint at that update is written)."""
    proc = _sweep_process(path)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            records = metrics_of(run_dir) if (run_dir / "metrics.jsonl").exists() else []
            if any(r["step"] > after_update for r in records):
                break
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.01)
        else:
            pytest.fail("the trial never reached its update")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_a_sweep_killed_mid_trial_ends_with_the_trials_of_an_uninterrupted_one(tmp_path):
    whole = tiny_sweep(tmp_path, "whole")
    uninterrupted = _sweep_process(whole)  # alongside the killed one: half the wall time
    try:
        killed = tiny_sweep(tmp_path, "killed")
        third = tmp_path / "killed" / "trial_002"
        _killed_in_trial(killed, third, after_update=20)
        stored = _trials(killed)
        assert [t[1] for t in stored][-1] == "RUNNING" and len(stored) == 3
        rerun = subprocess.run(
            [sys.executable, "-m", "slhub", "sweep", "--config", str(killed)],
            cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert "trial 2 resumed" in rerun.stdout
        out, _ = uninterrupted.communicate(timeout=400)
        assert uninterrupted.returncode == 0, out[-3000:]
    finally:
        if uninterrupted.poll() is None:
            os.killpg(uninterrupted.pid, signal.SIGKILL)
            uninterrupted.wait()

    # the interrupted trial continued from its checkpoint, not from the start
    markers = [r for r in _metrics_with_markers(third) if r.get("event") == "resume"]
    assert len(markers) == 1 and markers[0]["step"] >= 20, markers

    expected, got = _trials(whole), _trials(killed)
    assert len(got) == 6 and got == expected  # states, values and reports, float ==
    assert {t[1] for t in got} <= {"COMPLETE", "PRUNED"} and "COMPLETE" in {t[1] for t in got}

    summary = subprocess.run(
        [sys.executable, "-m", "slhub", "sweep", "--config", str(killed), "--summary"],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert summary.returncode == 0, summary.stderr[-3000:]
    best = min((t for t in got if t[1] == "COMPLETE"), key=lambda t: (t[3], t[0]))
    assert f"best: trial {best[0]}, {METRIC}={best[3]!r}" in summary.stdout
    assert (tmp_path / "killed" / "best_trials.png").is_file()
    assert str(tmp_path / "killed" / "best_trials.png") in summary.stdout
    assert len(summary.stdout.splitlines()) == 1 + 6 + 2

    recipe = tmp_path / "killed" / "best.yaml"
    trained = subprocess.run(
        [sys.executable, "-m", "slhub", "train", "--config", str(recipe)],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    last = [r[METRIC] for r in metrics_of(tmp_path / "killed" / "best") if METRIC in r][-1]
    assert not math.isnan(last) and last == best[3]


def _metrics_with_markers(run_dir: Path) -> list[dict[str, Any]]:
    from slhub.artifacts import read_metrics

    return read_metrics(run_dir / "metrics.jsonl", markers=True)
