"""What a boundary's checkpoint holds and which checkpoints a run keeps, across resumes.

- Rank 0's state after validation is what its boundary checkpoint holds: a plugin
  whose ``validate`` changes its saved state resumes exactly from every boundary.
- ``trainer.keep_last`` and ``trainer.best`` continue exactly after a preemption and
  a resume in place: the same files kept and deleted, the same best picked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import (
    REPO,
    assert_same_final_state,
    load,
    metrics_of,
    subprocess_env,
    warm_launcher,
    write_recipe,
)
from slhub import train
from slhub.errors import RankFailure
from slhub.preemption import Preempted
from slhub.testing import STOP_AT_ENV, assert_tree_equal, check_resume_exact

STEPS, EVERY = 8, 2
BOUNDARIES = range(EVERY, STEPS, EVERY)  # 2, 4, 6: every boundary a run can stop at
POLICIES = {"trainer__keep_last": 2, "trainer__best": {"metric": "validation/score"}}


def _recipe(tmp_path: Path, **changes) -> Path:
    base = {
        "plugin": "slhub_testplugins:ValidationTracker",
        "trainer__steps": STEPS,
        "trainer__validate_every": EVERY,
        "trainer__save_every": 4,
        "trainer__batch_size": 16,
        "trainer__output_dir": str(tmp_path / "unused"),
    }
    return write_recipe(tmp_path / "tracker.yaml", **{**base, **changes})


def _check(recipe: Path, workdir: Path, stop_at: int, workers: int, in_place: bool):
    launch = (
        {"in_process": True}
        if workers == 1
        else {"cwd": REPO, "env": subprocess_env(), "launcher": warm_launcher}
    )
    return check_resume_exact(
        recipe, stop_at=stop_at, workdir=workdir, workers=workers, in_place=in_place, **launch
    )


def _same_history(check, stop_at: int, in_place: bool) -> None:
    expected = metrics_of(check.uninterrupted)
    actual = metrics_of(check.resumed)
    if not in_place:  # a fresh directory holds the updates after the resume only
        expected = [r for r in expected if r["step"] > stop_at]
    assert actual == expected
    validated = [r for r in expected if "validation/score" in r]
    assert validated, "the run logged no validation to compare"


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow, id="2-workers")])
def test_state_validate_changes_resumes_exactly_from_every_boundary(tmp_path: Path, workers):
    """``check_resume_exact`` compares step, model, optimizer, schedule and every rank's
    state with ``torch.equal``; before the fix rank 0's tracker state in ``step_k.pt``
    was the one before that boundary's validation."""
    recipe = _recipe(tmp_path)
    for stop_at in BOUNDARIES:
        check = _check(recipe, tmp_path / f"stop{stop_at}", stop_at, workers, in_place=False)
        _same_history(check, stop_at, in_place=False)
        stopped = load(check.stopped / f"step_{stop_at}.pt")
        tracker = stopped["ranks"][0]["tracker"]
        assert tracker["count"] == stop_at // EVERY  # this boundary's validation counted
        for rank in range(1, workers):  # only rank 0 validates
            assert stopped["ranks"][rank]["tracker"]["count"] == 0


def test_the_two_worker_boundary_holds_rank_0s_state_after_validation(tmp_path: Path):
    """Fast two-worker case: one stop, in place, at a validation-only boundary."""
    recipe = _recipe(tmp_path)
    check = _check(recipe, tmp_path, stop_at=2, workers=2, in_place=True)
    _same_history(check, 2, in_place=True)
    entries = load(check.stopped / "step_2.pt")["ranks"]
    assert [entry["tracker"]["count"] for entry in entries] == [1, 0]


def _kept(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".pt")


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow, id="2-workers")])
def test_keep_last_and_best_continue_exactly_after_a_preemption_in_place(
    tmp_path: Path, workers: int
):
    recipe = _recipe(tmp_path, **POLICIES)
    for stop_at in BOUNDARIES:
        check = _check(recipe, tmp_path / f"stop{stop_at}", stop_at, workers, in_place=True)
        _same_history(check, stop_at, in_place=True)
        uninterrupted, resumed = check.uninterrupted, check.resumed
        # save_every 4 and the end: step_4, step_8; the stop adds step_k, which keep_last
        # removes again exactly when the uninterrupted run would have
        assert _kept(resumed) == _kept(uninterrupted)
        assert _kept(uninterrupted) == ["best.pt", "last.pt", "step_4.pt", "step_8.pt"]
        best = {
            run: json.loads((run / "run.json").read_text())["best"]
            for run in (uninterrupted, resumed)
        }
        assert best[uninterrupted] == best[resumed]
        a, b = load(uninterrupted / "best.pt"), load(resumed / "best.pt")
        assert a["step"] == b["step"] == best[resumed]["step"]
        for key in ("model", "optimizer", "ranks", "retention"):
            assert_tree_equal(a[key], b[key], key)
        scores = {r["step"]: r["validation/score"] for r in metrics_of(uninterrupted)
                  if "validation/score" in r}  # fmt: skip
        assert best[resumed]["step"] == min(scores, key=scores.get)
        assert best[resumed]["value"] == min(scores.values())


