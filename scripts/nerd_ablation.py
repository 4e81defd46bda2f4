"""NeRD's ablation on Ant-v5 and Hopper-v5 (docs/nerd.md, "The ablation"): the world
frame against the base frame, the per-body contact force against contact geometry, on
the same data and the same number of updates, judged in NeRD's measures beside both
baselines.

1. Collect each robot's training episodes once with both contact forms (``slhub data
   collect ... --contacts force,geometry``): the recipe header's smooth random actions
   from the env's reset, and ``--passive-transitions`` steps of episodes with every
   control 0 from random initial states (``--init random``: the robot turned, moving
   and dropped, as NeRD starts its episodes), so that the model also sees it fall,
   bounce and come to rest; each passive episode lasts about as long as the robot
   takes to settle (``Robot.passive_steps``). One store holds both (:func:`merge`).
2. Train the robot's recipe (``examples/nerd/<robot>/sl.train.yaml``) four ways,
   ``model.frame`` world or body and ``data.features.extra`` ``[contact]`` or
   ``[contact_geometry]``, once per ``--seeds`` (``trainer.seed``: the weights' start
   and the batches; the data is the same).
3. Judge every run with ``slhub eval --env gymnasium:<env>`` on the same fresh episodes
   (seed 1000): actuated (smooth random actions from the env's reset, 300 steps) at 10
   and 100 steps, and passive (``--actions zero --init random``, 510 steps, as NeRD
   judges passive motion) at 10, 100 and 500.
4. Print one markdown table per robot and write every figure to ``OUT/ablation.json``:
   per configuration and measure, the mean over seeds with the smallest and largest.

The model's figures are its ``selfcontact_*`` ones: each rollout step's contact inputs
computed from the model's own predicted state through MuJoCo, as when it stands in for
the simulator; ``ablation.json`` keeps the teacher-forced ``rollout_*`` figures too. A
run whose final checkpoint exists is not trained again and a judged one not judged
again, so a stopped ablation continues where it stopped. Run it with
``OMP_NUM_THREADS=1``; ``--jobs`` runs that many trainings at once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
FRAMES = ("world", "body")
#: contact form -> the dataset feature the recipe's ``extra`` names
CONTACTS = {"force": "contact", "geometry": "contact_geometry"}
MEASURES = ("base_position", "base_orientation", "joint_position")
UNITS = {"base_position": "m", "base_orientation": "rad", "joint_position": "rad"}
#: The horizons judged per setting, in the table's column order.
HORIZONS = {"passive": (10, 100, 500), "actuated": (10, 100)}
#: Judged episodes per setting: (actions, steps, init); passive ones give 500 predicted
#: steps after a window of up to 10.
SETTINGS = {"actuated": ("smooth", 300, "reset"), "passive": ("zero", 510, "random")}
#: Training steps with every control 0, beside the recipe's smooth-action episodes
#: (``--passive-transitions``).
ZERO_TRANSITIONS = 15000
BASELINES = {"baseline": "state held", "linear": "change held"}


@dataclass(frozen=True)
class Robot:
    """A robot's env, recipe and the data its recipe header collects; its passive
    episodes' length covers its fall and settling (Ant-v5 is at rest after about 40
    steps of 0.05 s, Hopper-v5 after about 250 of 0.008 s), so that rest does not fill
    the passive data."""

    env: str
    recipe: Path
    episodes: int
    steps: int
    passive_steps: int


NERD = REPO / "examples" / "nerd"
ROBOTS = {
    "ant": Robot("Ant-v5", NERD / "ant" / "sl.train.yaml", 150, 300, 100),
    "hopper": Robot("Hopper-v5", NERD / "hopper" / "sl.train.yaml", 100, 300, 300),
}


def slhub(*args: str) -> list[str]:
    return [sys.executable, "-m", "slhub", *args]


def _say(line: str) -> None:
    """One whole line to stdout (trainings run in threads)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run(command: list[str], log: Path) -> None:
    """Run one slhub command, its output into ``log``; a failure stops the ablation."""
    _say("$ " + " ".join(command[2:]))
    with log.open("a", encoding="utf-8") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[2:])} failed ({done.returncode}); see {log}")


