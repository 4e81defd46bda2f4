"""What the W&B plugin costs an update, measured inside one tracked run: the mirror
(and W&B's service) stopped and running in alternating blocks of updates.

    OMP_NUM_THREADS=1 python benchmarks/tracker_interleaved.py              # 60000 updates, 9 runs
    OMP_NUM_THREADS=1 python benchmarks/tracker_interleaved.py --null       # the same, plain runs
    OMP_NUM_THREADS=1 python benchmarks/tracker_interleaved.py --spin       # a busy CPU instead
    OMP_NUM_THREADS=1 python benchmarks/tracker_interleaved.py --paired --runs 20 --updates 30000 \
        --warmup 3000 --off 200 --on 800                                     # what W&B's work costs
    OMP_NUM_THREADS=1 python benchmarks/tracker_interleaved.py --updates 8000 --warmup 2000 \
        --off 1000 --on 2000 --runs 1                                        # smoke

Launch pairs (``tracker_overhead.py``) differ by more than the overhead: on a 2-core
VM a plain update alone moves by 10% to 20% from one launch to the next. Here one
launch is its own control. The run is ``tracker_overhead.py``'s tracked contestant
(``examples/sl_ddp/cpu.yaml`` with ``plugins: [wandb]``, ``wandb.mode: offline``).
This script follows its metrics.jsonl and, after ``--warmup`` updates, alternates
blocks: ``--off`` updates as in a plain run, with the mirror and its W&B processes
stopped (SIGSTOP: no CPU, no I/O) and the training threads free to use every CPU,
then ``--on`` updates as the plugin runs them, the mirror logging the lines the off
block left as well as its own and rank 0's update thread kept off the mirror's CPU.
Blocks are whole multiples of the checkpoint interval, so each holds the same share
of validations and checkpoints, and long (1000 and 4000 updates, about half a second
and two): each switch signals W&B's processes and may move the update thread, which
costs the update a little that the formula below charges to the mirror. The mirror
does all of its work in the on blocks, so their extra time over the off blocks is
what it costs the run (taking its cost as proportional to the lines it logs):

    ratio = 1 + N_on / (N_on + N_off) * (t_on / t_off - 1)

where ``t_on`` and ``t_off`` are the mean times per update in the on and off blocks
(from when this script sees each block's first and last line, polling every
``--poll-ms``) and ``N_on``, ``N_off`` their update counts. That holds only while the
mirror keeps up: an on block logs (N_on + N_off) / N_on lines an update, 1.25 with
the default blocks, and the script prints the share of a CPU the stopped processes
used in the on blocks; near 100% they fell behind and the ratio leaves out what
they did after. The figure is the median ratio over ``--runs`` launches, with the
smallest and largest, and the mean with its standard error.

Beside the wall clock, the same ratio of the update thread's own time on a CPU
(Linux ``schedstat``; without the time the host ran something else on that CPU,
steal, where the kernel accounts for it), and per update what it waited for a CPU
and what it spent neither running nor waiting (asleep on a disk write, or stolen),
with each CPU's steal share in the two kinds of block: where the extra time of the
on blocks is, in the update's own work or around it.

``--null`` applies the same schedule to the plain run (nothing to stop): its ratios
show the method's own noise; with ``--mirror-only`` the plain run keeps off the
mirror's CPU, as the tracked one does. ``--spin`` runs plain runs beside a process that only
keeps the mirror's CPU busy (the highest-numbered one, at the mirror's nice value),
stopped in the off blocks, with the run kept off that CPU: what a busy neighbour
CPU costs an update on the machine, whatever keeps it busy. ``--paired`` runs, in
every round, a ``--mirror-only`` run and then its control, a ``--null --mirror-only``
run, and prints the difference of their mean ratios with its standard error and a
one-sided 95% bound: what W&B's work costs an update, the two kinds of run taken in
turn so that the machine's drift over the hours falls on both alike. With ``--mirror-only``
an off block only stops the mirror (rank 0's update thread keeps the CPUs the
plugin gave it), which leaves out what keeping the update thread off the mirror's
CPU does. This script starts on the highest-numbered CPU and moves onto the
mirror's once the mirror runs, so that following the file does not take the
update's. Both kinds of block hand every line to the plugin's ``on_log``; what that
adds to a line is timed apart after the runs (the loggers' call with and without
the plugin, in this process) and printed added to the ratio. What it cannot see:
the mirror's start (importing ``wandb``, W&B's service), which falls in the
warm-up, and a cost that outlasts a block, such as the kernel writing W&B's file to
disk later (in a run this short, mostly after it ends).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sl_ddp_vs_torch import ROOT, SAVE_EVERY, slhub_command, source_digest  # noqa: E402
from slhub_wandb.mirror import NICENESS  # noqa: E402
from tracker_overhead import recipe_command, tracked_recipe  # noqa: E402

from slhub import hookimpl  # noqa: E402

#: What the mirror's command line holds (``python -m slhub_wandb.mirror``).
MIRROR_MODULE = "slhub_wandb.mirror"


@dataclass
class Mark:
    """The step this script saw when it switched, when, and the state it switched to."""

    step: int
    time: float
    running: bool
    #: Nanoseconds rank 0's update thread had run on a CPU, and waited for one, by then
    #: (:func:`thread_schedstat`).
    run_ns: int = 0
    wait_ns: int = 0
    #: (steal, total) clock ticks of each CPU by then (:func:`steal_per_cpu`).
    steal: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: CPU clock ticks the mirror and W&B's processes had used by then (:func:`cpu_used`).
    tracker_ticks: int = 0


def last_step(path: Path, offset: int) -> tuple[int, int | None]:
    """The new offset, and the step of the last complete line after ``offset`` (None: none)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return offset, None
    end = data.rfind(b"\n")
    if end < 0:
        return offset, None
    start = data.rfind(b"\n", 0, end) + 1
    return offset + end + 1, json.loads(data[start:end])["step"]


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (Linux ``/proc``), depth first."""
    found: list[int] = []
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        direct = [int(c) for t in tasks for c in (t / "children").read_text().split()]
    except OSError:
        return found
    for child in direct:
        found += [child, *children(child)]
    return found


def mirror_processes(training: int) -> list[int]:
    """The mirror and everything it started, once W&B's service is among them."""
    for pid in children(training):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if MIRROR_MODULE.encode() in command:
            below = children(pid)
            return [pid, *below] if below else []
    return []


