"""``slhub inspect CKPT``: a checkpoint described for people
(:mod:`slhub.checkpoint.summary`)."""

from __future__ import annotations

import argparse
from typing import Any

from slhub.commands import EXIT_CODES_ONE_PROCESS, add_command

#: The path arguments: (attribute, the name a message gives it).
PATH_ARGUMENTS = (("checkpoint", "CKPT"),)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    inspect = add_command(
        subparsers,
        "inspect",
        "describe a checkpoint: update, world size, recipe digest, plugins, last metrics",
        "examples:\n  slhub inspect outputs/sl_ddp_cpu/last.pt\n\n" + EXIT_CODES_ONE_PROCESS,
    )
    inspect.add_argument("checkpoint", metavar="CKPT", help="a .pt checkpoint written by slhub")
    return inspect


def run(args: argparse.Namespace) -> None:
    from slhub.checkpoint.summary import describe

    print(describe(args.checkpoint))
