"""What each rank saves of its own so a resume continues exactly: its random streams,
its sampler generator and its model buffers.

The loop registers one object of each under ``rng``, ``sampler`` and ``buffers``
(:meth:`slhub.checkpoint.CheckpointManager.register`); the gather puts them in the
rank's entry ``ranks[rank]`` and a resume gives each rank its own entry back, so
dropout masks, sampled batches and per-rank statistics (DDP does not broadcast the
buffers here) continue as in the uninterrupted run.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from slhub.rng import random_state, set_random_state


class RandomStreams:
    """``rng``: python, numpy, torch CPU and (on a CUDA device) CUDA random states."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def state_dict(self) -> dict[str, Any]:
        return random_state(self.device)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_random_state(state, self.device)


class SamplerState:
    """``sampler``: the state of the generator ``sample`` draws batches with."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> torch.Tensor:
        return self.generator.get_state()

    def load_state_dict(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


class ModelBuffers:
    """``buffers``: this rank's own model buffers, on the CPU (a buffer the model no
    longer has is skipped on load)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: buf.detach().to("cpu", copy=True) for name, buf in self.model.named_buffers()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        own = dict(self.model.named_buffers())
        with torch.no_grad():
            for name, value in state.items():
                if name in own:
                    own[name].copy_(value)
