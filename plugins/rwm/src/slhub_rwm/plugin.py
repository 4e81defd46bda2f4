"""The ``rwm`` slhub plugin: recipe sections, model, sampling, objective and validation.

The hook class only; the recipe sections are in :mod:`slhub_rwm.sections`, the
roles, windows and normalization in :mod:`slhub_rwm.data` and the network in
:mod:`slhub_rwm.model`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel
from slhub import LossResult, RecipeError, Trainer, hookimpl
from slhub.data import TrainingData, WindowStream

from slhub_rwm.data import (
    batch_of,
    layout_of,
    normalization,
    open_data,
    validation_anchors,
    window_offsets,
)
from slhub_rwm.export import export_checkpoint
from slhub_rwm.model import RwmLayout, WorldModel
from slhub_rwm.sections import SECTION, SECTIONS, RwmDataSection, RwmSection

DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: Validation windows evaluated at once (bounds memory on a large held-out split).
VALIDATION_CHUNK = 4096


class RwmPlugin:
    """Robotic World Model for any robot's episodes: GRU history encoder, autoregressive
    forecast, relative-error validation on held-out episodes."""

    def __init__(self) -> None:
        self._data: TrainingData | None = None
        self._layout: RwmLayout | None = None
        self._val_anchors: np.ndarray | None = None
        self._stream: WindowStream | None = None

    @hookimpl
    def recipe_sections(self) -> dict[str, type[BaseModel]]:
        return dict(SECTIONS)

    @hookimpl
    def build_model(self, trainer: Trainer) -> torch.nn.Module:
        cfg: RwmSection = trainer.section(SECTION)
        data_cfg: RwmDataSection = trainer.section("data")
        if data_cfg.window.pad:
            raise RecipeError(
                "data.window.pad: RWM trains on whole windows only (an anchor whose window "
                "leaves its episode is excluded); set it to false"
            )
        data = open_data(data_cfg, trainer)
        layout = layout_of(data, cfg)
        offsets = window_offsets(layout, cfg.history, cfg.horizon)
        # refuses short episodes; checkpointed under "rwm" and closed with the run
        self._stream = data.stream(offsets, trainer.config.batch_size, trainer=trainer, key=SECTION)
        self._val_anchors = validation_anchors(data, layout, cfg.val_stride)
        model = WorldModel(layout).to(DTYPES[cfg.precision])
        model.set_normalization(*normalization(data, layout))
        self._data, self._layout = data, layout
        return model

    @hookimpl
    def sample(self, trainer: Trainer, generator: torch.Generator) -> dict[str, torch.Tensor]:
        cfg: RwmSection = trainer.section(SECTION)
        _, layout = self._require_data()
        assert self._stream is not None
        window = self._stream.next(generator)
        return batch_of(window, layout, trainer.device, DTYPES[cfg.precision])

    @hookimpl
    def objective(self, trainer: Trainer, model: torch.nn.Module, batch: dict) -> LossResult:
        horizon = trainer.section(SECTION).horizon
        err = _forecast_error(model, batch, horizon)
        return LossResult(loss=err.square().mean(), weight=err.numel())

    @hookimpl
    def validate(self, trainer: Trainer, model: torch.nn.Module, step: int) -> dict[str, float]:
        """``mse`` (the training loss) and ``mse_stepK`` per forecast step, and RWM's
        relative error Σ|ŝ − s| / Σ|s| over the forecast after the context, with the
        same ratio for the state held at its last true value (``baseline_relative_error``)."""
        if self._data is None or self._val_anchors is None:
            return {}
        cfg: RwmSection = trainer.section(SECTION)
        data, layout = self._require_data()
        offsets = window_offsets(layout, cfg.history, cfg.horizon)
        net = _unwrap(model)
        squares = torch.zeros(cfg.horizon, dtype=torch.float64)
        error = baseline = scale = 0.0
        for start in range(0, len(self._val_anchors), VALIDATION_CHUNK):
            anchors = self._val_anchors[start : start + VALIDATION_CHUNK]
            batch = batch_of(
                data.read(offsets, anchors), layout, trainer.device, DTYPES[cfg.precision]
            )
            pred = net(batch["states"], batch["inputs"], cfg.horizon)
            truth = batch["states"][:, -cfg.horizon :]
            err = net.normalized_error(pred, truth).double().square()
            squares += err.sum(dim=(0, 2)).cpu()
            held = batch["states"][:, cfg.history - 1 : cfg.history].expand_as(truth)
            part, total = net.relative_error(pred, truth)
            error, scale = error + part, scale + total
            baseline += net.relative_error(held, truth)[0]
        per_step = squares / (len(self._val_anchors) * layout.state_dim)
        metrics = {"mse": float(per_step.mean())}
        metrics.update({f"mse_step{k + 1}": float(v) for k, v in enumerate(per_step)})
        scale = max(scale, float(np.finfo(np.float64).tiny))
        metrics["relative_error"] = error / scale
        metrics["baseline_relative_error"] = baseline / scale
        return metrics

    @hookimpl
    def export(self, checkpoint: Any, checkpoint_path: Path, out_dir: Path) -> Path | None:
        """``model.safetensors`` and ``export.json`` (:mod:`slhub_rwm.export`)."""
        return export_checkpoint(checkpoint, checkpoint_path, out_dir)

    def _require_data(self) -> tuple[TrainingData, RwmLayout]:
        if self._data is None or self._layout is None:
            raise RuntimeError("the rwm plugin's build_model has not run")
        return self._data, self._layout


def _unwrap(model: torch.nn.Module) -> WorldModel:
    inner = getattr(model, "module", model)
    if not isinstance(inner, WorldModel):
        raise TypeError(f"the rwm plugin expects a WorldModel, got {type(inner).__name__}")
    return inner


def _forecast_error(model, batch: dict[str, torch.Tensor], horizon: int) -> torch.Tensor:
    """Normalized forecast errors ``[B, horizon, S]``; gradients flow through every step."""
    pred = model(batch["states"], batch["inputs"], horizon)
    return _unwrap(model).normalized_error(pred, batch["states"][:, -horizon:])
