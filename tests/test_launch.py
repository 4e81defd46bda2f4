"""``slhub launch``: torch's elastic agent with slhub's exit statuses and one line on
stderr, on 2 Gloo workers: bad input 2, a preemption of the launcher 75 (checkpoint
written, the same command resumes it), a dead worker 1 (a SIGKILLed one named), a
normal run 0, a stop signal on the last update or after the workers' done records 0,
and no status folder left behind. The status rules themselves are checked without
launching (:func:`slhub.launch._failed`)."""

from __future__ import annotations

import os
import signal
import socket
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
    assert "prints slhub's lines first, one per worker" in readme
    assert "torchrun then adds its own failure report" in readme
    assert "and exits 1" in readme
    recipe = _recipe(tmp_path, "bad", trainer__bogus=1)
    proc = run_torchrun("train", "--config", str(recipe), timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stderr[-3000:]
    ours = [line for line in lines if line.startswith("slhub:")]
    assert lines[: len(ours)] == ours and len(ours) == 2, proc.stderr[-3000:]  # one a worker
    assert any("trainer.bogus: unknown key" in line for line in ours)
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


def _status_folders(temp: Path) -> list[str]:
    """The launchers' status folders (``slhub-launch-PID-*``) in a launch's TMPDIR."""
    return sorted(path.name for path in temp.glob("slhub-launch-*"))


def _dead_pid() -> int:
    """The pid of a process that has ended (as a launcher killed by SIGKILL has)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_stop_signal_on_the_last_update_exits_0_and_stale_folders_go(tmp_path: Path):
    """docs/launch.md: a stop signal that lands in the last update leaves status 0, as
    for `slhub train` (rank 0 sends the launcher SIGTERM in the last update's on_commit;
    the agent forwards it). The launch leaves no status folder, and removes the one a
    launcher killed by SIGKILL left, but not a live launcher's."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    dead = _dead_pid()
    stale = temp / f"slhub-launch-{dead}-gone"
    stale.mkdir()
    (stale / "launcher").write_text(launch._owner(dead))
    (stale / "0.json").write_text("{}")
    live = temp / f"slhub-launch-{os.getpid()}-live"  # this process: a launcher still running
    live.mkdir()
    (live / "launcher").write_text(launch._owner(os.getpid()))
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, "run", plugin="slhub_testplugins:LaunchKillPoints")
    env = {"TMPDIR": str(temp), "SLHUB_TERM_LAUNCHER_AT": str(STEPS)}
    code, lines = _finish(_start("train", "--config", str(recipe), env=env))
    assert code == 0, lines[-20:]
    assert not [line for line in lines if line.startswith("slhub:")], lines
    assert "torch.distributed" not in "\n".join(lines)
    assert load(out / "last.pt")["step"] == STEPS
    assert _status_folders(temp) == [live.name]


