"""``slhub launch``: torch's elastic agent with slhub's exit statuses and one line on
stderr, on 2 Gloo workers: bad input 2, a preemption of the launcher 75 (checkpoint
written, the same command resumes it), a dead worker 1, a normal run 0. The status
rules themselves are checked without launching (:func:`slhub.launch._failed`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import (
    REPO,
    cli_error,
    load,
    metrics_of,
    run_torchrun,
    subprocess_env,
    write_recipe,
)
from slhub import launch
from slhub.preemption import EXIT_PREEMPTED

STEPS = 60
LAUNCH = ("launch", "--standalone", "--nnodes=1", "--nproc-per-node=2")


def _recipe(tmp: Path, name: str, **changes) -> Path:
    keys = {
        "trainer__steps": STEPS,
        "trainer__validate_every": 20,
        "trainer__save_every": 30,
        "trainer__output_dir": str(tmp / name),
        **changes,
    }
    return write_recipe(tmp / f"{name}.yaml", **keys)


def _start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m slhub launch --standalone --nproc-per-node=2 ARGS`` (the launcher)."""
    return subprocess.Popen(
        [sys.executable, "-m", "slhub", *LAUNCH, *args],
        cwd=REPO,
        env=subprocess_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, list[str]]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, [line for line in err.splitlines() if line.strip()]


def _the_line(lines: list[str]) -> str:
    """The launch's one ``slhub:`` line, last; no agent log or traceback anywhere."""
    text = "\n".join(lines)
    assert "Traceback" not in text and "torch.distributed" not in text, text[-3000:]
    ours = [line for line in lines if line.startswith("slhub:")]
    assert len(ours) == 1 and lines[-1] == ours[0], text[-3000:]
    return ours[0]


def test_bad_recipe_exits_2_with_one_line(tmp_path: Path):
    recipe = _recipe(tmp_path, "bad", trainer__bogus=1)
    code, lines = _finish(_start("train", "--config", str(recipe)))
    assert code == 2, lines
    assert len(lines) == 1, lines  # two workers refused it; the user reads it once
    assert lines[0].startswith("slhub: error: ") and "trainer.bogus: unknown key" in lines[0]


def test_plain_torchrun_shows_slhubs_line_first_as_readme_says(tmp_path: Path):
    """README: under plain torchrun a bad input prints slhub's line first (once per
    worker), then torchrun's own failure report, and torchrun exits 1."""
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "prints slhub's one line first, once per worker; torchrun then adds" in readme
    assert "and exits 1" in readme
    recipe = _recipe(tmp_path, "bad", trainer__bogus=1)
    proc = run_torchrun("train", "--config", str(recipe), timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stderr[-3000:]
    ours = [line for line in lines if line.startswith("slhub:")]
    assert lines[: len(ours)] == ours and len(ours) == 2, proc.stderr[-3000:]
    assert all("trainer.bogus: unknown key" in line for line in ours)
    assert "ChildFailedError" in proc.stderr  # torchrun's report, after slhub's lines
    assert not (tmp_path / "bad").exists()


def test_sigterm_to_the_launcher_checkpoints_exits_75_and_the_same_command_resumes(
    tmp_path: Path,
):
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, "run", plugin="slhub_testplugins:Slow")
    command = ("train", "--config", str(recipe), "--resume", "auto")
    proc = _start(*command, env={"SLHUB_SLOW_S": "0.05"})
    deadline = time.monotonic() + 60
    while (
        not (out / "metrics.jsonl").exists()
        or '"step": 3,' not in (out / "metrics.jsonl").read_text()
    ):
        assert proc.poll() is None, _finish(proc)
        assert time.monotonic() < deadline, "update 3 not reached"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    code, lines = _finish(proc)
    assert code == EXIT_PREEMPTED, lines
    line = _the_line(lines)
    step = load(out / "last.pt")["step"]
    assert 3 <= step < STEPS and load(out / f"step_{step}.pt")["step"] == step
    assert max(m["step"] for m in metrics_of(out)) == step  # nothing after the agreed stop
    assert f"at update {step}:" in line
    resume = "slhub launch --standalone --nnodes=1 --nproc-per-node=2 train --config"
    assert resume in line and line.endswith("--resume auto"), line

    code, lines = _finish(_start(*command, env={"SLHUB_SLOW_S": "0"}))  # the requeue
    assert code == 0, lines[-20:]
    assert not [line for line in lines if line.startswith("slhub:")], lines
    assert "torch.distributed" not in "\n".join(lines)
    assert load(out / "last.pt")["step"] == STEPS
    assert [m["step"] for m in metrics_of(out) if "train/loss" in m] == list(range(1, STEPS + 1))