def collect(robot: Robot, dst: Path, log: Path, passive: int = ZERO_TRANSITIONS) -> None:
    """The robot's smooth-action episodes and ``passive`` steps of zero-action ones, one
    store at ``dst``."""
    if dst.exists():
        return
    parts = []
    zero = (passive // robot.passive_steps, robot.passive_steps)
    kinds = (("smooth", (robot.episodes, robot.steps), 0, "reset"), ("zero", zero, 1, "random"))
    for actions, (episodes, steps), seed, init in kinds:
        part = dst.with_name(f"{dst.name}_{actions}")
        if not part.exists():
            run(slhub("data", "collect", str(part), "--env", f"gymnasium:{robot.env}",
                      "--episodes", str(episodes), "--steps", str(steps),
                      "--actions", actions, "--init", init, "--seed", str(seed),
                      "--through-termination", "--contacts", "force,geometry"), log)  # fmt: skip
        parts.append(part)
    merge(parts, dst)


def merge(parts: list[Path], dst: Path) -> None:
    """Every episode of ``parts`` (collected from one env) in one store; its ``source``
    is the first part's, which names the env and the floating base, with each part's
    own record under ``parts``."""
    from slhub.data import ArrayEpisodes, open_dataset, write_store

    stores = [open_dataset(part) for part in parts]
    keys = [key for key in stores[0].features if all(key in s.features for s in stores)]
    episodes = [
        {key: store.read(key, index, 0, int(length)) for key in keys}
        for store in stores
        for index, length in enumerate(store.lengths)
    ]
    names = {key: stores[0].features[key].names for key in keys if stores[0].features[key].names}
    sources = [store.source for store in stores]
    source = {**sources[0], "episodes": len(episodes), "parts": sources}
    for key in ("actions", "init"):
        source[key] = "+".join(str(s.get(key)) for s in sources)
    write_store(ArrayEpisodes(episodes, fps=stores[0].fps, names=names), dst, provenance=source)


def train_and_judge(
    robot: Robot, data: Path, folder: Path, frame: str, contacts: str, seed: int,
    updates: int | None, episodes: int,
) -> dict[str, Any]:  # fmt: skip
    """Train one configuration (unless its final checkpoint exists) and return its
    figures on fresh actuated and passive episodes."""
    steps = updates or yaml.safe_load(robot.recipe.read_text())["trainer"]["steps"]
    settings = [
        f"data.path={data}", f"trainer.output_dir={folder}", f"model.frame={frame}",
        f"data.features.extra=[{CONTACTS[contacts]}]", f"trainer.seed={seed}",
        "trainer.device=cpu", f"trainer.steps={steps}", f"trainer.validate_every={steps}",
        f"trainer.save_every={steps}",
    ]  # fmt: skip
    sets = [arg for s in settings for arg in ("--set", s)]
    log = folder.with_suffix(".log")
    if not (folder / f"step_{steps}.pt").exists():
        resume = ["--resume", "auto"] if (folder / "run.json").exists() else []
        run(slhub("train", "--config", str(robot.recipe), *sets, *resume), log)
    return {setting: judge(robot, folder, setting, episodes) for setting in SETTINGS}


def judge(robot: Robot, folder: Path, setting: str, episodes: int) -> dict[str, float]:
    """``slhub eval --env`` of the run's last checkpoint, kept in ``<setting>.json``."""
    kept = folder / f"{setting}.json"
    if not kept.exists():
        actions, steps, init = SETTINGS[setting]
        horizons = ", ".join(map(str, HORIZONS[setting]))
        command = slhub("eval", "--checkpoint", str(folder / "last.pt"),
                        "--env", f"gymnasium:{robot.env}", "--actions", actions, "--init", init,
                        "--episodes", str(episodes), "--steps", str(steps), "--seed", "1000",
                        "--set", f"validation.horizons=[{horizons}]",
                        "--json")  # fmt: skip
        _say("$ " + " ".join(command[2:]))
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"slhub eval of {folder} failed: {done.stderr.strip()[-500:]}")
        kept.write_text(done.stdout, encoding="utf-8")
    return json.loads(kept.read_text(encoding="utf-8"))


