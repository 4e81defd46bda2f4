"""The slhub hook contract: every hook a plugin may implement, in lifecycle order.

This module is the whole contract between the trainer and plugins. The trainer
calls every hook with keyword arguments only, so implementations may accept any
subset of the documented parameters (pluggy matches them by name).

Lifecycle on every rank (the step protocol lives in :mod:`slhub.trainer`):

1. Configuration: :func:`recipe_sections` (which recipe sections a plugin owns).
2. Construction: :func:`build_model`.
3. Every update: :func:`sample` -> :func:`objective` -> :func:`scale_loss`
   -> optimizer step -> :func:`on_commit`.
4. Boundaries: :func:`save` (every rank), :func:`validate` (rank 0 only).
5. Resume: :func:`restore` (every rank, once, before the first update).
6. Export (outside training): :func:`export`.

Built-in defaults are registered with ``trylast=True`` so that a model package
can override them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import torch
    from pydantic import BaseModel
    from torch import nn

    from slhub.trainer import Trainer

PROJECT = "slhub"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass
class LossResult:
    """What an objective returns for one local batch.

    ``loss`` is the local *mean* loss over the valid supervision of this rank's
    batch; ``weight`` is the number of valid supervision elements behind that
    mean. The committed update is the gradient of ``sum(w_r * L_r) / sum(w_r)``
    over ranks, so unequal valid counts are weighted correctly. A rank whose
    weight is 0 contributes nothing, whatever its loss value. ``metrics`` are
    extra scalars logged to metrics.jsonl under ``train/<name>`` (rank 0's
    local values).
    """

    loss: torch.Tensor
    weight: float | int | torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------


@hookspec
def recipe_sections() -> dict[str, type[BaseModel]]:
    """Declare the top-level recipe sections this plugin owns.

    The core validates ``plugin`` and ``trainer`` itself; every other top-level
    key must be claimed by exactly one plugin, whose pydantic model (with
    ``extra="forbid"``) validates it. Validated sections are read back with
    ``trainer.section(name)``.

    :returns: a mapping of section name to pydantic model class. Results of
        all plugins are merged; a section claimed twice is an error.
    """


# --------------------------------------------------------------------------
# Construction
# --------------------------------------------------------------------------


@hookspec(firstresult=True)
def build_model(trainer: Trainer) -> nn.Module:
    """Build the model, once per rank.

    Called with torch seeded from ``trainer.config.seed`` identically on every rank,
    so every rank builds the same initial parameters. The trainer moves the
    module to ``trainer.device`` afterwards. Stops at the first non-None result.

    :param trainer: the running trainer (recipe, device, rank, world size).
    :returns: the model as an ``nn.Module``.
    """


# --------------------------------------------------------------------------
# Every update, every rank
# --------------------------------------------------------------------------


@hookspec(firstresult=True)
def sample(trainer: Trainer, generator: torch.Generator) -> Any:
    """Draw this rank's local batch for one update.

    ``trainer.batch_size`` is per worker. Draw only with ``generator``: it is
    this rank's sampler stream, owned and checkpointed by the trainer, which
    makes a resumed run draw exactly what the uninterrupted run drew.
    Stops at the first non-None result.

    :param trainer: the running trainer.
    :param generator: this rank's sampler generator (CPU).
    :returns: the local batch, in any structure :func:`objective` accepts.
    """


@hookspec(firstresult=True)
def objective(trainer: Trainer, model: nn.Module, batch: Any) -> LossResult:
    """Compute the local mean loss and its valid-supervision count.

    Runs inside the DistributedDataParallel-wrapped computation, so gradients
    of ``model``'s parameters are reduced across ranks. ``trainer.step`` is the
    last committed update while it runs.
    Stops at the first non-None result.

    :param trainer: the running trainer.
    :param model: the model (the original module; its parameters are the ones
        DDP reduces).
    :param batch: what :func:`sample` returned on this rank.
    :returns: a :class:`LossResult`.
    """


@hookspec(firstresult=True)
def scale_loss(trainer: Trainer, result: LossResult, total_weight: float) -> torch.Tensor:
    """Turn a rank's local loss into the tensor that is back-propagated.

    The built-in ``ddp_weighting`` plugin returns
    ``loss * weight * world_size / total_weight`` so that DDP's gradient mean
    equals the gradient of ``sum(w_r * L_r) / sum(w_r)``. It is only called
    when ``total_weight > 0`` and this rank's weight is > 0.
    Stops at the first non-None result.

    :param trainer: the running trainer.
    :param result: this rank's :class:`LossResult`.
    :param total_weight: the sum of every rank's weight for this update.
    :returns: a scalar tensor to call ``backward()`` on.
    """


@hookspec
def on_commit(trainer: Trainer, step: int, result: LossResult, metrics: dict[str, float]) -> None:
    """React to a committed update (metrics, progress, schedules).

    Called on every rank after the optimizer step (also after an update
    skipped because every rank's weight was 0). Must not call collectives:
    ranks reach this point at different times.

    :param trainer: the running trainer.
    :param step: the number of the update just committed (1-based).
    :param result: this rank's :class:`LossResult` for the update.
    :param metrics: the metrics line that rank 0 appends to metrics.jsonl for
        this update; implementations may add keys to it.
    """


# --------------------------------------------------------------------------
# Boundaries
# --------------------------------------------------------------------------


@hookspec
def save(trainer: Trainer) -> dict[str, Any] | None:
    """Contribute this rank's state to the next checkpoint.

    Called on every rank at every validation or save boundary, before
    validation. The merged results of one rank become ``ranks[rank]`` in the
    checkpoint (gathered to rank 0), so store only tensors, numbers, strings,
    lists, tuples, dicts and None. Use a key named after your plugin; a key
    contributed twice is an error.

    :param trainer: the running trainer.
    :returns: ``{key: state}`` or None.
    """


@hookspec
def validate(trainer: Trainer, model: nn.Module, step: int) -> dict[str, float] | None:
    """Evaluate the model at a validation boundary, on rank 0 only.

    ``model`` is the unwrapped module in eval mode under ``torch.no_grad``; the
    random state of every generator is restored afterwards, so validation does
    not change the training stream. May call ``trainer.save()``, which writes the
    state gathered at this boundary and issues no collective. An exception is
    held and fails every rank at the next agreement.

    :param trainer: the running trainer.
    :param model: the unwrapped model.
    :param step: the committed update being validated.
    :returns: ``{name: value}``, logged as ``validation/<name>``.
    """


@hookspec
def restore(trainer: Trainer, state: dict[str, Any]) -> None:
    """Read this rank's state back from a checkpoint on resume.

    Called on every rank once, after model and optimizer are loaded and before
    the first update. ``state`` is this rank's ``ranks[rank]`` entry (for a v1
    checkpoint: ``{"rng": ...}`` only).

    :param trainer: the running trainer.
    :param state: what :func:`save` contributed on this rank, merged.
    """


# --------------------------------------------------------------------------
# Outside training
# --------------------------------------------------------------------------


@hookspec(firstresult=True)
def export(checkpoint: dict[str, Any], checkpoint_path: Path, out_dir: Path) -> Path | None:
    """Export a checkpoint for inference, if this plugin recognizes it.

    ``slhub export`` calls this with every installed plugin registered (and,
    for a v2 checkpoint, the plugin its run names). A plugin that does not
    recognize the checkpoint returns None.
    Stops at the first non-None result.

    :param checkpoint: the loaded checkpoint (v1 or v2 layout).
    :param checkpoint_path: where it was read from (for provenance).
    :param out_dir: an empty directory to write the export into.
    :returns: the export directory, or None when the checkpoint is not this
        plugin's.
    """
