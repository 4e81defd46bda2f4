"""RigidFormer: a transformer encoder over one token per object, with a key padding mask."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


class Block(nn.Module):
    """Pre-norm transformer encoder layer whose attention ignores padded keys.

    The key projection has no bias: softmax is invariant to it, so its gradient is
    zero in exact arithmetic and only rounding noise in floating point.
    """

    def __init__(self, width: int, heads: int, ff: int) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.query = nn.Linear(width, width)
        self.key = nn.Linear(width, width, bias=False)
        self.value = nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, ff), nn.GELU(), nn.Linear(ff, width))

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        b, m, width = x.shape
        h = self.norm1(x)

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, m, self.heads, width // self.heads).transpose(1, 2)

        q, k, v = split(self.query(h)), split(self.key(h)), split(self.value(h))
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads)
        scores = scores.masked_fill(padding[:, None, None, :], float("-inf"))
        mixed = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, m, width)
        x = x + self.out(mixed)
        return x + self.ff(self.norm2(x))


class RigidFormer(nn.Module):
    """Maps object tokens ``[B, M, 16]`` to normalized next-step corner displacements."""

    def __init__(
        self,
        stats: dict[str, np.ndarray],
        width: int,
        heads: int,
        layers: int,
        ff: int,
    ) -> None:
        super().__init__()
        for name, value in stats.items():
            self.register_buffer(name, torch.as_tensor(value, dtype=torch.float32))
        features, targets = len(stats["feature_mean"]), len(stats["target_mean"])
        self.embed = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width, heads, ff) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, targets)

    def forward(self, features: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """:param valid: ``[B, M]`` bool, True for real objects (at least one per row)."""
        x = self.embed((features - self.feature_mean) / self.feature_std)
        padding = ~valid
        for block in self.blocks:
            x = block(x, padding)
        return self.head(self.norm(x))

    def normalize_targets(self, targets: torch.Tensor) -> torch.Tensor:
        return (targets - self.target_mean) / self.target_std
