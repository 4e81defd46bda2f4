"""Command line: parse arguments, call the library, map SlhubError to one line and exit 2.

slhub train --config RECIPE.yaml [--set a.b=VALUE ...] [--resume CKPT|auto] [--overwrite]
            [--allow-source-change] [--allow-dataset-change] [--log-format console|json]
slhub launch [torchrun options] train ...   (slhub.launch: torch's elastic agent)
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
import gc
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from slhub._version import __version__
from slhub.errors import SlhubError, one_line

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: The most characters of a refusal's one line (a longer message is cut).
LONGEST_LINE = 1000

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

TRAIN_EXAMPLES = """examples:
  slhub train --config examples/sl_ddp/cpu.yaml
  slhub train --config examples/sl_ddp/cpu.yaml --set trainer.steps=500 --set trainer.lr=3e-4
  slhub train --config examples/sl_ddp/cpu.yaml --resume auto      # start, or continue a requeue
  slhub train --config R.yaml --set trainer.output_dir=outputs/b --resume outputs/a/step_100.pt
  slhub launch --standalone --nproc-per-node=2 train --config R.yaml --resume auto
  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m slhub train --config R.yaml

"""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2 like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        _final_line(f"slhub: error: {message} (see `{self.prog} --help`)")
        raise SystemExit(EXIT_USAGE)


def _final_line(line: str) -> None:
    """Write the command's last line to stderr in ONE write, flushed: torchrun workers
    share that stream, and a line written apart from its newline can be glued to
    another worker's line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# ``sub``/``actions``: what ``add_subparsers()`` returns (argparse names no public class for it)
