"""``slhub launch [torchrun options] train ...``: training on this node's workers under
torch's elastic agent (:mod:`slhub.launch`), with slhub's exit status. torchrun's own
parser reads the options, so ``slhub --help`` lists the command and ``slhub launch
--help`` is torchrun's."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    launch = subparsers.add_parser(
        "launch",
        add_help=False,  # `slhub launch --help` is torchrun's options (slhub.launch)
        help="train on N workers under torch's elastic agent (torchrun's options), "
        "with slhub's exit status",
    )
    launch.add_argument("arguments", nargs=argparse.REMAINDER)
    return launch


def run(
    words: list[str],
    *,
    owns_process: bool,
    parse: Callable[[list[str]], argparse.Namespace],
) -> int:
    """Launch with the words after ``launch``; ``parse`` is the command line's parser,
    which checks the train command's arguments once, before any worker starts."""
    from slhub.launch import launch

    return launch(words, owns_process=owns_process, parse=parse)
