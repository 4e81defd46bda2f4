"""What NeRD is trained and judged on: the masked loss and the rollout evaluation.

Training and validation must measure the same thing, so the loss mask, the
masked MSE and the angle-aware state error are defined once here and used by
both the ``objective`` and the ``validate`` hooks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from slhub.builtin.nerd.data import window_batch
from slhub.builtin.nerd.model import NerdArch, NerdModel
from slhub.builtin.nerd.sections import ANGLE_FEATURE, LossSection, ValidationSection
from slhub.data import STATE_NAMES, CartpoleData, wrap_angle


def loss_mask(arch: NerdArch, cfg: LossSection) -> torch.Tensor:
    """``[history, state_dim]`` float mask of supervised (position, feature) pairs.

    A non-causal model sees the future inside its window, so only its last
    position is supervised.
    """
    mask = torch.zeros(arch.history, arch.state_dim)
    columns = [STATE_NAMES.index(name) for name in cfg.features]
    mask[:, columns] = 1.0
    mask[: cfg.skip_first] = 0.0
    if not arch.causal:
        mask[:-1] = 0.0
    return mask


def batch_mask(mask: torch.Tensor, batch: dict[str, Any], tokens: torch.Tensor) -> torch.Tensor:
    """The recipe's ``mask`` for every window of ``tokens``, times the batch's own ``mask``.

    Windows shorter than the history are supervised on the mask's last positions.
    """
    length = tokens.shape[1]
    full = mask[-length:].to(tokens.device).expand(tokens.shape[0], -1, -1)
    extra = batch.get("mask")
    if extra is not None:
        full = full * extra.to(device=full.device, dtype=full.dtype)
    return full


def masked_mse(
    prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """Mean squared error over unmasked elements and their count (0 -> loss 0).

    bfloat16 errors are accumulated in float32.
    """
    compute = torch.promote_types(prediction.dtype, torch.float32)
    error = (prediction.to(compute) - target.to(compute)).square()
    mask = mask.to(compute)
    weight = int(mask.sum().item())
    loss = (error * mask).sum() / max(weight, 1)
    return loss, weight


def angle_aware_error(prediction: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Squared state error in float64 with the angle difference wrapped."""
    diff = prediction.double() - truth.double()
    index = STATE_NAMES.index(ANGLE_FEATURE)
    diff[..., index] = wrap_angle(diff[..., index])
    return diff.square()


def evaluate(
    model: NerdModel,
    data: CartpoleData,
    cfg: ValidationSection,
    mask: torch.Tensor | None,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[str, float]:
    """One-step normalized MSE, rollout state MSE and the constant-state baseline.

    - ``one_step_mse``: the training loss (same mask) on windows tiling every
      validation trajectory.
    - ``rollout_mse_K``: mean squared state error over the first K states of an
      autoregressive rollout that starts after ``history`` true steps.
    - ``baseline_mse_K``: the same error for "the state stays as the last true one".
    """
    arch = model.arch
    history = arch.history
    count = min(cfg.num_trajectories or data.num_trajectories, data.num_trajectories)
    states = torch.from_numpy(np.array(data.states[:count], dtype=np.float64))
    actions = torch.from_numpy(np.array(data.actions[:count], dtype=np.float64))
    metrics: dict[str, float] = {}

    starts = np.arange(0, data.length - history + 1, history)
    traj = np.repeat(np.arange(count), len(starts))
    tokens, delta = window_batch(data, traj, np.tile(starts, count), history)
    tokens_t = torch.from_numpy(tokens).to(device=device, dtype=dtype)
    delta_t = torch.from_numpy(delta).to(device=device, dtype=dtype)
    if mask is None:
        mask = torch.ones(history, arch.state_dim)
    full_mask = mask.to(device).expand(tokens_t.shape[0], -1, -1)
    loss, _ = masked_mse(model(tokens_t), model.normalize_target(delta_t), full_mask)
    metrics["one_step_mse"] = float(loss)

    horizon = max(cfg.horizons)
    history_tokens = torch.cat([states[:, :history], actions[:, :history]], dim=-1)
    future = actions[:, history : history + horizon - 1]
    predicted = model.rollout(
        history_tokens.to(device=device, dtype=dtype), future.to(device=device, dtype=dtype)
    ).cpu()
    truth = states[:, history : history + horizon]
    rollout_error = angle_aware_error(predicted, truth)
    baseline_error = angle_aware_error(states[:, history - 1 : history].expand_as(truth), truth)
    for k in sorted(set(cfg.horizons)):
        metrics[f"rollout_mse_{k}"] = float(rollout_error[:, :k].mean())
        metrics[f"baseline_mse_{k}"] = float(baseline_error[:, :k].mean())
    return metrics
