"""The hand-written sl_ddp loop every benchmark compares slhub with, written once.

What a careful user would write without a framework for the ``examples/sl_ddp``
work, with slhub's seeds so that both produce the same metrics and bitwise-equal
weights: the corpus on the device, batch indices from a per-rank CPU generator,
masked weighted MSE, Adam, one all-reduce of ``[w, w*L]`` per update besides
DDP's under a process group, backward of ``loss * w * world / W``, a metrics
line per update on rank 0, rank-0 validation and, at every checkpoint, every
rank's RNG states gathered to rank 0 and written durably once, as ``last.pt``
and (a hard link) ``step_N.pt``, as slhub writes them.
"""

from __future__ import annotations

import io
import json
import os
import random
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from durable import durable_write  # benchmarks/durable.py
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from examples.sl_ddp.plugin import make_corpus, masked_mse

SEED, LR = 0, 1e-3


def hand_loop(
    out: Path,
    updates: int,
    sampler_seed: int,
    *,
    device: torch.device | None = None,
    hidden: int = 32,
    batch: int = 32,
    validate_every: int = 50,
    save_every: int = 100,
    after_metrics: Callable[[int], None] | None = None,
) -> Iterator[int]:
    """One update per ``next()``, yielding its step once its validation and checkpoint
    are done; ``after_metrics(step)`` runs on rank 0 right after each metrics line.

    Inside an initialized process group it is one rank of a DDP run; ``sampler_seed``
    is this rank's. ``validate_every`` or ``save_every`` 0 turns that boundary off (the
    last update always writes a checkpoint). The metrics file is closed after the last
    update; drive the generator to its end.
    """
    device = device or torch.device("cpu")
    distributed = dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)  # identical initial weights on every rank
    x_train, y_train, m_train = (t.to(device) for t in make_corpus(4096, 1234))
    x_val, y_val, m_val = (t.to(device) for t in make_corpus(1024, 4321))
    model = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 2)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(sampler_seed)
    with warnings.catch_warnings():  # torch 2.13 deprecates broadcast_buffers (as in slhub)
        warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated")
        ddp: nn.Module = (
            DistributedDataParallel(model, broadcast_buffers=False) if distributed else model
        )
    metrics = None
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        metrics = open(out / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
    for step in range(1, updates + 1):
        index = torch.randint(0, x_train.shape[0], (batch,), generator=generator)
        x, y, mask = x_train[index], y_train[index], m_train[index]
        loss, count = masked_mse(ddp(x), y, mask)
        weight = float(count)
        loss_value = float(loss.detach())
        if distributed:
            sums = torch.tensor([weight, weight * loss_value], dtype=torch.float64)
            dist.all_reduce(sums)
            total_weight, weighted_loss = sums.tolist()
        else:
            total_weight, weighted_loss = weight, weight * loss_value
        optimizer.zero_grad(set_to_none=True)
        lr = optimizer.param_groups[0]["lr"]
        (loss * (weight * world / total_weight)).backward()
        optimizer.step()
        if metrics is not None:
            record = {
                "step": step,
                "train/loss": weighted_loss / total_weight,
                "train/weight": total_weight,
                "train/supervised": weight,
                "train/lr": lr,
            }
            metrics.write(json.dumps(record, sort_keys=True) + "\n")
            metrics.flush()
            if after_metrics is not None:
                after_metrics(step)
            if validate_every and step % validate_every == 0:
                model.eval()
                with torch.no_grad():
                    val_loss, _ = masked_mse(model(x_val), y_val, m_val)
                model.train()
                record = {"step": step, "validation/mse": float(val_loss)}
                metrics.write(json.dumps(record, sort_keys=True) + "\n")
                metrics.flush()
        if (save_every and step % save_every == 0) or step == updates:
            _checkpoint(out, step, model, optimizer, generator, metrics, device, world)
        yield step
    if metrics is not None:
        metrics.close()
    del ddp  # no DDP wrapper may outlive the process group


def _checkpoint(out, step, model, optimizer, generator, metrics, device, world) -> None:
    """Every rank's RNG states to rank 0, which writes the checkpoint durably."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "sampler": generator.get_state(),
    }
    ranks = [state]
    if world > 1:
        ranks = [None] * world if metrics is not None else None
        dist.gather_object(state, ranks, dst=0)
    if metrics is None:
        return
    ckpt = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "ranks": ranks,
    }
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    data = buffer.getvalue()
    durable_write(data, out / "last.pt", out / f"step_{step}.pt")
    os.fsync(metrics.fileno())
