"""One trial: an ordinary ``slhub train --resume auto`` run in its own directory, as a
subprocess, with its validation records read from ``metrics.jsonl`` as they are
written, so the sweep reports them to the pruner while the trial trains.

The trial runs in the sweep's process group: a signal to the group (Ctrl-C, a batch
scheduler's stop) reaches both, the trial checkpoints, and the same command resumes
it. ``--resume auto`` makes the first start and every later one the same command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slhub.artifacts import METRICS_FILE, RESUME_EVENT, read_metrics
from slhub.strictjson import NON_FINITE

#: The trial's console output, appended on each start, next to its run's artifacts.
LOG_FILE = "train.log"
#: Seconds between looks at a running trial's metrics.
POLL_S = 0.1
VALIDATION = "validation/"


def train_command(recipe: Path, overrides: list[str], run_dir: Path, workers: int) -> list[str]:
    """The command of a trial: ``python -m slhub train`` on one process, ``python -m
    slhub launch`` with ``workers`` workers on this node otherwise."""
    head = [sys.executable, "-m", "slhub"]
    if workers > 1:
        head += ["launch", "--standalone", "--nnodes=1", f"--nproc-per-node={workers}"]
    words = [*head, "train", "--config", str(recipe)]
    for text in overrides:
        words += ["--set", text]
    return [*words, "--set", f"trainer.output_dir={json.dumps(str(run_dir))}", "--resume", "auto"]


@dataclass
class Validations:
    """The validation records of a run's metrics.jsonl read so far, in order."""

    path: Path
    seen: list[dict[str, Any]] = field(default_factory=list)
    _offset: int = 0
    _inode: int | None = None
    _partial: bytes = b""

    def read(self) -> list[dict[str, Any]]:
        """Validation records appended since the last read (a file moved aside by a fresh
        start is read again from its beginning)."""
        try:
            info = os.stat(self.path)
            if info.st_ino != self._inode or info.st_size < self._offset:
                self._inode, self._offset, self._partial = info.st_ino, 0, b""
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except OSError:
            return []
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        new = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line torn by a kill, fenced by the resumed run
            if not isinstance(record, dict):
                continue
            if record.get("event") == RESUME_EVENT:
                continue  # the resumed run logs the same values again after its checkpoint
            if any(str(key).startswith(VALIDATION) for key in record):
                record = {
                    k: NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in record.items()
                }
                new.append(record)
        self.seen += new
        return new


@dataclass
class Outcome:
    """How a trial's process ended: its exit status (None: the sweep stopped it), and
    whether the sweep stopped it on the pruner's word or for a missing metric."""

    status: int | None
    pruned: bool = False
    missing: dict[str, Any] | None = None


def run_trial(
    command: list[str],
    run_dir: Path,
    metric: str,
    on_validation: Callable[[int, float], bool],
    *,
    check_metric: bool,
    keep_fds: tuple[int, ...] = (),
) -> Outcome:
    """Run ``command`` until it ends. Each new validation value of ``metric`` goes to
    ``on_validation(step, value)``, in step order; True from it (prune) stops the trial
    with SIGTERM (it checkpoints and exits). With ``check_metric``, a first validation
    that lacks ``metric`` stops the trial too (``Outcome.missing`` holds that record).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    validations = Validations(run_dir / METRICS_FILE)
    with open(run_dir / LOG_FILE, "ab") as log:
        proc = subprocess.Popen(  # noqa: S603 - the sweep's own command
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            pass_fds=keep_fds,
        )  # fmt: skip
        try:
            outcome = _watch(proc, validations, metric, on_validation, check_metric)
        except BaseException:
            _wait_quietly(proc)  # a stop signal reached the trial too: let it checkpoint
            raise
    return outcome


def _watch(
    proc: subprocess.Popen[bytes],
    validations: Validations,
    metric: str,
    on_validation: Callable[[int, float], bool],
    check_metric: bool,
) -> Outcome:
    reported: set[int] = set()
    while True:
        status = proc.poll()
        for record in validations.read():
            step = int(record.get("step", 0))
            if metric not in record:
                if check_metric and len(validations.seen) == 1:
                    _stop(proc)
                    return Outcome(None, missing=record)
                continue
            if step in reported:
                continue
            reported.add(step)
            if on_validation(step, float(record[metric])):
                _stop(proc)
                return Outcome(None, pruned=True)
        if status is not None:
            return Outcome(status)
        time.sleep(POLL_S)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (slhub's stop signal: the run checkpoints and exits), then wait."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait()


def _wait_quietly(proc: subprocess.Popen[bytes]) -> None:
    while True:
        try:
            proc.wait()
            return
        except KeyboardInterrupt:
            continue


def final_value(run_dir: Path, metric: str) -> tuple[int, float] | None:
    """(update, value) of ``metric`` at the run's last validation, from its effective
    history; None when no validation logged it."""
    last = None
    for record in read_metrics(run_dir / METRICS_FILE):
        if metric in record:
            last = (int(record["step"]), float(record[metric]))
    return last


def last_line(run_dir: Path) -> str:
    """The last line a trial printed (its one-line error when it failed)."""
    try:
        with open(run_dir / LOG_FILE, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 4096))
            lines = handle.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""
