"""The built-in ``nerd`` plugin: NeRD (Neural Robot Dynamics) for any robot's episodes.

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

from slhub import LossResult, RecipeError, Trainer, hookimpl
from slhub.builtin.nerd.data import (
    layout_of,
    normalization,
    open_data,
    state_contacts,
    tokens_of,
    window_offsets,
)
from slhub.builtin.nerd.export import export_checkpoint
from slhub.builtin.nerd.loss import (
    batch_mask,
    evaluate,
    loss_mask,
    masked_mse,
    measure_columns,
    rollout_episodes,
)
from slhub.builtin.nerd.model import DTYPES, NerdLayout, NerdModel
from slhub.builtin.nerd.sections import (
    SECTIONS,
    LossSection,
    ModelSection,
    NerdDataSection,
    ValidationSection,
)
from slhub.data import TrainingData, WindowStream

if TYPE_CHECKING:
    from slhub.export import Checkpoint


class NerdPlugin:
    """NeRD model, a dataset's episodes, masked MSE, rollout validation and export."""

    def __init__(self) -> None:
        self._data: TrainingData | None = None
        self._layout: NerdLayout | None = None
        self._mask: torch.Tensor | None = None
        self._stream: WindowStream | None = None
        self._contacts: Any = None

    @hookimpl
    def recipe_sections(self) -> dict[str, type[BaseModel]]:
        return dict(SECTIONS)

    # -------------------------------------------------------------- construction

    @hookimpl
    def build_model(self, trainer: Trainer) -> nn.Module:
        model_cfg: ModelSection = trainer.section("model")
        data_cfg: NerdDataSection = trainer.section("data")
        val_cfg: ValidationSection = trainer.section("validation")
        loss_cfg: LossSection = trainer.section("loss")
        if data_cfg.window.pad:
            raise RecipeError(
                "data.window.pad: NeRD trains on whole windows only (an anchor whose window "
                "leaves its episode is excluded); set it to false"
            )
        if loss_cfg.skip_first >= model_cfg.history:
            raise RecipeError(
                f"loss.skip_first ({loss_cfg.skip_first}) leaves no supervised position in a "
                f"history of {model_cfg.history}"
            )
        data = open_data(data_cfg, trainer)
        layout = layout_of(data, model_cfg)
        arch = model_cfg.arch(layout)
        data.require_anchors(window_offsets(layout, arch.history), "train")
        rollout_episodes(data, arch.history, val_cfg)
        measure_columns(layout, val_cfg)
        self._mask = loss_mask(arch, layout, loss_cfg)
        model = NerdModel(arch, layout).to(DTYPES[model_cfg.precision])
        model.set_normalization(*normalization(data, layout))
        self._data, self._layout = data, layout
        self._contacts = state_contacts(data, layout)
        self._stream = data.stream(  # checkpointed under "nerd", closed with the run
            window_offsets(layout, arch.history), trainer.config.batch_size,
            trainer=trainer, key="nerd",
        )  # fmt: skip
        return model

    # -------------------------------------------------------------- every update

    @hookimpl
    def sample(self, trainer: Trainer, generator: torch.Generator) -> dict[str, torch.Tensor]:
        _, layout = self._require_data()
        assert self._stream is not None
        history = trainer.section("model").history
        window = self._stream.next(generator)
        tokens, delta = tokens_of(window, layout, history)
        dtype = DTYPES[trainer.section("model").precision]
        return {
            "tokens": torch.from_numpy(tokens).to(device=trainer.device, dtype=dtype),
            "delta": torch.from_numpy(delta).to(device=trainer.device, dtype=dtype),
        }

    @hookimpl
    def objective(self, trainer: Trainer, model: nn.Module, batch: dict[str, Any]) -> LossResult:
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
    def validate(self, trainer: Trainer, model: nn.Module, step: int) -> dict[str, float]:
        if self._data is None:
            return {}
        val_cfg: ValidationSection = trainer.section("validation")
        net = _unwrap(model)
        dtype = next(net.parameters()).dtype
        device = next(net.parameters()).device
        return evaluate(net, self._data, val_cfg, self._mask, dtype, device, self._contacts)

    # -------------------------------------------------------------- export

    @hookimpl
    def export(self, checkpoint: Checkpoint, checkpoint_path: Path, out_dir: Path) -> Path | None:
        return export_checkpoint(checkpoint, checkpoint_path, out_dir)

    def _require_data(self) -> tuple[TrainingData, NerdLayout]:
        if self._data is None or self._layout is None:
            raise RuntimeError("the nerd plugin's build_model has not run")
        return self._data, self._layout


def _unwrap(model: nn.Module) -> NerdModel:
    inner = getattr(model, "module", model)
    if not isinstance(inner, NerdModel):
        raise TypeError(f"the nerd plugin expects a NerdModel, got {type(inner).__name__}")
    return inner
