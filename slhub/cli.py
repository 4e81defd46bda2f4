"""Command line: parse arguments, run the command (a module of :mod:`slhub.commands`,
which builds its own parser), map SlhubError to one line and exit 2.

slhub train --config RECIPE.yaml [--set a.b=VALUE ...] [--resume CKPT|auto] [--overwrite]
            [--allow-source-change] [--allow-dataset-change] [--log-format console|json]
slhub launch [torchrun options] train ...   (slhub.launch: torch's elastic agent)
slhub sweep --config SWEEP.yaml [--summary [--top K]]   (slhub.sweep: Optuna)
slhub plugins
slhub inspect CKPT
slhub export --checkpoint CKPT --out DIR [--plugin NAME] [--onnx]
slhub plot RUN_DIR [--out FILE.png]
slhub data info|check PATH [--format NAME]
slhub data convert SRC DST [--to slhub|lerobot] [--fps HZ] [--format NAME]
slhub data collect DST --env gymnasium:ENV --episodes N --steps T --seed S [--actions ...]
slhub --version

Exit status: 0 done; 2 bad input or a rank failure (one line); 75 preempted (a
checkpoint of the last update was written: rerun with ``--resume auto``); 130
interrupted; 128+N a second stop signal N; 1 a bug (with a traceback) or, one line, a
worker that lost the others (a worker died); 141 when stdout's reader went away
(``| head``). Under ``slhub launch`` a worker leaves its last line to the launcher,
which prints one line for all of them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from types import ModuleType

from slhub import commands
from slhub._version import __version__
from slhub.commands import EXIT_CODES
from slhub.errors import SlhubError, one_line, write_final_line

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: The most characters of a refusal's one line (a longer message is cut).
LONGEST_LINE = 1000


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2 like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        write_final_line(f"slhub: error: {message} (see `{self.prog} --help`)")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    """slhub's parser: each command of :mod:`slhub.commands` adds its own."""
    parser = _Parser(
        prog="slhub",
        description="Supervised robot learning with plugins: train recipes on one process or "
        "under torchrun, inspect and export checkpoints, plot runs.",
        epilog="examples:\n  slhub train --config examples/sl_ddp/cpu.yaml\n"
        "  slhub plot outputs/sl_ddp_cpu\n  slhub <command> --help\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"slhub {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in commands.NAMES:
        commands.command_module(name).add_parser(sub)
    return parser


def _check_paths(args: argparse.Namespace, command: ModuleType) -> None:
    """Refuse an empty path or a NUL byte before any work, naming the argument:
    ``Path("")`` quietly means the current directory (``--out ""`` would use it).
    A leading ``~`` (which a quoted argument or ``--out=~/x`` keeps) is expanded to
    the home directory here, and the expanded path is the one every command uses.
    The command's ``PATH_ARGUMENTS`` name them: (attribute, the name a message gives it).
    """
    from slhub.paths import user_path

    for attribute, name in getattr(command, "PATH_ARGUMENTS", ()):
        value = getattr(args, attribute, None)
        if isinstance(value, list):  # nargs="+": every path checked, each expanded
            setattr(args, attribute, [str(user_path(v, name)) for v in value])
        elif value is not None:
            user_path(value, name)
            setattr(args, attribute, os.path.expanduser(value))


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["launch"]:  # torchrun's options are the launcher's to parse
        from slhub.commands import launch

        return launch.run(words[1:], owns_process=argv is None, parse=build_parser().parse_args)
    args = build_parser().parse_args(argv)
    args.whole_process = argv is None  # the console script or python -m slhub
    command = commands.command_module(args.command)
    try:
        _check_paths(args, command)
        command.run(args)
    except SlhubError as exc:
        from slhub.log import final_line
        from slhub.preemption import Preempted

        fmt = getattr(args, "log_format", "console")
        code = getattr(exc, "exit_code", EXIT_USAGE)
        if isinstance(exc, Preempted):
            message = f"{exc}; resume with: {_resume_command(argv)}"
            line = final_line(message, fmt, event="preempted", level="warning")
        else:
            # one line, however long or multi-line a message became (a value echoed whole)
            line = final_line(one_line(exc, LONGEST_LINE), fmt)
        _last_word(line, code, getattr(exc, "origin_rank", None))
        _record_for_torchrun(exc)
        return code
    except KeyboardInterrupt:
        _last_word("slhub: interrupted", EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _reader_gone()
    from slhub.launch import report_done

    report_done()  # under slhub launch: this worker finished (a signal now changes nothing)
    return 0


#: A shell's status for a process that a closed pipe stopped (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141


def _reader_gone() -> int:
    """Whoever read stdout stopped (``slhub data info ... | head``): end quietly, as a
    command stopped by SIGPIPE does. stdout is pointed at /dev/null so that the
    interpreter's last flush at exit cannot fail again and print a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def _last_word(line: str, code: int, origin_rank: int | None = None) -> None:
    """The command's last line, or under ``slhub launch`` the worker's record of it:
    the launcher prints one line for all its workers."""
    from slhub.launch import report

    if not report(code, line, origin_rank):
        write_final_line(line)


def _resume_command(argv: Sequence[str] | None) -> str:
    """This command with ``--resume auto`` in place of any --resume or --overwrite."""
    words = list(sys.argv[1:] if argv is None else argv)
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word == "--resume":
            skip = True
            continue
        if word.startswith("--resume=") or word == "--overwrite":
            continue
        kept.append(word)
    from slhub.launch import resume_launcher

    launcher = resume_launcher()
    if launcher is None:
        launcher = "torchrun ... -m slhub" if "TORCHELASTIC_RUN_ID" in os.environ else "slhub"
    return " ".join([launcher, *map(shlex.quote, kept), "--resume", "auto"])


def _record_for_torchrun(exc: BaseException) -> None:
    """Leave torchrun the worker's error file, so its failure summary names the real cause."""
    if "TORCHELASTIC_ERROR_FILE" not in os.environ:
        return
    try:
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)
    except Exception:  # noqa: BLE001 - the one-line message was printed already
        pass
