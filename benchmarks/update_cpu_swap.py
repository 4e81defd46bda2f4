"""How fast one sl_ddp update runs on each CPU of this machine, inside one plain run.

    OMP_NUM_THREADS=1 python benchmarks/update_cpu_swap.py              # 20000 updates, 8 runs
    OMP_NUM_THREADS=1 python benchmarks/update_cpu_swap.py --updates 6000 --runs 1   # smoke

A tracker that moves training's update thread to another CPU (to give its own work
a CPU of its own) charges training whatever that CPU costs. The CPUs of a virtual
machine need not run alike: one may take more of the host's interrupts and timers
than another. This script launches the sl_ddp run (``examples/sl_ddp/cpu.yaml``, 1
process, no tracker) and, after ``--warmup`` updates, pins rank 0's update thread to
each CPU it may use in turn, ``--block`` updates at a time, following metrics.jsonl
as ``tracker_interleaved.py`` does. Each run's figure is the mean time per update on
each CPU and each CPU's ratio to the fastest of them; launches start the cycle on a
different CPU in turn. Comparing blocks of one run leaves out what separates two
launches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sl_ddp_vs_torch import slhub_command, source_digest  # noqa: E402
from tracker_interleaved import last_step, start_training, wait_for_success  # noqa: E402


def pinned_run(
    command: list[str], metrics: Path, starts: list[int], cpus: list[int], poll_s: float
) -> dict[int, float]:
    """Launch ``command``; from each step in ``starts`` pin its update thread to the next
    of ``cpus``; the mean seconds per update on each CPU (the last block closes it)."""
    proc, log = start_training(command, metrics)
    marks: list[tuple[int, float, int]] = []
    offset = 0
    while proc.poll() is None and len(marks) < len(starts):
        offset, step = last_step(metrics, offset)
        if step is not None and step >= starts[len(marks)]:
            cpu = cpus[len(marks) % len(cpus)]
            os.sched_setaffinity(proc.pid, {cpu})  # the main thread: the update's
            marks.append((step, time.perf_counter(), cpu))
        time.sleep(poll_s)
    wait_for_success(proc, log)
    if len(marks) < len(starts):
        raise SystemExit(f"the run ended before update {starts[len(marks)]}")
    seconds = dict.fromkeys(cpus, 0.0)
    updates = dict.fromkeys(cpus, 0)
    for (step, when, cpu), (next_step, next_when, _) in zip(marks, marks[1:], strict=False):
        seconds[cpu] += next_when - when
        updates[cpu] += next_step - step
    return {cpu: seconds[cpu] / updates[cpu] for cpu in cpus}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--block", type=int, default=1000)
    parser.add_argument("--poll-ms", type=float, default=3.0)
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    args = parser.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        parser.error("this process may use one CPU only: nothing to compare")
    starts = list(range(args.warmup, args.updates, args.block))
    if len(starts) < len(allowed) + 1:
        parser.error("--updates leaves less than a block a CPU after --warmup")
    base = args.keep or Path(tempfile.mkdtemp(prefix="slhub-update-cpu-swap-"))
    print(
        f"sl_ddp: {args.updates} updates, 1 process, {args.runs} run(s), blocks of "
        f"{args.block} after {args.warmup} on CPUs {allowed}; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}",
        flush=True,
    )
    print(f"slhub {source_digest()}", flush=True)
    ratios: dict[int, list[float]] = {cpu: [] for cpu in allowed}
    for index in range(args.runs):
        folder = base / f"run_{index}"
        order = allowed[index % len(allowed) :] + allowed[: index % len(allowed)]
        per_update = pinned_run(
            slhub_command(args.updates, folder, 1),
            folder / "metrics.jsonl",
            starts,
            order,
            args.poll_ms / 1e3,
        )
        fastest = min(per_update.values())
        for cpu in allowed:
            ratios[cpu].append(per_update[cpu] / fastest)
        print(
            f"run {index}: "
            + ", ".join(
                f"CPU {cpu} {1e3 * per_update[cpu]:.3f} ms ({per_update[cpu] / fastest:.3f})"
                for cpu in allowed
            ),
            flush=True,
        )
    print("\nper CPU, time per update over the fastest CPU of the run:", flush=True)
    for cpu in allowed:
        values = ratios[cpu]
        print(
            f"CPU {cpu}: median {statistics.median(values):.3f} "
            f"(min {min(values):.3f}, max {max(values):.3f}), fastest in "
            f"{sum(v == 1.0 for v in values)} of {len(values)} run(s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
