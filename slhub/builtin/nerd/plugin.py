"""The built-in ``nerd`` plugin: NeRD (Neural Robot Dynamics) on cart-pole data.

This module is the hook class only; each concern it wires together has its
own module: recipe sections (:mod:`~slhub.builtin.nerd.sections`), splits and
windows (:mod:`~slhub.builtin.nerd.data`), the network
(:mod:`~slhub.builtin.nerd.model`), loss and evaluation
(:mod:`~slhub.builtin.nerd.loss`) and export (:mod:`~slhub.builtin.nerd.export`).

Hooks: ``recipe_sections``, ``build_model``, ``sample``, ``objective``,
``validate`` and ``export`` (v1 and v2 checkpoints, recognized by the
``nerd_arch`` buffer in the model's state dict).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel
from torch import nn

from slhub import LossResult, RecipeError, hookimpl
from slhub.builtin.nerd.data import cached_statistics, open_splits, window_batch
from slhub.builtin.nerd.export import export_checkpoint
from slhub.builtin.nerd.loss import batch_mask, evaluate, loss_mask, masked_mse
from slhub.builtin.nerd.model import DTYPES, NerdModel
from slhub.builtin.nerd.sections import (
    SECTIONS,
    DataSection,
    LossSection,
    ModelSection,
    ValidationSection,
)
from slhub.data import CartpoleData

if TYPE_CHECKING:
    from slhub.export import Checkpoint


class NerdPlugin:
    """NeRD model, cart-pole data, masked MSE, rollout validation and export."""

    def __init__(self) -> None:
        self._train: CartpoleData | None = None
        self._val: CartpoleData | None = None
        self._mask: torch.Tensor | None = None

    @hookimpl
    def recipe_sections(self) -> dict[str, type[BaseModel]]:
        return dict(SECTIONS)

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
        self._train, self._val = open_splits(data_cfg)
        model = NerdModel(arch).to(DTYPES[model_cfg.precision])
        stats = [torch.from_numpy(s) for s in cached_statistics(data_cfg, self._train)]
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
        if self._mask is None:
            raise RuntimeError("the nerd plugin's build_model has not run")
        tokens, delta = batch["tokens"], batch["delta"]
        prediction = model(tokens)
        loss, weight = masked_mse(
            prediction,
            _unwrap(model).normalize_target(delta),
            batch_mask(self._mask, batch, tokens),
        )
        return LossResult(loss=loss, weight=weight)

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
    def export(self, checkpoint: Checkpoint, checkpoint_path: Path, out_dir: Path) -> Path | None:
        return export_checkpoint(checkpoint, checkpoint_path, out_dir)

    def _require_data(self) -> CartpoleData:
        if self._train is None:
            raise RuntimeError("the nerd plugin's build_model has not run")
        return self._train


def _unwrap(model: nn.Module) -> NerdModel:
    inner = getattr(model, "module", model)
    if not isinstance(inner, NerdModel):
        raise TypeError(f"the nerd plugin expects a NerdModel, got {type(inner).__name__}")
    return inner
