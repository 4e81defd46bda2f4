"""Optimizer and schedule from the recipe: the default of ``configure_optimizers``.

Owns the recipe sections ``optim`` (adam, adamw or sgd and their keys) and
``schedule`` (constant, cosine, linear or step, with warmup and a floor); both
have defaults, so a recipe without them trains with Adam at a constant
``trainer.lr``. A plugin that implements ``configure_optimizers`` replaces this.
"""

from __future__ import annotations

from typing import Any

from slhub import OptimSection, ScheduleSection, Trainer, build_optimizer, build_schedule, hookimpl


@hookimpl(trylast=True)
def recipe_sections() -> dict[str, Any]:
    return {"optim": OptimSection, "schedule": ScheduleSection}


@hookimpl(trylast=True)
def configure_optimizers(trainer: Trainer, model):
    optimizer = build_optimizer(model.parameters(), trainer.config.lr, trainer.section("optim"))
    return optimizer, build_schedule(optimizer, trainer.section("schedule"), trainer.config.steps)
