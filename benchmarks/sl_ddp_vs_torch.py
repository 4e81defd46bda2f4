"""slhub against a hand-written torch loop and PyTorch Lightning on the sl_ddp workload.

    OMP_NUM_THREADS=1 python benchmarks/sl_ddp_vs_torch.py    # 1 and 2 workers, 2000 updates
    OMP_NUM_THREADS=1 python benchmarks/sl_ddp_vs_torch.py --updates 200 --repeats 1   # smoke

Three contestants run the same work: the ``examples/sl_ddp`` corpus and masked,
weighted MSE (``make_corpus`` / ``masked_mse``), batch 32 per worker drawn with
replacement from a per-rank generator, Adam lr 1e-3, one all-reduce per update
of what the weighting and the metrics line need (weight sum and weighted loss
sum; none on one process) besides DDP's, backward of ``loss * w * world / W``,
a metrics line per update on rank 0, validation every 50 updates and every 100
a checkpoint written durably to step_N and last (the bytes written and fsynced
once, the second name a link, as slhub does).
The hand loop uses slhub's seeds, so it and slhub produce the same metrics and
bitwise-equal final weights; the driver checks that after every repetition,
and checks Lightning's metrics and final weights against the hand loop too.

- **hand**: a plain torch loop (``benchmarks/hand_loop.py``; DDP under torchrun with
  2+ workers), rank 0 validates, every rank's RNG states gathered to rank 0 into the
  checkpoint.
- **slhub**: ``python -m slhub train --config examples/sl_ddp/cpu.yaml`` (under
  torchrun with 2+ workers), JSON logs; everything its step protocol adds
  (failure agreement, per-rank state at every boundary, RNG preservation around
  validation, plugin dispatch, the progress plugin, logging) is measured.
- **lightning** (optional: ``pip install -e ".[bench]"``): a ``LightningModule``
  with the same model and step, an iterable data set sampling with the same
  generator, Lightning's own validation loop (``val_check_interval=50``) and
  ``ModelCheckpoint(every_n_train_steps=100, save_last="link")`` (one write,
  ``last`` a link) through a ``CheckpointIO`` that writes durably; no logger, progress bar or model
  summary. Its checkpoints hold what Lightning saves (no per-rank RNG states).

Each repetition launches every contestant once per worker count, rotating the
order so drift falls on all. One worker is a plain ``python`` process (no
process group); 2+ workers are ``torchrun`` with Gloo. Measured per launch:

- ``wall``: the whole process tree, launch to exit (perf_counter).
- ``CPU``: user + system CPU seconds of that tree (getrusage of the children):
  less sensitive than wall time to other load on the machine.
- ``loop``: from the end of update 1 to the end of the last update, taken from
  events rank 0 prints as JSON lines on stderr right after the metrics line
  (slhub: its own ``progress`` events, which it emits at the first and last
  update; hand and Lightning print an ``update`` event at the same point). It
  covers updates 2..N with every validation and checkpoint boundary before
  update N; ``update`` is ``loop / (N - 1)``.
- ``startup``: launch to the end of update 1 (interpreter, imports, process
  group, admission, model build, first update); ``teardown`` is the rest.

The table shows medians over repetitions and each contestant's ratio to the
hand loop; the ratio of each repetition's slhub/hand pair and the median of
those follow.
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

from durable import durable_write  # noqa: E402 - benchmarks/durable.py

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "sl_ddp" / "cpu.yaml"
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


def hand_worker(updates: int, output_dir: Path, sampler_seeds: list[int]) -> None:
    """One rank of the hand-written loop (benchmarks/hand_loop.py; DDP under torchrun)."""
    import torch.distributed as dist
    from hand_loop import hand_loop

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo", timeout=dt.timedelta(seconds=600))
    log_every = max(1, updates // 10)

    def after_metrics(step: int) -> None:
        if step == 1 or step % log_every == 0:
            event = {"event": "update", "step": step, "timestamp": _now()}
            print(json.dumps(event), file=sys.stderr, flush=True)

    rank = dist.get_rank() if distributed else 0
    steps = hand_loop(
        output_dir, updates, sampler_seeds[rank], validate_every=VALIDATE_EVERY,
        save_every=SAVE_EVERY, after_metrics=after_metrics,
    )  # fmt: skip
    for _ in steps:
        pass
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


def lightning_worker(updates: int, output_dir: Path, sampler_seeds: list[int]) -> None:
    """One rank of the Lightning contestant (a plain process, or one rank under torchrun)."""
    import io

    import lightning as L
    import numpy as np
    import torch
    import torch.distributed as dist
    from lightning.pytorch.plugins.io import TorchCheckpointIO
    from torch import nn

    from examples.sl_ddp.plugin import make_corpus, masked_mse

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)  # identical initial weights on every rank, as in the hand loop
    x_train, y_train, m_train = make_corpus(4096, 1234)
    x_val, y_val, m_val = make_corpus(1024, 4321)
    log_every = max(1, updates // 10)

    class Batches(torch.utils.data.IterableDataset):
        def __iter__(self):
            generator = torch.Generator().manual_seed(sampler_seeds[rank])
            while True:
                index = torch.randint(0, x_train.shape[0], (BATCH,), generator=generator)
                yield x_train[index], y_train[index], m_train[index]

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
            self.record: dict = {}

        def training_step(self, batch, batch_idx):
            x, y, mask = batch
            loss, count = masked_mse(self.model(x), y, mask)
            weight = float(count)
            loss_value = float(loss.detach())
            if world > 1:
                sums = torch.tensor([weight, weight * loss_value], dtype=torch.float64)
                dist.all_reduce(sums)
                total_weight, weighted_loss = sums.tolist()
            else:
                total_weight, weighted_loss = weight, weight * loss_value
            self.record = {
                "step": batch_idx + 1,
                "train/loss": weighted_loss / total_weight,
                "train/weight": total_weight,
                "train/supervised": weight,
                "train/lr": self.optimizers().param_groups[0]["lr"],
            }
            return loss * (weight * world / total_weight)

        def validation_step(self, batch, batch_idx):
            x, y, mask = batch
            val_loss, _ = masked_mse(self.model(x), y, mask)
            if rank == 0:
                record = {"step": self.global_step, "validation/mse": float(val_loss)}
                metrics.write(json.dumps(record, sort_keys=True) + "\n")
                metrics.flush()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=LR)

    class MetricsLine(L.Callback):
        """The metrics line and the timing event, before ModelCheckpoint (Lightning runs
        checkpoint callbacks last)."""

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if rank != 0:
                return
            metrics.write(json.dumps(module.record, sort_keys=True) + "\n")
            metrics.flush()
            step = batch_idx + 1
            if step == 1 or step % log_every == 0:
                event = {"event": "update", "step": step, "timestamp": _now()}
                print(json.dumps(event), file=sys.stderr, flush=True)

    class DurableIO(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            durable_write(buffer.getvalue(), Path(path))
            if metrics is not None:
                os.fsync(metrics.fileno())

    metrics = None
    if rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        metrics = open(output_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=output_dir,
        filename="step_{step}",
        every_n_train_steps=SAVE_EVERY,
        save_top_k=-1,
        save_last="link",
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        max_steps=updates,
        max_epochs=-1,
        val_check_interval=VALIDATE_EVERY,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[MetricsLine(), checkpoints],
        plugins=[DurableIO()],
    )
    val = torch.utils.data.DataLoader([(x_val, y_val, m_val)], batch_size=None)
    train = torch.utils.data.DataLoader(Batches(), batch_size=None)
    trainer.fit(Module(), train_dataloaders=train, val_dataloaders=val)
    if metrics is not None:
        metrics.close()


# ------------------------------------------------------------------- driver


def _launcher(workers: int) -> list[str]:
    """A plain interpreter for one worker (no process group); torchrun for more."""
    if workers == 1:
        return [sys.executable]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={workers}",
    ]


def slhub_command(updates: int, output_dir: Path, workers: int) -> list[str]:
    sets = {
        "output_dir": output_dir,
        "steps": updates,
        "batch_size": BATCH,
        "lr": LR,
        "seed": SEED,
        "validate_every": VALIDATE_EVERY,
        "save_every": SAVE_EVERY,
    }
    overrides = [arg for k, v in sets.items() for arg in ("--set", f"trainer.{k}={v}")]
    return [
        *_launcher(workers),
        "-m",
        "slhub",
        "train",
        "--config",
        str(RECIPE),
        *overrides,
        "--log-format",
        "json",
    ]


def _worker_command(role: str, updates: int, output_dir: Path, workers: int) -> list[str]:
    from slhub.trainer import sampler_seed

    seeds = ",".join(str(sampler_seed(SEED, r)) for r in range(workers))
    return [
        *_launcher(workers),
        str(Path(__file__).resolve()),
        "--worker",
        role,
        "--updates",
        str(updates),
        "--output-dir",
        str(output_dir),
        "--sampler-seeds",
        seeds,
    ]


def hand_command(updates: int, output_dir: Path, workers: int) -> list[str]:
    return _worker_command("hand", updates, output_dir, workers)


def lightning_command(updates: int, output_dir: Path, workers: int) -> list[str]:
    return _worker_command("lightning", updates, output_dir, workers)


def _update_times(stderr: str) -> dict[int, float]:
    """Step -> POSIX time of rank 0's ``update`` (hand, Lightning) or ``progress`` (slhub)
    events, JSON lines on stderr."""
    times: dict[int, float] = {}
    for line in stderr.splitlines():
        if not line.lstrip().startswith("{") or not ('"update"' in line or '"progress"' in line):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") in ("update", "progress") and event.get("rank", 0) == 0:
            stamp = dt.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
            times.setdefault(int(event["step"]), stamp.timestamp())
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
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{name}: no events for updates 1 and {updates} on stderr")
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


def _final_weights(folder: Path) -> dict:
    import torch

    from slhub import checkpoint

    last = checkpoint.files.last_path(folder)
    if last.exists():
        return checkpoint.load(last).model
    state = torch.load(folder / "last.ckpt", weights_only=False)["state_dict"]  # Lightning
    return {k.removeprefix("model."): v for k, v in state.items()}


def same_work(dir_a: Path, dir_b: Path) -> str:
    """Compare metrics and final weights of two runs: the work must be the same."""
    import torch

    def lines(folder: Path) -> list[dict]:
        text = (folder / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in text if line.strip()]

    a, b = lines(dir_a), lines(dir_b)
    if len(a) != len(b):
        return f"DIFFERENT: {len(a)} vs {len(b)} metrics lines"
    worst = 0.0
    for ra, rb in zip(a, b, strict=True):
        if set(ra) != set(rb) or ra["step"] != rb["step"]:
            return f"DIFFERENT: metrics line for step {ra.get('step')} has other keys"
        for key in ra:
            worst = max(worst, abs(float(ra[key]) - float(rb[key])))
    ma, mb = _final_weights(dir_a), _final_weights(dir_b)
    exact = set(ma) == set(mb) and all(torch.equal(ma[k], mb[k]) for k in ma)
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


def _table(workers: int, results: dict[str, list[dict[str, float]]]) -> list[str]:
    """Medians over repetitions as a Markdown table, each contestant's ratio to hand."""
    med = {
        name: {key: statistics.median(r[key] for r in runs) for key, _, _ in COLUMNS}
        for name, runs in results.items()
    }
    where = "1 process" if workers == 1 else f"{workers} Gloo workers"
    lines = [
        f"| {where}, median | " + " | ".join(title for _, title, _ in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for name in results:
        cells = " | ".join(f"{med[name][key]:.{digits}f}" for key, _, digits in COLUMNS)
        lines.append(f"| {name} | {cells} |")
    for name in results:
        if name != "hand":
            ratios = " | ".join(f"{med[name][key] / med['hand'][key]:.3f}" for key, _, _ in COLUMNS)
            lines.append(f"| {name}/hand | {ratios} |")
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


def _lightning_available() -> str | None:
    try:
        import lightning
    except ImportError:
        return None
    return lightning.__version__


def run_benchmark(
    updates: int,
    repeats: int,
    worker_counts: list[int],
    warmup: bool,
    keep: Path | None,
    with_lightning: bool,
) -> int:
    if updates < 2:
        raise SystemExit("--updates must be at least 2")
    log_every = max(1, updates // 10)
    if updates % log_every:
        raise SystemExit(f"--updates {updates}: must be a multiple of {log_every} (N // 10)")
    base = keep or Path(tempfile.mkdtemp(prefix="slhub-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    commands = {"hand": hand_command, "slhub": slhub_command}
    lightning = _lightning_available() if with_lightning else None
    if lightning is not None:
        commands["lightning"] = lightning_command
    import torch

    print(
        f"sl_ddp: {updates} updates, batch {BATCH}/worker, Adam lr {LR}, validation every "
        f"{VALIDATE_EVERY}, checkpoint every {SAVE_EVERY}; workers {worker_counts}; "
        f"{repeats} repetition(s); OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}; "
        f"{os.cpu_count()} CPUs; python {sys.version.split()[0]}; torch {torch.__version__}; "
        f"lightning {lightning or 'not measured'}",
        flush=True,
    )
    print(f"slhub {source_digest()}", flush=True)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    if warmup:
        for workers in worker_counts:
            for name, make in commands.items():
                launch(name, make(20, base / f"warmup-{name}-{workers}", workers), 20)
    names = list(commands)
    results = {w: {name: [] for name in names} for w in worker_counts}
    for rep in range(repeats):
        for workers in worker_counts:
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:  # rotate the order every repetition
                out = base / f"{name}-{workers}-{rep}"
                result = launch(name, commands[name](updates, out, workers), updates)
                results[workers][name].append(result)
                print(
                    f"rep {rep} workers {workers} {name:<9} wall {result['wall_s']:6.2f} s  "
                    f"cpu {result['cpu_s']:6.2f} s  startup {result['startup_s']:6.2f} s  "
                    f"loop {result['loop_s']:7.2f} s  "
                    f"per-update {result['per_update_ms']:7.3f} ms",
                    flush=True,
                )
            hand_dir = base / f"hand-{workers}-{rep}"
            for name in names[1:]:
                check = same_work(base / f"{name}-{workers}-{rep}", hand_dir)
                print(f"rep {rep} workers {workers} check {name} vs hand: {check}", flush=True)

    for workers in worker_counts:
        res = results[workers]
        print()
        print("\n".join(_table(workers, res)))
        for key, label in (("wall_s", "whole-process"), ("per_update_ms", "per-update")):
            for name in names[1:]:
                pairs = [a[key] / h[key] for a, h in zip(res[name], res["hand"], strict=True)]
                shown = " ".join(f"{r:.3f}" for r in pairs)
                print(
                    f"{label} {name}/hand per repetition: {shown} "
                    f"(median {statistics.median(pairs):.3f})"
                )
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
        "--workers", default="1,2", help="comma-separated worker counts (1,2); 1 = no torchrun"
    )
    parser.add_argument("--no-lightning", action="store_true", help="leave Lightning out")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    parser.add_argument("--keep", type=Path, help="write run folders here (default: a temp dir)")
    parser.add_argument("--worker", choices=("hand", "lightning"), help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--sampler-seeds", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        seeds = [int(s) for s in args.sampler_seeds.split(",")]
        worker = hand_worker if args.worker == "hand" else lightning_worker
        worker(args.updates, args.output_dir, seeds)
        return 0
    counts = [int(w) for w in args.workers.split(",")]
    return run_benchmark(
        args.updates, args.repeats, counts, not args.no_warmup, args.keep, not args.no_lightning
    )


if __name__ == "__main__":
    raise SystemExit(main())
