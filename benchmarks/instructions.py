"""slhub's per-update overhead as a count of executed instructions: no noise.

    OMP_NUM_THREADS=1 python benchmarks/instructions.py            # ~16 min on 2 cores
    OMP_NUM_THREADS=1 python benchmarks/instructions.py --validate-every 50 --save-every 100

Wall-clock ratios on a shared VM move by several percent between runs; the
number of instructions a loop executes does not. This runs the hand-written
loop (``hand_loop.py``) and slhub on the sl_ddp work (``examples/sl_ddp/cpu.yaml``,
no validation or checkpoints unless asked) under valgrind's callgrind, each for
``--short`` and ``--long`` updates, and reports the difference divided by the
updates between: the instructions of one update, start-up and the last
checkpoint cancelled out. Their ratio bounds what slhub's own work costs per
update on a CPU, apart from cache effects (callgrind does not time anything).
Needs ``valgrind``; runs two callgrind processes at a time (each ~30x slower
than native, mostly importing torch).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _one_run(loop: str, updates: int, validate_every: int, save_every: int) -> None:
    """The measured program: one loop for ``updates`` updates (run under callgrind)."""
    sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]
    out = Path(tempfile.mkdtemp(prefix="slhub-instructions-"))
    if loop == "hand":
        from hand_loop import hand_loop

        from slhub.trainer import sampler_seed

        steps = hand_loop(
            out, updates, sampler_seed(0, 0), validate_every=validate_every, save_every=save_every
        )
        for _ in steps:
            pass
    else:
        import slhub

        overrides = [
            f"trainer.output_dir={out}",
            f"trainer.steps={updates}",
            f"trainer.validate_every={validate_every}",
            f"trainer.save_every={save_every}",
        ]
        slhub.train(ROOT / "examples" / "sl_ddp" / "cpu.yaml", overrides, log_format="json")
    shutil.rmtree(out, ignore_errors=True)


def _count(loop: str, updates: int, args: argparse.Namespace, folder: Path) -> int:
    """Instructions executed by the whole program (callgrind's ``Collected``)."""
    command = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/{loop}.{updates}.out",
        sys.executable, __file__, "--run", loop, str(updates),
        "--validate-every", str(args.validate_every), "--save-every", str(args.save_every),
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"{loop} {updates}: callgrind failed:\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", type=int, default=100, help="updates of the short runs")
    parser.add_argument("--long", type=int, default=300, help="updates of the long runs")
    parser.add_argument("--validate-every", type=int, default=0, help="0: none (0)")
    parser.add_argument("--save-every", type=int, default=0, help="0: only the last update (0)")
    parser.add_argument("--run", nargs=2, metavar=("LOOP", "UPDATES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        _one_run(args.run[0], int(args.run[1]), args.validate_every, args.save_every)
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    jobs = [(loop, n) for loop in ("hand", "slhub") for n in (args.short, args.long)]
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(2) as pool:
        counts = dict(zip(jobs, pool.map(lambda j: _count(*j, args, Path(folder)), jobs)))
    span = args.long - args.short
    per_update = {
        loop: (counts[(loop, args.long)] - counts[(loop, args.short)]) / span
        for loop in ("hand", "slhub")
    }
    print(
        f"instructions per update (runs of {args.short} and {args.long} updates, validation "
        f"every {args.validate_every or 'never'}, checkpoint every {args.save_every or 'never'})"
    )
    print("| loop | instructions per update |\n|---|---:|")
    for loop, value in per_update.items():
        print(f"| {loop} | {value:,.0f} |")
    print(f"| slhub/hand | {per_update['slhub'] / per_update['hand']:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
