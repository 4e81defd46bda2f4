"""The built-in ``nerd`` plugin: NeRD (Neural Robot Dynamics) on cart-pole data.

Recipe sections owned here (every key has a default; docs/nerd.md lists them):

- ``model``: history window, sizes, causal attention, normalization, angle
  features and the precision the model is built, trained and exported in.
- ``data``: cache directory and the sizes and seeds of the train and
  validation splits (made on first use, memory-mapped afterwards).
- ``loss``: the loss mask: which state features and which window positions
  are supervised.
- ``validation``: rollout horizons and how many validation trajectories to use.

Hooks: ``recipe_sections``, ``build_model``, ``sample``, ``objective``,
``validate`` and ``export`` (v1 and v2 checkpoints, recognized by the
``nerd_arch`` buffer in the model's state dict).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from slhub import LossResult, hookimpl
from slhub.builtin.nerd.artifact import write_export
from slhub.builtin.nerd.cartpole import STATE_NAMES, CartpoleData, ensure_dataset
from slhub.builtin.nerd.model import ARCH_KEY, DTYPES, NerdArch, NerdModel
from slhub.errors import CheckpointError, RecipeError

ANGLE_FEATURE = "theta"

# ------------------------------------------------------------------ recipe sections


class ModelSection(BaseModel):
    """``model``: the network and its precision."""

    model_config = ConfigDict(extra="forbid")

    history: int = Field(default=10, ge=1, le=1024)
    width: int = Field(default=64, ge=1)
    layers: int = Field(default=2, ge=1)
    heads: int = Field(default=4, ge=1)
    mlp_hidden: int | None = Field(default=None, ge=1, description="default: 4 * width")
    causal: bool = True
    normalize: bool = True
    angle_features: bool = True
    precision: Literal["float32", "float64", "bfloat16"] = "float32"

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelSection:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be divisible by heads {self.heads}")
        return self

    def arch(self) -> NerdArch:
        return NerdArch(
            feature_set=1,
            history=self.history,
            width=self.width,
            layers=self.layers,
            heads=self.heads,
            mlp_hidden=self.mlp_hidden or 4 * self.width,
            causal=int(self.causal),
            normalize=int(self.normalize),
            angle_index=STATE_NAMES.index(ANGLE_FEATURE) if self.angle_features else -1,
        )


class SplitSection(BaseModel):
    """One data split: ``num_trajectories`` trajectories of ``length`` steps from ``seed``."""

    model_config = ConfigDict(extra="forbid")

    num_trajectories: int = Field(ge=1)
    length: int = Field(ge=1)
    seed: int = Field(ge=0)


class DataSection(BaseModel):
    """``data``: where the cart-pole cache lives and how it is made."""

    model_config = ConfigDict(extra="forbid")

    cache_dir: str = Field(default=".cache/nerd_cartpole", min_length=1)
    max_force: float = Field(default=10.0, gt=0)
    train: SplitSection = SplitSection(num_trajectories=1000, length=200, seed=0)
    val: SplitSection = SplitSection(num_trajectories=64, length=120, seed=1)

    @model_validator(mode="after")
    def _distinct_seeds(self) -> DataSection:
        if self.train.seed == self.val.seed:
            raise ValueError("train.seed and val.seed must differ (independent validation data)")
        return self


class LossSection(BaseModel):
    """``loss``: the mask of the normalized state-change MSE."""

    model_config = ConfigDict(extra="forbid")

    features: list[Literal[STATE_NAMES]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(STATE_NAMES), min_length=1
    )
    skip_first: int = Field(default=0, ge=0)


class ValidationSection(BaseModel):
    """``validation``: autoregressive rollout horizons and validation set size."""

    model_config = ConfigDict(extra="forbid")

    horizons: list[int] = Field(default_factory=lambda: [10, 100], min_length=1)
    num_trajectories: int | None = Field(default=None, ge=1, description="default: all")

    @model_validator(mode="after")
    def _positive(self) -> ValidationSection:
        if any(h < 1 for h in self.horizons):
            raise ValueError("horizons must be >= 1")
        return self


# ------------------------------------------------------------------ data helpers


def window_batch(
    data: CartpoleData, traj: np.ndarray, start: np.ndarray, history: int
) -> tuple[np.ndarray, np.ndarray]:
    """Tokens ``[B, history, S + A]`` and raw state changes ``[B, history, S]`` (float64).

    ``delta[:, t]`` is ``state[t + 1] - state[t]`` with the angle difference wrapped.
    """
    offsets = np.arange(history + 1)
    rows = traj[:, None]
    states = np.asarray(data.states[rows, start[:, None] + offsets], dtype=np.float64)
    actions = np.asarray(data.actions[rows, start[:, None] + offsets[:-1]], dtype=np.float64)
    tokens = np.concatenate([states[:, :-1], actions], axis=-1)
    return tokens, state_delta(states)


def state_delta(states: np.ndarray) -> np.ndarray:
    """Consecutive state changes along axis 1, the angle wrapped to [-pi, pi)."""
    delta = states[:, 1:] - states[:, :-1]
    index = STATE_NAMES.index(ANGLE_FEATURE)
    delta[..., index] = (delta[..., index] + np.pi) % (2.0 * np.pi) - np.pi
    return delta


def training_statistics(data: CartpoleData) -> tuple[np.ndarray, ...]:
    """Per-feature mean and std of input tokens and of state changes over a whole split."""
    states = np.asarray(data.states, dtype=np.float64)
    tokens = np.concatenate([states[:, :-1], np.asarray(data.actions, dtype=np.float64)], -1)
    tokens = tokens.reshape(-1, tokens.shape[-1])
    delta = state_delta(states).reshape(-1, states.shape[-1])
    floor = 1e-6
    return (
        tokens.mean(0),
        np.maximum(tokens.std(0), floor),
        delta.mean(0),
        np.maximum(delta.std(0), floor),
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ------------------------------------------------------------------ the plugin


class NerdPlugin:
    """NeRD model, cart-pole data, masked MSE, rollout validation and export."""

    def __init__(self) -> None:
        self._train: CartpoleData | None = None
        self._val: CartpoleData | None = None
        self._mask: torch.Tensor | None = None

    @hookimpl
    def recipe_sections(self) -> dict[str, type[BaseModel]]:
        return {
            "model": ModelSection,
            "data": DataSection,
            "loss": LossSection,
            "validation": ValidationSection,
        }

    # -------------------------------------------------------------- construction

    @hookimpl
    def build_model(self, trainer: Any) -> nn.Module:
        model_cfg: ModelSection = trainer.section("model")
        data_cfg: DataSection = trainer.section("data")
        val_cfg: ValidationSection = trainer.section("validation")
        loss_cfg: LossSection = trainer.section("loss")
        arch = model_cfg.arch()
        if data_cfg.train.length < arch.history:
            raise RecipeError(
                f"data.train.length ({data_cfg.train.length}) must be >= model.history "
                f"({arch.history})"
            )
        needed = arch.history + max(val_cfg.horizons) - 1
        if data_cfg.val.length < needed:
            raise RecipeError(
                f"data.val.length ({data_cfg.val.length}) must be >= model.history + "
                f"max(validation.horizons) - 1 = {needed}"
            )
        if loss_cfg.skip_first >= arch.history:
            raise RecipeError(
                f"loss.skip_first ({loss_cfg.skip_first}) leaves no supervised position in a "
                f"history of {arch.history}"
            )
        self._train = ensure_dataset(
            data_cfg.cache_dir,
            "train",
            data_cfg.train.num_trajectories,
            data_cfg.train.length,
            data_cfg.train.seed,
            data_cfg.max_force,
        )
        self._val = ensure_dataset(
            data_cfg.cache_dir,
            "val",
            data_cfg.val.num_trajectories,
            data_cfg.val.length,
            data_cfg.val.seed,
            data_cfg.max_force,
        )
        model = NerdModel(arch).to(DTYPES[model_cfg.precision])
        stats = [torch.from_numpy(s) for s in training_statistics(self._train)]
        model.set_normalization(*stats)
        self._mask = loss_mask(arch, loss_cfg)
        return model

    # -------------------------------------------------------------- every update

    @hookimpl
    def sample(self, trainer: Any, generator: torch.Generator) -> dict[str, torch.Tensor]:
        data = self._require_data()
        history = trainer.section("model").history
        batch = trainer.config.batch_size
        traj = torch.randint(data.num_trajectories, (batch,), generator=generator)
        start = torch.randint(data.length - history + 1, (batch,), generator=generator)
        tokens, delta = window_batch(data, traj.numpy(), start.numpy(), history)
        dtype = DTYPES[trainer.section("model").precision]
        return {
            "tokens": torch.from_numpy(tokens).to(device=trainer.device, dtype=dtype),
            "delta": torch.from_numpy(delta).to(device=trainer.device, dtype=dtype),
        }

    @hookimpl
    def objective(self, trainer: Any, model: nn.Module, batch: dict[str, Any]) -> LossResult:
        tokens, delta = batch["tokens"], batch["delta"]
        prediction = model(tokens)
        loss, weight = masked_mse(
            prediction, _unwrap(model).normalize_target(delta), self._batch_mask(batch, tokens)
        )
        return LossResult(loss=loss, weight=weight)

    def _batch_mask(self, batch: dict[str, Any], tokens: torch.Tensor) -> torch.Tensor:
        if self._mask is None:
            raise RuntimeError("the nerd plugin's build_model has not run")
        length = tokens.shape[1]
        mask = self._mask[-length:].to(tokens.device).expand(tokens.shape[0], -1, -1)
        extra = batch.get("mask")
        if extra is not None:
            mask = mask * extra.to(device=mask.device, dtype=mask.dtype)
        return mask

    # -------------------------------------------------------------- validation

    @hookimpl
    def validate(self, trainer: Any, model: nn.Module, step: int) -> dict[str, float]:
        if self._val is None:
            return {}
        val_cfg: ValidationSection = trainer.section("validation")
        net = _unwrap(model)
        dtype = next(net.parameters()).dtype
        device = next(net.parameters()).device
        return evaluate(net, self._val, val_cfg, self._mask, dtype, device)

    # -------------------------------------------------------------- export

    @hookimpl
    def export(
        self, checkpoint: dict[str, Any], checkpoint_path: Path, out_dir: Path
    ) -> Path | None:
        state = checkpoint.get("model") if isinstance(checkpoint, dict) else None
        if not isinstance(state, dict) or ARCH_KEY not in state:
            return None
        try:
            model = NerdModel.from_state_dict(state)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(
                f"{checkpoint_path} holds a NeRD model that cannot be rebuilt: {exc}"
            ) from None
        run = checkpoint.get("run") if isinstance(checkpoint.get("run"), dict) else {}
        step = checkpoint.get("step")
        provenance = {
            "source_run_id": run.get("run_id"),
            "source": run.get("source"),
            "step": int(step) if isinstance(step, int) else None,
            "checkpoint_format": checkpoint.get("format") or "slhub.checkpoint/1",
            "checkpoint_path": str(checkpoint_path),
            "checkpoint_sha256": file_sha256(Path(checkpoint_path)),
        }
        return write_export(model, Path(out_dir), provenance)

    def _require_data(self) -> CartpoleData:
        if self._train is None:
            raise RuntimeError("the nerd plugin's build_model has not run")
        return self._train


def _unwrap(model: nn.Module) -> NerdModel:
    inner = getattr(model, "module", model)
    if not isinstance(inner, NerdModel):
        raise TypeError(f"the nerd plugin expects a NerdModel, got {type(inner).__name__}")
    return inner


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
    diff[..., index] = torch.remainder(diff[..., index] + np.pi, 2.0 * np.pi) - np.pi
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
