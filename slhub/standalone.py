"""A trainer without a training loop: what ``slhub eval`` and :mod:`slhub.testing` hand
a plugin's hooks.

:class:`Standalone` is a backend of :class:`slhub.view.TrainerView` holding what a
hook may read (config, device, rank, sections, model, optimizer...) in one
process, with nothing to train: ``save()`` writes nothing and ``register_state``
only records the object. Its hooks see the same view, with the same answers
(:class:`slhub.trainer.TrainerBase`), as in a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn

from slhub import rng
from slhub.errors import PluginError
from slhub.optim import OptimSection, ScheduleSection, build_optimizer, build_schedule
from slhub.recipe import TrainerConfig
from slhub.trainer import TrainerBase, sampler_seed
from slhub.view import TrainerView, backend_of


class Standalone(TrainerBase):
    """One rank's trainer state without a loop; hooks receive its :attr:`view`.

    :param plugin: when given, raw section mappings in ``sections`` are
        validated with the models its ``recipe_sections`` hook declares, and
        sections it declares but ``sections`` omits get their defaults.
    :param sections: section name -> validated pydantic model or raw mapping.
    :param device: the device; default ``trainer.device`` when given (``auto``:
        CUDA when visible, else CPU), else CPU.
    :param trainer: ``trainer:`` keys (``batch_size``, ``seed``, ``lr``,
        ``output_dir``...); ``steps=1``, ``batch_size=8``, ``lr=1e-3`` and
        ``output_dir`` are filled in when absent.

    ``step``, ``model``, ``optimizer`` and ``scheduler`` may be set directly (the
    view reads them live). ``save()`` records the names it was asked for in
    :attr:`saved` and writes nothing; ``register_state`` keeps the objects in
    :attr:`registered`.
    """

    def __init__(
        self,
        plugin: Any = None,
        sections: Mapping[str, Any] | None = None,
        *,
        device: str | torch.device | None = None,
        rank: int = 0,
        world_size: int = 1,
        step: int = 0,
        **trainer: Any,
    ) -> None:
        keys = {"steps": 1, "batch_size": 8, "lr": 1e-3, "output_dir": "outputs/stand-in"}
        self.config = TrainerConfig.model_validate({**keys, **trainer})
        choice = device if device is not None else trainer.get("device", "cpu")
        if isinstance(choice, str) and choice == "auto":
            choice = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(choice)
        self.rank = rank
        self.world_size = world_size
        self.step = step
        self.output_dir = Path(self.config.output_dir)
        self.run_id: str | None = "stand-in"
        self.generator = torch.Generator().manual_seed(sampler_seed(self.config.seed, rank))
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        #: What :meth:`record_dataset` recorded, by name.
        self.datasets: dict[str, dict[str, Any]] = {}
        self.saved: list[str | None] = []
        self.registered: dict[str, Any] = {}
        self._sections = validated_sections(plugin, dict(sections or {}))
        #: What hooks receive as ``trainer``.
        self.view = TrainerView(self)

    def save(self, name: str | None = None) -> Path | None:
        self.saved.append(name)
        return None

    def register_state(self, name: str, obj: Any) -> None:
        """Keep ``obj`` under ``name`` (nothing is checkpointed without a loop)."""
        for method in ("state_dict", "load_state_dict"):
            if not callable(getattr(obj, method, None)):
                raise PluginError(
                    f"register_state({name!r}): {type(obj).__name__} has no {method}()"
                )
        if name in self.registered:
            raise PluginError(f"checkpoint state {name!r} is registered twice (register_state)")
        self.registered[name] = obj

    def close(self) -> None:
        """Close the registered objects that have ``close()`` (a stream's decode threads),
        newest first and once, as a run does when it ends."""
        registered, self.registered = self.registered, {}
        for obj in reversed(registered.values()):
            if callable(getattr(obj, "close", None)):
                obj.close()

    def build(
        self, plugin: Any, optim: Mapping[str, Any] | None = None, schedule: Any = None
    ) -> nn.Module:
        """Call ``plugin.build_model`` seeded as the loop seeds it; keep the model and give
        it the optimizer and schedule the built-in default makes from the recipe sections
        ``optim`` and ``schedule`` (given as mappings; default Adam, constant)."""
        rng.seed_everything(self.config.seed)
        model = plugin.build_model(trainer=self.view)
        self.model = model.to(self.device)
        self.optimizer = build_optimizer(
            self.model.parameters(), self.config.lr, OptimSection.model_validate(optim or {})
        )
        self.scheduler = build_schedule(
            self.optimizer, ScheduleSection.model_validate(schedule or {}), self.config.steps
        )
        return self.model


def standalone_trainer(
    plugin: Any = None,
    sections: Mapping[str, Any] | None = None,
    *,
    device: str | torch.device | None = None,
    rank: int = 0,
    world_size: int = 1,
    step: int = 0,
    **trainer: Any,
) -> TrainerView:
    """The view of a new :class:`Standalone` (same parameters)."""
    backend = Standalone(
        plugin, sections, device=device, rank=rank, world_size=world_size, step=step, **trainer
    )
    return backend.view


def standalone_of(view: Any) -> Standalone:
    """The :class:`Standalone` behind ``view`` (:func:`standalone_trainer`'s result)."""
    backend = backend_of(view)
    if not isinstance(backend, Standalone):
        raise TypeError(f"this trainer is a view of {type(backend).__name__}, not of Standalone")
    return backend


def validated_sections(plugin: Any, sections: dict[str, Any]) -> dict[str, Any]:
    """``sections`` validated with the models ``plugin.recipe_sections`` declares
    (defaults for the ones omitted); unchanged without a plugin."""
    if plugin is None or not hasattr(plugin, "recipe_sections"):
        return sections
    models: dict[str, type[BaseModel]] = plugin.recipe_sections() or {}
    unknown = sorted(set(sections) - set(models))
    if unknown:
        raise PluginError(f"the plugin owns no section {', '.join(unknown)}")
    out = {}
    for name, model in models.items():
        value = sections.get(name, {})
        out[name] = value if isinstance(value, BaseModel) else model.model_validate(value or {})
    return out
