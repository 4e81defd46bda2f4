"""Per-rank memory of NeRD training on a large cart-pole data set, for 1 and 2 workers.

    OMP_NUM_THREADS=1 python benchmarks/nerd_memory.py            # 27000 x 200 steps: 217 MB

The training split (``states`` float64 ``[N, T+1, 4]`` and ``actions``
``[N, T, 1]``) is made once, up front, in ``--cache``; then
``examples/nerd/cartpole/sl.train.yaml`` trains ``--steps`` updates with one
process and with 2 Gloo workers (torchrun). Each rank reads
``/proc/self/smaps_rollup`` and ``/proc/self/status`` at the end of its run
(``on_fit_end``) and the driver prints, per rank:

- ``RSS``: resident pages, shared ones counted in full by every rank;
- ``PSS``: resident pages with each shared page divided by the processes mapping it;
- ``USS``: private pages only (``Private_Clean + Private_Dirty``): what the rank
  holds that no other process shares;
- ``anon``: anonymous memory (heap, tensors, numpy arrays): the rank's own copies;
- ``data RSS``: resident pages of the memory-mapped ``.npy`` files of the split;
- ``peak``: the highest RSS of the process (``VmHWM``).

Memory-mapped data are one copy in the page cache for the whole node: ``data
RSS`` is the same for every rank and PSS divides it between the ranks. USS counts
a file page as private while only one process maps it, so with one worker it
includes the data and with two it does not; ``anon`` is the figure that would
grow with a per-rank copy of the data.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slhub import hookimpl  # noqa: E402

RECIPE = ROOT / "examples" / "nerd" / "cartpole" / "sl.train.yaml"


def _kib(text: str, key: str) -> int:
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def memory_now(data_dir: str | None = None) -> dict[str, float]:
    """This process's memory in MiB from /proc (Linux)."""
    rollup = Path("/proc/self/smaps_rollup").read_text()
    status = Path("/proc/self/status").read_text()
    data_rss = 0
    if data_dir is not None:
        current = None
        for line in Path("/proc/self/smaps").read_text().splitlines():
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                current = fields[5] if len(fields) > 5 else ""
            elif fields and fields[0] == "Rss:" and current and current.startswith(data_dir):
                data_rss += int(fields[1])
    return {
        "rss": _kib(rollup, "Rss") / 1024,
        "pss": _kib(rollup, "Pss") / 1024,
        "uss": (_kib(rollup, "Private_Clean") + _kib(rollup, "Private_Dirty")) / 1024,
        "anon": _kib(rollup, "Anonymous") / 1024,
        "data_rss": data_rss / 1024,
        "peak": _kib(status, "VmHWM") / 1024,
    }


class MemoryProbe:
    """An extra plugin: each rank writes its memory at the end of the run."""

    @hookimpl
    def on_fit_end(self, trainer, status):
        data_dir = str(Path(trainer.section("data").cache_dir).resolve())
        record = {"rank": trainer.rank, "world_size": trainer.world_size, "status": status}
        record.update(memory_now(data_dir))
        out = Path(trainer.config.output_dir) / f"memory-rank{trainer.rank}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record))


def _make_data(cache: Path, trajectories: int, length: int) -> float:
    from slhub.sim.cartpole import ensure_dataset

    data = ensure_dataset(cache, "train", trajectories, length, 0, 10.0)
    ensure_dataset(cache, "val", 64, 120, 1, 10.0)
    return (data.states.nbytes + data.actions.nbytes) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=27000)
    parser.add_argument("--length", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20, help="updates per run (20)")
    parser.add_argument("--workers", default="1,2", help="worker counts (1,2)")
    parser.add_argument("--cache", type=Path, help="data cache (default: a temporary dir)")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="slhub-nerd-mem-"))
    cache = (args.cache or base / "cache").resolve()
    size = _make_data(cache, args.trajectories, args.length)
    print(f"training split: {args.trajectories} x {args.length} steps, {size:.0f} MiB in {cache}")
    sets = {
        "trainer.steps": args.steps,
        "trainer.validate_every": 0,
        "trainer.save_every": 0,
        "trainer.device": "cpu",
        "data.cache_dir": cache,
        "data.generated_train": json.dumps(
            {"num_trajectories": args.trajectories, "length": args.length, "seed": 0}
        ),
        "plugins": '["benchmarks.nerd_memory:MemoryProbe"]',
    }
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    print(
        "| workers | rank | RSS (MiB) | PSS (MiB) | USS (MiB) | anon (MiB) | data RSS (MiB) "
        "| peak RSS (MiB) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for workers in [int(w) for w in args.workers.split(",")]:
        out = base / f"run-{workers}"
        launcher = [sys.executable]
        if workers > 1:
            launcher += ["-m", "torch.distributed.run", "--standalone", "--nnodes=1"]
            launcher += [f"--nproc-per-node={workers}"]
        overrides = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
        command = [*launcher, "-m", "slhub", "train", "--config", str(RECIPE), *overrides]
        command += ["--set", f"trainer.output_dir={out}", "--log-format", "json"]
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"{workers} worker(s): exit status {proc.returncode}")
        for rank in range(workers):
            m = json.loads((out / f"memory-rank{rank}.json").read_text())
            print(
                f"| {workers} | {rank} | {m['rss']:.0f} | {m['pss']:.0f} | {m['uss']:.0f} "
                f"| {m['anon']:.0f} "
                f"| {m['data_rss']:.0f} | {m['peak']:.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