def _command(sub: Any, name: str, summary: str, examples: str):
    return sub.add_parser(
        name,
        help=summary,
        description=summary[0].upper() + summary[1:] + ".",
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
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

    train = _command(
        sub, "train", "train a recipe (alone or under torchrun)", TRAIN_EXAMPLES + EXIT_CODES
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

    launch = sub.add_parser(
        "launch",
        add_help=False,  # `slhub launch --help` is torchrun's options (slhub.launch)
        help="train on N workers under torch's elastic agent (torchrun's options), "
        "with slhub's exit status",
    )
    launch.add_argument("arguments", nargs=argparse.REMAINDER)

    _command(
        sub,
        "plugins",
        "list built-in and installed plugins and the hooks each implements",
        "examples:\n  slhub plugins\n  slhub plugins | grep model\n\n" + EXIT_CODES_ONE_PROCESS,
    )

    inspect = _command(
        sub,
        "inspect",
        "describe a checkpoint: update, world size, recipe digest, plugins, last metrics",
        "examples:\n  slhub inspect outputs/sl_ddp_cpu/last.pt\n\n" + EXIT_CODES_ONE_PROCESS,
    )
    inspect.add_argument("checkpoint", metavar="CKPT", help="a .pt checkpoint written by slhub")

    export = _command(
        sub,
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

    evaluate = _command(
        sub,
        "eval",
        "judge a checkpoint as its run validated it: on the run's held-out episodes, other "
        "recorded ones (--set data.path=...), or fresh ones from a simulator (--env: a "
        "policy is rolled out in it, a learned simulator that reads episodes is compared "
        "with it; any other model is refused)",
        "examples:\n  slhub eval --checkpoint outputs/nerd_pendulum/last.pt\n"
        "  slhub eval --checkpoint outputs/nerd_pendulum/last.pt "
        "--env gymnasium:InvertedPendulum-v5 --episodes 20 --steps 200\n"
        "  slhub eval --checkpoint C.pt --set 'validation.horizons=[1, 10, 100]'\n"
        "  slhub eval --checkpoint C.pt --env gymnasium:InvertedPendulum-v5 --episodes 50 "
        "--video outputs/rollout.mp4\n\n"
        "Prints one 'metric value' line each (or JSON); writes nothing but --video.\n\n"
        + EXIT_CODES_ONE_PROCESS,
    )
    evaluate.add_argument("--checkpoint", required=True, metavar="CKPT", help="checkpoint to read")
    evaluate.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a recipe key for the evaluation (repeatable)",
    )
    evaluate.add_argument(
        "--plugin", metavar="NAME", help="model plugin (default: the installed one it names)"
    )
    evaluate.add_argument(
        "--env",
        metavar="PREFIX:ENV",
        help="roll a policy out in this simulator, or collect fresh episodes from it first",
    )
    evaluate.add_argument("--episodes", type=int, default=16, help="with --env, >= 1 (default 16)")
    evaluate.add_argument(
        "--steps",
        type=int,
        help="with --env, >= 1: collected episodes' length (default 200); a policy's episode "
        "limit (default: the recipe's, else the env's)",
    )
    evaluate.add_argument("--seed", type=int, default=1000, help="with --env, >= 0 (default 1000)")
    evaluate.add_argument(
        "--actions", choices=("uniform", "smooth"), default="smooth", help="with --env"
    )
    evaluate.add_argument(
        "--video",
        metavar="FILE.mp4",
        help="with --env (refused without it), a policy's first rollout as an mp4 video, "
        "into a folder that exists",
    )
    evaluate.add_argument("--json", action="store_true", help="one JSON object instead")

    plot = _command(
        sub,
        "plot",
        "plot a run: train loss, validation metrics and learning rate against update",
        "examples:\n  slhub plot outputs/sl_ddp_cpu\n"
        "  slhub plot outputs/sl_ddp_cpu --out outputs/sl_ddp_cpu/loss.png\n\n"
        "needs matplotlib: pip install 'slhub[plot]'\n\n" + EXIT_CODES_ONE_PROCESS,
    )
    plot.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds metrics.jsonl)")
    plot.add_argument(
        "--out", metavar="FILE.png", help="image to write (default: RUN_DIR/metrics.png)"
    )
    data = _command(
        sub,
        "data",
        "describe, check or convert a robot dataset (LeRobot, robomimic, zarr, Minari, NeRD, "
        "slhub's store), or collect one from a simulator",
        "examples:\n  slhub data info path/to/lerobot_dataset\n"
        "  slhub data check demos.hdf5\n  slhub data convert replay.zarr datasets/pusht\n"
        "  slhub data convert datasets/pendulum datasets/pendulum_lerobot --to lerobot\n"
        "  slhub data collect datasets/hopper --env gymnasium:Hopper-v5 --episodes 10 "
        "--steps 500 --seed 0\n\n" + EXIT_CODES_ONE_PROCESS,
    )
    actions = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    for action, summary in (
        ("info", "format, episodes, fps, features (shape, dtype, names), splits, statistics"),
        ("check", "read every value: non-finite values, empty or short episodes, bad files"),
        (
            "convert",
            "copy into slhub's store (one .npy per feature), or with --to lerobot into a "
            "LeRobot v3.0 dataset with video, atomically",
        ),
    ):
        parser_ = actions.add_parser(action, help=summary, description=summary)
        parser_.add_argument("path", metavar="PATH" if action != "convert" else "SRC")
        if action == "convert":
            parser_.add_argument("destination", metavar="DST", help="a new directory")
            parser_.add_argument(
                "--to",
                choices=("slhub", "lerobot"),
                default="slhub",
                help="slhub's store (default), or LeRobot v3.0: parquet and H.264 mp4 video "
                "(a source without tasks gets its folder's name as the one task); both keep "
                "each step's task where the source records tasks (LeRobot's)",
            )
            parser_.add_argument(
                "--fps",
                type=float,
                metavar="HZ",
                help="the control rate (steps per second) of a source that records none "
                "(robomimic, zarr, Minari, NeRD): --to lerobot refuses such a source without "
                "it; the store records it. A source that records an fps keeps it: a "
                "different --fps is refused",
            )
        if action == "check":
            parser_.add_argument(
                "--min-length", type=int, default=1, help="the fewest steps an episode may have"
            )
        parser_.add_argument(
            "--format", default="auto", help="reader name (default: detected from the files)"
        )
    _collect_arguments(actions)
    return parser


COLLECT_EXAMPLES = """examples:
  slhub data collect datasets/hopper --env gymnasium:Hopper-v5 --episodes 100 --steps 1000 \\
      --actions smooth --seed 0
  slhub data collect datasets/pendulum --env gymnasium:InvertedPendulum-v5 --episodes 10 \\
      --steps 200 --actions policy --policy slhub.sim.experts:inverted_pendulum --noise 0.5 \\
      --seed 1 --render

Per step: observation, action, reward, terminated, truncated, qpos, qvel (named after
the joints), sim_state (mj_getState: restore it and replay the actions bit for bit),
contact (per-body normal force, where geoms can touch), image (with --render). The same
command writes a byte-identical dataset. Experts for --policy: slhub.sim.experts:inverted_pendulum
(InvertedPendulum-v5), slhub.sim.experts:reacher (Reacher-v5). Needs mujoco and gymnasium:
pip install 'slhub[sim]'

"""


def _collect_arguments(actions: Any) -> None:
    summary = "roll a MuJoCo simulator out into slhub's store, atomically"
    collect = actions.add_parser(
        "collect",
        help=summary,
        description=summary[0].upper() + summary[1:] + ".",
        epilog=COLLECT_EXAMPLES + EXIT_CODES_ONE_PROCESS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    collect.add_argument("destination", metavar="DST", help="a new directory")
    collect.add_argument(
        "--env", required=True, metavar="PREFIX:ENV", help="e.g. gymnasium:Hopper-v5"
    )
    collect.add_argument("--episodes", type=int, required=True, help="episodes to record")
    collect.add_argument(
        "--steps",
        type=int,
        required=True,
        help="the most steps of an episode (the env's "
        "time limit); an episode the env terminates is shorter",
    )
    collect.add_argument(
        "--actions",
        choices=("uniform", "smooth", "policy"),
        default="uniform",
        help="uniform in the ctrlrange; smooth: piecewise-linear between random knots; "
        "policy: --policy (default: uniform)",
    )
    collect.add_argument(
        "--policy",
        metavar="MODULE:FUNCTION",
        help="called as FUNCTION(observation, simulator), returns the action",
    )
    collect.add_argument(
        "--noise",
        type=float,
        default=0.0,
        metavar="STD",
        help="Gaussian noise added to the policy's action; the clean one is kept as "
        "policy_action (DART)",
    )
    collect.add_argument("--seed", type=int, required=True, help="seeds resets and actions")
    collect.add_argument(
        "--through-termination",
        action="store_true",
        help="keep simulating after the env terminates (the robot fell; terminated still "
        "marks those steps): a learned simulator needs the falls too",
    )
    collect.add_argument("--render", action="store_true", help="record an RGB image per step")
    collect.add_argument(
        "--camera",
        default="follow",
        help="a camera of the model (Hopper's track), or slhub's: follow, which follows the "
        "robot from the side (default), or fixed, which looks at the model's centre",
    )
    collect.add_argument("--size", type=int, default=64, help="image height and width")


def _data(args: argparse.Namespace) -> None:
    from slhub.data import command

    if args.data_command == "info":
        print(command.info(args.path, args.format))
    elif args.data_command == "check":
        print(command.check(args.path, args.format, args.min_length))
    elif args.data_command == "collect":
        from slhub.sim import collect

        print(
            collect(
                args.destination,
                args.env,
                episodes=args.episodes,
                steps=args.steps,
                actions=args.actions,
                seed=args.seed,
                policy=args.policy,
                noise=args.noise,
                render=args.render,
                camera=args.camera,
                size=args.size,
                progress=True,
                through_termination=args.through_termination,
            )
        )
    else:
        print(command.convert(args.path, args.destination, args.format, to=args.to, fps=args.fps))


def _train(args: argparse.Namespace) -> None:
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


def _plugins(_: argparse.Namespace) -> None:
    from slhub.registry import list_plugins

    print(f"{'NAME':<20} {'KIND':<9} {'DISTRIBUTION':<28} HOOKS")
    for row in list_plugins():
        dist = f"{row.dist} {row.version}" if row.dist else "-"
        hooks = ", ".join(row.hooks) if row.error is None else f"BROKEN: {row.error}"
        print(f"{row.name:<20} {row.kind:<9} {dist:<28} {hooks}")


def _inspect(args: argparse.Namespace) -> None:
    from slhub.inspect_command import describe

    print(describe(args.checkpoint))


def _export(args: argparse.Namespace) -> None:
    from slhub import log
    from slhub.export.command import run_export

    log.configure("console")  # a failing export hook's traceback goes to stderr
    done = run_export(args.checkpoint, args.out, plugin=args.plugin, onnx=args.onnx)
    also = " (and model.onnx)" if args.onnx else ""
    print(f"exported {args.checkpoint} to {done.path}{also} with {done.plugin.describe()}")


def _eval(args: argparse.Namespace) -> None:
    from slhub.eval_command import format_metrics, run_eval
    from slhub.strictjson import dumps

    metrics = run_eval(
        args.checkpoint, overrides=args.overrides, plugin=args.plugin, env=args.env,
        episodes=args.episodes, steps=args.steps, seed=args.seed, actions=args.actions,
        video=args.video,
    )  # fmt: skip
    print(dumps(metrics) if args.json else format_metrics(metrics))


def _plot(args: argparse.Namespace) -> None:
    from slhub.plot import plot_run

    plotted = plot_run(args.run_dir, args.out)
    print(f"plotted {', '.join(plotted.series)} to {plotted.path}")


COMMANDS = {
    "train": _train,
    "plugins": _plugins,
    "inspect": _inspect,
    "export": _export,
    "plot": _plot,
    "data": _data,
    "eval": _eval,
}

#: Each command's path arguments: (attribute, the name a message gives it).
PATH_ARGUMENTS: dict[str, tuple[tuple[str, str], ...]] = {
    "train": (("config", "--config"), ("resume", "--resume")),
    "inspect": (("checkpoint", "CKPT"),),
    "export": (("checkpoint", "--checkpoint"), ("out", "--out")),
    "eval": (("checkpoint", "--checkpoint"), ("video", "--video")),
    "plot": (("run_dir", "RUN_DIR"), ("out", "--out")),
    "data": (("path", "PATH"), ("destination", "DST")),
}


def _check_paths(args: argparse.Namespace) -> None:
    """Refuse an empty path or a NUL byte before any work, naming the argument:
    ``Path("")`` quietly means the current directory (``--out ""`` would use it).
    A leading ``~`` (which a quoted argument or ``--out=~/x`` keeps) is expanded to
    the home directory here, and the expanded path is the one every command uses."""
    from slhub.paths import user_path

    for attribute, name in PATH_ARGUMENTS.get(args.command, ()):
        value = getattr(args, attribute, None)
        if value is not None:
            user_path(value, name)
            setattr(args, attribute, os.path.expanduser(value))


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["launch"]:  # torchrun's options are the launcher's to parse
        from slhub.launch import launch

        return launch(words[1:], owns_process=argv is None, parse=build_parser().parse_args)
    args = build_parser().parse_args(argv)
    args.whole_process = argv is None  # the console script or python -m slhub
    try:
        _check_paths(args)
        COMMANDS[args.command](args)
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
        _final_line(line)


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
