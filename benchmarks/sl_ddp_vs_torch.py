"""slhub against a hand-written torch DDP loop on the sl_ddp workload (2 Gloo workers).

    OMP_NUM_THREADS=1 python benchmarks/sl_ddp_vs_torch.py            # 2000 updates, 3 repetitions
    OMP_NUM_THREADS=1 python benchmarks/sl_ddp_vs_torch.py --updates 200 --repeats 1   # smoke

Both contestants run the same work: the ``examples/sl_ddp`` corpus and masked,
weighted MSE (``make_corpus`` / ``masked_mse``), batch 32 per worker drawn with
replacement from a per-rank generator, Adam lr 1e-3, DDP's gradient all-reduce
plus one all-reduce per update of what the weighting and the metrics line need
(the hand loop: weight sum and weighted loss sum), backward of
``loss * w * world / W``, a metrics line per update on rank 0, rank-0
validation every 50 updates and an atomic, fsynced checkpoint (model,
optimizer, every rank's RNG states gathered to rank 0; written to step_N.pt
and last.pt) every 100. The hand loop uses slhub's seeds, so both produce the
same metrics and bitwise-equal final weights; the driver checks that after
every repetition. What the hand loop leaves out is what slhub adds on top:
failure flags in the agreement, the state gather at validation-only
boundaries, RNG preservation around validation, plugin dispatch, logging.

Each repetition launches ``torchrun`` once per contestant, alternating the
order (slhub, hand, hand, slhub, ...) so drift falls on both. Measured per
launch:

- ``wall``: the whole ``torchrun`` process tree, launch to exit (perf_counter).
- ``CPU``: user + system CPU seconds of that tree (getrusage of the children):
  less sensitive than wall time to other load on the machine.
- ``loop``: from the end of update 1 to the end of the last update, taken from
  the ``update`` events rank 0 prints as JSON lines on stderr (slhub's own
  ``--log-format json`` events, timestamped by structlog, no product change;
  the hand loop prints the same events at the same point, after the metrics
  line is appended). It covers updates 2..N with every validation and
  checkpoint boundary before update N; ``update`` is ``loop / (N - 1)``.
- ``startup``: launch to the end of update 1 (interpreter, imports, process
  group, admission, model build, first update); ``teardown`` is the rest.

The table shows medians over repetitions and their slhub/hand ratio; the
ratio of each repetition's adjacent pair and the median of those follow.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "sl_ddp" / "cpu.yaml"
DEFAULT_WORKERS = 2
SEED = 0
BATCH = 32
LR = 1e-3
VALIDATE_EVERY = 50
SAVE_EVERY = 100

# This checkout's slhub and examples, even where another checkout is installed.
sys.path.insert(0, str(ROOT))


# ---------------------------------------------------------------- hand loop


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _atomic_write(data: bytes, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def hand_worker(updates: int, output_dir: Path, sampler_seeds: list[int]) -> None:
    """One rank of the hand-written loop (run under torchrun)."""
    import io

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from examples.sl_ddp.plugin import make_corpus, masked_mse

    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()

    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)  # identical initial weights on every rank
    x_train, y_train, m_train = make_corpus(4096, 1234)
    x_val, y_val, m_val = make_corpus(1024, 4321)
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(sampler_seeds[rank])
    ddp = DDP(model, broadcast_buffers=False)

    metrics = None
    if rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        metrics = open(output_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
    log_every = max(1, updates // 10)

    for step in range(1, updates + 1):
        index = torch.randint(0, x_train.shape[0], (BATCH,), generator=generator)
        x, y, mask = x_train[index], y_train[index], m_train[index]
        loss, count = masked_mse(ddp(x), y, mask)
        weight = float(count)
        loss_value = float(loss.detach())
        sums = torch.tensor([weight, weight * loss_value], dtype=torch.float64)
        dist.all_reduce(sums)
        total_weight, weighted_loss = sums.tolist()
        optimizer.zero_grad(set_to_none=True)
        (loss * (weight * world / total_weight)).backward()
        optimizer.step()
        if rank == 0:
            record = {
                "step": step,
                "train/loss": weighted_loss / total_weight,
                "train/weight": total_weight,
                "train/supervised": weight,
            }
            metrics.write(json.dumps(record, sort_keys=True) + "\n")
            metrics.flush()
            if step == 1 or step % log_every == 0:
                event = {"event": "update", "step": step, "timestamp": _now()}
                print(json.dumps(event), file=sys.stderr, flush=True)
            if step % VALIDATE_EVERY == 0:
                model.eval()
                with torch.no_grad():
                    val_loss, _ = masked_mse(model(x_val), y_val, m_val)
                model.train()
                record = {"step": step, "validation/mse": float(val_loss)}
                metrics.write(json.dumps(record, sort_keys=True) + "\n")
                metrics.flush()
        if step % SAVE_EVERY == 0 or step == updates:
            kind, keys, pos, has_gauss, cached = np.random.get_state()
            state = {
                "python": random.getstate(),
                "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
                "torch": torch.get_rng_state(),
                "sampler": generator.get_state(),
            }
            ranks = [None] * world if rank == 0 else None
            dist.gather_object(state, ranks, dst=0)
            if rank == 0:
                ckpt = {
                    "step": step,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "ranks": ranks,
                }
                buffer = io.BytesIO()
                torch.save(ckpt, buffer)
                data = buffer.getvalue()
                _atomic_write(data, output_dir / f"step_{step}.pt")
                _atomic_write(data, output_dir / "last.pt")
                os.fsync(metrics.fileno())

    if metrics is not None:
        metrics.close()
    del ddp  # no DDP wrapper may outlive the process group
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------- driver


def _torchrun(workers: int, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={workers}",
        *args,
    ]


def slhub_command(updates: int, output_dir: Path, workers: int) -> list[str]:
    return _torchrun(
        workers,
        "-m",
        "slhub",
        "train",
        "--config",
        str(RECIPE),
        "--set",
        f"trainer.output_dir={output_dir}",
        "--set",
        f"trainer.steps={updates}",
        "--set",
        f"trainer.batch_size={BATCH}",
        "--set",
        f"trainer.lr={LR}",
        "--set",
        f"trainer.seed={SEED}",
        "--set",
        f"trainer.validate_every={VALIDATE_EVERY}",
        "--set",
        f"trainer.save_every={SAVE_EVERY}",
        "--log-format",
        "json",
    )


def hand_command(updates: int, output_dir: Path, workers: int) -> list[str]:
    from slhub.trainer import sampler_seed

    seeds = ",".join(str(sampler_seed(SEED, r)) for r in range(workers))
    return _torchrun(
        workers,
        str(Path(__file__).resolve()),
        "--worker",
        "--updates",
        str(updates),
        "--output-dir",
        str(output_dir),
        "--sampler-seeds",
        seeds,
    )


def _update_times(stderr: str) -> dict[int, float]:
    """Step -> POSIX time of rank 0's ``update`` events (JSON lines on stderr)."""
    times: dict[int, float] = {}
    for line in stderr.splitlines():
        if '"update"' not in line or not line.lstrip().startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "update" and event.get("rank", 0) == 0:
            stamp = dt.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
            times[int(event["step"])] = stamp.timestamp()
    return times


