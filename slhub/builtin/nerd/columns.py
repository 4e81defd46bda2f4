"""Where a floating base's components sit in a state vector, for the frames that
convert between the world and the base (:mod:`slhub.builtin.nerd.frame`,
:mod:`slhub.builtin.nerd.planar_frame`)."""

from __future__ import annotations

import torch
from torch import nn


class BaseColumns(nn.Module):
    """Where a base's components sit in a state vector: split a state into the base's
    columns and the rest, and join them back in the state's order.

    Holds index buffers only (not saved: the layout names the base), so a model's
    state dict is the same with or without a frame.
    """

    def __init__(self, columns: tuple[int, ...], state_dim: int) -> None:
        super().__init__()
        rest = [i for i in range(state_dim) if i not in columns]
        order = list(columns) + rest
        inverse = sorted(range(state_dim), key=order.__getitem__)
        self.state_dim = state_dim
        self.register_buffer("base_columns", torch.tensor(columns), persistent=False)
        self.register_buffer("rest_columns", torch.tensor(rest, dtype=torch.int64), False)
        self.register_buffer("inverse", torch.tensor(inverse), persistent=False)

    def _columns(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The base's columns ``[..., B]`` (in the base's order) and the rest ``[..., R]``."""
        return state.index_select(-1, self.base_columns), state.index_select(-1, self.rest_columns)

    def _join(self, *parts: torch.Tensor) -> torch.Tensor:
        return torch.cat(parts, dim=-1).index_select(-1, self.inverse)
