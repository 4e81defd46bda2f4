"""``slhub plugins``: the built-in and installed plugins and the hooks each implements."""

from __future__ import annotations

import argparse
from typing import Any

from slhub.commands import EXIT_CODES_ONE_PROCESS, add_command


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    return add_command(
        subparsers,
        "plugins",
        "list built-in and installed plugins and the hooks each implements",
        "examples:\n  slhub plugins\n  slhub plugins | grep model\n\n" + EXIT_CODES_ONE_PROCESS,
    )


def run(_: argparse.Namespace) -> None:
    from slhub.registry import list_plugins

    print(f"{'NAME':<20} {'KIND':<9} {'DISTRIBUTION':<28} HOOKS")
    for row in list_plugins():
        dist = f"{row.dist} {row.version}" if row.dist else "-"
        hooks = ", ".join(row.hooks) if row.error is None else f"BROKEN: {row.error}"
        print(f"{row.name:<20} {row.kind:<9} {dist:<28} {hooks}")
