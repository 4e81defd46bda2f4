"""The ``rwm`` slhub plugin: recipe section, model, sampling, objective and validation."""

from __future__ import annotations

import os
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from slhub import LossResult, hookimpl
from slhub.data import SplitCache, ensure_dataset, split_seed

from slhub_rwm.data import Windows, normalization
from slhub_rwm.model import WorldModel

SECTION = "rwm"
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class RwmData(BaseModel):
    """Cart-pole trajectories made on first use under ``cache_dir`` (relative to the cwd)."""

    model_config = ConfigDict(extra="forbid")

    cache_dir: str = ".cache/slhub-rwm"

    @field_validator("cache_dir")
    @classmethod
    def _home(cls, value: str) -> str:
        """``~`` is the user's home, as in a shell, never a directory named ``~``."""
        return os.path.expanduser(value)

    train_trajectories: int = Field(default=64, gt=0)
    val_trajectories: int = Field(default=16, gt=0)
    length: int = Field(default=100, gt=1)
    seed: int = Field(default=0, ge=0)
    max_force: float = Field(default=10.0, gt=0)


class RwmSection(BaseModel):
    """The ``rwm`` recipe section."""

    model_config = ConfigDict(extra="forbid")

    history: int = Field(default=8, gt=0)
    horizon: int = Field(default=3, gt=0)
    hidden: int = Field(default=64, gt=0)
    layers: int = Field(default=1, gt=0)
    val_stride: int = Field(default=5, gt=0)
    precision: Literal["float32", "float64"] = "float32"
    data: RwmData = Field(default_factory=RwmData)

    @model_validator(mode="after")
    def _window_fits(self) -> RwmSection:
        if self.history + self.horizon > self.data.length + 1:
            raise ValueError(
                f"history + horizon = {self.history + self.horizon} states do not fit "
                f"episodes of data.length + 1 = {self.data.length + 1} states"
            )
        return self

    @property
    def span(self) -> int:
        return self.history + self.horizon


class RwmPlugin:
    """Robotic World Model on cart-pole: GRU history encoder, autoregressive forecast."""

    def __init__(self) -> None:
        self._splits: SplitCache[Windows] = SplitCache()

    def _windows(self, cfg: RwmSection, split: str) -> Windows:
        def make(split: str) -> Windows:
            d = cfg.data
            count = d.train_trajectories if split == "train" else d.val_trajectories
            seed = split_seed(d.seed, split)
            data = ensure_dataset(d.cache_dir, split, count, d.length, seed, d.max_force)
            return Windows(data, cfg.span)

        return self._splits.get(cfg, split, make)

    @hookimpl
    def recipe_sections(self) -> dict[str, type[BaseModel]]:
        return {SECTION: RwmSection}

    @hookimpl
    def build_model(self, trainer: Any) -> torch.nn.Module:
        cfg: RwmSection = trainer.section(SECTION)
        stats = normalization(self._windows(cfg, "train").data)
        return WorldModel(cfg.hidden, cfg.layers, stats).to(DTYPES[cfg.precision])

    @hookimpl
    def sample(self, trainer: Any, generator: torch.Generator) -> dict[str, torch.Tensor]:
        cfg: RwmSection = trainer.section(SECTION)
        windows = self._windows(cfg, "train")
        states, actions = windows.gather(*windows.draw(trainer.config.batch_size, generator))
        return _to_batch(states, actions, trainer.device, DTYPES[cfg.precision])

    @hookimpl
    def objective(self, trainer: Any, model: torch.nn.Module, batch: dict) -> LossResult:
        horizon = trainer.section(SECTION).horizon
        err = _forecast_error(model, batch, horizon)
        return LossResult(loss=err.square().mean(), weight=err.numel())

    @hookimpl
    def validate(self, trainer: Any, model: torch.nn.Module, step: int) -> dict[str, float]:
        cfg: RwmSection = trainer.section(SECTION)
        windows = self._windows(cfg, "val")
        states, actions = windows.gather(*windows.grid(cfg.val_stride))
        batch = _to_batch(states, actions, trainer.device, DTYPES[cfg.precision])
        per_step = _forecast_error(model, batch, cfg.horizon).square().mean(dim=(0, 2))
        metrics = {"mse": float(per_step.mean())}
        metrics.update({f"mse_step{k + 1}": float(v) for k, v in enumerate(per_step)})
        return metrics


def _to_batch(states, actions, device, dtype) -> dict[str, torch.Tensor]:
    return {
        "states": torch.as_tensor(states, dtype=dtype, device=device),
        "actions": torch.as_tensor(actions, dtype=dtype, device=device),
    }


def _forecast_error(model, batch: dict[str, torch.Tensor], horizon: int) -> torch.Tensor:
    """Normalized forecast errors ``[B, horizon, 4]``; gradients flow through every step."""
    pred = model(batch["states"], batch["actions"], horizon)
    return model.normalized_error(pred, batch["states"][:, -horizon:])
