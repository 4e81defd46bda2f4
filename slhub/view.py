"""What every hook receives as ``trainer``: the :class:`slhub.Trainer` protocol, nothing more.

The object behind a run (the loop, or the standalone backend of ``slhub eval`` and
:mod:`slhub.testing`) holds the plugin manager, the checkpoint component, the
recipe and more. A :class:`TrainerView` forwards exactly the protocol's members to
it, each read live (``step``, ``run_id`` and ``model`` change as the run goes on),
and refuses everything else, so a plugin cannot come to depend on the engine and a
plugin's unit test passes only where a real run would.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from slhub.hookspecs import Trainer

if TYPE_CHECKING:
    import torch
    from torch import nn


def protocol_members(protocol: type) -> frozenset[str]:
    """The public names a protocol class declares: its annotated attributes, methods
    and properties."""
    names = set(getattr(protocol, "__annotations__", {}))
    names.update(name for name in vars(protocol) if not name.startswith("_"))
    return frozenset(names)


#: The names a hook may read on ``trainer``: the members of :class:`slhub.Trainer`.
MEMBERS: frozenset[str] = protocol_members(Trainer)


#: Why an attribute outside the protocol is refused, and what there is instead.
_ONLY = f"hooks receive the slhub.Trainer view, whose members are {', '.join(sorted(MEMBERS))}"


class TrainerView:
    """One rank's :class:`slhub.Trainer`: the protocol's members, forwarded to ``backend``.

    ``backend`` is any object with those members (the loop, or
    :class:`slhub.standalone.Standalone`). Reading any other attribute, or setting
    any attribute, raises :class:`AttributeError` naming the members.
    """

    __slots__ = ("_backend",)

    def __init__(self, backend: Any) -> None:
        object.__setattr__(self, "_backend", backend)

    @property
    def config(self) -> Any:
        """The validated ``trainer:`` section."""
        return self._backend.config

    @property
    def device(self) -> torch.device:
        """This rank's device."""
        return self._backend.device

    @property
    def rank(self) -> int:
        """Global rank."""
        return self._backend.rank

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self._backend.world_size

    @property
    def step(self) -> int:
        """The last committed update (0 before the first), read now."""
        return self._backend.step

    @property
    def output_dir(self) -> Path:
        """The run directory."""
        return self._backend.output_dir

    @property
    def run_id(self) -> str | None:
        """The run's id, read now (None until training starts)."""
        return self._backend.run_id

    @property
    def model(self) -> nn.Module:
        """The original, unwrapped model (after ``build_model``)."""
        return self._backend.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer stepping ``model``'s parameters."""
        return self._backend.optimizer

    @property
    def scheduler(self) -> Any:
        """The learning-rate schedule, or None."""
        return self._backend.scheduler

    @property
    def generator(self) -> torch.Generator:
        """This rank's sampler generator."""
        return self._backend.generator

    @property
    def is_main(self) -> bool:
        """True on rank 0."""
        return self._backend.is_main

    @property
    def batch_size(self) -> int:
        """The per-worker batch size."""
        return self._backend.batch_size

    def section(self, name: str) -> Any:
        """The validated recipe section ``name``."""
        return self._backend.section(name)

    def record_dataset(self, name: str, dataset: Any, split: Any = None) -> dict[str, Any]:
        """Record ``dataset`` (and its ``split``) in the run identity."""
        return self._backend.record_dataset(name, dataset, split)

    def save(self, name: str | None = None) -> Path | None:
        """Write a checkpoint of the committed state now."""
        return self._backend.save(name)

    def register_state(self, name: str, obj: Any) -> None:
        """Register ``obj`` (``state_dict``/``load_state_dict``) with the checkpoints."""
        self._backend.register_state(name, obj)

    def __getattr__(self, name: str) -> Any:
        # reached only when the lookup above failed: a member the backend does not hold
        # yet (``model`` inside ``build_model``), or a name outside the protocol
        if name in MEMBERS:
            raise AttributeError(f"trainer.{name} is not available yet at this point of the run")
        raise AttributeError(f"trainer has no attribute {name!r}: {_ONLY}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot set trainer.{name}: {_ONLY} (read-only)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete trainer.{name}: the slhub.Trainer view is read-only")

    def __repr__(self) -> str:
        return f"<slhub.Trainer view: rank {self.rank} of {self.world_size}>"


def backend_of(view: TrainerView) -> Any:
    """The object ``view`` forwards to: for slhub's own helpers that built it
    (:mod:`slhub.testing`'s stand-in, ``slhub eval``), never for a plugin."""
    if not isinstance(view, TrainerView):
        raise TypeError(f"expected a slhub.Trainer view, got {type(view).__name__}")
    return object.__getattribute__(view, "_backend")
