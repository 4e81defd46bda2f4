"""The sl_ddp example: a ``4 -> 32 -> 2`` MLP fitted to a fixed synthetic corpus.

Target 1 is a linear combination of the inputs and is always supervised.
Target 2 adds a sine term and is supervised only where input 2 is positive, so
local batches carry different numbers of valid targets; the objective returns
the masked mean squared error and ``weight = mask.sum()``. The corpora are made
from fixed seeds, identically on every rank; the validation corpus is
independent of the training corpus.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from slhub import LossResult, hookimpl

COEFFICIENTS = np.array([0.5, -1.0, 0.25, 2.0])


class CorpusConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train_size: int = Field(default=4096, gt=0)
    validation_size: int = Field(default=1024, gt=0)
    train_seed: int = Field(default=1234, ge=0)
    validation_seed: int = Field(default=4321, ge=0)


class MlpConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hidden: int = Field(default=32, gt=0)


def make_corpus(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs ``[size, 4]``, targets ``[size, 2]`` and the supervision mask ``[size, 2]``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(size, 4))
    linear = x @ COEFFICIENTS + 0.1
    targets = np.stack([linear, linear + np.sin(3.0 * x[:, 0])], axis=1)
    mask = np.stack([np.ones(size), (x[:, 2] > 0).astype(np.float64)], axis=1)
    as_tensor = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
    return as_tensor(x), as_tensor(targets), as_tensor(mask)


def masked_mse(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> tuple:
    """Mean squared error over supervised elements, and their count."""
    count = mask.sum()
    loss = ((pred - target) ** 2 * mask).sum() / count.clamp(min=1)
    return loss, count


class SlDdpPlugin:
    """Model plugin for ``plugin: examples.sl_ddp.plugin:SlDdpPlugin``."""

    def __init__(self) -> None:
        self.train_corpus: tuple[torch.Tensor, ...] | None = None
        self.validation_corpus: tuple[torch.Tensor, ...] | None = None

    @hookimpl
    def recipe_sections(self):
        return {"data": CorpusConfig, "model": MlpConfig}

    @hookimpl
    def build_model(self, trainer) -> nn.Module:
        data: CorpusConfig = trainer.section("data")
        hidden = trainer.section("model").hidden
        # on the device once, not a batch copy every update
        on_device = lambda corpus: tuple(t.to(trainer.device) for t in corpus)  # noqa: E731
        self.train_corpus = on_device(make_corpus(data.train_size, data.train_seed))
        self.validation_corpus = on_device(make_corpus(data.validation_size, data.validation_seed))
        return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 2))

    @hookimpl
    def sample(self, trainer, generator: torch.Generator):
        x, y, mask = self.train_corpus
        index = torch.randint(0, x.shape[0], (trainer.batch_size,), generator=generator)
        return x[index], y[index], mask[index]

    @hookimpl
    def objective(self, trainer, model: nn.Module, batch) -> LossResult:
        x, y, mask = batch
        loss, count = masked_mse(model(x), y, mask)
        supervised = float(count)  # one host read (a sync on a GPU) for weight and metric
        return LossResult(loss=loss, weight=supervised, metrics={"supervised": supervised})

    @hookimpl
    def validate(self, trainer, model: nn.Module, step: int) -> dict[str, float]:
        x, y, mask = self.validation_corpus
        loss, _ = masked_mse(model(x), y, mask)
        return {"mse": float(loss)}
