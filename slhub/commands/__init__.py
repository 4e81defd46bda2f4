"""slhub's commands, one module each (:data:`NAMES`, in the order ``slhub --help`` lists
them). Each module has ``add_parser(subparsers)``, which builds the command's parser,
and ``run``, which runs the parsed command; ``PATH_ARGUMENTS``, where a command takes
paths, names those that ``slhub.cli`` checks before any work.

A command module imports at its top only what building its parser needs: ``slhub
--help`` and a recipe typo answer before torch is imported, and each ``run`` imports
the library code it calls.
"""

from __future__ import annotations

import argparse
from importlib import import_module
from types import ModuleType
from typing import Any

#: The commands, in the order ``slhub --help`` lists them (each a module of this package).
NAMES = ("train", "launch", "sweep", "plugins", "inspect", "export", "eval", "plot", "data")

EXIT_CODES = """exit status:
  0    done
  2    bad input (recipe, path, checkpoint, plugin) or a rank failure; one line says which
  75   preempted by a stop signal: the last update was checkpointed; rerun with --resume auto
  130  interrupted (Ctrl-C)
  128+N  a second stop signal N arrived while the first was being honoured
  1    a bug in slhub or a plugin (with a traceback), or a worker died (one line)"""
#: The statuses of every command but train: one process, which honours no stop signal
#: (75 and 128+N are a training's).
EXIT_CODES_ONE_PROCESS = """exit status:
  0    done
  2    bad input (path, checkpoint, recipe, plugin, dataset); one line says which
  130  interrupted (Ctrl-C)
  1    a bug in slhub or a plugin (with a traceback)"""


def command_module(name: str) -> ModuleType:
    """The module of command ``name`` (one of :data:`NAMES`)."""
    return import_module(f"{__name__}.{name}")


# ``subparsers``: what ``add_subparsers()`` returns (argparse names no public class for it)
def add_command(subparsers: Any, name: str, summary: str, examples: str) -> argparse.ArgumentParser:
    """A command's parser: ``summary`` in ``slhub --help``, again as its description, and
    ``examples`` (with the exit statuses) below its options, laid out as written."""
    return subparsers.add_parser(
        name,
        help=summary,
        description=summary[0].upper() + summary[1:] + ".",
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
