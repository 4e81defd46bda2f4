"""Updates/s of visual BC from a LeRobot v3.0 video dataset, decoding inline vs ahead.

    OMP_NUM_THREADS=1 python benchmarks/visual_bc_decode.py
    OMP_NUM_THREADS=1 python benchmarks/visual_bc_decode.py --steps 200 --repeats 3

Trains ``examples/bc/visual.yaml`` (needs ``pip install -e plugins/bc``) from the LeRobot
v3.0 dataset in ``tests/data/datasets/lerobot_v30`` (4 Hopper-v5 episodes, 48x48 frames
in AV1 video, written by lerobot 0.4.4; copied to a temporary folder first), one
process, no validation, with the same anchors in every configuration:

- ``inline``: ``data.decode: {workers: 0, ahead: 0}`` — frames decoded in the update's
  thread, when the batch is taken;
- ``ahead, 0 workers``: ``{workers: 0, ahead: 2}`` — the same draw order as below, still
  decoded in the update's thread (the control for the thread pool);
- ``ahead, 2 workers``: ``{workers: 2, ahead: 2}`` — two batches drawn ahead and decoded
  on 2 threads while the update runs.

Each configuration runs ``--repeats`` times in rotating order in fresh processes; the
median updates/s between its first and last update (timed by an extra plugin's
``on_commit``, so start-up and the dataset's caches, filled by a warm-up run, are not)
is printed, and the final weights of the two ``ahead`` configurations are checked equal
(decode workers never change a result). LeRobot's own ``LeRobotDataset`` under a
``DataLoader`` is not in the table: the ``lerobot`` package caps torch below 2.11 and
pulls CUDA builds of torchvision/torchcodec, so it does not install beside torch 2.13
here (docs/performance.md, "LeRobot is not in the table").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {
    "inline": {"workers": 0, "ahead": 0},
    "ahead, 0 workers": {"workers": 0, "ahead": 2},
    "ahead, 2 workers": {"workers": 2, "ahead": 2},
}
CHILD = """
import json, sys, time
import slhub

class Clock:
    times = {}

    @slhub.hookimpl
    def on_commit(self, trainer, step):
        self.times[step] = time.perf_counter()

recipe, out = sys.argv[1], sys.argv[2]
clock = Clock()
slhub.train(recipe, [f"trainer.output_dir={out}"], plugins=[clock])
steps = sorted(clock.times)
print(json.dumps({"updates": steps[-1] - steps[0],
                  "seconds": clock.times[steps[-1]] - clock.times[steps[0]]}))
"""


def recipe_for(folder: Path, dataset: Path, steps: int, batch: int, decode: dict) -> Path:
    raw = yaml.safe_load((ROOT / "examples" / "bc" / "visual.yaml").read_text())
    raw["trainer"].update(
        steps=steps, batch_size=batch, validate_every=0, save_every=steps, device="cpu"
    )
    raw["bc"].update(history=2, frame_gap=1, chunk=8, rollouts=0)
    raw["data"] = {
        "path": str(dataset),
        "split": {"validation_ratio": 0.25, "seed": 0},
        "window": {"pad": True},
        "decode": decode,
        "features": {"image": ["observation.images.front"], "action": ["action"]},
    }
    path = folder / f"visual-{decode['workers']}-{decode['ahead']}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        dataset = folder / "lerobot_v30"
        shutil.copytree(ROOT / "tests" / "data" / "datasets" / "lerobot_v30", dataset)
        recipes = {
            name: recipe_for(folder, dataset, args.steps, args.batch, decode)
            for name, decode in CONFIGS.items()
        }
        rates: dict[str, list[float]] = {name: [] for name in CONFIGS}
        names = list(CONFIGS)
        # a first run fills the dataset's digest and statistics caches for all of them
        subprocess.run(
            [sys.executable, "-c", CHILD, str(recipes["inline"]), str(folder / "warm")],
            env=env, capture_output=True, text=True, check=True, cwd=ROOT,
        )  # fmt: skip
        for repeat in range(args.repeats):
            for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
                out = folder / f"run-{len(rates[name])}-{names.index(name)}"
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, str(recipes[name]), str(out)],
                    env=env, capture_output=True, text=True, check=True, cwd=ROOT,
                )  # fmt: skip
                timed = json.loads(done.stdout.strip().splitlines()[-1])
                rates[name].append(timed["updates"] / timed["seconds"])
        import torch

        finals = [
            torch.load(folder / f"run-0-{i}" / "last.pt", weights_only=True)["model"]
            for i in (1, 2)
        ]
        same = all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
    load = os.getloadavg()[0]
    print(f"visual BC, {args.steps} updates of {args.batch} windows (2 frames, 8-step chunk)")
    print(f"load average {load:.1f}; median of {args.repeats}, updates/s after the first update")
    print("| decoding | updates/s |")
    print("|---|---|")
    for name in CONFIGS:
        print(f"| {name} | {statistics.median(rates[name]):.1f} |")
    print(f"ahead with 0 and 2 workers give bitwise-equal weights: {same}")


if __name__ == "__main__":
    main()
