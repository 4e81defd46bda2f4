"""slhub against a hand-written loop on one CUDA GPU, with host-device syncs counted.

    python benchmarks/gpu_overhead.py                   # on a CUDA machine, under 5 minutes
    python benchmarks/gpu_overhead.py --device cpu --updates 200 --repeats 1   # logic check

One process, both contestants in it, alternating (hand, slhub, slhub, hand,
...), on the sl_ddp work at two sizes: the example's (4 -> 32 -> 2 MLP, batch
32) and a large one (hidden 2048, batch 8192). Each does ``--updates`` updates
with validation every 50 and a durable checkpoint (temporary, fsync, rename)
every 100, as in ``sl_ddp_vs_torch.py``; the hand loop samples like the
example's plugin (corpus on the device, indices from a CPU generator).
Time per update is taken between the end of update 1 and the end of the last
one, with ``torch.cuda.synchronize()`` at both ends; the table gives medians
and the ratio, and the driver checks that both produced the same metrics and
final weights.

Then ``torch.cuda.set_sync_debug_mode("warn")`` counts the synchronizing CUDA
calls of 20 updates away from any boundary in each contestant and prints them
per update with where they come from. ``--device cpu`` runs the same logic on
the CPU (no sync counts): it checks the script, it measures nothing about GPUs.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from hand_loop import hand_loop  # noqa: E402 - benchmarks/hand_loop.py

import slhub  # noqa: E402
from slhub import checkpoint, hookimpl  # noqa: E402
from slhub.trainer import sampler_seed  # noqa: E402

SEED, LR, VALIDATE_EVERY, SAVE_EVERY = 0, 1e-3, 50, 100
SIZES = ((32, 32), (2048, 8192))  # (hidden, batch)
SYNC_WINDOW = 20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SyncCounter:
    """Counts synchronizing CUDA calls between :meth:`start` and :meth:`stop`, by call site."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sites: collections.Counter[str] = collections.Counter()
        self.count = 0
        self._catcher: warnings.catch_warnings | None = None

    def start(self) -> None:
        if self.device.type != "cuda":
            return
        self._catcher = warnings.catch_warnings(record=True)
        self._records = self._catcher.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> None:
        if self._catcher is None:
            return
        torch.cuda.set_sync_debug_mode(0)
        records = [r for r in self._records if "synchroniz" in str(r.message)]
        self.count += len(records)
        for record in records:
            self.sites[f"{Path(record.filename).name}:{record.lineno}"] += 1
        self._catcher.__exit__(None, None, None)
        self._catcher = None


def hand(out: Path, device: torch.device, hidden: int, batch: int, updates: int, counter=None):
    """The hand-written loop (benchmarks/hand_loop.py); returns ms per update (2..N).

    The counter covers updates VALIDATE_EVERY + 5 .. VALIDATE_EVERY + 4 + SYNC_WINDOW,
    from before the first one's sampling to after the last one's metrics line."""
    last = VALIDATE_EVERY + 4 + SYNC_WINDOW

    def after_metrics(step: int) -> None:
        if counter is not None and step == last:
            counter.stop()

    steps = hand_loop(
        out, updates, sampler_seed(SEED, 0), device=device, hidden=hidden, batch=batch,
        validate_every=VALIDATE_EVERY, save_every=SAVE_EVERY, after_metrics=after_metrics,
    )  # fmt: skip
    started = 0.0
    for step in steps:
        if step == 1:
            _sync(device)
            started = time.perf_counter()
        if counter is not None and step == VALIDATE_EVERY + 4:
            counter.start()
    _sync(device)
    return 1e3 * (time.perf_counter() - started) / (updates - 1)


class Probe:
    """An extra slhub plugin: the clock at updates 1 and N, the sync counter in between."""

    def __init__(self, device: torch.device, updates: int, counter=None) -> None:
        self.device, self.updates, self.counter = device, updates, counter
        self.started = self.elapsed = 0.0

    @hookimpl
    def on_commit(self, trainer, step, result, metrics):
        if self.counter is not None and step == VALIDATE_EVERY + 4:
            self.counter.start()  # from after this commit: updates 55..74 of the hand loop
        if self.counter is not None and step == VALIDATE_EVERY + 4 + SYNC_WINDOW:
            self.counter.stop()

    @hookimpl
    def on_log(self, trainer, step, metrics):
        if "train/loss" not in metrics:
            return
        if step == 1:
            _sync(self.device)
            self.started = time.perf_counter()
        elif step == self.updates:
            _sync(self.device)
            self.elapsed = time.perf_counter() - self.started


