"""What NeRD is trained and judged on: the masked loss and the rollout evaluation.

Training and validation must measure the same thing, so the loss mask, the
masked MSE and the angle-aware state error are defined once here and used by
both the ``objective`` and the ``validate`` hooks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from slhub import DatasetError
from slhub.builtin.nerd.base import RobotBase, free_joint_base
from slhub.builtin.nerd.data import tokens_of, window_offsets
from slhub.builtin.nerd.measures import MeasureColumns, averaged, step_errors
from slhub.builtin.nerd.model import NerdArch, NerdLayout, NerdModel
from slhub.builtin.nerd.sections import LossSection, ValidationSection
from slhub.data import TrainingData, wrap_angle


def loss_mask(arch: NerdArch, layout: NerdLayout, cfg: LossSection) -> torch.Tensor:
    """``[history, state_dim]`` float mask of supervised (position, component) pairs.

    A non-causal model sees the future inside its window, so only its last
    position is supervised. A body-frame model of a free joint predicts its orientation
    change as a rotation vector in the ``qx qy qz`` slots, so its ``qw`` slot is never
    supervised (the base's ``unsupervised`` slots).

    :raises DatasetError: ``loss.features`` names a component the state lacks.
    """
    mask = torch.zeros(arch.history, arch.state_dim)
    names = layout.state_names
    chosen = names if cfg.features is None else cfg.features
    missing = [name for name in chosen if name not in names]
    if missing:
        raise DatasetError(
            f"loss.features: {missing[0]!r} is not a state component (the state has: "
            f"{', '.join(names)})"
        )
    mask[:, [names.index(name) for name in chosen]] = 1.0
    mask[: cfg.skip_first] = 0.0
    if layout.body and layout.base is not None:
        for name in layout.base.unsupervised:
            mask[:, names.index(name)] = 0.0
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


def angle_aware_error(
    prediction: torch.Tensor, truth: torch.Tensor, layout: NerdLayout
) -> torch.Tensor:
    """Squared state error in float64 with the angle differences wrapped."""
    return _wrapped(prediction.double() - truth.double(), layout).square()


def rollout_episodes(data: TrainingData, history: int, cfg: ValidationSection) -> list[int]:
    """The validation episodes long enough for ``history`` true steps and the longest
    horizon (at most ``cfg.num_trajectories`` of them, in order).

    :raises DatasetError: none is long enough (at admission, naming the lengths).
    """
    needed = history + max(cfg.horizons)
    episodes = [e for e in data.split.validation if int(data.dataset.lengths[e]) >= needed]
    if not episodes:
        longest = max((int(data.dataset.lengths[e]) for e in data.split.validation), default=0)
        raise DatasetError(
            f"{data.dataset.path}: validation.horizons up to {max(cfg.horizons)} after "
            f"model.history {history} need validation episodes of {needed} steps; the "
            f"longest has {longest}"
            if data.split.validation
            else f"{data.dataset.path}: the validation split holds no episodes"
        )
    return episodes[: cfg.num_trajectories] if cfg.num_trajectories else episodes


def evaluate(
    model: NerdModel,
    data: TrainingData,
    cfg: ValidationSection,
    mask: torch.Tensor | None,
    dtype: torch.dtype,
    device: torch.device,
    contacts: Any = None,
) -> dict[str, float]:
    """One-step normalized MSE, rollout state MSE and two baselines.

    - ``one_step_mse``: the training loss (same mask) on windows tiling every
      rollout episode.
    - ``rollout_mse_K``: mean squared state error over the first K states of an
      autoregressive rollout that starts after ``history`` true steps.
    - ``baseline_mse_K``: the same error for "the state stays as the last true one";
      ``linear_mse_K``: for "the state keeps changing as in the last true step".
      The rollout reads each step's extra inputs (contacts) from the recorded episode
      (teacher-forced).
    - ``selfcontact_mse_K`` (with ``contacts``, a :class:`slhub.sim.StateContacts`
      of the dataset's env): the same rollout computing each later step's contact
      inputs from its own predicted state, as a simulator would.
    - ``<kind>_base_position_K``, ``<kind>_base_orientation_K``,
      ``<kind>_joint_position_K`` for each of them: NeRD's measures in physical
      units (:mod:`~slhub.builtin.nerd.measures`), when the state has ``qpos``
      components.
    """
    arch, layout = model.arch, model.layout
    history = arch.history
    episodes = np.asarray(rollout_episodes(data, history, cfg), dtype=np.int64)
    metrics: dict[str, float] = {}

    window = window_offsets(layout, history)
    anchors = data.anchors(window, "validation")
    tiles = anchors[np.isin(anchors[:, 0], episodes) & ((anchors[:, 1] + 1) % history == 0)]
    tokens, delta = tokens_of(data.read(window, tiles), layout, history)
    tokens_t = torch.from_numpy(tokens).to(device=device, dtype=dtype)
    delta_t = torch.from_numpy(delta).to(device=device, dtype=dtype)
    if mask is None:
        mask = torch.ones(history, arch.state_dim)
    full_mask = mask.to(device).expand(tokens_t.shape[0], -1, -1)
    loss, _ = masked_mse(model(tokens_t), model.normalize_target(delta_t), full_mask)
    metrics["one_step_mse"] = float(loss)

    horizon = max(cfg.horizons)
    starts = np.stack([episodes, np.zeros_like(episodes)], axis=1)
    whole = data.read(
        window_offsets(layout, history + horizon, 0), starts + [0, history + horizon - 1]
    )
    states = torch.from_numpy(whole["state"])
    inputs = [whole["action"]] + ([whole["extra"]] if layout.extra_names else [])
    controls = torch.from_numpy(np.concatenate(inputs, axis=-1))
    history_tokens = torch.cat([states[:, :history], controls[:, :history]], dim=-1)
    future = controls[:, history : history + horizon - 1]
    predicted = model.rollout(
        history_tokens.to(device=device, dtype=dtype), future.to(device=device, dtype=dtype)
    ).cpu()
    truth = states[:, history : history + horizon]
    guesses = {"rollout": predicted}
    if contacts is not None:
        actions = torch.from_numpy(whole["action"])
        guesses["selfcontact"] = self_contact_rollout(
            model, history_tokens, actions[:, history - 1 : history + horizon - 1], contacts,
            dtype, device,
        ).cpu()  # fmt: skip
    last = states[:, history - 1 : history]
    errors = {kind: angle_aware_error(guess, truth, layout) for kind, guess in guesses.items()}
    baseline_error = angle_aware_error(last.expand_as(truth), truth, layout)
    step = (
        _wrapped(last - states[:, history - 2 : history - 1], layout) if history > 1 else 0 * last
    )
    ahead = torch.arange(1, horizon + 1, dtype=torch.float64)[None, :, None]
    linear = _wrapped(last + ahead * step, layout)
    linear_error = angle_aware_error(linear, truth, layout)
    errors.update(baseline=baseline_error, linear=linear_error)
    groups = measure_columns(layout, cfg)
    physical = MeasureColumns.of(layout.state_names, layout.angles, measured_base(layout))
    guesses.update(baseline=last.expand_as(truth), linear=linear)
    measured = {
        kind: step_errors(guess, truth, physical) for kind, guess in guesses.items() if physical
    }
    for k in sorted(set(cfg.horizons)):
        for kind, error in errors.items():
            metrics[f"{kind}_mse_{k}"] = float(error[:, :k].mean())
        for group, columns in groups.items():
            for kind, error in errors.items():
                metrics[f"{kind}_{group}_mse_{k}"] = float(error[:, :k, columns].mean())
        for kind, measures in measured.items():
            for name, value in averaged(measures, k).items():
                metrics[f"{kind}_{name}_{k}"] = value
    return metrics


def self_contact_rollout(
    model: NerdModel,
    tokens: torch.Tensor,
    actions: torch.Tensor,
    contacts: Any,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """:meth:`NerdModel.rollout` computing each later token's extra inputs from its own
    predicted state (``contacts(states, previous_actions)``, float64 numpy) instead of
    reading them: the same window slides the same way, so recorded inputs would give
    the rollout's states bit for bit.

    :param tokens: the true history ``[B, L, features]`` (float64).
    :param actions: ``[B, K, action_dim]``: the last history token's action, then the
        action of each of the ``K - 1`` later tokens.
    :returns: ``[B, K, state_dim]``.
    """
    window = tokens[:, -model.arch.history :].to(device=device, dtype=dtype)
    states = [model.next_state(window)]
    for k in range(1, actions.shape[1]):
        state = states[-1]
        extra = contacts(state.detach().double().cpu().numpy(), actions[:, k - 1].numpy())
        controls = torch.cat([actions[:, k], torch.from_numpy(extra)], dim=-1)
        window = model.advance(window, state, controls.to(device=device, dtype=dtype))
        states.append(model.next_state(window))
    return torch.stack(states, dim=1)


def measured_base(layout: NerdLayout) -> RobotBase | None:
    """The floating base the measures judge: the model's own (``model.base`` or the
    dataset's record), else the first free joint whose thirteen components
    ``slhub data collect`` names (``qpos.J_x`` ... ``qpos.J_qz``, ``qvel.J_vx`` ...
    ``qvel.J_wz``) are all state components (a world-frame model of unrecorded data)."""
    if layout.base is not None:
        return layout.base
    names = set(layout.state_names)
    for name in layout.state_names:
        if name.startswith("qpos.") and name.endswith("_qw"):
            base = free_joint_base(name.removeprefix("qpos.").removesuffix("_qw"))
            if names.issuperset(base.names):
                return base
    return None


def measure_columns(layout: NerdLayout, cfg: ValidationSection) -> dict[str, list[int]]:
    """``validation.groups`` as state columns.

    :raises DatasetError: a group names a component the state lacks (listing them).
    """
    out = {}
    for group, components in cfg.groups.items():
        missing = [c for c in components if c not in layout.state_names]
        if missing:
            raise DatasetError(
                f"validation.groups.{group}: {missing[0]!r} is not a state component (the "
                f"state has: {', '.join(layout.state_names)})"
            )
        out[group] = [layout.state_names.index(c) for c in components]
    return out


def _wrapped(values: torch.Tensor, layout: NerdLayout) -> torch.Tensor:
    out = values.clone()
    if layout.angles:
        columns = list(layout.angles)
        out[..., columns] = wrap_angle(out[..., columns])
    return out