def figures(results: dict[str, Any], kind: str) -> dict[str, Any]:
    """``{measure: {"passive_K"|"actuated_K": [value per seed]}}`` for one figure kind."""
    table: dict[str, Any] = {}
    for measure in MEASURES:
        row: dict[str, list[float]] = {}
        for setting, horizons in HORIZONS.items():
            for k in horizons:
                row[f"{setting}_{k}"] = [r[setting][f"{kind}_{measure}_{k}"] for r in results]
        table[measure] = row
    return table


def _cell(values: list[float], best: bool) -> str:
    mean = statistics.fmean(values)
    text = (
        f"{mean:.3g}" if len(values) == 1 else f"{mean:.3g} ({min(values):.3g}–{max(values):.3g})"
    )
    return f"**{text}**" if best else text


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    """One table: a block of rows per measure, the best mean of each column in bold."""
    columns = [f"{setting}_{k}" for setting, horizons in HORIZONS.items() for k in horizons]
    head = ["measure", "model"] + [c.replace("_", " ") + " steps" for c in columns]
    lines = [f"| {' | '.join(head)} |", "|" + "---|" * len(head)]
    for measure in MEASURES:
        best = {c: min(statistics.fmean(r[measure][c]) for r in rows.values()) for c in columns}
        for label, row in rows.items():
            cells = [_cell(row[measure][c], statistics.fmean(row[measure][c]) == best[c])
                     for c in columns]  # fmt: skip
            lines.append(f"| {measure.replace('_', ' ')} ({UNITS[measure]}) | "
                         f"{label} | {' | '.join(cells)} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a folder for its files")
    parser.add_argument("--robots", nargs="+", choices=sorted(ROBOTS), default=sorted(ROBOTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--updates", type=int, help="training updates (default: the recipe's)")
    parser.add_argument("--episodes", type=int, default=16, help="judged episodes per setting")
    parser.add_argument(
        "--passive-transitions",
        type=int,
        default=ZERO_TRANSITIONS,
        help="training steps with every control 0 from random initial states",
    )
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 1)))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs").mkdir(exist_ok=True)
    for name in args.robots:
        collect(
            ROBOTS[name], args.out / "data" / name, args.out / f"collect_{name}.log",
            args.passive_transitions,
        )  # fmt: skip
    work = [(name, frame, contacts, seed) for name in args.robots for frame in FRAMES
            for contacts in CONTACTS for seed in args.seeds]  # fmt: skip
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {
            job: pool.submit(
                train_and_judge, ROBOTS[job[0]], args.out / "data" / job[0],
                args.out / "runs" / "{}-{}-{}-s{}".format(*job), job[1], job[2], job[3],
                args.updates, args.episodes,
            )
            for job in work
        }  # fmt: skip
        done = {job: future.result() for job, future in futures.items()}
    report: dict[str, Any] = {
        "seeds": args.seeds,
        "updates": args.updates,
        "passive_transitions": args.passive_transitions,
        "robots": {},
    }
    for name in args.robots:
        per_config = {
            f"{frame}, {contacts}": [done[(name, frame, contacts, s)] for s in args.seeds]
            for frame in FRAMES for contacts in CONTACTS
        }  # fmt: skip
        model = {label: figures(r, "selfcontact") for label, r in per_config.items()}
        first = next(iter(per_config.values()))  # baselines: the same episodes in every run
        held = {label: figures(first[:1], kind) for kind, label in BASELINES.items()}
        report["robots"][name] = {
            "env": ROBOTS[name].env,
            "selfcontact": model,
            "rollout": {label: figures(r, "rollout") for label, r in per_config.items()},
            "baselines": held,
        }
        print(f"\n{ROBOTS[name].env}\n\n{markdown(model | held)}")
    report["seconds"] = round(time.perf_counter() - started)
    (args.out / "ablation.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"\n{report['seconds']} s; figures in {args.out / 'ablation.json'}")
    return report


if __name__ == "__main__":
    main()
