"""What a checkpoint boundary costs in slhub against a bare serialize plus durable write.

    OMP_NUM_THREADS=1 python benchmarks/checkpoint_boundary.py                # sl_ddp, 4->32->2
    OMP_NUM_THREADS=1 python benchmarks/checkpoint_boundary.py --hidden 2048  # 0.2 MB checkpoint

One process trains the sl_ddp example for a few updates; then, inside the run
(from an ``on_log`` hook at the last update, so the loop's real state is used),
it times alternately, ``--repeats`` times each:

- **slhub**: ``trainer.save()``, what a save-only boundary does: every rank's
  state (RNG, sampler, buffers) gathered, the v2 checkpoint
  built, serialized once and written durably to ``step_N.pt`` and ``last.pt``
  (temporary, fsync, rename, directory fsync), metrics.jsonl fsynced.
- **bare**: the same checkpoint object (the one slhub wrote last) serialized
  with ``torch.save`` into a ``BytesIO`` and the bytes written durably to two
  files, each on its own (temporary, fsync, rename, directory fsync),
  metrics.jsonl fsynced: the yardstick.
- **bare, one write**: the same, but written as slhub writes them: once
  (temporary, fsync), ``last.pt`` a hard link, one directory fsync. slhub
  against this one is the framework's own cost at a boundary.

It prints medians, the ratios and the checkpoint size. fsync latency dominates
on a small model and varies a lot on a shared disk: compare the medians.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from durable import durable_write  # noqa: E402 - benchmarks/durable.py

import slhub  # noqa: E402
from slhub import checkpoint, hookimpl  # noqa: E402


class Probe:
    """Times both contestants from inside the run, at its last update."""

    def __init__(self, steps: int, repeats: int, bare_dir: Path) -> None:
        self.steps, self.repeats, self.bare_dir = steps, repeats, bare_dir
        self.times: dict[str, list[float]] = {"slhub": [], "bare": [], "bare, one write": []}
        self.size = 0

    @hookimpl
    def on_log(self, trainer, step, metrics) -> None:
        if step != self.steps or "train/loss" not in metrics:
            return
        # warm-up; its file is also the object the bare path writes (as it was gathered)
        written = trainer.save()
        ckpt = checkpoint.load(written).to_dict()
        metrics_fd = os.open(trainer.output_dir / "metrics.jsonl", os.O_RDONLY)

        def bare() -> None:
            buffer = io.BytesIO()
            torch.save(ckpt, buffer)
            data = buffer.getvalue()
            self.size = len(data)
            durable_write(data, self.bare_dir / checkpoint.step_file(step))
            durable_write(data, self.bare_dir / checkpoint.LAST)
            os.fsync(metrics_fd)

        def bare_once() -> None:
            buffer = io.BytesIO()
            torch.save(ckpt, buffer)
            data = buffer.getvalue()
            durable_write(
                data, self.bare_dir / checkpoint.LAST, self.bare_dir / checkpoint.step_file(step)
            )
            os.fsync(metrics_fd)

        def framework() -> None:  # the boundary's gather and write, through the public API
            trainer.save()

        contestants = [("slhub", framework), ("bare", bare), ("bare, one write", bare_once)]
        for i in range(self.repeats):  # every order in turn: each runs first, second, third
            for name, fn in contestants[i % 3 :] + contestants[: i % 3]:
                started = time.perf_counter()
                fn()
                self.times[name].append(time.perf_counter() - started)
        os.close(metrics_fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=32, help="MLP hidden width (32)")
    parser.add_argument("--repeats", type=int, default=30, help="timings per contestant (30)")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary dir)")
    args = parser.parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="slhub-ckpt-bench-"))
    (base / "bare").mkdir(parents=True, exist_ok=True)
    steps = 5
    probe = Probe(steps, args.repeats, base / "bare")
    slhub.train(
        ROOT / "examples" / "sl_ddp" / "cpu.yaml",
        [
            f"trainer.output_dir={base / 'slhub'}",
            f"trainer.steps={steps}",
            "trainer.validate_every=0",
            "trainer.save_every=0",
            f"model.hidden={args.hidden}",
        ],
        log_format="json",
        plugins=[probe],
    )
    med = {name: statistics.median(ts) * 1e3 for name, ts in probe.times.items()}
    print(
        f"checkpoint {probe.size} bytes (hidden {args.hidden}), {args.repeats} alternating "
        f"timings each, {base}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )
    print("| median | boundary (ms) |")
    print("|---|---:|")
    for name, value in med.items():
        print(f"| {name} | {value:.2f} |")
    for name in ("bare", "bare, one write"):
        pairs = [a / b for a, b in zip(probe.times["slhub"], probe.times[name], strict=True)]
        print(
            f"slhub / {name}: {med['slhub'] / med[name]:.3f} "
            f"(median of per-round ratios {statistics.median(pairs):.3f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