def follow_the_mirror(training: int) -> bool:
    """Move this script onto the CPUs of the run's mirror once it runs; True once done."""
    processes = mirror_processes(training)
    if not processes or CPUS is None:
        return False
    try:
        os.sched_setaffinity(0, os.sched_getaffinity(processes[0]))
    except OSError:
        return False
    return True


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


@dataclass
class Paused:
    """What an off block changed: the processes it stopped, the training threads' CPUs."""

    processes: list[int]
    cpus: dict[int, set[int]]


def pause(training: int, processes: list[int], free_threads: bool) -> Paused:
    """Stop ``processes`` (the mirror and its W&B processes, or the spinner) and, with
    ``free_threads``, give the training process's threads every CPU, as in a plain run
    (the plugin keeps rank 0's update thread off the mirror's CPU while the mirror runs)."""
    signal_all(processes, signal.SIGSTOP)
    cpus: dict[int, set[int]] = {}
    for task in Path(f"/proc/{training}/task").iterdir() if free_threads else ():
        try:
            cpus[int(task.name)] = os.sched_getaffinity(int(task.name))
            os.sched_setaffinity(int(task.name), CPUS)
        except OSError:
            continue
    return Paused(processes, cpus)


def resume(paused: Paused) -> None:
    """Undo :func:`pause`."""
    for tid, cpus in paused.cpus.items():
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            continue
    signal_all(paused.processes, signal.SIGCONT)


#: The CPUs this script was given (the run gets them all; this script keeps to one).
CPUS = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def restore_cpus() -> None:
    """In the launched run: every CPU this script was given."""
    if CPUS is not None:
        os.sched_setaffinity(0, CPUS)


def schedule(updates: int, warmup: int, off: int, on: int) -> list[tuple[int, bool]]:
    """(step, running from there) for every switch: off and on blocks from ``warmup``,
    ending with an on block at least one on block before the last update."""
    switches, step = [], warmup
    while step + off + on + on <= updates:
        switches += [(step, False), (step + off, True)]
        step += off + on
    return switches + [(step, True)]


