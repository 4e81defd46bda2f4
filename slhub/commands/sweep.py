"""``slhub sweep --config SWEEP.yaml [--summary [--top K]]``: a hyperparameter sweep of a
recipe with Optuna (:mod:`slhub.sweep`); ``--summary`` prints its trials and writes the
best recipe."""

from __future__ import annotations

import argparse
from typing import Any

from slhub.commands import add_command

EXAMPLES = """examples:
  slhub sweep --config examples/nerd/cartpole/sweep.yaml             # start, or continue
  slhub sweep --config examples/nerd/cartpole/sweep.yaml --summary   # trials, best.yaml, plot

each trial is a run in OUTPUT_DIR/trial_NNN; the study is in OUTPUT_DIR/study.db unless
the sweep file names a storage. A killed sweep continues when the same command is rerun:
finished trials are kept and an interrupted trial resumes from its checkpoint.

needs optuna: pip install 'slhub[sweep]' (docs/trackers.md)

exit status:
  0    done (every trial of the budget finished) or the summary printed
  2    bad input (sweep file, recipe key, metric, storage); one line says which
  75   stopped by SIGTERM: the running trial checkpointed; rerun the same command
  130  interrupted (Ctrl-C); rerun the same command
  1    a bug in slhub or a plugin (with a traceback)"""

#: The path arguments: (attribute, the name a message gives it).
PATH_ARGUMENTS = (("config", "--config"),)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    sweep = add_command(
        subparsers,
        "sweep",
        "sweep a recipe's keys with Optuna, one run per trial; --summary: the trials and "
        "the best recipe",
        EXAMPLES,
    )
    sweep.add_argument("--config", required=True, metavar="SWEEP.yaml", help="sweep YAML file")
    sweep.add_argument(
        "--summary",
        action="store_true",
        help="print the trials table, write OUTPUT_DIR/best.yaml (the best trial's recipe) "
        "and plot the best trials; trains nothing",
    )
    sweep.add_argument(
        "--top",
        type=int,
        default=3,
        metavar="K",
        help="--summary: plot the K best complete trials (default 3)",
    )
    return sweep


def run(args: argparse.Namespace) -> None:
    from slhub.sweep import SweepError, load_sweep, run_sweep

    if args.top < 1:
        raise SweepError(f"--top {args.top}: must be at least 1")
    if not args.summary:
        status = run_sweep(args.config)
        if status:
            raise SystemExit(status)
        return
    from slhub.sweep.study import import_optuna
    from slhub.sweep.summary import report, summarize

    import_optuna()
    sweep = load_sweep(args.config)
    print(report(sweep, summarize(sweep, args.top)))
