"""What an experiment tracker adds to an update: slhub on the sl_ddp workload with and
without the W&B plugin (``wandb.mode: offline``), in one run.

    OMP_NUM_THREADS=1 python benchmarks/tracker_overhead.py                # 20000 updates, 5 pairs
    OMP_NUM_THREADS=1 python benchmarks/tracker_overhead.py --updates 200 --repeats 1   # smoke

Both contestants are ``python -m slhub train`` on ``examples/sl_ddp/cpu.yaml`` with the
settings of ``sl_ddp_vs_torch.py`` (1 process, or 2 Gloo workers with ``--workers 2``);
the tracked one adds ``plugins: [wandb]`` and ``wandb: {mode: offline}``, so rank 0
mirrors every metrics line into an offline W&B run (W&B's own service process
included). Each repetition launches both, alternating which goes first. Measured per
launch from rank 0's ``progress`` events: ``loop`` (end of update 1 to end of the
last update, every validation and checkpoint boundary in between) and ``update``
(``loop / (N - 1)``). The figure is the median over repetitions of each pair's
ratio tracked/plain of ``update``, with the smallest and largest pair ratio as its
spread. Beside it, the same ratio over a late window (``--late-from`` to the last
checkpoint, timed by the checkpoint files' modification times): it leaves out the
start of W&B beside the first updates. ``--null`` makes both runs of a pair plain: the
spread of launch pairs without a tracker, at the same hour. The two runs must produce
the same metrics and bitwise-equal final weights (checked after every pair): the
tracker only watches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sl_ddp_vs_torch import RECIPE, SAVE_EVERY, launch, same_work, slhub_command, source_digest  # noqa: E402
from update_thread_cpu import cpu_ms_per_update  # noqa: E402

#: The probe plugin ``--thread-cpu`` adds to both runs (``benchmarks/update_thread_cpu.py``).
THREAD_CPU_PLUGIN = "update_thread_cpu:UpdateThreadCpu"


def write_recipe(folder: Path, name: str, plugins: tuple[str, ...], **sections: Any) -> Path:
    """``examples/sl_ddp/cpu.yaml`` with ``plugins`` added and ``sections`` set, as
    ``folder/name``."""
    recipe = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
    recipe["plugins"] = [*recipe.get("plugins", []), *plugins]
    recipe.update(sections)
    path = folder / name
    path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    return path


def tracked_recipe(folder: Path, extra: tuple[str, ...] = ()) -> Path:
    """The recipe with the W&B plugin, offline, writing under the run (and ``extra``)."""
    wandb = {"mode": "offline", "project": "slhub-benchmark"}
    return write_recipe(folder, "tracked.yaml", ("wandb", *extra), wandb=wandb)


def recipe_command(updates: int, output_dir: Path, workers: int, recipe: Path) -> list[str]:
    command = slhub_command(updates, output_dir, workers)
    command[command.index(str(RECIPE))] = str(recipe)
    return command


def late_update_ms(folder: Path, from_step: int) -> float:
    """ms per update from checkpoint ``step_{from_step}.pt`` to the last one, by the
    files' modification times (each written at the end of its update)."""
    from slhub import checkpoint

    stamps = {}
    for path in folder.iterdir():
        step = checkpoint.files.step_of_file(path.name)
        if step is not None and step >= from_step:
            stamps[step] = path.stat().st_mtime_ns
    if len(stamps) < 2:
        raise SystemExit(f"{folder}: fewer than 2 checkpoints from update {from_step}")
    first, last = min(stamps), max(stamps)
    return (stamps[last] - stamps[first]) / 1e6 / (last - first)


