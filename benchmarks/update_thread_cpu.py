"""A benchmark probe plugin: the CPU time rank 0's update thread spends on its updates.

``plugins: ["update_thread_cpu:UpdateThreadCpu"]`` (with ``benchmarks/`` on the path)
reads the thread's CPU clock (``time.thread_time``: user and system time of that
thread alone) at every metrics line and writes, when the run ends, what it spent from
the end of update 1 to the end of the last update into ``update_thread_cpu.json`` in
the output directory. Wall time per update says how long an update took; this says
whether the thread itself ran longer (its code slower) or waited.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from slhub import Trainer, hookimpl

#: The file the probe writes into the output directory.
RESULT = "update_thread_cpu.json"


class UpdateThreadCpu:
    """Reads rank 0's update thread's CPU clock at its first and every later metrics line."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None

    @hookimpl
    def on_log(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        stamp = (step, time.thread_time())
        if self.first is None:
            self.first = stamp
        self.last = stamp

    @hookimpl
    def on_fit_end(self, trainer: Trainer, status: str) -> None:
        if self.first is None or self.last is None or not trainer.is_main:
            return
        result = {
            "updates": self.last[0] - self.first[0],
            "cpu_s": self.last[1] - self.first[1],
        }
        Path(trainer.output_dir, RESULT).write_text(json.dumps(result), encoding="utf-8")


def cpu_ms_per_update(output_dir: Path) -> float:
    """What the probe wrote, as ms of the update thread's CPU per update."""
    result = json.loads((output_dir / RESULT).read_text(encoding="utf-8"))
    return 1e3 * result["cpu_s"] / result["updates"]
