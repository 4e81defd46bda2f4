"""Cart-pole windows for world-model training, drawn inside single episodes.

The trajectories come from slhub's public cart-pole helpers
(:func:`slhub.data.ensure_dataset`): every row of
``states [N, T+1, 4]`` / ``actions [N, T, 1]`` is one episode that starts from a
reset. A window is ``(trajectory, start)``: ``span`` consecutive states of that
one row and the ``span - 1`` actions between them, so a window never crosses an
episode reset by construction (the starts are drawn in ``[0, T + 1 - span]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from slhub.data import CartpoleData, state_deltas


@dataclass(frozen=True)
class Windows:
    """Fixed-length windows over the episodes of a cart-pole split."""

    data: CartpoleData
    span: int

    def __post_init__(self) -> None:
        if self.span < 2 or self.span > self.data.length + 1:
            raise ValueError(
                f"a window of {self.span} states does not fit episodes of "
                f"{self.data.length + 1} states"
            )

    @property
    def starts_per_episode(self) -> int:
        return self.data.length + 2 - self.span

    def gather(self, episode: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """States ``[B, span, 4]`` and actions ``[B, span - 1, 1]`` of the given windows."""
        offsets = start[:, None] + np.arange(self.span)[None, :]
        states = self.data.states[episode[:, None], offsets]
        actions = self.data.actions[episode[:, None], offsets[:, :-1]]
        return states, actions

    def draw(self, batch_size: int, generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Episode and start indices of ``batch_size`` windows, with replacement."""
        episode = torch.randint(0, self.data.num_trajectories, (batch_size,), generator=generator)
        start = torch.randint(0, self.starts_per_episode, (batch_size,), generator=generator)
        return episode.numpy(), start.numpy()

    def grid(self, stride: int) -> tuple[np.ndarray, np.ndarray]:
        """A fixed set of windows: every ``stride``-th start of every episode."""
        starts = np.arange(0, self.starts_per_episode, stride)
        episode = np.repeat(np.arange(self.data.num_trajectories), len(starts))
        return episode, np.tile(starts, self.data.num_trajectories)


def input_features(states: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """``[x, sin(theta), cos(theta), x_dot, theta_dot, force]`` (numpy twin of the model's)."""
    x, theta, x_dot, theta_dot = np.moveaxis(states, -1, 0)
    return np.stack([x, np.sin(theta), np.cos(theta), x_dot, theta_dot, actions[..., 0]], axis=-1)


def normalization(data: CartpoleData) -> dict[str, np.ndarray]:
    """Mean and standard deviation of the inputs and of the state changes of a split."""
    states = np.asarray(data.states, dtype=np.float64)
    actions = np.asarray(data.actions, dtype=np.float64)
    features = input_features(states[:, :-1], actions).reshape(-1, 6)
    deltas = state_deltas(states).reshape(-1, 4)
    return {
        "feature_mean": features.mean(0),
        "feature_std": np.maximum(features.std(0), 1e-6),
        "delta_mean": deltas.mean(0),
        "delta_std": np.maximum(deltas.std(0), 1e-6),
    }
