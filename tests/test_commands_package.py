"""Every command is a module of ``slhub.commands`` that builds its own parser and runs
the command; ``slhub.cli`` only asks each to add itself, then dispatches."""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, subprocess_env
from slhub import cli, commands

COMMANDS_DIR = REPO / "slhub" / "commands"


def _listed(help_text: str) -> list[str]:
    """The subcommands a parser's ``--help`` lists under ``{a,b,...}`` or ``ACTION``."""
    braces = re.search(r"\{([\w,-]+)\}", help_text)
    if braces:
        return braces.group(1).split(",")
    block = help_text.split("positional arguments:", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^    (\w[\w-]*)\b", block, flags=re.MULTILINE)


def _help(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser.parse_args(argv)
    return out.getvalue()


def _alone(name: str) -> argparse.ArgumentParser:
    """A parser holding command ``name`` only, as its module builds it."""
    parser = argparse.ArgumentParser(prog="slhub")
    subparsers = parser.add_subparsers(dest="command", required=True)
    built = commands.command_module(name).add_parser(subparsers)
    assert isinstance(built, argparse.ArgumentParser)
    assert built.prog == f"slhub {name}"
    return parser


@pytest.fixture(scope="module")
def listed() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "slhub", "--help"], cwd=REPO, env=subprocess_env(),
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return _listed(done.stdout)


def test_every_listed_command_is_a_module_with_add_parser_and_run(listed, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert listed == list(commands.NAMES)
    modules = {p.stem for p in COMMANDS_DIR.glob("*.py")} - {"__init__"}
    assert modules == set(listed)
    for name in listed:
        module = commands.command_module(name)
        assert Path(module.__file__) == COMMANDS_DIR / f"{name}.py"
        assert callable(module.add_parser) and callable(module.run), name
        if name == "launch":  # its --help is torchrun's (slhub.launch)
            continue
        # the command's help is the one its module builds, byte for byte
        assert _help(_alone(name), [name, "--help"]) == _help(cli.build_parser(), [name, "--help"])


def test_the_data_actions_are_built_in_commands_data(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    actions = _listed(_help(cli.build_parser(), ["data", "--help"]))
    assert actions == ["info", "check", "convert", "collect"]
    for action in actions:
        argv = ["data", action, "--help"]
        assert _help(_alone("data"), argv) == _help(cli.build_parser(), argv), action


def test_no_command_module_is_left_outside_the_package():
    stray = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "slhub").rglob("*.py")
        if p.name.endswith("_command.py") or p.name == "command.py"
    )
    assert not stray


def test_build_parser_only_asks_each_command_to_add_itself():
    source = inspect.getsource(cli.build_parser)
    assert len(source.splitlines()) < 40
    assert "add_argument(" in source  # --version, the only option of its own
    assert source.count("add_argument(") == 1
