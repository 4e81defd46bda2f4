"""slhub's per-update overhead, interleaved with a hand-written loop in blocks, in one job.

    OMP_NUM_THREADS=1 python benchmarks/interleaved_overhead.py     # 4000 updates, blocks of 100
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 benchmarks/interleaved_overhead.py

For a shared, noisy machine: instead of timing two launches minutes apart,
one process (or each of N Gloo workers under torchrun, sharing one process
group) runs slhub (``slhub.train`` on ``examples/sl_ddp/cpu.yaml``) and a
hand-written loop doing the same work (``hand_loop.py``, as in
``sl_ddp_vs_torch.py``, DDP under a group: validation every 50, durable
checkpoint every 100, or as ``--validate-every`` / ``--save-every`` set, 0 for
none) side by side, in alternating blocks of ``--block`` updates: from slhub's
``on_commit`` at every block's last update (on every rank) a probe plugin runs
the next block of the hand loop. So
both see the same load within seconds, and by default each block of either contains one
checkpoint and two validations. Per block it records wall time
(``perf_counter``) and this thread's CPU time (``thread_time``, which does not
count time spent waiting for a CPU).

slhub's block is the time from the probe's return to its next call: updates,
its boundaries and the probe's own ``on_commit`` calls (a few microseconds per
update). The first block of each is a warm-up and not counted. Rank 0 prints
medians and the median of per-block ratios (its times: the collectives keep
the ranks in step), and checks that both loops produced the same metrics and
bitwise-equal weights.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from hand_loop import hand_loop  # noqa: E402 - benchmarks/hand_loop.py

import slhub  # noqa: E402
from slhub import checkpoint, distributed, hookimpl  # noqa: E402
from slhub.trainer import sampler_seed  # noqa: E402

SEED, VALIDATE_EVERY, SAVE_EVERY = 0, 50, 100


class Interleave:
    """Probe plugin: at each block end of slhub, run the hand loop's next block."""

    def __init__(self, hand, block: int, updates: int) -> None:
        self.hand, self.block, self.updates = hand, block, updates
        self.times: dict[str, list[tuple[float, float]]] = {"slhub": [], "hand": []}
        self._resumed: tuple[float, float] | None = None

    @hookimpl
    def on_commit(self, trainer, step):
        if step % self.block:
            return
        now = (time.perf_counter(), time.thread_time())
        if self._resumed is not None:
            wall, cpu = (now[0] - self._resumed[0], now[1] - self._resumed[1])
            self.times["slhub"].append((wall, cpu))
        started = (time.perf_counter(), time.thread_time())
        for _ in range(self.block):
            next(self.hand)
        self.times["hand"].append(
            (time.perf_counter() - started[0], time.thread_time() - started[1])
        )
        if step == self.updates:  # finish it now: its DDP wrapper must go before the group
            for _ in self.hand:
                pass
        self._resumed = (time.perf_counter(), time.thread_time())


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _check(a: Path, b: Path) -> str:
    def lines(folder: Path) -> list[dict]:
        return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x]

    la, lb = lines(a), lines(b)
    if la != lb:
        return "DIFFERENT metrics"
    ma = checkpoint.load(checkpoint.files.last_path(a)).model
    mb = checkpoint.load(checkpoint.files.last_path(b)).model
    exact = all(torch.equal(ma[k], mb[k]) for k in ma)
    return "same metrics, bitwise-equal final weights" if exact else "DIFFERENT final weights"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=4000, help="updates of each loop (4000)")
    parser.add_argument("--block", type=int, default=100, help="updates per block (100)")
    parser.add_argument(
        "--validate-every", type=int, default=VALIDATE_EVERY, help="0: no validation (50)"
    )
    parser.add_argument(
        "--save-every", type=int, default=SAVE_EVERY, help="0: only the final checkpoint (100)"
    )
    args = parser.parse_args(argv)
    boundaries = [n for n in (args.validate_every, args.save_every) if n]
    if args.updates % args.block or any(args.block % n for n in boundaries):
        raise SystemExit(
            "--block must divide --updates and be a multiple of --validate-every and --save-every"
        )
    with distributed.distributed_run("cpu"):  # a group under torchrun, shared by both loops
        rank, world = distributed.rank(), distributed.world_size()
        base = Path(distributed.broadcast_from_rank0(tempfile.mkdtemp(prefix="slhub-interleaved-")))
        hand = hand_loop(
            base / "hand", args.updates, sampler_seed(SEED, rank),
            validate_every=args.validate_every, save_every=args.save_every,
        )  # fmt: skip
        probe = Interleave(hand, args.block, args.updates)
        if rank == 0:
            print(f"{world} worker(s); load average before: {_load()}")
        overrides = [
            f"trainer.output_dir={base / 'slhub'}",
            f"trainer.steps={args.updates}",
            f"trainer.validate_every={args.validate_every}",
            f"trainer.save_every={args.save_every}",
        ]
        slhub.train(ROOT / "examples" / "sl_ddp" / "cpu.yaml", overrides, log_format="json",
                    plugins=[probe])  # fmt: skip
    if rank != 0:
        return 0
    print(f"load average after: {_load()}")
    # slhub's block j (after the hand's block j) pairs with the hand's block j + 1; the
    # first block of each (startup, model build) is left out.
    pairs = list(zip(probe.times["slhub"][1:], probe.times["hand"][2:], strict=True))
    print(
        f"{len(pairs)} block pairs of {args.block} updates; {_check(base / 'slhub', base / 'hand')}"
    )
    print("| median per update | wall (ms) | thread CPU (ms) |")
    print("|---|---:|---:|")
    med = {}
    for name, idx in (("hand", 1), ("slhub", 0)):
        walls = [p[idx][0] * 1e3 / args.block for p in pairs]
        cpus = [p[idx][1] * 1e3 / args.block for p in pairs]
        med[name] = (statistics.median(walls), statistics.median(cpus))
        print(f"| {name} | {med[name][0]:.4f} | {med[name][1]:.4f} |")
    print(f"| slhub/hand | {med['slhub'][0] / med['hand'][0]:.3f} "
          f"| {med['slhub'][1] / med['hand'][1]:.3f} |")  # fmt: skip
    wall_ratio = statistics.median(s[0] / h[0] for s, h in pairs)
    cpu_ratio = statistics.median(s[1] / h[1] for s, h in pairs)
    print(f"median of per-block ratios: wall {wall_ratio:.3f}, thread CPU {cpu_ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
