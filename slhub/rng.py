"""Capture and restore every random stream of a process, in checkpoint-safe types.

States are converted to tensors, ints and tuples so that a checkpoint loads with
``torch.load(weights_only=True)``: numpy's state array and python's 625-word
state become int64 tensors (one pickled object each, where python's tuple of
ints cost ``torch.save`` a Python callback per int: ~0.25 ms per checkpoint).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def derived_seed(seed: int, rank: int, stream: str) -> int:
    """A per-rank, per-stream seed: independent streams that depend only on (seed, rank)."""
    words = np.random.SeedSequence([seed, rank, sum(map(ord, stream)) + 7919 * len(stream)])
    return int(words.generate_state(1, dtype=np.uint64)[0] % (2**63 - 1))


def capture(device: torch.device | None = None) -> dict[str, Any]:
    """This process's python, numpy, torch CPU and (if used) CUDA RNG states."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    cuda: torch.Tensor | None = None
    if device is not None and device.type == "cuda":
        cuda = torch.cuda.get_rng_state(device)
    version, internal, gauss = random.getstate()
    return {
        # np.fromiter: ~6x faster than torch.tensor() on a tuple of 625 ints
        "python": (
            version,
            torch.from_numpy(np.fromiter(internal, np.int64, len(internal))),
            gauss,
        ),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
        "cuda": cuda,
    }


def restore(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Restore what :func:`capture` returned."""
    version, internal, gauss = state["python"]
    if isinstance(internal, torch.Tensor):
        internal = internal.tolist()
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


@contextmanager
def preserved(device: torch.device | None = None) -> Iterator[None]:
    """Run a block (e.g. validation) without changing any random stream afterwards.

    The states stay in memory, so they are kept as the libraries return them, without
    :func:`capture`'s conversions to checkpoint-safe types.
    """
    cuda = device is not None and device.type == "cuda"
    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    gpu = torch.cuda.get_rng_state(device) if cuda else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if gpu is not None:
            torch.cuda.set_rng_state(gpu, device)
