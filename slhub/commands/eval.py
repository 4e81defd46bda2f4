"""``slhub eval --checkpoint CKPT [--env PREFIX:ENV ...] [--set KEY=VALUE]``: a
checkpoint's model judged as its run validated it (:mod:`slhub.evaluation`), one
``metric value`` line each or one JSON object."""

from __future__ import annotations

import argparse
from typing import Any

from slhub.commands import EXIT_CODES_ONE_PROCESS, add_command

#: The path arguments: (attribute, the name a message gives it).
PATH_ARGUMENTS = (("checkpoint", "--checkpoint"), ("video", "--video"))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    evaluate = add_command(
        subparsers,
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
        "--actions",
        choices=("uniform", "smooth", "zero"),
        default="smooth",
        help="with --env, the collected episodes' actions (zero: passive motion)",
    )
    evaluate.add_argument(
        "--init",
        choices=("reset", "random"),
        default="reset",
        help="with --env, where collected episodes start: the env's reset (default), or "
        "random, as slhub data collect --init random draws them",
    )
    evaluate.add_argument(
        "--video",
        metavar="FILE.mp4",
        help="with --env (refused without it), a policy's first rollout as an mp4 video, "
        "into a folder that exists",
    )
    evaluate.add_argument("--json", action="store_true", help="one JSON object instead")
    return evaluate


def run(args: argparse.Namespace) -> None:
    from slhub.evaluation import run_eval
    from slhub.strictjson import dumps

    metrics = run_eval(
        args.checkpoint, overrides=args.overrides, plugin=args.plugin, env=args.env,
        episodes=args.episodes, steps=args.steps, seed=args.seed, actions=args.actions,
        video=args.video, init=args.init,
    )  # fmt: skip
    print(dumps(metrics) if args.json else format_metrics(metrics))


def format_metrics(metrics: dict[str, float]) -> str:
    """One ``name value`` line per metric, in the order the plugin reported them."""
    width = max((len(name) for name in metrics), default=0)
    return "\n".join(f"{name:<{width}}  {value:.6g}" for name, value in metrics.items())