def launch(name: str, command: list[str], updates: int) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started_wall = time.time()
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{name} run failed with exit code {proc.returncode}")
    times = _update_times(proc.stderr)
    if 1 not in times or updates not in times:
        raise SystemExit(f"{name}: no update events for updates 1 and {updates} on stderr")
    loop = times[updates] - times[1]
    startup = times[1] - started_wall
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "startup_s": startup,
        "loop_s": loop,
        "teardown_s": wall - startup - loop,
        "per_update_ms": 1000.0 * loop / max(1, updates - 1),
    }


def same_work(slhub_dir: Path, hand_dir: Path) -> str:
    """Compare metrics and final weights of the two runs: the work must be the same."""
    import torch

    def lines(folder: Path) -> list[dict]:
        text = (folder / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in text if line.strip()]

    a, b = lines(slhub_dir), lines(hand_dir)
    if len(a) != len(b):
        return f"DIFFERENT: {len(a)} vs {len(b)} metrics lines"
    worst = 0.0
    for ra, rb in zip(a, b, strict=True):
        if set(ra) != set(rb) or ra["step"] != rb["step"]:
            return f"DIFFERENT: metrics line for step {ra.get('step')} has other keys"
        for key in ra:
            worst = max(worst, abs(float(ra[key]) - float(rb[key])))
    ma = torch.load(slhub_dir / "last.pt", weights_only=True)["model"]
    mb = torch.load(hand_dir / "last.pt", weights_only=True)["model"]
    exact = all(torch.equal(ma[k], mb[k]) for k in ma) and set(ma) == set(mb)
    if not exact:
        return f"DIFFERENT final weights (max metrics difference {worst:g})"
    return f"same metrics (max difference {worst:g}) and bitwise-equal final weights"


