"""``slhub plot RUN_DIR [RUN_DIR ...] [--out FILE.png]``: a run's metrics history drawn
(:mod:`slhub.plot`), or several runs on shared axes (:mod:`slhub.plot_compare`)."""

from __future__ import annotations

import argparse
from typing import Any

from slhub.commands import EXIT_CODES_ONE_PROCESS, add_command

#: The path arguments: (attribute, the name a message gives it).
PATH_ARGUMENTS = (("run_dirs", "RUN_DIR"), ("out", "--out"))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    plot = add_command(
        subparsers,
        "plot",
        "plot a run: train loss, validation metrics and learning rate against update; "
        "several runs: compared on shared axes",
        "examples:\n  slhub plot outputs/sl_ddp_cpu\n"
        "  slhub plot outputs/sl_ddp_cpu --out outputs/sl_ddp_cpu/loss.png\n"
        "  slhub plot outputs/sl_single_cpu outputs/sl_ddp_cpu --out outputs/one_vs_two.png\n\n"
        "several runs: one line per run in each panel, labelled by the run's name and the\n"
        "recipe keys that differ between the runs\n\n"
        "needs matplotlib: pip install 'slhub[plot]'\n\n" + EXIT_CODES_ONE_PROCESS,
    )
    plot.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="a run directory (holds metrics.jsonl)"
    )
    plot.add_argument(
        "--out",
        metavar="FILE.png",
        help="image to write (default: RUN_DIR/metrics.png; several runs: "
        "compare.png in the first RUN_DIR)",
    )
    return plot


def run(args: argparse.Namespace) -> None:
    if len(args.run_dirs) == 1:
        from slhub.plot import plot_run

        plotted = plot_run(args.run_dirs[0], args.out)
        print(f"plotted {', '.join(plotted.series)} to {plotted.path}")
        return
    from slhub.plot_compare import plot_runs

    compared = plot_runs(args.run_dirs, args.out)
    keys = dict.fromkeys(key for series in compared.series.values() for key in series)
    print(f"plotted {len(compared.series)} runs ({', '.join(keys)}) to {compared.path}")
