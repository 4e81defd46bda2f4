"""Policies: an MLP on the cart-pole state and a small CNN on two rendered frames."""

from __future__ import annotations

import torch
from torch import nn

from slhub_bc.render import SIZE


class StatePolicy(nn.Module):
    """``[B, 4]`` state -> ``[B, 1]`` force (N), inputs standardized with training statistics."""

    def __init__(self, state_mean, state_std, action_scale: float, hidden: int) -> None:
        super().__init__()
        self.register_buffer("state_mean", torch.as_tensor(state_mean, dtype=torch.float32))
        self.register_buffer("state_std", torch.as_tensor(state_std, dtype=torch.float32))
        self.register_buffer("action_scale", torch.tensor(float(action_scale)))
        self.net = nn.Sequential(
            nn.Linear(4, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, 1),
        )

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.net((states - self.state_mean) / self.state_std) * self.action_scale


class VisualPolicy(nn.Module):
    """``[B, 2, 64, 64]`` frames (t - frame_gap, t) -> ``[B, 1]`` force (N).

    Two frames, because one image shows positions but not velocities, and the
    expert's action depends on both.
    """

    def __init__(self, action_scale: float, channels: int, hidden: int) -> None:
        super().__init__()
        self.register_buffer("action_scale", torch.tensor(float(action_scale)))
        c = channels
        self.features = nn.Sequential(
            nn.Conv2d(2, c, 5, stride=2, padding=2),
            nn.ReLU(),  # 32 x 32
            nn.Conv2d(c, 2 * c, 3, stride=2, padding=1),
            nn.ReLU(),  # 16 x 16
            nn.Conv2d(2 * c, 2 * c, 3, stride=2, padding=1),
            nn.ReLU(),  # 8 x 8
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * c * (SIZE // 8) ** 2, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(frames)) * self.action_scale
