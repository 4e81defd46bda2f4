"""Policies: an MLP on an observation history, and a small CNN per camera.

Both map a window (``observation [B, K, D]``, ``image[i] [B, K, H, W, C]`` uint8) to
an action chunk ``[B, chunk, A]`` in normalized units. The normalization (the training
split's observation and action mean and std) is kept in buffers, so every checkpoint
and export carries what inference needs to standardize inputs and to turn the
prediction back into actions (:meth:`Policy.act`); images are scaled by 1/255.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from slhub_bc import augment
from slhub_bc.data import camera_role

#: The smallest standard deviation used to normalize (a constant component stays finite).
STD_FLOOR = 1e-6


def _vector(values: np.ndarray) -> torch.Tensor:
    """``values`` as a float64 tensor of its own, with unit stride even when empty (an
    empty tensor made from numpy has stride 0, which a byte view of it refuses)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    return torch.zeros(len(values), dtype=torch.float64).copy_(torch.from_numpy(values))


class Policy(nn.Module):
    """Normalization buffers and the mapping between normalized and real actions."""

    def __init__(
        self,
        observation: tuple[np.ndarray, np.ndarray],
        action: tuple[np.ndarray, np.ndarray],
        chunk: int,
    ) -> None:
        super().__init__()
        for name, (mean, std) in (("observation", observation), ("action", action)):
            self.register_buffer(f"{name}_mean", _vector(mean))
            self.register_buffer(f"{name}_std", _vector(np.maximum(std, STD_FLOOR)))
        self.chunk = chunk
        self.action_dim = len(action[0])

    def normalize_observation(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation - self.observation_mean) / self.observation_std

    def normalize_action(self, action: torch.Tensor) -> torch.Tensor:
        return (action - self.action_mean) / self.action_std

    def act(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The action chunk ``[B, chunk, A]`` in the dataset's units."""
        return self(batch) * self.action_std + self.action_mean

    def _chunk(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.view(flat.shape[0], self.chunk, self.action_dim)


class StatePolicy(Policy):
    """``observation [B, K, D]`` -> ``[B, chunk, A]``: an MLP (tanh) on the standardized,
    flattened history."""

    def __init__(
        self,
        observation: tuple[np.ndarray, np.ndarray],
        action: tuple[np.ndarray, np.ndarray],
        *,
        history: int,
        chunk: int,
        hidden: int,
    ) -> None:
        super().__init__(observation, action, chunk)
        inputs = history * len(observation[0])
        self.net = nn.Sequential(
            nn.Linear(inputs, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, chunk * self.action_dim),
        )

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        observation = self.normalize_observation(batch["observation"])
        return self._chunk(self.net(observation.flatten(1)))


def _conv_size(size: int) -> int:
    """A side after the encoder's three stride-2 convolutions (each ``ceil(n / 2)``)."""
    for _ in range(3):
        size = (size + 1) // 2
    return size


class VisualPolicy(Policy):
    """Frames of every camera (``image[i] [B, K, H, W, C]`` uint8) and, when the recipe
    names one, the observation history -> ``[B, chunk, A]``.

    Each camera has its own encoder (3 strided convolutions) over its ``K`` frames
    stacked as channels: several frames, because one shows positions but not the
    velocities an expert acts on. With ``crop`` the encoders see cropped frames: at the
    corners ``image[i]_crop`` a training batch carries, else the centre
    (:mod:`slhub_bc.augment`); ``image[i]_jitter`` factors change brightness and contrast.
    """

    def __init__(
        self,
        observation: tuple[np.ndarray, np.ndarray],
        action: tuple[np.ndarray, np.ndarray],
        *,
        cameras: Sequence[tuple[int, int, int]],
        history: int,
        chunk: int,
        channels: int,
        hidden: int,
        crop: int | float | None = None,
    ) -> None:
        super().__init__(observation, action, chunk)
        c = channels
        #: The ``(h, w)`` each camera's frames are cropped to.
        self.crops = augment.crop_sizes(crop, cameras)
        # (H, W, C) per camera: what an export needs to rebuild the encoders
        self.register_buffer("camera_shapes", torch.tensor(cameras, dtype=torch.int64))
        self.encoders = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(history * depth, c, 5, stride=2, padding=2),
                nn.ReLU(),
                nn.Conv2d(c, 2 * c, 3, stride=2, padding=1),
                nn.ReLU(),
                nn.Conv2d(2 * c, 2 * c, 3, stride=2, padding=1),
                nn.ReLU(),
                nn.Flatten(),
            )
            for _, _, depth in cameras
        )
        features = sum(2 * c * _conv_size(h) * _conv_size(w) for h, w in self.crops)
        features += history * len(observation[0])
        self.head = nn.Sequential(
            nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, chunk * self.action_dim)
        )

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        dtype = self.action_std.dtype
        parts = []
        for index, encoder in enumerate(self.encoders):
            role = camera_role(index)
            frames = batch[role]  # [B, K, H, W, C]
            if self.crops[index] != tuple(frames.shape[2:4]):
                corners = batch.get(role + augment.CROP_SUFFIX)
                frames = augment.crop(frames, self.crops[index], corners)
            frames = frames.to(dtype).div(255.0)
            if role + augment.JITTER_SUFFIX in batch:
                frames = augment.jitter(frames, batch[role + augment.JITTER_SUFFIX])
            b, k, h, w, c = frames.shape
            frames = frames.permute(0, 1, 4, 2, 3).reshape(b, k * c, h, w)
            parts.append(encoder(frames))
        if "observation" in batch:
            parts.append(self.normalize_observation(batch["observation"]).flatten(1))
        return self._chunk(self.head(torch.cat(parts, dim=1)))
