"""``slhub export --checkpoint CKPT --out DIR [--plugin NAME] [--onnx]``: a checkpoint
exported for inference (:mod:`slhub.export.writer`)."""

from __future__ import annotations

import argparse
from typing import Any

from slhub.commands import EXIT_CODES_ONE_PROCESS, add_command

#: The path arguments: (attribute, the name a message gives it).
PATH_ARGUMENTS = (("checkpoint", "--checkpoint"), ("out", "--out"))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    export = add_command(
        subparsers,
        "export",
        "export a checkpoint for inference",
        "examples:\n"
        "  slhub export --checkpoint outputs/nerd_cartpole/last.pt --out exports/nerd_cartpole\n"
        "  slhub export --checkpoint C.pt --out D --plugin examples.sl_ddp.plugin:SlDdpPlugin\n"
        "  slhub export --checkpoint outputs/nerd_cartpole/last.pt --out exports/nerd_onnx --onnx"
        "\n\n" + EXIT_CODES_ONE_PROCESS,
    )
    export.add_argument("--checkpoint", required=True, metavar="CKPT", help="checkpoint to read")
    export.add_argument("--out", required=True, metavar="DIR", help="empty or new directory")
    export.add_argument(
        "--plugin",
        metavar="NAME",
        help="plugin to export with (entry-point name or package.module:object); "
        "default: the installed plugin the checkpoint names",
    )
    export.add_argument(
        "--onnx",
        action="store_true",
        help="also write model.onnx beside the weights (needs pip install 'slhub[onnx]')",
    )
    return export


def run(args: argparse.Namespace) -> None:
    from slhub import log
    from slhub.export.writer import run_export

    log.configure("console")  # a failing export hook's traceback goes to stderr
    done = run_export(args.checkpoint, args.out, plugin=args.plugin, onnx=args.onnx)
    also = " (and model.onnx)" if args.onnx else ""
    print(f"exported {args.checkpoint} to {done.path}{also} with {done.plugin.describe()}")
