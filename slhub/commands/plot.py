"""``slhub plot RUN_DIR [--out FILE.png]``: a run's metrics history drawn
(:mod:`slhub.plot`)."""

from __future__ import annotations

import argparse
from typing import Any

from slhub.commands import EXIT_CODES_ONE_PROCESS, add_command

#: The path arguments: (attribute, the name a message gives it).
PATH_ARGUMENTS = (("run_dir", "RUN_DIR"), ("out", "--out"))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    plot = add_command(
        subparsers,
        "plot",
        "plot a run: train loss, validation metrics and learning rate against update",
        "examples:\n  slhub plot outputs/sl_ddp_cpu\n"
        "  slhub plot outputs/sl_ddp_cpu --out outputs/sl_ddp_cpu/loss.png\n\n"
        "needs matplotlib: pip install 'slhub[plot]'\n\n" + EXIT_CODES_ONE_PROCESS,
    )
    plot.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds metrics.jsonl)")
    plot.add_argument(
        "--out", metavar="FILE.png", help="image to write (default: RUN_DIR/metrics.png)"
    )
    return plot


def run(args: argparse.Namespace) -> None:
    from slhub.plot import plot_run

    plotted = plot_run(args.run_dir, args.out)
    print(f"plotted {', '.join(plotted.series)} to {plotted.path}")
