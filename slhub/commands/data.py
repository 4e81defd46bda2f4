"""``slhub data info|check|convert|collect``: a robot dataset described
(:mod:`slhub.data.inspection`), checked, converted (:mod:`slhub.data.conversion`), or
collected from a MuJoCo simulator (:func:`slhub.sim.collect`)."""

from __future__ import annotations

import argparse
from typing import Any

from slhub.commands import EXIT_CODES_ONE_PROCESS, add_command

#: The path arguments: (attribute, the name a message gives it).
PATH_ARGUMENTS = (("path", "PATH"), ("destination", "DST"))

COLLECT_EXAMPLES = """examples:
  slhub data collect datasets/hopper --env gymnasium:Hopper-v5 --episodes 100 --steps 1000 \\
      --actions smooth --seed 0
  slhub data collect datasets/pendulum --env gymnasium:InvertedPendulum-v5 --episodes 10 \\
      --steps 200 --actions policy --policy slhub.sim.experts:inverted_pendulum --noise 0.5 \\
      --seed 1 --render

Per step: observation, action, reward, terminated, truncated, qpos, qvel (named after
the joints), sim_state (mj_getState: restore it and replay the actions bit for bit),
contact (per-body normal force, where geoms can touch; --contacts geometry records
contact_geometry instead: per contact slot the point, normal, depth and an active mask),
image (with --render). The same
command writes a byte-identical dataset. Experts for --policy: slhub.sim.experts:inverted_pendulum
(InvertedPendulum-v5), slhub.sim.experts:reacher (Reacher-v5). Needs mujoco and gymnasium:
pip install 'slhub[sim]'

"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    data = add_command(
        subparsers,
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
    _add_collect(actions)
    return data


# ``actions``: what ``add_subparsers()`` returns (argparse names no public class for it)
def _add_collect(actions: Any) -> None:
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
        choices=("uniform", "smooth", "zero", "policy"),
        default="uniform",
        help="uniform in the ctrlrange; smooth: piecewise-linear between random knots; "
        "zero: every control 0 (passive motion); policy: --policy (default: uniform)",
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
    collect.add_argument(
        "--contacts",
        default="force",
        metavar="KIND",
        help="contact inputs, where geoms can touch: force (per-body normal force, feature "
        "contact; the default), geometry (per contact slot: point, normal, depth, active; "
        "feature contact_geometry) or force,geometry",
    )
    collect.add_argument(
        "--init",
        choices=("reset", "random"),
        default="reset",
        help="where episodes start: the env's reset (default), or random: the base turned "
        "up to 90 degrees, moving and dropped, every joint anywhere in its range and "
        "moving, as NeRD starts its episodes",
    )
    collect.add_argument("--render", action="store_true", help="record an RGB image per step")
    collect.add_argument(
        "--camera",
        default="follow",
        help="a camera of the model (Hopper's track), or slhub's: follow, which follows the "
        "robot from the side (default), or fixed, which looks at the model's centre",
    )
    collect.add_argument("--size", type=int, default=64, help="image height and width")


def run(args: argparse.Namespace) -> None:
    if args.data_command == "info":
        from slhub.data.inspection import info

        print(info(args.path, args.format))
    elif args.data_command == "check":
        from slhub.data.inspection import check

        print(check(args.path, args.format, args.min_length))
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
                contacts=args.contacts,
                init=args.init,
            )
        )
    else:
        from slhub.data.conversion import convert

        print(convert(args.path, args.destination, args.format, to=args.to, fps=args.fps))
