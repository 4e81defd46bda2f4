"""Every random stream of a process: seeding, reading and setting it, in checkpoint-safe types.

Public as ``slhub.random_state``, ``slhub.set_random_state`` and
``slhub.preserved_random_state``; :func:`seed_everything` and :func:`derived_seed`
are the loop's.

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


def _read(device: torch.device | None) -> tuple[Any, Any, torch.Tensor, torch.Tensor | None]:
    """The python, numpy, torch CPU and (on a CUDA device) CUDA states, as returned."""
    cuda = device is not None and device.type == "cuda"
    return (
        random.getstate(),
        np.random.get_state(),
        torch.get_rng_state(),
        torch.cuda.get_rng_state(device) if cuda else None,
    )


def _write(states: tuple[Any, Any, torch.Tensor, torch.Tensor | None], device) -> None:
    """Set what :func:`_read` returned (CUDA only on a CUDA device)."""
    python, numpy, cpu, gpu = states
    random.setstate(python)
    np.random.set_state(numpy)
    torch.set_rng_state(cpu)
    if gpu is not None and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(gpu, device)


def random_state(device: torch.device | None = None) -> dict[str, Any]:
    """This process's python, numpy, torch CPU and (on a CUDA ``device``) CUDA random
    states, in types a checkpoint stores (``torch.load(weights_only=True)`` reads them).
    """
    (version, internal, gauss), numpy, cpu, cuda = _read(device)
    kind, keys, pos, has_gauss, cached = numpy
    return {
        # np.fromiter: ~6x faster than torch.tensor() on a tuple of 625 ints
        "python": (
            version,
            torch.from_numpy(np.fromiter(internal, np.int64, len(internal))),
            gauss,
        ),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "torch": cpu,
        "cuda": cuda,
    }


def set_random_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Set every random stream to what :func:`random_state` returned (CUDA only on a
    CUDA ``device``)."""
    version, internal, gauss = state["python"]
    if isinstance(internal, torch.Tensor):
        internal = internal.tolist()
    kind, keys, pos, has_gauss, cached = state["numpy"]
    numpy = (kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached)
    python = (version, tuple(internal), gauss)
    _write((python, numpy, state["torch"], state.get("cuda")), device)


@contextmanager
def preserved_random_state(device: torch.device | None = None) -> Iterator[None]:
    """Run a block (e.g. validation) without changing any random stream afterwards.

    The states stay in memory, so they are kept as the libraries return them, without
    :func:`random_state`'s conversions to checkpoint-safe types.
    """
    saved = _read(device)
    try:
        yield
    finally:
        _write(saved, device)
