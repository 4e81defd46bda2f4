"""The ``rigidformer`` slhub plugin: recipe section, model, sampling, objective, validation."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from slhub import LossResult, Trainer, hookimpl
from slhub.data import SplitCache, split_seed

from slhub_rigidformer.model import RigidFormer
from slhub_rigidformer.scenes import Scenes, normalization, simulate

SECTION = "rigidformer"
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class SceneConfig(BaseModel):
    """Scene generation (see :mod:`slhub_rigidformer.scenes`); made in memory at build time."""

    model_config = ConfigDict(extra="forbid")

    train_scenes: int = Field(default=256, gt=0)
    val_scenes: int = Field(default=64, gt=0)
    steps: int = Field(default=30, ge=2)
    seed: int = Field(default=0, ge=0)
    min_objects: int = Field(default=1, ge=1)
    max_objects: int = Field(default=6, ge=1)
    dt: float = Field(default=0.05, gt=0)
    gravity: float = 9.8
    restitution: float = Field(default=0.5, ge=0, le=1)
    friction: float = Field(default=0.8, ge=0, le=1)
    spin_damping: float = Field(default=0.8, ge=0, le=1)

    @model_validator(mode="after")
    def _counts(self) -> SceneConfig:
        if self.min_objects > self.max_objects:
            raise ValueError("min_objects must be <= max_objects")
        return self

    def make(self, split: str) -> Scenes:
        """The ``train`` split (``seed``) or the validation split (``seed + 1``)."""
        train = split == "train"
        params = self.model_dump(exclude={"train_scenes", "val_scenes", "seed"})
        count = self.train_scenes if train else self.val_scenes
        return simulate(count, seed=split_seed(self.seed, split), **params)


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    width: int = Field(default=64, gt=0)
    heads: int = Field(default=4, gt=0)
    layers: int = Field(default=2, gt=0)
    ff: int = Field(default=128, gt=0)


class RigidFormerSection(BaseModel):
    """The ``rigidformer`` recipe section."""

    model_config = ConfigDict(extra="forbid")

    scenes: SceneConfig = Field(default_factory=SceneConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    val_stride: int = Field(default=3, gt=0)
    precision: Literal["float32", "float64"] = "float32"


class RigidFormerPlugin:
    """Next-step motion of every box in a scene, one transformer token per box."""

    def __init__(self) -> None:
        self._splits: SplitCache[Scenes] = SplitCache()

    def _scenes(self, cfg: RigidFormerSection, split: str) -> Scenes:
        return self._splits.get(cfg, split, cfg.scenes.make)

    @hookimpl
    def recipe_sections(self) -> dict[str, type[BaseModel]]:
        return {SECTION: RigidFormerSection}

    @hookimpl
    def build_model(self, trainer: Trainer) -> torch.nn.Module:
        cfg: RigidFormerSection = trainer.section(SECTION)
        stats = normalization(self._scenes(cfg, "train"))
        return RigidFormer(stats, **cfg.model.model_dump()).to(DTYPES[cfg.precision])

    @hookimpl
    def sample(self, trainer: Trainer, generator: torch.Generator) -> dict[str, torch.Tensor]:
        cfg: RigidFormerSection = trainer.section(SECTION)
        scenes = self._scenes(cfg, "train")
        size = (trainer.config.batch_size,)
        scene = torch.randint(0, scenes.num_scenes, size, generator=generator).numpy()
        t = torch.randint(1, scenes.steps, size, generator=generator).numpy()
        return _to_batch(scenes.examples(scene, t), trainer.device, DTYPES[cfg.precision])

    @hookimpl
    def objective(self, trainer: Trainer, model: torch.nn.Module, batch: dict) -> LossResult:
        sq, count = _squared_error(model, batch)
        return LossResult(loss=sq.sum() / max(count, 1), weight=count)

    @hookimpl
    def validate(self, trainer: Trainer, model: torch.nn.Module, step: int) -> dict[str, float]:
        cfg: RigidFormerSection = trainer.section(SECTION)
        scenes = self._scenes(cfg, "val")
        t = np.arange(1, scenes.steps, cfg.val_stride)
        scene = np.repeat(np.arange(scenes.num_scenes), len(t))
        example = scenes.examples(scene, np.tile(t, scenes.num_scenes))
        batch = _to_batch(example, trainer.device, DTYPES[cfg.precision])
        sq, count = _squared_error(model, batch)
        return {"mse": float(sq.sum() / count)}


def _to_batch(example, device, dtype) -> dict[str, torch.Tensor]:
    features, targets, valid = example
    return {
        "features": torch.as_tensor(features, dtype=dtype, device=device),
        "targets": torch.as_tensor(targets, dtype=dtype, device=device),
        "valid": torch.as_tensor(valid, dtype=torch.bool, device=device),
    }


def _squared_error(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Squared normalized errors ``[B, M, 8]`` (zero on padded slots) and the valid count.

    The count is valid objects x target dims: the loss is a mean over real objects only.
    """
    pred = model(batch["features"], batch["valid"])
    err = pred - model.normalize_targets(batch["targets"])
    valid = batch["valid"][..., None]
    sq = torch.where(valid, err.square(), torch.zeros((), dtype=err.dtype, device=err.device))
    return sq, int(valid.sum()) * err.shape[-1]
