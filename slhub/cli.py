"""Command line: parse arguments, call the library, map SlhubError to one line and exit 2.

slhub train --config RECIPE.yaml [--set a.b=VALUE ...] [--resume CKPT|auto] [--overwrite]
            [--log-format json]
slhub plugins
slhub inspect CKPT
slhub export --checkpoint CKPT --out DIR [--plugin NAME]

Exit status: 0 done; 2 bad input or a rank failure (one line); 75 preempted (a
checkpoint of the last update was written: rerun with ``--resume auto``); 130
interrupted; 128+N a second stop signal N; 1 a bug (with a traceback).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from slhub.errors import SlhubError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2 like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"slhub: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="slhub", description="Supervised robot learning with plugins.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = sub.add_parser("train", help="train a recipe (alone or under torchrun)")
    train.add_argument("--config", required=True, help="recipe YAML file")
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
        help="continue from a checkpoint; `auto`: from output_dir/last.pt when it exists, "
        "else start fresh (one command for the first start and every requeue)",
    )
    train.add_argument(
        "--allow-source-change",
        action="store_true",
        help="resume although the slhub or torch version or a plugin's code differs from "
        "the checkpoint's (the run records what changed)",
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="move the artifacts already in output_dir into a dated superseded-* folder "
        "there (nothing is deleted) and start fresh",
    )
    train.add_argument("--log-format", choices=("console", "json"), default="console")

    sub.add_parser("plugins", help="list built-in and installed plugins and their hooks")

    inspect = sub.add_parser("inspect", help="describe a checkpoint")
    inspect.add_argument("checkpoint", metavar="CKPT")

    export = sub.add_parser("export", help="export a checkpoint for inference")
    export.add_argument("--checkpoint", required=True, metavar="CKPT")
    export.add_argument("--out", required=True, metavar="DIR")
    export.add_argument(
        "--plugin",
        metavar="NAME",
        help="plugin to export with (entry-point name or package.module:object); "
        "default: the installed plugin the checkpoint names",
    )
    return parser


def _train(args: argparse.Namespace) -> None:
    from slhub.run import train

    train(
        args.config,
        args.overrides,
        resume=args.resume,
        log_format=args.log_format,
        overwrite=args.overwrite,
        allow_source_change=args.allow_source_change,
    )


def _plugins(_: argparse.Namespace) -> None:
    from slhub.registry import list_plugins

    for row in list_plugins():
        dist = f"{row.dist} {row.version}" if row.dist else "-"
        hooks = ", ".join(row.hooks) if row.error is None else f"BROKEN: {row.error}"
        print(f"{row.name:<20} {row.kind:<9} {dist:<28} {hooks}")


def _inspect(args: argparse.Namespace) -> None:
    from slhub.checkpoint import describe

    print(describe(args.checkpoint))


def _export(args: argparse.Namespace) -> None:
    from slhub.export.command import run_export

    done = run_export(args.checkpoint, args.out, plugin=args.plugin)
    print(f"exported {args.checkpoint} to {done.path} with {done.plugin.describe()}")


COMMANDS = {"train": _train, "plugins": _plugins, "inspect": _inspect, "export": _export}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except SlhubError as exc:
        from slhub.preemption import Preempted

        if isinstance(exc, Preempted):
            print(f"slhub: {exc}; resume with: {_resume_command(argv)}", file=sys.stderr)
            code = exc.exit_code
        else:
            print(f"slhub: error: {exc}", file=sys.stderr)
            code = EXIT_USAGE
        _record_for_torchrun(exc)
        return code
    except KeyboardInterrupt:
        print("slhub: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


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