def spread(values: list[float]) -> str:
    """median (min, max), mean +- sd."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return (
        f"median {statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f}), "
        f"mean {statistics.mean(values):.3f} +- {sd:.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    parser.add_argument(
        "--null",
        action="store_true",
        help="both runs of a pair plain: the spread launch pairs have without a tracker",
    )
    parser.add_argument(
        "--late-from", type=int, default=5000, help="the late window starts at this checkpoint"
    )
    parser.add_argument(
        "--thread-cpu",
        action="store_true",
        help="both runs also load a probe that reads rank 0's update thread's CPU clock",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("WANDB_SILENT", "true")
    extra: tuple[str, ...] = ()
    if args.thread_cpu:
        extra = (THREAD_CPU_PLUGIN,)
        here = str(Path(__file__).resolve().parent)  # where the launched runs find the probe
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [here, os.environ.get("PYTHONPATH")])
        )
    # a short run (the smoke) times its late window from its middle checkpoint
    late_from = min(args.late_from, args.updates // 2 // SAVE_EVERY * SAVE_EVERY)
    base = args.keep or Path(tempfile.mkdtemp(prefix="slhub-tracker-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    recipe = tracked_recipe(base, extra)
    untracked = write_recipe(base, "plain.yaml", extra) if extra else RECIPE
    import wandb

    print(
        f"sl_ddp: {args.updates} updates, {args.workers} worker(s), {args.repeats} pair(s)"
        f"{' (null: both plain)' if args.null else ''}; "
        f"W&B {wandb.__version__} offline; {os.cpu_count()} CPUs; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}",
        flush=True,
    )
    print(f"slhub {source_digest()}", flush=True)
    ratios: list[float] = []
    late_ratios: list[float] = []
    plain_ms: list[float] = []
    tracked_ms: list[float] = []
    cpu_ratios: list[float] = []
    for rep in range(args.repeats):
        plain_dir, tracked_dir = base / f"plain_{rep}", base / f"tracked_{rep}"
        runs = [
            ("plain", recipe_command(args.updates, plain_dir, args.workers, untracked)),
            (
                "tracked",
                recipe_command(args.updates, tracked_dir, args.workers, untracked)
                if args.null
                else recipe_command(args.updates, tracked_dir, args.workers, recipe),
            ),
        ]
        if rep % 2:
            runs.reverse()
        result = {name: launch(name, command, args.updates) for name, command in runs}
        dirs = {"plain": plain_dir, "tracked": tracked_dir}
        verdict = same_work(plain_dir, tracked_dir)
        if not verdict.startswith("same"):
            raise SystemExit(f"repetition {rep}: the tracked run differs: {verdict}")
        plain, tracked = result["plain"]["per_update_ms"], result["tracked"]["per_update_ms"]
        after = {name: run["teardown_s"] for name, run in result.items()}
        plain_ms.append(plain)
        tracked_ms.append(tracked)
        ratios.append(tracked / plain)
        late = late_update_ms(tracked_dir, late_from) / late_update_ms(plain_dir, late_from)
        late_ratios.append(late)
        thread = ""
        if args.thread_cpu:
            cpu = {name: cpu_ms_per_update(folder) for name, folder in dirs.items()}
            cpu_ratios.append(cpu["tracked"] / cpu["plain"])
            thread = (
                f"; update thread CPU {cpu['plain']:.3f} ms plain, {cpu['tracked']:.3f} ms "
                f"tracked, ratio {cpu_ratios[-1]:.3f}"
            )
        print(
            f"pair {rep}: update {plain:.3f} ms plain, {tracked:.3f} ms tracked, "
            f"ratio {tracked / plain:.3f} (late window {late:.3f}); "
            f"last update to exit {after['plain']:.2f} s plain, "
            f"{after['tracked']:.2f} s tracked{thread}",
            flush=True,
        )
    print(
        f"\nupdate (ms), median: plain {statistics.median(plain_ms):.3f}, "
        f"tracked {statistics.median(tracked_ms):.3f}\ntracked/plain per pair: {spread(ratios)}"
        f"\nfrom update {late_from}: {spread(late_ratios)}",
        flush=True,
    )
    if cpu_ratios:
        print(f"update thread CPU, tracked/plain per pair: {spread(cpu_ratios)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