COLUMNS = (
    ("wall_s", "wall (s)", 2),
    ("cpu_s", "CPU (s)", 2),
    ("startup_s", "startup (s)", 2),
    ("loop_s", "loop (s)", 2),
    ("per_update_ms", "update (ms)", 3),
    ("teardown_s", "teardown (s)", 2),
)


def _table(results: dict[str, list[dict[str, float]]]) -> list[str]:
    """Medians over repetitions as a Markdown table, with the slhub/hand ratio row."""
    med = {
        name: {key: statistics.median(r[key] for r in runs) for key, _, _ in COLUMNS}
        for name, runs in results.items()
    }
    lines = [
        "| median | " + " | ".join(title for _, title, _ in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for name in ("slhub", "hand"):
        cells = " | ".join(f"{med[name][key]:.{digits}f}" for key, _, digits in COLUMNS)
        lines.append(f"| {name} | {cells} |")
    ratios = " | ".join(f"{med['slhub'][key] / med['hand'][key]:.3f}" for key, _, _ in COLUMNS)
    lines.append(f"| slhub/hand | {ratios} |")
    return lines


def source_digest() -> str:
    """Where the measured slhub comes from, and a digest of its sources (the tree may be dirty)."""
    import hashlib

    import slhub

    package = Path(slhub.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return f"{package} (sources sha256 {digest.hexdigest()[:12]})"


def run_benchmark(updates: int, repeats: int, workers: int, warmup: bool, keep: Path | None) -> int:
    if updates < 2:
        raise SystemExit("--updates must be at least 2")
    log_every = max(1, updates // 10)
    if updates % log_every:
        raise SystemExit(f"--updates {updates}: slhub logs update N only when N % (N // 10) == 0")
    base = keep or Path(tempfile.mkdtemp(prefix="slhub-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    commands = {"slhub": slhub_command, "hand": hand_command}
    print(
        f"sl_ddp: {workers} Gloo worker(s), {updates} updates, batch {BATCH}/worker, "
        f"Adam lr {LR}, validation every {VALIDATE_EVERY}, checkpoint every {SAVE_EVERY}; "
        f"{repeats} repetition(s); OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}; "
        f"{os.cpu_count()} CPUs; python {sys.version.split()[0]}",
        flush=True,
    )
    print(f"slhub {source_digest()}", flush=True)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    if warmup:
        for name, make in commands.items():
            launch(name, make(20, base / f"warmup-{name}", workers), 20)
    results: dict[str, list[dict[str, float]]] = {"slhub": [], "hand": []}
    for rep in range(repeats):
        order = ("slhub", "hand") if rep % 2 == 0 else ("hand", "slhub")
        for name in order:
            out = base / f"{name}-{rep}"
            result = launch(name, commands[name](updates, out, workers), updates)
            results[name].append(result)
            print(
                f"rep {rep} {name:<5} wall {result['wall_s']:6.2f} s  "
                f"cpu {result['cpu_s']:6.2f} s  startup {result['startup_s']:6.2f} s  "
                f"loop {result['loop_s']:7.2f} s  "
                f"per-update {result['per_update_ms']:7.3f} ms",
                flush=True,
            )
        print(f"rep {rep} check: {same_work(base / f'slhub-{rep}', base / f'hand-{rep}')}")

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    print()
    print("\n".join(_table(results)))
    wall_ratio = median("slhub", "wall_s") / median("hand", "wall_s")
    update_ratio = median("slhub", "per_update_ms") / median("hand", "per_update_ms")
    print()
    print(f"whole-process ratio slhub/hand (median): {wall_ratio:.3f}")
    print(f"per-update ratio    slhub/hand (median): {update_ratio:.3f}")
    for key, label in (("wall_s", "whole-process"), ("per_update_ms", "per-update")):
        pairs = [s[key] / h[key] for s, h in zip(results["slhub"], results["hand"], strict=True)]
        shown = " ".join(f"{r:.3f}" for r in pairs)
        print(f"{label} ratio per repetition: {shown} (median {statistics.median(pairs):.3f})")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if keep is None:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"run folders in {base}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=2000, help="updates per run (2000)")
    parser.add_argument("--repeats", type=int, default=3, help="launches per contestant (3)")
    parser.add_argument(
        "--workers", type=int, default=DEFAULT_WORKERS, help="Gloo workers per launch (2)"
    )
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    parser.add_argument("--keep", type=Path, help="write run folders here (default: a temp dir)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--sampler-seeds", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        seeds = [int(s) for s in args.sampler_seeds.split(",")]
        hand_worker(args.updates, args.output_dir, seeds)
        return 0
    return run_benchmark(args.updates, args.repeats, args.workers, not args.no_warmup, args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
