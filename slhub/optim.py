"""Optimizer, learning-rate schedule and mixed precision, built from the recipe.

The recipe sections ``optim`` and ``schedule`` are owned by the built-in
``optimization`` plugin (its ``configure_optimizers`` default builds from them);
``trainer.grad_clip_norm``, ``trainer.accumulate`` and ``trainer.precision`` are
the loop's. Everything here is a pure function of the recipe, so a resumed run
rebuilds exactly the optimizer and schedule it saved the state of.

The schedule is a multiplier of ``trainer.lr`` that depends only on the number
of the update: update ``k`` (1-based) trains with ``lr * multiplier(k - 1)``.
It advances on every update, including one skipped because every weight was 0
or because fp16 gradients overflowed, so the learning rate of an update never
depends on what happened before it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from slhub.errors import RecipeError

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

#: Which ``optim`` keys apply to which optimizer.
_APPLIES = {
    "betas": ("adam", "adamw"),
    "eps": ("adam", "adamw"),
    "momentum": ("sgd",),
    "nesterov": ("sgd",),
}
#: Schedule keys only some schedules read.
_SCHEDULE_APPLIES = {
    "every": ("step",),
    "gamma": ("step",),
    "min_lr_ratio": ("cosine", "linear", "step"),
}


def applicable(section: str, values: dict) -> dict:
    """The keys of a recorded ``optim`` or ``schedule`` section that its named optimizer
    or schedule reads (``slhub inspect`` shows no momentum for adam)."""
    table = _APPLIES if section == "optim" else _SCHEDULE_APPLIES
    name = values.get("name")
    return {k: v for k, v in values.items() if k not in table or name in table[k]}


class OptimSection(BaseModel):
    """``optim``: which optimizer steps the parameters (``trainer.lr`` is its learning rate)."""

    model_config = _STRICT

    name: Literal["adam", "adamw", "sgd"] = "adam"
    betas: tuple[float, float] = Field(default=(0.9, 0.999), strict=False)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    momentum: float = Field(default=0.0, ge=0, lt=1)
    nesterov: bool = False

    @model_validator(mode="after")
    def _applies(self) -> OptimSection:
        for key, names in _APPLIES.items():
            if key in self.model_fields_set and self.name not in names:
                raise ValueError(f"{key} applies to {' and '.join(names)} only, not {self.name}")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {list(self.betas)}")
        if self.nesterov and self.momentum <= 0:
            raise ValueError("nesterov needs momentum > 0")
        return self


class ScheduleSection(BaseModel):
    """``schedule``: the learning-rate multiplier over the run's updates."""

    model_config = _STRICT

    name: Literal["constant", "cosine", "linear", "step"] = "constant"
    warmup_steps: int = Field(default=0, ge=0)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    every: int | None = Field(default=None, gt=0)
    gamma: float = Field(default=0.1, gt=0, le=1)

    @model_validator(mode="after")
    def _step_keys(self) -> ScheduleSection:
        if self.name == "step" and self.every is None:
            raise ValueError("step decay needs every (updates between decays)")
        for key in ("every", "gamma"):
            if key in self.model_fields_set and self.name != "step":
                raise ValueError(f"{key} applies to the step schedule only, not {self.name}")
        return self


def build_optimizer(
    params: Iterable[torch.nn.Parameter] | Iterable[dict], lr: float, cfg: OptimSection
) -> torch.optim.Optimizer:
    """The optimizer ``cfg`` names, with learning rate ``lr``."""
    if cfg.name == "sgd":
        return torch.optim.SGD(
            params,
            lr=lr,
            momentum=cfg.momentum,
            nesterov=cfg.nesterov,
            weight_decay=cfg.weight_decay,
        )
    kind = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
    return kind(params, lr=lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)


def lr_multiplier(cfg: ScheduleSection, steps: int) -> Callable[[int], float]:
    """``f(i)``: the multiplier of the base lr for the update after ``i`` committed ones.

    Linear warmup from ``1/warmup_steps`` to 1 over the first ``warmup_steps``
    updates, then the decay, never below ``min_lr_ratio`` (except during warmup).
    """
    if cfg.warmup_steps >= steps:
        raise RecipeError(
            f"schedule.warmup_steps ({cfg.warmup_steps}) must be smaller than trainer.steps "
            f"({steps}): the warmup would never end"
        )
    warmup, floor = cfg.warmup_steps, cfg.min_lr_ratio
    span = max(1, steps - warmup)

    def decay(done: int) -> float:
        progress = min(1.0, done / span)
        if cfg.name == "cosine":
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        if cfg.name == "linear":
            return floor + (1 - floor) * (1 - progress)
        if cfg.name == "step":
            assert cfg.every is not None
            return max(floor, cfg.gamma ** (done // cfg.every))
        return 1.0

    def multiplier(i: int) -> float:
        if i < warmup:
            return (i + 1) / warmup
        return decay(i - warmup)

    return multiplier


def build_schedule(
    optimizer: torch.optim.Optimizer, cfg: ScheduleSection, steps: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """A ``LambdaLR`` stepped once per update; its state is the number of updates done.

    None for a constant rate without warmup: there is nothing to step or to save, and
    a ``LambdaLR`` would cost every update its step and its wrapper around
    ``optimizer.step`` (about 2% of the sl_ddp update on CPU, docs/performance.md).
    """
    if cfg.name == "constant" and cfg.warmup_steps == 0:
        return None
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(cfg, steps))


# ---------------------------------------------------------------- precision

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")
Precision = Literal["fp32", "bf16-mixed", "fp16-mixed"]


class MixedPrecision:
    """Autocast for the objective, and the fp16 gradient scaler (whose state is checkpointed).

    Autocast lowers float32 operations: a model built in float64 (NeRD's
    ``model.precision``) keeps its dtype, a bfloat16 one keeps it under
    bf16-mixed; do not combine a bfloat16 model with fp16-mixed.
    """

    def __init__(self, precision: Precision, device: torch.device) -> None:
        if precision == "fp16-mixed" and device.type != "cuda":
            raise RecipeError(
                f"trainer.precision fp16-mixed needs a CUDA device (this worker has "
                f"{device}); use bf16-mixed or fp32 on CPU"
            )
        self.precision = precision
        self.device = device
        self.dtype = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16-mixed" else None

    def autocast(self) -> AbstractContextManager:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)
