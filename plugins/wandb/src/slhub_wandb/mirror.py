"""The process that mirrors one slhub process's metrics.jsonl into a W&B run.

Rank 0 of a run starts it (``python -m slhub_wandb.mirror``) at its first metrics
line and hands it, as one JSON line on stdin, what :class:`MirrorSpec` holds. The
mirror follows metrics.jsonl, the file slhub already writes and flushes line by
line, so training pays nothing per update for W&B: no ``wandb`` import, no
serialization, no wait on W&B's service. It logs every complete line that is not
a resume marker and whose step is after ``skip_through`` (what earlier processes
of the run logged), at W&B step = the line's ``step``.

It ends when rank 0 writes the closing line (status, last update, exit code) on
stdin: it logs every line written until then, records the status in the summary
and finishes the W&B run. If stdin closes without that line (rank 0 was killed)
it does the same with status ``failed``. It ignores SIGINT and SIGTERM (a
scheduler signals the whole process group) and runs in its own session, so a
preempted run's last lines still reach W&B.

It keeps out of training's way: at a lower scheduling priority (nice
:data:`NICENESS`, for its session too: :func:`lower_session_priority`) and, where
the process may use more than one CPU, on one CPU only, all inherited by W&B's
service process: one that rank 0's update thread is not running on when the mirror
starts (:func:`mirror_cpus`). Where rank 0 has CPUs to spare, its update thread
keeps off that one and stays where the scheduler put it (:func:`update_thread_cpus`).
Left free to run anywhere, W&B's threads and the update meet on one CPU and the
update slows, even with a CPU idle. The update is never moved: W&B takes a CPU
around it, so training runs where it would without the plugin. On a busy machine
training gets the CPU first and the mirror catches up when it finishes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: What a resume marker in metrics.jsonl holds as ``event``.
RESUME_EVENT = "resume"
#: Metric values slhub writes as strings (strict JSON), read back as floats.
NON_FINITE = frozenset({"NaN", "Infinity", "-Infinity"})
#: Keys whose string values are text.
TEXT_KEYS = frozenset({"event", "checkpoint"})
#: How often the mirror looks for new lines while the run goes on.
POLL_S = 0.05
#: How much the mirror lowers its scheduling priority (``os.nice``).
NICENESS = 10
#: Where Linux keeps the nice value of a process's session (autogroup scheduling).
AUTOGROUP = Path("/proc/self/autogroup")
#: The calling thread's state on Linux; the CPU it runs on is one of its fields.
THREAD_STAT = Path("/proc/thread-self/stat")
#: Which field of :data:`THREAD_STAT` that CPU is, counted after the command name
#: (field 39, ``processor``, of proc(5)).
CPU_FIELD = 36


@dataclass
class MirrorSpec:
    """Everything the mirror needs, sent by rank 0 as one JSON line."""

    metrics: str
    skip_through: int
    #: Keys added to the first row logged (the resume key of a resumed process).
    first_row: dict[str, Any]
    #: ``wandb.init`` keyword arguments (id, project, mode, dir, ...).
    init: dict[str, Any]
    config: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)
    #: The CPUs the mirror and W&B's service keep to (empty: every CPU it was given).
    cpus: list[int] = field(default_factory=list)

    def to_line(self) -> str:
        return json.dumps(asdict(self)) + "\n"


@dataclass
class Closing:
    """How the slhub process ended: the W&B summary's status and step, and exit code."""

    status: str
    step: int | None
    exit_code: int

    def to_line(self) -> str:
        return json.dumps(asdict(self)) + "\n"


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One metrics.jsonl line as a record (None: not one slhub wrote whole)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        return None
    for key, value in record.items():
        if isinstance(value, str) and value in NON_FINITE and key not in TEXT_KEYS:
            record[key] = float(value)
    return record


