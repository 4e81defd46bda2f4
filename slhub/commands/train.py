"""``slhub train --config RECIPE.yaml [--set a.b=VALUE ...] [--resume CKPT|auto]
[--overwrite] [--allow-source-change] [--allow-dataset-change] [--log-format console|json]``:
a recipe trained on this process, alone or as one worker under torchrun."""

from __future__ import annotations

import argparse
import gc
import os
from typing import Any

from slhub.commands import EXIT_CODES, add_command

TRAIN_EXAMPLES = """examples:
  slhub train --config examples/sl_ddp/cpu.yaml
  slhub train --config examples/sl_ddp/cpu.yaml --set trainer.steps=500 --set trainer.lr=3e-4
  slhub train --config examples/sl_ddp/cpu.yaml --resume auto      # start, or continue a requeue
  slhub train --config R.yaml --set trainer.output_dir=outputs/b --resume outputs/a/step_100.pt
  slhub launch --standalone --nproc-per-node=2 train --config R.yaml --resume auto
  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m slhub train --config R.yaml

"""

#: The path arguments: (attribute, the name a message gives it).
PATH_ARGUMENTS = (("config", "--config"), ("resume", "--resume"))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    train = add_command(
        subparsers,
        "train",
        "train a recipe (alone or under torchrun)",
        TRAIN_EXAMPLES + EXIT_CODES,
    )
    train.add_argument("--config", required=True, metavar="RECIPE.yaml", help="recipe YAML file")
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a recipe key (repeatable; the later one wins; values are YAML scalars)",
    )
    train.add_argument(
        "--resume",
        metavar="CKPT|auto",
        help="continue from a checkpoint (exactly: same world size, every rank's state); "
        "`auto`: from output_dir/last.pt when it exists, else start fresh (one command for "
        "the first start and every requeue)",
    )
    train.add_argument(
        "--allow-source-change",
        action="store_true",
        help="resume although the slhub or torch version or a plugin's code differs from "
        "the checkpoint's (the run records what changed)",
    )
    train.add_argument(
        "--allow-dataset-change",
        action="store_true",
        help="resume although a dataset the plugins train on differs from the checkpoint's "
        "(content, episodes, split; the run records what changed)",
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="move the artifacts already in output_dir into a dated superseded-* folder "
        "there (nothing is deleted) and start fresh",
    )
    train.add_argument(
        "--log-format",
        choices=("console", "json"),
        default="console",
        help="console: short lines and a progress bar on a terminal (default); json: one "
        "JSON object per line with run_id, rank and step, errors included, for log pipelines",
    )
    return train


def run(args: argparse.Namespace) -> None:
    """Train the recipe; ``args.whole_process``: this command is the process (the
    console script or ``python -m slhub``), not a caller's library call."""
    from slhub import log
    from slhub.recipe import load_recipe

    # the recipe's core part first, before torch is imported: a typo answers at once; the
    # run takes the recipe read here (its overrides applied), not the file again
    log.configure(
        args.log_format, int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    )
    recipe = load_recipe(args.config, args.overrides)

    from slhub.preemption import own_process
    from slhub.run import train

    if args.whole_process:
        own_process()  # after a stop signal, repeats must not cut the exit (75) short
        # torch's imports leave ~1e5 long-lived objects that every full collection, and
        # the one at interpreter exit, traverses: that exit pass alone took ~0.6 s of each
        # worker's life. Frozen, the collector skips them; they live as long as the
        # process anyway. Only when this command is the process, not a caller's library.
        gc.freeze()
    try:
        train(
            recipe,
            [],
            resume=args.resume,
            log_format=args.log_format,
            overwrite=args.overwrite,
            allow_source_change=args.allow_source_change,
            allow_dataset_change=args.allow_dataset_change,
        )
    finally:
        if args.whole_process:
            gc.freeze()  # the process ends now: no collection pass over the run's objects