def test_best_follows_the_metric_and_mode_and_keep_last_removes_the_oldest(tmp_path: Path):
    out = tmp_path / "run"
    recipe = _recipe(
        tmp_path, trainer__keep_last=1, trainer__save_every=2,
        trainer__best={"metric": "validation/score", "mode": "max"},
    )  # fmt: skip
    train(recipe, [f"trainer.output_dir={out}"])
    assert _kept(out) == ["best.pt", "last.pt", "step_8.pt"]
    scores = {r["step"]: r["validation/score"] for r in metrics_of(out) if "validation/score" in r}
    best_step = max(scores, key=scores.get)
    assert best_step != STEPS  # the policy picked an earlier boundary, not the latest
    assert load(out / "best.pt")["step"] == best_step
    recorded = json.loads((out / "run.json").read_text())["best"]
    assert recorded == {"step": best_step, "metric": "validation/score",
                        "value": scores[best_step], "file": "best.pt"}  # fmt: skip


def test_a_best_metric_the_run_does_not_validate_fails_naming_it(tmp_path: Path):
    recipe = _recipe(tmp_path, trainer__best={"metric": "validation/accuracy"})
    with pytest.raises(RankFailure, match=r"trainer.best.metric validation/accuracy is not"):
        train(recipe, [f"trainer.output_dir={tmp_path / 'run'}"])


def test_a_run_failed_after_a_best_only_boundary_continues_with_resume_auto(
    tmp_path: Path, monkeypatch
):
    """Boundary 2 validates but does not save; its new best writes best.pt and last.pt,
    so a run that fails at update 3 continues from update 2 under ``--resume auto``."""
    recipe = _recipe(tmp_path, **POLICIES)
    full, out = tmp_path / "full", tmp_path / "failed"
    train(recipe, [f"trainer.output_dir={full}"])
    monkeypatch.setenv("SLHUB_TRACKER_FAIL_AT", "3")
    with pytest.raises(RankFailure, match="injected failure at update 3"):
        train(recipe, [f"trainer.output_dir={out}"])
    assert load(out / "last.pt")["step"] == load(out / "best.pt")["step"] == 2
    assert _kept(out) == ["best.pt", "last.pt"]
    monkeypatch.delenv("SLHUB_TRACKER_FAIL_AT")
    train(recipe, [f"trainer.output_dir={out}"], resume="auto")
    assert_same_final_state(full / "last.pt", out / "last.pt")
    assert _kept(out) == _kept(full)
    assert metrics_of(out) == metrics_of(full)


def test_two_stops_in_a_row_leave_no_stop_checkpoint_behind(tmp_path: Path, monkeypatch):
    """Stopped at 5, resumed, stopped at 7 (both unscheduled), resumed: keep_last lets
    both stop files go, as the uninterrupted run never had them."""
    recipe = _recipe(tmp_path, **POLICIES)
    plugins = 'plugins=["slhub.testing:StopAt"]'
    full, out = tmp_path / "full", tmp_path / "stopped"
    monkeypatch.delenv(STOP_AT_ENV, raising=False)
    train(recipe, [plugins, f"trainer.output_dir={full}"])
    for stop_at in (5, 7):
        monkeypatch.setenv(STOP_AT_ENV, str(stop_at))
        with pytest.raises(Preempted):
            train(recipe, [plugins, f"trainer.output_dir={out}"], resume="auto")
    assert _kept(out) == ["best.pt", "last.pt", "step_4.pt", "step_7.pt"]
    monkeypatch.delenv(STOP_AT_ENV)
    train(recipe, [plugins, f"trainer.output_dir={out}"], resume="auto")
    assert _kept(out) == _kept(full) == ["best.pt", "last.pt", "step_4.pt", "step_8.pt"]
    assert_same_final_state(full / "last.pt", out / "last.pt")


def test_best_without_validation_is_refused_naming_both_keys(tmp_path: Path):
    recipe = _recipe(tmp_path, trainer__validate_every=0, **POLICIES)
    with pytest.raises(Exception, match=r"trainer.best: needs trainer.validate_every > 0"):
        train(recipe, [f"trainer.output_dir={tmp_path / 'run'}"])
