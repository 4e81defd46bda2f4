"""Preemption and requeue: a stop signal at a random moment loses no committed update,
a kill -9 leaves nothing that blocks ``--resume auto``, and the requeued command (the
original one plus ``--resume auto``) finishes bit-identical to the run never
interrupted, with the same effective metrics.

The SIGKILL matrix runs a few trials here; ``SLHUB_KILL_TRIALS=N`` runs N (slow).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import (
    REPO,
    assert_same_final_state,
    free_port,
    load,
    metrics_of,
    one_line_error,
    run_cli,
    subprocess_env,
    torchrun_env,
    write_recipe,
)
from slhub.preemption import EXIT_PREEMPTED, REPEAT_AFTER_S

STEPS = 120


def _recipe(tmp: Path, out: Path, **changes) -> Path:
    keys = {
        "plugin": "slhub_testplugins:Slow",
        "trainer__steps": STEPS,
        "trainer__validate_every": 20,
        "trainer__save_every": 25,
        "trainer__output_dir": str(out),
        **changes,
    }
    return write_recipe(tmp / f"{out.name}.yaml", **keys)


def _start(recipe: Path, *extra: str, workers: int = 1, port: int | None = None, env=None):
    """Start the run's processes: one, or ``workers`` ranks with torchrun's environment."""
    procs = []
    port = port or free_port()
    for rank in range(workers):
        worker_env = subprocess_env(env)
        if workers > 1:
            worker_env.update(torchrun_env(rank, workers, port))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "slhub", "train", "--config", str(recipe), *extra],
                cwd=REPO,
                env=worker_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    return procs


def _finish(procs, timeout: float = 120) -> list[tuple[int, str]]:
    out = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        out.append((proc.returncode, err))
    return out


def _wait_for_update(folder: Path, step: int, procs, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    path = folder / "metrics.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and f'"step": {step},' in path.read_text():
            return
        if any(p.poll() is not None for p in procs):
            raise AssertionError(f"run ended before update {step}: {_finish(procs)}")
        time.sleep(0.01)
    raise AssertionError(f"update {step} not reached in {timeout} s")


class _References(dict):
    """Uninterrupted runs of the recipe every test interrupts, by worker count, each
    trained on first use (a selection without 2-worker tests never launches one)."""

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp

    def __missing__(self, workers: int) -> Path:
        out = self.tmp / f"w{workers}"
        results = _finish(
            _start(_recipe(self.tmp, out), workers=workers, env={"SLHUB_SLOW_S": "0"})
        )
        assert [rc for rc, _ in results] == [0] * workers, results[0][1][-2000:]
        self[workers] = out
        return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> _References:
    return _References(tmp_path_factory.mktemp("reference"))


def _assert_same_as_reference(run: Path, reference: Path) -> None:
    assert_same_final_state(reference / "last.pt", run / "last.pt")
    assert metrics_of(run) == metrics_of(reference)
    assert not [p.name for p in run.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize(
    ("workers", "signalled"),
    [
        (1, 0),
        pytest.param(2, 1, marks=pytest.mark.slow),
        pytest.param(2, 0, marks=pytest.mark.slow),
    ],
)
def test_stop_signal_checkpoints_the_update_and_resume_auto_is_exact(
    tmp_path: Path, reference, workers: int, signalled: int
):
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, out)
    procs = _start(recipe, "--resume", "auto", workers=workers)  # the requeue-ready command
    _wait_for_update(out, random.randint(3, STEPS // 2), procs)
    sent = time.monotonic()
    procs[signalled].send_signal(random.choice([signal.SIGTERM, signal.SIGUSR1]))
    results = _finish(procs)
    assert time.monotonic() - sent < 30
    codes = [rc for rc, _ in results]
    assert codes == [EXIT_PREEMPTED] * workers, results[0][1][-2000:]
    lines = [line for line in results[0][1].splitlines() if line.startswith("slhub:")]
    assert len(lines) == 1 and "--resume auto" in lines[0], results[0][1][-2000:]
    stopped = load(out / "last.pt")
    step = stopped["step"]
    assert f"at update {step}:" in lines[0]
    assert load(out / f"step_{step}.pt")["step"] == step
    assert max(m["step"] for m in metrics_of(out)) == step  # no update after the agreed stop

    again = _finish(_start(recipe, "--resume", "auto", workers=workers))
    assert [rc for rc, _ in again] == [0] * workers, again[0][1][-2000:]
    _assert_same_as_reference(out, reference[workers])


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_second_signal_exits_at_once_and_a_repeat_is_one_request(tmp_path: Path):
    out = tmp_path / "run"
    gate = tmp_path / "gate"  # never opened: update 3 never commits, so the stop never comes
    procs = _start(_recipe(tmp_path, out), env={"SLHUB_GATE": str(gate)})
    _wait_for_update(out, 2, procs)
    procs[0].send_signal(signal.SIGTERM)
    procs[0].send_signal(signal.SIGTERM)  # the same request delivered twice: ignored
    time.sleep(REPEAT_AFTER_S + 0.5)
    assert procs[0].poll() is None
    procs[0].send_signal(signal.SIGTERM)  # a real second request
    (rc, err), = _finish(procs)  # fmt: skip
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    assert "second SIGTERM: exiting now" in err


def test_repeated_sigterm_after_the_stop_still_exits_preempted(tmp_path: Path):
    """SIGTERM, then SIGTERM every 20 ms until the process is gone (torchrun forwarding
    and then tearing the workers down): the orderly exit is never cut short (75)."""
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, out)
    procs = _start(recipe, "--resume", "auto")
    _wait_for_update(out, 3, procs)
    first = time.monotonic()
    # within the repeat window, so that no repeat counts as a second request (which exits
    # at once by design); the stop and its exit take well under a second here
    while procs[0].poll() is None and time.monotonic() - first < REPEAT_AFTER_S * 0.7:
        procs[0].send_signal(signal.SIGTERM)
        time.sleep(0.02)
    (rc, err), = _finish(procs)  # fmt: skip
    assert rc == EXIT_PREEMPTED, err[-2000:]
    step = load(out / "last.pt")["step"]
    assert load(out / f"step_{step}.pt")["step"] == step
    (rc, err), = _finish(_start(recipe, "--resume", "auto", env={"SLHUB_SLOW_S": "0"}))  # fmt: skip
    assert rc == 0, err[-2000:]
    assert load(out / "last.pt")["step"] == STEPS


@pytest.mark.parametrize("owned", [False, True])
def test_stop_signals_after_a_stop_restore_or_stay_ignored(monkeypatch, owned: bool):
    """The Python API gets its handler back; the CLI (owns the process) keeps ignoring."""
    from slhub import preemption

    monkeypatch.setattr(preemption, "_owns_process", owned)

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGUSR2, mine)
    try:
        with preemption.StopSignals(["SIGUSR2"]) as stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stop.received == signal.SIGUSR2
        assert signal.getsignal(signal.SIGUSR2) is (signal.SIG_IGN if owned else mine)
    finally:
        signal.signal(signal.SIGUSR2, previous)


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_sigterm_to_the_torchrun_agent_checkpoints_every_worker(tmp_path: Path, reference):
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, out)
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
         "--nproc-per-node=2", "-m", "slhub", "train", "--config", str(recipe),
         "--resume", "auto"],
        cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _wait_for_update(out, random.randint(3, STEPS // 2), [agent])
    agent.send_signal(signal.SIGTERM)
    _, err = agent.communicate(timeout=120)
    assert agent.returncode != 0
    assert "preempted by a stop signal at update" in err, err[-3000:]
    step = load(out / "last.pt")["step"]
    assert max(m["step"] for m in metrics_of(out)) == step
    again = _finish(_start(recipe, "--resume", "auto", workers=2))
    assert [rc for rc, _ in again] == [0, 0], again[0][1][-2000:]
    _assert_same_as_reference(out, reference[2])


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_sigkill_at_random_moments_resumes_exactly(tmp_path: Path, reference):
    """kill -9 (no chance to clean up), at random moments; then the requeued command."""
    trials = int(os.environ.get("SLHUB_KILL_TRIALS", "3"))
    rng = random.Random(os.environ.get("SLHUB_KILL_SEED"))
    for trial in range(trials):
        out = tmp_path / f"run{trial}"
        recipe = _recipe(tmp_path, out, trainer__save_every=5)
        procs = _start(recipe, "--resume", "auto", env={"SLHUB_SLOW_S": "0.002"})
        _wait_for_update(out, rng.randint(1, STEPS - 10), procs)
        time.sleep(rng.random() * 0.05)
        procs[0].kill()
        _finish(procs)
        if (out / "last.pt").exists():
            assert load(out / "last.pt")["step"] % 5 == 0  # loads: never torn
        again = _finish(_start(recipe, "--resume", "auto", env={"SLHUB_SLOW_S": "0"}))
        assert again[0][0] == 0, again[0][1][-2000:]
        _assert_same_as_reference(out, reference[1])  # save cadence changes no state


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_two_writers_on_one_directory_exactly_one_proceeds(tmp_path: Path, reference):
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, out)
    gate = tmp_path / "gate"
    first = _start(recipe, env={"SLHUB_GATE": str(gate)})  # holds at update 3 until the gate
    _wait_for_update(out, 2, first)
    fresh = run_cli("train", "--config", str(recipe))
    line = one_line_error(fresh)
    assert "another slhub run writes into this directory" in line
    assert f"pid {first[0].pid} on host" in line
    in_place = run_cli("train", "--config", str(recipe), "--resume", "auto")
    assert f"pid {first[0].pid} on host" in one_line_error(in_place)
    gate.touch()
    (rc, err), = _finish(first)  # fmt: skip
    assert rc == 0, err[-2000:]
    _assert_same_as_reference(out, reference[1])  # the refused writers changed nothing


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_torn_metrics_line_is_fenced_and_resume_in_place_after_a_crash(tmp_path: Path, reference):
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, out, trainer__steps=60)
    assert run_cli("train", "--config", str(recipe), env={"SLHUB_SLOW_S": "0"}).returncode == 0
    with open(out / "metrics.jsonl", "a") as handle:  # updates 61.. of a crashed longer run
        handle.write('{"step": 61, "train/loss": 1.0}\n{"step": 62, "train/lo')
    (out / ".last.pt.tmp-4242").write_bytes(b"half a checkpoint")  # left by a kill -9
    for _ in range(2):  # a second in-place resume must work as well as the first
        proc = run_cli(
            "train", "--config", str(recipe), "--set", f"trainer.steps={STEPS}",
            "--resume", "auto", env={"SLHUB_SLOW_S": "0"},
        )  # fmt: skip
        assert proc.returncode == 0 or "nothing to train" in proc.stderr, proc.stderr[-2000:]
    _assert_same_as_reference(out, reference[1])
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert '{"step": 62, "train/lo' in lines  # nothing written is rewritten or deleted


def test_a_stop_at_the_last_update_completes_the_run(tmp_path: Path, monkeypatch):
    """Nothing would be left to resume: the run ends as done (exit 0), not preempted."""
    import slhub
    from slhub.testing import STOP_AT_ENV

    monkeypatch.setenv(STOP_AT_ENV, "4")
    recipe = write_recipe(
        tmp_path / "r.yaml", plugins=["slhub.testing:StopAt"], trainer__steps=4,
        trainer__output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    out = slhub.train(recipe)
    assert load(out / "last.pt")["step"] == 4


def _children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (from /proc; torchrun's workers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_sigkill_of_a_worker_under_torchrun_resumes_exactly(tmp_path: Path, reference):
    """kill -9 of one of two workers: torchrun tears the job down; the requeued command
    (--resume auto, in place) finishes bit-identical to the uninterrupted run."""
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, out, trainer__save_every=5)
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
         "--nproc-per-node=2", "-m", "slhub", "train", "--config", str(recipe),
         "--resume", "auto"],
        cwd=REPO, env=subprocess_env({"SLHUB_SLOW_S": "0.005"}), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _wait_for_update(out, random.randint(2, STEPS - 20), [agent])
    workers = _children(agent.pid)
    assert len(workers) == 2, workers
    os.kill(random.choice(workers), signal.SIGKILL)
    agent.communicate(timeout=120)
    assert agent.returncode != 0
    again = _finish(_start(recipe, "--resume", "auto", workers=2, env={"SLHUB_SLOW_S": "0"}))
    assert [rc for rc, _ in again] == [0, 0], again[0][1][-2000:]
    _assert_same_as_reference(out, reference[2])