def test_a_worker_that_dies_exits_1_with_one_line(tmp_path: Path):
    recipe = _recipe(tmp_path, "dies", plugin="slhub_testplugins:DiesInBuild")
    code, lines = _finish(_start("train", "--config", str(recipe)))
    assert code == 1, lines
    # rank 0 lost rank 1 in the admission agreement: it leaves that to the launcher
    assert len(lines) == 1, lines
    assert lines[0].startswith("slhub: error: worker rank 1 (pid "), lines
    assert "exited with status 3" in lines[0] and "--resume auto" in lines[0]


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_an_agreed_failure_exits_2_with_the_origin_ranks_line(tmp_path: Path):
    recipe = _recipe(tmp_path, "fault", plugin="slhub_testplugins:FaultInjector")
    env = {"SLHUB_FAULT_PHASE": "objective", "SLHUB_FAULT_RANK": "1", "SLHUB_FAULT_STEP": "2"}
    code, lines = _finish(_start("train", "--config", str(recipe), env=env))
    assert code == 2, lines
    ours = [line for line in lines if line.startswith("slhub:")]
    assert ours == [
        "slhub: error: rank 1 failed during objective: RuntimeError: injected objective failure"
    ], lines
    assert "torch.distributed" not in "\n".join(lines)


def test_usage_errors_are_one_line_before_any_worker_starts(capsys):
    assert "expected `train`" in cli_error(capsys, "launch", "--nproc-per-node=2", "trian")
    assert "unrecognized arguments: --bogus" in cli_error(capsys, "launch", "--bogus", "train")
    assert "--module" in cli_error(capsys, "launch", "--module", "train", "--config", "r.yaml")
    assert "--config" in cli_error(capsys, "launch", "--nproc-per-node=2", "train")
    assert "min_nodes" in cli_error(capsys, "launch", "--nnodes=3:1", "train", "--config", "r")


def _failure(exitcode: int, timestamp: int = 100, pid: int = 7) -> SimpleNamespace:
    """What the agent reports of a failed worker (ProcessFailure's fields used here)."""
    name = signal.Signals(-exitcode).name if exitcode < 0 else ""
    return SimpleNamespace(
        exitcode=exitcode, timestamp=timestamp, pid=pid, signal_name=lambda: name
    )


def _record(rank: int, code: int, line: str, origin: int | None = None) -> dict:
    return {"rank": rank, "code": code, "line": line, "origin": origin, "attempt": 0}


@pytest.mark.parametrize(
    ("failures", "records", "code", "line"),
    [
        # every worker refused the recipe; the agent's SIGTERM met rank 1 on its way out
        (
            {0: _failure(2), 1: _failure(-15)},
            {0: _record(0, 2, "A"), 1: _record(1, 2, "A")},
            2,
            "A",
        ),
        # an agreed failure: the origin rank's line names the cause
        (
            {0: _failure(2), 1: _failure(2)},
            {0: _record(0, 2, "points", 1), 1: _record(1, 2, "cause", 1)},
            2,
            "cause",
        ),
        # a preemption wins over anything else
        ({0: _failure(75), 1: _failure(-15)}, {0: _record(0, 75, "P")}, 75, "P"),
        # a dead worker is the cause; the survivor's record is its consequence
        (
            {0: _failure(1), 1: _failure(3)},
            {0: _record(0, 1, "lost")},
            1,
            "rank 1 (pid 7) exited with status 3",
        ),
        # killed (out of memory) in the same second as the agent stopped rank 0: the kill
        ({0: _failure(-15), 1: _failure(-9)}, {}, 1, "rank 1 (pid 7) was killed by SIGKILL"),
        # a bug on rank 0 (its traceback printed) and bad input on rank 1: not bad input
        ({0: _failure(1), 1: _failure(2)}, {1: _record(1, 2, "B")}, 1, "its traceback is above"),
        # this node's workers lost a peer on another node: their own line
        ({0: _failure(1), 1: _failure(-15)}, {0: _record(0, 1, "lost")}, 1, "lost"),
    ],
)
def test_status_and_line_of_failed_workers(failures, records, code, line):
    outcome = launch._failed(failures, records)
    assert outcome.code == code
    said = outcome.final_line("console")
    assert said is not None and line in said


def test_the_launchers_own_line_follows_the_log_format():
    """A worker's line is printed as the worker wrote it; the launcher's own follows
    ``--log-format`` (a JSON error event for log pipelines)."""
    import json

    died = launch._failed({1: _failure(-9)}, {})
    assert died.final_line("console").startswith("slhub: error: worker rank 1 (pid 7) was")
    event = json.loads(died.final_line("json"))
    assert event["event"] == "error" and "killed by SIGKILL" in event["message"]
    assert launch.Outcome(2, line="as written").final_line("json") == "as written"


def test_records_of_an_earlier_attempt_are_not_read(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(launch.STATUS_ENV, str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    for rank, attempt in ((0, 1), (1, 0)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(attempt))
        assert launch.report(2, f"line {rank}")
    assert list(launch._records(str(tmp_path))) == [0]
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert not launch.report(2, "printed by the caller")  # not a worker of a launch
