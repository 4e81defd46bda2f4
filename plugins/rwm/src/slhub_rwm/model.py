"""The world model: a GRU over (state, action) history that forecasts autoregressively."""

from __future__ import annotations

import numpy as np
import torch
from slhub.data import THETA, wrap_angle
from torch import nn


class WorldModel(nn.Module):
    """Predicts the next normalized state change from a GRU summary of the history.

    Inputs per step are ``[x, sin(theta), cos(theta), x_dot, theta_dot, force]``,
    standardized with training-split statistics held as buffers; the head's
    output is the state change standardized the same way.
    """

    def __init__(self, hidden: int, layers: int, stats: dict[str, np.ndarray]) -> None:
        super().__init__()
        for name, value in stats.items():
            self.register_buffer(name, torch.as_tensor(value, dtype=torch.float32))
        self.gru = nn.GRU(6, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, 4)

    def features(self, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x, theta, x_dot, theta_dot = states.unbind(-1)
        raw = torch.stack(
            [x, torch.sin(theta), torch.cos(theta), x_dot, theta_dot, actions[..., 0]], dim=-1
        )
        return (raw - self.feature_mean) / self.feature_std

    def advance(self, state: torch.Tensor, normalized_delta: torch.Tensor) -> torch.Tensor:
        """Apply a predicted normalized change to a state, wrapping the angle."""
        nxt = state + normalized_delta * self.delta_std + self.delta_mean
        return torch.cat(
            [nxt[..., :THETA], wrap_angle(nxt[..., THETA : THETA + 1]), nxt[..., 2:]], -1
        )

    def forward(self, states: torch.Tensor, actions: torch.Tensor, horizon: int) -> torch.Tensor:
        """Forecast ``horizon`` states after a history.

        :param states: ``[B, H + horizon, 4]``; only the first ``H`` (the history) are read.
        :param actions: ``[B, H + horizon - 1, 1]``, the true actions of the whole window.
        :returns: predicted states ``[B, horizon, 4]`` for ``states[:, H:]``. After the
            first step the model's own prediction is fed back with the true action.
        """
        history = states.shape[1] - horizon
        out, hidden = self.gru(self.features(states[:, :history], actions[:, :history]))
        pred = self.advance(states[:, history - 1], self.head(out[:, -1]))
        preds = [pred]
        for k in range(1, horizon):
            step_in = self.features(pred[:, None], actions[:, history + k - 1 : history + k])
            out, hidden = self.gru(step_in, hidden)
            pred = self.advance(pred, self.head(out[:, -1]))
            preds.append(pred)
        return torch.stack(preds, dim=1)

    def normalized_error(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Prediction error in units of the state-change standard deviation (angle wrapped)."""
        err = pred - target
        err = torch.cat(
            [err[..., :THETA], wrap_angle(err[..., THETA : THETA + 1]), err[..., 2:]], -1
        )
        return err / self.delta_std