def start_training(
    command: list[str], metrics: Path, preexec_fn: Callable[[], None] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """Launch the run ``command`` (its metrics.jsonl is ``metrics``) from the repository,
    its stderr into a log file beside its folder; the process and that log."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    log = metrics.parent.with_suffix(".log")
    metrics.parent.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
            preexec_fn=preexec_fn,
        )  # fmt: skip
    return proc, log


def wait_for_success(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait for the run to end; stop with its log's tail if it failed."""
    if proc.wait() != 0:
        sys.stderr.write(log.read_text(encoding="utf-8", errors="replace")[-4000:])
        raise SystemExit(f"the run failed with exit code {proc.returncode}")


def start_spinner() -> subprocess.Popen[bytes]:
    """A process that only keeps a CPU busy, where and as the mirror would run: on the
    highest-numbered CPU, at the mirror's nice value."""
    code = f"import os\nos.nice({NICENESS})\nos.sched_setaffinity(0, {{{max(CPUS or {0})}}})\n"
    return subprocess.Popen([sys.executable, "-c", code + "while True: pass"])


def off_the_spinner() -> None:
    """In the launched run beside a spinner: every CPU this script was given but its."""
    if CPUS is not None and len(CPUS) > 1:
        os.sched_setaffinity(0, CPUS - {max(CPUS)})


def interleaved_run(
    command: list[str], metrics: Path, switches: list[tuple[int, bool]], tracked: bool,
    free_threads: bool, poll_s: float, spin: bool = False, off_top_cpu: bool = False,
) -> list[Mark]:  # fmt: skip
    """Launch ``command`` and stop/continue the mirror (or, with ``spin``, a spinner
    beside a plain run) at ``switches``; the marks seen. With ``spin`` or
    ``off_top_cpu`` the run keeps off the highest-numbered CPU."""
    if CPUS is not None:
        os.sched_setaffinity(0, {max(CPUS)})  # until the mirror runs: follow_the_mirror
    spinner = start_spinner() if spin else None
    proc, log = start_training(
        command, metrics, preexec_fn=off_the_spinner if spin or off_top_cpu else restore_cpus
    )
    marks: list[Mark] = []
    paused: Paused | None = None
    pending = list(switches)
    offset = 0
    followed = False
    try:
        while proc.poll() is None and pending:
            offset, step = last_step(metrics, offset)
            if tracked and not followed:
                followed = follow_the_mirror(proc.pid)
            if step is not None and step >= pending[0][0]:
                running = pending.pop(0)[1]
                now = time.perf_counter()
                helpers = [spinner.pid] if spinner else []
                if tracked:
                    helpers = mirror_processes(proc.pid)
                    if not helpers:
                        raise SystemExit(
                            f"no W&B mirror with its service by update {step}: raise --warmup"
                        )
                if helpers and not running:
                    paused = pause(proc.pid, helpers, free_threads)
                elif paused is not None:
                    resume(paused)
                    paused = None
                tracker = cpu_used(helpers)
                marks.append(
                    Mark(step, now, running, *thread_schedstat(proc.pid), steal_per_cpu(), tracker)
                )
            time.sleep(poll_s)
    except BaseException:
        if paused is not None:
            resume(paused)
            paused = None
        proc.kill()  # the run is of no use unmeasured; the mirror ends with it
        proc.wait()
        raise
    finally:
        if paused is not None:
            resume(paused)
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    wait_for_success(proc, log)
    if pending:
        raise SystemExit(f"the run ended before update {pending[0][0]}")
    return marks


class OtherLogger:
    """Stands for the loggers a plain run hands its lines to (slhub's progress)."""

    @hookimpl
    def on_log(self, trainer: Any, step: int, metrics: dict[str, Any]) -> None:
        return None


def hook_us_per_line(calls: int = 200_000) -> float:
    """What the plugin adds to rank 0's hand-off of one metrics line (``on_log``), in
    microseconds: slhub's call of the loggers with the W&B plugin (its mirror started)
    among them, less the same call without it. Both kinds of block of a tracked run
    pay it, so the ratio leaves it out; it is added apart."""
    import pluggy
    from slhub_wandb.plugin import WandbLogger

    from slhub import hookspecs
    from slhub.registry import direct_caller

    def seconds(with_plugin: bool) -> float:
        manager = pluggy.PluginManager(hookspecs.PROJECT)
        manager.add_hookspecs(hookspecs)
        manager.register(OtherLogger(), "other")
        if with_plugin:
            logger = WandbLogger()
            logger.mirror = subprocess.Popen([sys.executable, "-c", ""], stdin=subprocess.PIPE)
            logger.mirror.communicate()
            manager.register(logger, "wandb")
        on_log = direct_caller(manager, "on_log")
        line = {"step": 1, "train/loss": 0.5}
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            for step in range(calls):
                on_log(trainer=None, step=step, metrics=line)
            best = min(best, time.perf_counter() - started)
        return best

    return (seconds(True) - seconds(False)) / calls * 1e6


def thread_schedstat(pid: int) -> tuple[int, int]:
    """How long the main thread of ``pid`` (rank 0's update thread) has run on a CPU,
    and waited, runnable, for one, in nanoseconds (Linux ``schedstat``; 0, 0 elsewhere).
    Time the host ran something else on its CPU (steal) is in neither where the kernel
    accounts for steal (``CONFIG_PARAVIRT_TIME_ACCOUNTING``)."""
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
        return int(fields[0]), int(fields[1])
    except (OSError, IndexError, ValueError):
        return 0, 0


def cpu_used(pids: list[int]) -> int:
    """User and system clock ticks the processes ``pids`` have used (Linux ``/proc``)."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime: fields 14, 15 of proc(5)
    return ticks


def tracker_share(marks: list[Mark]) -> float:
    """The share of one CPU the mirror and W&B's processes used in the on blocks."""
    seconds = in_blocks(marks, wall_s)[True]
    ticks = in_blocks(marks, lambda mark: mark.tracker_ticks)[True]
    return ticks / os.sysconf("SC_CLK_TCK") / seconds if seconds else 0.0


def steal_per_cpu() -> dict[int, tuple[int, int]]:
    """(steal, total) clock ticks of each CPU so far (Linux ``/proc/stat``; empty elsewhere)."""
    ticks: dict[int, tuple[int, int]] = {}
    try:
        lines = Path("/proc/stat").read_text(encoding="ascii").splitlines()
    except OSError:
        return ticks
    for line in lines:
        fields = line.split()
        if fields and fields[0].startswith("cpu") and fields[0][3:].isdigit():
            values = [int(value) for value in fields[1:9]]
            ticks[int(fields[0][3:])] = (values[7], sum(values))
    return ticks


def cpu_ticks() -> tuple[int, int]:
    """(steal, total) clock ticks of all CPUs so far (:func:`steal_per_cpu` summed).
    Steal is time a virtual machine's CPU was ready to run and the host ran something
    else: where it is high, work on one CPU takes time from the others."""
    per_cpu = steal_per_cpu().values()
    return sum(steal for steal, _ in per_cpu), sum(total for _, total in per_cpu)


def lines_per_update(metrics: Path, updates: int) -> float:
    """How many lines rank 0 hands to ``on_log`` per update (update and validation lines)."""
    with open(metrics, "rb") as handle:
        return sum(1 for _ in handle) / updates


def wall_s(mark: Mark) -> float:
    return mark.time


def update_thread_s(mark: Mark) -> float:
    return mark.run_ns / 1e9


def waiting_s(mark: Mark) -> float:
    return mark.wait_ns / 1e9


def blocked_s(mark: Mark) -> float:
    """Wall time the update thread neither ran nor waited for a CPU: it slept (on a
    disk write, say) or the host ran something else on its CPU."""
    return mark.time - (mark.run_ns + mark.wait_ns) / 1e9


def in_blocks(marks: list[Mark], value: Callable[[Mark], float]) -> dict[bool, float]:
    """How much ``value`` grew over the off blocks (False) and the on blocks (True)."""
    grown = {True: 0.0, False: 0.0}
    for start, end in pairwise(marks):
        grown[start.running] += value(end) - value(start)
    return grown


def ratio(marks: list[Mark], clock: Callable[[Mark], float] = wall_s) -> tuple[float, float, float]:
    """(ratio, t_on, t_off) in ms per update from the blocks between consecutive marks,
    timed by ``clock`` (seconds): the wall clock, or the update thread's own time."""
    time_in = in_blocks(marks, clock)
    updates_in = in_blocks(marks, lambda mark: mark.step)
    t_on = time_in[True] / updates_in[True]
    t_off = time_in[False] / updates_in[False]
    share_on = updates_in[True] / (updates_in[True] + updates_in[False])
    return 1 + share_on * (t_on / t_off - 1), 1e3 * t_on, 1e3 * t_off


def steal_in_blocks(marks: list[Mark]) -> dict[int, tuple[float, float]]:
    """Each CPU's steal share of its time in the off blocks and in the on blocks."""
    shares = {}
    for cpu in marks[0].steal:
        steal = in_blocks(marks, lambda mark, cpu=cpu: mark.steal[cpu][0])
        total = in_blocks(marks, lambda mark, cpu=cpu: mark.steal[cpu][1])
        shares[cpu] = (steal[False] / max(1, total[False]), steal[True] / max(1, total[True]))
    return shares


def summary(ratios: list[float]) -> str:
    """median (min, max), mean +- standard error over the runs."""
    error = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else 0.0
    return (
        f"median over {len(ratios)} run(s): {statistics.median(ratios):.4f} "
        f"(min {min(ratios):.4f}, max {max(ratios):.4f}), "
        f"mean {statistics.mean(ratios):.4f} +- {error:.4f}"
    )


@dataclass(frozen=True)
class Mode:
    """One kind of run this script launches and how it treats it."""

    label: str
    #: What the header line calls it.
    what: str
    #: A run with the W&B plugin (else a plain run).
    tracked: bool
    #: Off blocks give the training threads every CPU (else they keep the plugin's).
    free_threads: bool
    #: A spinner stands where the mirror would run.
    spin: bool = False
    #: The run keeps off the highest-numbered CPU (the mirror's or the spinner's).
    off_top_cpu: bool = False


#: ``--paired``: W&B's work alone, then its control, in every round.
PAIRED = (
    Mode("W&B", "W&B offline, mirror only", tracked=True, free_threads=False),
    Mode(
        "plain",
        "plain, kept off the mirror's CPU",
        tracked=False,
        free_threads=False,
        off_top_cpu=True,
    ),
)


def chosen_modes(args: argparse.Namespace) -> tuple[Mode, ...]:
    """The runs of one round: both of :data:`PAIRED`, or the one the flags name."""
    if args.paired:
        return PAIRED
    plain = args.null or args.spin
    label, what = ("plain", "plain (null check)") if args.null else ("W&B", "W&B offline")
    if args.spin:
        label, what = "plain beside a spinner", "plain, beside a spinner on the mirror's CPU"
    if args.mirror_only:
        what += ", kept off the mirror's CPU" if args.null else ", mirror only"
    return (
        Mode(
            label,
            what,
            tracked=not plain,
            free_threads=not args.mirror_only and not args.spin,
            spin=args.spin,
            off_top_cpu=args.null and args.mirror_only,
        ),
    )


@dataclass
class Ratios:
    """What one mode's runs measured."""

    wall: list[float] = field(default_factory=list)
    own: list[float] = field(default_factory=list)
    stopped_ms: list[float] = field(default_factory=list)


def measured_run(
    mode: Mode, command: list[str], folder: Path, switches: list[tuple[int, bool]],
    poll_s: float, into: Ratios,
) -> str:  # fmt: skip
    """Launch one run of ``mode``, add its ratios to ``into`` and say what it measured."""
    steal_before, total_before = cpu_ticks()
    marks = interleaved_run(
        command, folder / "metrics.jsonl", switches, tracked=mode.tracked,
        free_threads=mode.free_threads, poll_s=poll_s, spin=mode.spin,
        off_top_cpu=mode.off_top_cpu,
    )  # fmt: skip
    steal_after, total_after = cpu_ticks()
    steal = (steal_after - steal_before) / max(1, total_after - total_before)
    value, t_on, t_off = ratio(marks)
    own, own_on, own_off = ratio(marks, update_thread_s)
    _, wait_on, wait_off = ratio(marks, waiting_s)
    _, blocked_on, blocked_off = ratio(marks, blocked_s)
    into.wall.append(value)
    into.own.append(own)
    into.stopped_ms.append(t_off)
    shares = ", ".join(
        f"CPU {cpu} {100 * off:.1f}% / {100 * on:.1f}%"
        for cpu, (off, on) in steal_in_blocks(marks).items()
    )
    return (
        f"update {t_off:.3f} ms stopped, {t_on:.3f} ms running; ratio "
        f"{value:.4f}; the update thread's own time {own_off:.3f} / {own_on:.3f} ms, "
        f"ratio {own:.4f}; waiting for a CPU {1e3 * wait_off:.1f} / {1e3 * wait_on:.1f} us, "
        f"neither {1e3 * blocked_off:.1f} / {1e3 * blocked_on:.1f} us; "
        f"host steal {100 * steal:.1f}% of the CPUs' time "
        f"(stopped / running: {shares}); what is stopped used "
        f"{100 * tracker_share(marks):.0f}% of a CPU while running"
    )


#: The standard normal's 95th percentile: a mean plus this many standard errors
#: bounds it from above with 95% confidence.
ONE_SIDED_95 = 1.645


def difference(tracked: list[float], plain: list[float]) -> str:
    """The tracked runs' mean ratio less the plain runs', with its standard error and
    the one-sided 95% upper bound on it (normal approximation), in percent."""
    error = (
        statistics.variance(tracked) / len(tracked) + statistics.variance(plain) / len(plain)
    ) ** 0.5
    cost = statistics.mean(tracked) - statistics.mean(plain)
    return (
        f"{100 * cost:+.2f}% +- {100 * error:.2f}% (standard error), "
        f"at most {100 * (cost + ONE_SIDED_95 * error):.2f}% (one-sided 95%)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=60000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=6000)
    parser.add_argument("--off", type=int, default=1000)
    parser.add_argument("--on", type=int, default=4000)
    parser.add_argument("--poll-ms", type=float, default=2.0)
    parser.add_argument("--null", action="store_true", help="plain runs, the same schedule")
    parser.add_argument(
        "--spin",
        action="store_true",
        help="plain runs beside a process that keeps the mirror's CPU busy, stopped in off blocks",
    )
    parser.add_argument(
        "--mirror-only",
        action="store_true",
        help="off blocks stop the mirror only; the update thread keeps the plugin's CPUs",
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="each round: a --mirror-only run, then a --null --mirror-only run; their difference",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    args = parser.parse_args(argv)
    for name in ("warmup", "off", "on"):
        if getattr(args, name) % SAVE_EVERY:
            parser.error(f"--{name} must be a multiple of the checkpoint interval {SAVE_EVERY}")
    if args.paired and (args.null or args.spin or args.mirror_only):
        parser.error("--paired runs its own two kinds of run: no --null, --spin or --mirror-only")
    if args.paired and args.runs < 2:
        parser.error("--paired needs --runs 2 or more for a standard error")
    switches = schedule(args.updates, args.warmup, args.off, args.on)
    if len(switches) < 3:
        parser.error("--updates leaves no off and on block after --warmup")
    os.environ.setdefault("WANDB_SILENT", "true")
    base = args.keep or Path(tempfile.mkdtemp(prefix="slhub-tracker-interleaved-"))
    base.mkdir(parents=True, exist_ok=True)
    recipe = tracked_recipe(base)
    modes = chosen_modes(args)
    what = ", then ".join(mode.what for mode in modes)
    print(
        f"sl_ddp: {args.updates} updates, {what}, {args.runs} run(s), blocks off {args.off} / "
        f"on {args.on} after {args.warmup}; {os.cpu_count()} CPUs; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}",
        flush=True,
    )
    print(f"slhub {source_digest()}", flush=True)
    measured = {mode: Ratios() for mode in modes}
    for index in range(args.runs):
        for mode in modes:
            name = "run" if mode is modes[0] else "plain"
            folder = base / f"{name}_{index}"
            if mode.tracked:
                command = recipe_command(args.updates, folder, 1, recipe)
            else:
                command = slhub_command(args.updates, folder, 1)
            said = measured_run(mode, command, folder, switches, args.poll_ms / 1e3, measured[mode])
            prefix = f"{mode.label} " if args.paired else ""
            print(f"{prefix}run {index}: {said}", flush=True)
    for mode, ratios in measured.items():
        prefix = f"{mode.label}: " if args.paired else ""
        print(f"\n{prefix}ratio, {summary(ratios.wall)}", flush=True)
        print(f"{prefix}the update thread's own time, ratio, {summary(ratios.own)}", flush=True)
        if not mode.tracked:
            continue
        # the hand-off to the plugin, timed after the runs, on their CPUs
        per_line = hook_us_per_line()
        lines = lines_per_update(base / f"run_{args.runs - 1}" / "metrics.jsonl", args.updates)
        ratios.wall = [
            r + per_line * lines / (1e3 * t) for r, t in zip(ratios.wall, ratios.stopped_ms)
        ]
        print(
            f"the plugin's on_log: {per_line:.3f} us a line, {lines:.3f} lines an update\n"
            f"{prefix}ratio with it, {summary(ratios.wall)}",
            flush=True,
        )
    if args.paired:
        tracked, plain = (measured[mode].wall for mode in PAIRED)
        print(f"\nW&B's work costs an update {difference(tracked, plain)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