def run_slhub(out: Path, device: torch.device, hidden: int, batch: int, updates: int, counter=None):
    probe = Probe(device, updates, counter)
    recipe = ROOT / "examples" / "sl_ddp" / ("cuda.yaml" if device.type == "cuda" else "cpu.yaml")
    slhub.train(
        recipe,
        [
            f"trainer.output_dir={out}",
            f"trainer.steps={updates}",
            f"trainer.batch_size={batch}",
            f"model.hidden={hidden}",
            f"trainer.validate_every={VALIDATE_EVERY}",
            f"trainer.save_every={SAVE_EVERY}",
        ],
        log_format="json",
        plugins=[probe],
    )
    return 1e3 * probe.elapsed / (updates - 1)


def same_work(a: Path, b: Path) -> str:
    def lines(folder: Path) -> list[dict]:
        return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x]

    la, lb = lines(a), lines(b)
    if [sorted(r) for r in la] != [sorted(r) for r in lb]:
        return "DIFFERENT metrics keys"
    worst = max(abs(float(ra[k]) - float(rb[k])) for ra, rb in zip(la, lb) for k in ra)
    ma = checkpoint.load(checkpoint.files.last_path(a)).model
    mb = checkpoint.load(checkpoint.files.last_path(b)).model
    exact = all(torch.equal(ma[k], mb[k]) for k in ma)
    return (
        f"metrics max difference {worst:g}; final weights {'bitwise equal' if exact else 'DIFFER'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (logic check)")
    parser.add_argument("--updates", type=int, default=1000, help="updates per run (1000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per contestant and size (3)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible; --device cpu checks the logic on the CPU")
    if args.updates < VALIDATE_EVERY + 4 + SYNC_WINDOW:
        raise SystemExit(f"--updates must be at least {VALIDATE_EVERY + 4 + SYNC_WINDOW}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device {name}; torch {torch.__version__}; {args.updates} updates; {args.repeats} reps")
    base = Path(tempfile.mkdtemp(prefix="slhub-gpu-bench-"))
    rows = []
    for hidden, batch in SIZES:
        times: dict[str, list[float]] = {"hand": [], "slhub": []}
        for rep in range(args.repeats + 1):  # repetition 0 is an untimed warm-up
            order = ("hand", "slhub") if rep % 2 else ("slhub", "hand")
            for who in order:
                out = base / f"{who}-{hidden}-{rep}"
                fn = hand if who == "hand" else run_slhub
                ms = fn(out, device, hidden, batch, args.updates)
                if rep > 0:
                    times[who].append(ms)
        check = same_work(base / f"slhub-{hidden}-1", base / f"hand-{hidden}-1")
        counts = {}
        for who, fn in (("hand", hand), ("slhub", run_slhub)):
            counter = SyncCounter(device)
            try:
                fn(base / f"sync-{who}-{hidden}", device, hidden, batch, args.updates, counter)
            except Exception:  # noqa: BLE001 - the timing table still prints
                traceback.print_exc()
            counts[who] = counter
        med = {who: statistics.median(ts) for who, ts in times.items()}
        rows.append((hidden, batch, med, check, counts))
    print()
    print("| hidden, batch | hand (ms/update) | slhub (ms/update) | slhub/hand | syncs/update hand"
          " | syncs/update slhub |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for hidden, batch, med, _, counts in rows:
        syncs = [
            f"{counts[w].count / SYNC_WINDOW:.1f}" if device.type == "cuda" else "n/a"
            for w in ("hand", "slhub")
        ]
        print(
            f"| {hidden}, {batch} | {med['hand']:.3f} | {med['slhub']:.3f} "
            f"| {med['slhub'] / med['hand']:.3f} | {syncs[0]} | {syncs[1]} |"
        )
    for hidden, batch, _, check, counts in rows:
        print(f"hidden {hidden}, batch {batch}: {check}")
        for who in ("hand", "slhub"):
            sites = ", ".join(f"{site} x{n}" for site, n in counts[who].sites.most_common())
            if sites:
                print(f"  {who} sync sites over {SYNC_WINDOW} updates: {sites}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