def test_a_worker_killed_by_sigkill_is_named_in_the_one_line(tmp_path: Path):
    """Rank 1 SIGKILLs itself in update 3 (as the out-of-memory killer would); rank 0
    loses it in the next agreement. The line names rank 1, not the survivor."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    recipe = _recipe(tmp_path, "oom", plugin="slhub_testplugins:LaunchKillPoints")
    env = {"TMPDIR": str(temp), "SLHUB_SIGKILL_AT": "1:3"}
    code, lines = _finish(_start("train", "--config", str(recipe), env=env))
    assert code == 1, lines
    line = _the_line(lines)
    assert line.startswith("slhub: error: worker rank 1 (pid "), line
    assert "was killed (SIGKILL: out of memory?); the others were stopped" in line
    assert line.endswith("--resume auto continues from the last checkpoint"), line
    assert _status_folders(temp) == []


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_a_stop_signal_after_every_done_record_exits_0(tmp_path: Path):
    """The launcher gets SIGTERM once both workers left their done records (rank 0, at
    its exit): the run completed, status 0 and no line."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, "run", plugin="slhub_testplugins:LaunchKillPoints")
    env = {"TMPDIR": str(temp), "SLHUB_TERM_LAUNCHER_AT": "done"}
    code, lines = _finish(_start("train", "--config", str(recipe), env=env))
    assert code == 0, lines[-20:]
    assert not [line for line in lines if line.startswith("slhub:")], lines
    assert load(out / "last.pt")["step"] == STEPS
    assert _status_folders(temp) == []


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_a_stop_signal_during_the_rendezvous_removes_the_status_folder(tmp_path: Path):
    """SIGTERM while the launcher waits for a second node that never comes (before the
    agent's own handlers): 143 with the launcher's line, and its folder is gone."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    recipe = _recipe(tmp_path, "run")
    proc = subprocess.Popen(
        [sys.executable, "-m", "slhub", "launch", "--nnodes=2", "--nproc-per-node=1",
         "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--rdzv-id=alone",
         "train", "--config", str(recipe)],
        cwd=REPO, env=subprocess_env({"TMPDIR": str(temp)}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not list(temp.glob(f"slhub-launch-{proc.pid}-*/launcher")):
        assert proc.poll() is None, _finish(proc)
        assert time.monotonic() < deadline, "no status folder"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    code, lines = _finish(proc)
    assert code == 128 + signal.SIGTERM, lines
    assert _the_line(lines).startswith("slhub: error: SIGTERM: the workers stopped without")
    assert _status_folders(temp) == []


def test_status_folders_of_launchers_that_are_gone_are_removed(tmp_path: Path):
    me, gone, host = os.getpid(), _dead_pid(), socket.gethostname()
    started = launch._process_start(me)
    owners = {
        "dead": (gone, f"{host} 1"),  # a launcher killed by SIGKILL
        "reused": (me, f"{host} 1"),  # this pid, but an earlier process's
        "live": (me, launch._owner(me)),  # a launcher still running: kept
        "elsewhere": (gone, "another-host 1"),  # a shared TMPDIR: kept
        "starting": (gone, None),  # no owner file yet: kept for a while
        "ownerless": (gone, None),  # ... then judged by its pid
    }
    folders = {}
    for name, (pid, owner) in owners.items():
        folders[name] = tmp_path / f"slhub-launch-{pid}-{name}"
        folders[name].mkdir()
        if owner is not None:
            (folders[name] / "launcher").write_text(owner)
    long_ago = time.time() - 2 * launch._OWNERLESS_AFTER_S
    os.utime(folders["ownerless"], (long_ago, long_ago))
    (tmp_path / "slhub-launch-x").mkdir()  # not a launcher's name: kept
    (tmp_path / f"slhub-launch-{gone}-file").write_text("not a folder")
    removed = launch.remove_stale_folders(tmp_path)
    expected = ["dead", "ownerless", *(["reused"] if started is not None else [])]
    assert sorted(removed) == sorted(folders[name] for name in expected)
    assert sorted(_status_folders(tmp_path)) == sorted(
        [path.name for name, path in folders.items() if name not in expected]
        + ["slhub-launch-x", f"slhub-launch-{gone}-file"]
    )


def test_done_records_make_a_late_stop_signal_status_0(tmp_path: Path, monkeypatch):
    """A worker that finishes leaves a done record; with them a stop signal (or the
    agent's teardown) after the last update leaves the status 0."""
    monkeypatch.setenv(launch.STATUS_ENV, str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        assert launch.report_done()
    done = launch._records(str(tmp_path))
    assert {rank: r["code"] for rank, r in done.items()} == {0: 0, 1: 0}
    assert launch._signalled(signal.SIGTERM, done) == launch.Outcome(0)
    assert launch._completed(done, 2) == launch.Outcome(0)
    assert launch._completed({0: done[0]}, 2) is None
    assert launch._failed({1: _failure(-15)}, {0: done[0]}).code == 1
    late = launch._signalled(signal.SIGTERM, {})  # no record: the workers did not finish
    assert late.code == 143 and "SIGTERM: the workers stopped without" in late.final_line("console")


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
        ({0: _failure(-15), 1: _failure(-9)}, {}, 1, "rank 1 (pid 7) was killed (SIGKILL: out"),
        # rank 1 killed (out of memory); rank 0 lost it and said so: rank 1 is named
        (
            {0: _failure(1, 101), 1: _failure(-9)},
            {0: _record(0, 1, "lost")},
            1,
            "rank 1 (pid 7) was killed (SIGKILL: out of memory?); the others were stopped",
        ),
        # the agent's own SIGKILL, 30 s after its SIGTERM met a worker that ignored it
        ({0: _failure(2), 1: _failure(-9, 130)}, {0: _record(0, 2, "A")}, 2, "A"),
        # a worker that left its done record before the agent's teardown is not a cause
        (
            {0: _failure(-9), 1: _failure(-15, 101)},
            {1: _record(1, 0, "")},
            1,
            "rank 0 (pid 7) was killed (SIGKILL: out of memory?)",
        ),
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
    assert event["event"] == "error" and "killed (SIGKILL: out of memory?)" in event["message"]
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