class Follower:
    """Reads the complete lines appended to a file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_lines(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        return data[:end].splitlines()


def mirror(spec: MirrorSpec, closing: threading.Event, outcome: list[Closing]) -> None:
    """Log the lines of ``spec.metrics`` until ``closing`` is set, then finish the run."""
    import wandb

    run = wandb.init(**spec.init, settings=wandb.Settings(console="off"))
    run.config.update(spec.config, allow_val_change=True)
    for key, value in spec.summary.items():
        run.summary[key] = value
    follower = Follower(Path(spec.metrics))
    first_row = dict(spec.first_row)
    while True:
        done = closing.is_set()  # read once more after the closing line arrived
        for line in follower.new_lines():
            record = parse_line(line)
            if record is None or record.get("event") is not None:
                continue
            if record["step"] <= spec.skip_through:
                continue
            row = {key: value for key, value in record.items() if key != "step"}
            row.update(first_row)
            first_row = {}
            run.log(row, step=record["step"])
        if done:
            break
        closing.wait(POLL_S)
    end = outcome[0] if outcome else Closing("failed", None, 1)
    run.summary["slhub/status"] = end.status
    if end.step is not None:
        run.summary["slhub/step"] = end.step
    run.finish(exit_code=end.exit_code)


def read_commands(closing: threading.Event, outcome: list[Closing]) -> None:
    """Wait for the closing line on stdin (or its end, when rank 0 is gone)."""
    for line in sys.stdin:
        try:
            outcome.append(Closing(**json.loads(line)))
        except (ValueError, TypeError):
            continue
        break
    closing.set()


def current_cpu(stat: Path = THREAD_STAT) -> int | None:
    """The CPU the calling thread runs on (None where the platform does not say)."""
    try:
        return int(stat.read_text(encoding="ascii").rsplit(")", 1)[1].split()[CPU_FIELD])
    except (OSError, IndexError, ValueError):
        return None


def mirror_cpus(allowed: set[int], update_cpu: int | None) -> set[int]:
    """The CPUs the mirror keeps to: where it may use several, the highest-numbered one
    other than ``update_cpu``, the one rank 0's update thread runs on (the scheduler's
    choice, which the update keeps); else all of them."""
    if len(allowed) < 2:
        return set(allowed)
    others = allowed - {update_cpu} if update_cpu is not None else allowed
    return {max(others)}


def update_thread_cpus(
    allowed: set[int], compute_threads: int, mirror: set[int]
) -> set[int] | None:
    """The CPUs rank 0's update thread keeps to while the mirror runs: all it may use
    but the ``mirror``'s, where it may use more CPUs than it has compute threads
    (``torch.get_num_threads()``); else None, it keeps them all.

    Left free, the scheduler moves the update onto the mirror's CPU now and then,
    where it shares that CPU with W&B's work while another CPU stands idle."""
    if len(allowed) < 2 or len(allowed) <= compute_threads:
        return None
    return allowed - mirror


def lower_session_priority(niceness: int, autogroup: Path = AUTOGROUP) -> bool:
    """Give this process's session the nice value ``niceness`` where Linux groups
    the CPU by session (``/proc/self/autogroup``); True if it did.

    Under autogroup scheduling a process's own nice value only weighs it against
    the processes of its session. The mirror has a session of its own, so without
    this its session weighs as much as training's wherever the two share a CPU."""
    try:
        autogroup.write_text(str(niceness), encoding="ascii")
    except OSError:
        return False
    return True


def keep_out_of_the_way(cpus: set[int]) -> None:
    """Lower this process's priority, its session's too, and keep it to ``cpus`` (none:
    the CPUs it has; where the platform has none of these, the mirror runs as it is)."""
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    lower_session_priority(NICENESS)
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec = MirrorSpec(**json.loads(sys.stdin.readline()))
    keep_out_of_the_way(set(spec.cpus))  # before W&B starts: its processes inherit it
    closing = threading.Event()
    outcome: list[Closing] = []
    threading.Thread(target=read_commands, args=(closing, outcome), daemon=True).start()
    started = time.monotonic()
    try:
        mirror(spec, closing, outcome)
    except Exception as exc:  # noqa: BLE001 - reported to rank 0 as one line, training goes on
        sys.stderr.write(f"W&B mirror stopped after {time.monotonic() - started:.0f} s: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
