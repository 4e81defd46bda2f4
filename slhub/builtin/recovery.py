"""Per-rank recovery: each rank's RNG, sampler generator and model buffers.

At every boundary each rank contributes ``rng`` (python, numpy, torch CPU,
CUDA), ``sampler`` (its sampler generator's state) and ``buffers`` (its own
model buffers, which DDP does not broadcast here); the trainer gathers them to
rank 0 into ``ranks[rank]``. On resume each rank restores its own entry, so
dropout masks, sampled batches and per-rank statistics continue exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from slhub import Trainer, hookimpl, random_state, set_random_state


@hookimpl(trylast=True)
def state_dict(trainer: Trainer) -> dict[str, Any]:
    return {
        "rng": random_state(trainer.device),
        "sampler": trainer.generator.get_state(),
        "buffers": {
            name: buf.detach().to("cpu", copy=True) for name, buf in trainer.model.named_buffers()
        },
    }


@hookimpl(trylast=True)
def load_state_dict(trainer: Trainer, state: dict[str, Any]) -> None:
    if "rng" in state:
        set_random_state(state["rng"], trainer.device)
    if "sampler" in state:
        trainer.generator.set_state(state["sampler"])
    if "buffers" in state:
        own = dict(trainer.model.named_buffers())
        with torch.no_grad():
            for name, value in state["buffers"].items():
                if name in own:
                    own[name].copy_(value)
