"""The slhub hook contract: every hook a plugin may implement, in lifecycle order.

This module is the whole contract between the loop and plugins, and it imports
nothing of slhub's implementation: what hooks receive as ``trainer`` is the
:class:`Trainer` protocol below, not the engine. The loop calls every hook with
keyword arguments only, so implementations may accept any subset of the
documented parameters (pluggy matches them by name).

A run registers the built-in plugins, the recipe's extra ``plugins:`` and its
one model plugin (``plugin:``). Lifecycle, on every rank unless stated
(the step protocol itself is the docstring of :mod:`slhub.trainer`):

1. Configuration: :func:`recipe_sections` (which recipe sections a plugin owns).
2. Construction: :func:`build_model`, :func:`configure_optimizers`.
3. Resume: :func:`load_state_dict` (once, before the first update).
4. Admission: :func:`admit` (refuse the run before rank 0 writes anything).
5. Every update: :func:`sample` -> :func:`objective` -> :func:`scale_loss`
   -> optimizer step -> :func:`on_commit`.
6. Boundaries: :func:`state_dict` (every rank), :func:`validate` (rank 0 only).
7. Reporting: :func:`on_log` (rank 0, each metrics line), :func:`on_fit_end`.
8. Outside training: :func:`export`.

Calling order. pluggy calls the most recently registered plugin first, and the
registry registers so that the **model plugin is called first**, then the
extra plugins in recipe order, then the built-ins (whose defaults are
``trylast=True``). Hooks marked *firstresult* stop at the first non-None
result, so the model plugin decides them; ``build_model``, ``sample``,
``objective`` and ``export`` are model hooks that extra plugins may not
implement. Every other hook calls every plugin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pluggy

if TYPE_CHECKING:
    import torch
    from pydantic import BaseModel
    from torch import nn

PROJECT = "slhub"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: Hooks only the model plugin (the recipe's ``plugin:``) may implement.
MODEL_HOOKS: tuple[str, ...] = ("build_model", "sample", "objective", "export")


@dataclass
class LossResult:
    """What an objective returns for one local batch.

    ``loss`` is the local *mean* loss over the valid supervision of this rank's
    batch, a tensor that requires grad whenever ``weight`` is above 0 (else the
    update fails on every rank, naming it); ``weight`` is the number of valid
    supervision elements behind that mean. The committed update is the gradient
    of ``sum(w_r * L_r) / sum(w_r)`` over ranks, so unequal valid counts are
    weighted correctly. A rank whose weight is 0 contributes nothing, whatever
    its loss value. The loop reads a tensor weight once (a host sync on a GPU)
    and stores the float back in ``weight``, so ``scale_loss`` and
    ``on_commit`` see a float. ``metrics`` are extra scalars logged to
    metrics.jsonl under ``train/<name>`` (rank 0's local values): floats, or
    one-element tensors, which the loop detaches and reads (a tensor that
    requires grad needs no ``float()``, which would print torch's warning; a
    tensor of more elements fails the update, naming the metric).
    """

    loss: torch.Tensor
    weight: float | int | torch.Tensor
    metrics: dict[str, float | torch.Tensor] = field(default_factory=dict)


@runtime_checkable
class Trainer(Protocol):
    """What every hook receives as ``trainer``: one rank's view of the running loop.

    Plugins read the recipe and the rank's situation here and never reach into
    the engine behind it, so the engine can change without breaking plugins: a
    hook receives a view (:class:`slhub.view.TrainerView`) holding exactly these
    members, and reading or setting anything else raises ``AttributeError``.
    :func:`slhub.testing.StandInTrainer` builds the same view for unit tests.
    """

    #: The validated ``trainer:`` section (steps, batch_size, lr, seed, ...).
    config: Any
    #: This rank's device (``cuda:LOCAL_RANK`` or CPU).
    device: torch.device
    #: Global rank and number of ranks.
    rank: int
    world_size: int
    #: The last committed update (0 before the first).
    step: int
    #: The run directory (only rank 0 writes into it).
    output_dir: Path
    #: The run's id (run.json), the same on every rank and across every resume in
    #: place (a logger's stable id); None until training starts.
    run_id: str | None
    #: The original, unwrapped model (after ``build_model``).
    model: nn.Module
    #: The optimizer stepping ``model``'s parameters (read its ``param_groups`` for the lr).
    optimizer: torch.optim.Optimizer
    #: The learning-rate schedule stepped after every update, or None.
    scheduler: Any
    #: This rank's sampler generator, owned and checkpointed by the loop.
    generator: torch.Generator

    @property
    def is_main(self) -> bool:
        """True on rank 0, the rank that validates and writes artifacts."""

    @property
    def batch_size(self) -> int:
        """``config.batch_size``: the per-worker batch size."""

    def section(self, name: str) -> Any:
        """The validated recipe section ``name`` (a pydantic model) a plugin owns."""

    def record_dataset(self, name: str, dataset: Any, split: Any = None) -> dict[str, Any]:
        """Record a dataset this plugin trains on (an :class:`slhub.data.EpisodeDataset`)
        and its ``split`` (a :class:`slhub.data.Split`) in the run identity, from
        ``build_model``: run.json and every checkpoint carry its fingerprint, and a resume
        against a changed dataset or split is refused in one line naming what changed
        (``--allow-dataset-change`` accepts it and records the change). Returns the entry.
        """

    def register_state(self, name: str, obj: Any) -> None:
        """Checkpoint ``obj`` on this rank under ``name``, from ``build_model`` (the
        model plugin) or ``admit`` (any plugin: an object registered after the checkpoint
        was loaded gets its state at once).

        ``obj`` has ``state_dict()`` and ``load_state_dict(state)`` (and optionally
        ``close()``). At every boundary its ``state_dict()`` is saved under ``name`` in
        this rank's entry of the checkpoint (``ranks[rank][name]``, beside the
        ``state_dict`` hooks' keys; None saves nothing), a resume hands that entry to
        its ``load_state_dict``, and its ``close()`` is called when the run ends
        (finished, failed or preempted). :meth:`slhub.data.TrainingData.stream` registers
        its stream this way. A name registered twice, or also returned by a
        ``state_dict`` hook, is a :class:`slhub.PluginError` naming it; ``rng``,
        ``sampler`` and ``buffers`` are the loop's own.
        """

    def save(self, name: str | None = None) -> Path | None:
        """Write a checkpoint of the committed state now (``step_N.pt`` and last.pt).

        From ``validate`` (rank 0) it writes the state gathered at that boundary
        and issues no collective; anywhere else every rank must call it. Returns
        the path on rank 0, None elsewhere.
        """


# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------


@hookspec
def recipe_sections() -> dict[str, type[BaseModel]]:
    """Declare the top-level recipe sections this plugin owns.

    Called on every rank during admission, every plugin. The core validates
    ``plugin``, ``plugins`` and ``trainer`` itself; every other top-level key
    must be claimed by exactly one plugin, whose pydantic model (with
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
    """Build the model, once per rank (model plugin only).

    Called on every rank with torch seeded from ``trainer.config.seed``
    identically, so every rank builds the same initial parameters. The loop
    moves the module to ``trainer.device`` afterwards. Raise
    :class:`slhub.SlhubError` for a configuration the model cannot use: the
    user sees its message as one line.
    Stops at the first non-None result.

    :param trainer: this rank's :class:`Trainer`.
    :returns: the model as an ``nn.Module``.
    """


@hookspec(firstresult=True)
def configure_optimizers(trainer: Trainer, model: nn.Module) -> Any:
    """Build the optimizer (and learning-rate schedule) that steps ``model``, once per rank.

    Called on every rank after :func:`build_model`, with the model on its
    device. The built-in ``optimization`` plugin (``trylast``) builds them from
    the recipe's ``optim`` and ``schedule`` sections and ``trainer.lr``;
    implement this hook for parameter groups or an optimizer of your own. The
    loop steps the schedule once after every update, checkpoints both and
    restores both on resume.
    Stops at the first non-None result.

    :param trainer: this rank's :class:`Trainer`.
    :param model: the model :func:`build_model` returned, on ``trainer.device``.
    :returns: a ``torch.optim.Optimizer``, or ``(optimizer, scheduler)`` where the
        scheduler has ``step()`` and ``state_dict()`` (or is None).
    """


# --------------------------------------------------------------------------
# Resume
# --------------------------------------------------------------------------


@hookspec
def load_state_dict(trainer: Trainer, state: dict[str, Any]) -> None:
    """Read this rank's state back from a checkpoint on resume.

    Called on every rank once, every plugin, after model and optimizer are
    loaded and before the first update. ``state`` is this rank's entry of the
    checkpoint (for a v1 checkpoint: ``{"rng": ...}`` only); read your own key.
    The counterpart of :func:`state_dict` (torch's ``Stateful`` names).

    :param trainer: this rank's :class:`Trainer`.
    :param state: what :func:`state_dict` contributed on this rank, all plugins merged.
    """


# --------------------------------------------------------------------------
# Admission
# --------------------------------------------------------------------------


@hookspec
def admit(trainer: Trainer) -> None:
    """Refuse a run this plugin could not serve, before anything is written.

    Called on every rank once, every plugin, at the end of admission: after the
    model and optimizer are built and a resume's state is loaded, before rank 0
    claims the run directory (run.json, metrics.jsonl). Check what the plugin
    will need later (a directory it will write into, on rank 0:
    ``trainer.is_main``; a file it will read) and raise :class:`slhub.SlhubError`
    naming the recipe key: every rank fails together with that one line, and no
    artifact is left behind. Write nothing here: ``trainer.output_dir`` may not
    exist yet and ``trainer.run_id`` is None.

    :param trainer: this rank's :class:`Trainer`.
    :returns: nothing; raise to refuse the run.
    """


# --------------------------------------------------------------------------
# Every update, every rank
# --------------------------------------------------------------------------


@hookspec(firstresult=True)
def sample(trainer: Trainer, generator: torch.Generator, step: int) -> Any:
    """Draw this rank's local batch for one update (model plugin only).

    Called on every rank, every update. ``trainer.batch_size`` is per worker.
    Draw only with ``generator``: it is this rank's sampler stream, owned and
    checkpointed by the loop, which makes a resumed run draw exactly what the
    uninterrupted run drew.
    Stops at the first non-None result.

    :param trainer: this rank's :class:`Trainer`.
    :param generator: this rank's sampler generator (CPU).
    :param step: the number of the update this batch is for (1-based).
    :returns: the local batch, in any structure :func:`objective` accepts.
    """


@hookspec(firstresult=True)
def objective(trainer: Trainer, model: nn.Module, batch: Any, step: int) -> LossResult:
    """Compute the local mean loss and its valid-supervision count (model plugin only).

    Called on every rank, every update, inside the DistributedDataParallel
    wrapped computation, so gradients of ``model``'s parameters are reduced
    across ranks.
    Stops at the first non-None result.

    :param trainer: this rank's :class:`Trainer`.
    :param model: the model (the original module; its parameters are the ones
        DDP reduces).
    :param batch: what :func:`sample` returned on this rank.
    :param step: the number of the update being computed (1-based).
    :returns: a :class:`LossResult`.
    """


@hookspec(firstresult=True)
def scale_loss(trainer: Trainer, result: LossResult, total_weight: float) -> torch.Tensor:
    """Turn a rank's local loss into the tensor that is back-propagated.

    Called on every rank whose weight is > 0, every update whose total weight
    is > 0. The built-in ``ddp_weighting`` plugin returns
    ``loss * weight * world_size / total_weight`` so that DDP's gradient mean
    equals the gradient of ``sum(w_r * L_r) / sum(w_r)``.
    Stops at the first non-None result.

    :param trainer: this rank's :class:`Trainer`.
    :param result: this rank's :class:`LossResult`.
    :param total_weight: the sum of every rank's weight for this update; with
        ``trainer.config.accumulate > 1`` it is ``world_size`` for every micro-batch (the
        total is known only after all of them ran) and the loop divides the
        reduced gradient by the total afterwards.
    :returns: a scalar tensor to call ``backward()`` on.
    """


@hookspec
def on_commit(trainer: Trainer, step: int, result: LossResult, metrics: dict[str, Any]) -> None:
    """React to a committed update (metrics, progress, schedules).

    Called on every rank, every plugin, after the optimizer step (also after an
    update skipped because every rank's weight was 0). Must not call
    collectives: ranks reach this point at different times. An exception fails
    every rank at the next agreement.

    :param trainer: this rank's :class:`Trainer`.
    :param step: the number of the update just committed (1-based).
    :param result: this rank's :class:`LossResult` for the update.
    :param metrics: the metrics line that rank 0 appends to metrics.jsonl for
        this update; implementations may add keys to it (its ``step`` stays the update's).
    """


# --------------------------------------------------------------------------
# Boundaries
# --------------------------------------------------------------------------


@hookspec
def state_dict(trainer: Trainer) -> dict[str, Any] | None:
    """Contribute this rank's state to the checkpoint of a boundary.

    Called on every rank, every plugin, at every validation or save boundary,
    before validation; on rank 0 once more after validation, so what
    :func:`validate` changed (a best value, a patience counter) is what that
    boundary's checkpoint holds. The merged results of one rank become that
    rank's entry of the checkpoint (gathered to rank 0), so store only tensors,
    numbers, strings, lists, tuples, dicts and None. Use one key named after
    your plugin; a key contributed twice is an error.

    :param trainer: this rank's :class:`Trainer`.
    :returns: ``{key: state}`` or None.
    """


@hookspec
def validate(trainer: Trainer, model: nn.Module, step: int) -> dict[str, float] | None:
    """Evaluate the model at a validation boundary.

    Called on rank 0 only, every plugin. ``model`` is the unwrapped module in
    eval mode under ``torch.no_grad``; the process-wide random streams (python,
    numpy, torch, CUDA) are restored afterwards, so validation does not change
    the training stream. Do not draw from ``trainer.generator`` here.
    May call ``trainer.save()``, which writes the state gathered at this
    boundary and issues no collective. An exception is held and fails every
    rank at the next agreement.

    :param trainer: rank 0's :class:`Trainer`.
    :param model: the unwrapped model.
    :param step: the committed update being validated.
    :returns: ``{name: value}``, logged as ``validation/<name>``.
    """


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------


@hookspec
def on_log(trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
    """Receive each line rank 0 appends to metrics.jsonl: the place for loggers.

    Called on rank 0 only, every plugin, right after the line is written: once
    per update (``train/...`` keys) and once per validation (``validation/...``
    keys). The metrics history is the source of truth; a logger (TensorBoard,
    W&B, CSV, a progress display) mirrors it. After a resume the first line has
    ``step`` = the checkpoint's update + 1, so a logger that had written past
    that point (a crash between checkpoints) should drop what it had from
    ``step`` on. Must not call collectives. An exception is held and fails every
    rank at the next agreement.

    :param trainer: rank 0's :class:`Trainer`.
    :param step: the update the line belongs to.
    :param metrics: the line as written (do not modify it).
    """


@hookspec
def on_fit_end(trainer: Trainer, status: str) -> None:
    """Training stopped on this rank: release files, terminals, connections.

    Called on every rank, every plugin, once, after the last update and its
    checkpoint, whether the run finished (``status`` ``"done"``), was
    preempted (``"preempted"``) or failed (``"failed"``). Must not call
    collectives (after a failure the other ranks may be gone). An exception is
    logged and does not change how the run ends.

    :param trainer: this rank's :class:`Trainer`.
    :param status: ``"done"``, ``"preempted"`` or ``"failed"``.
    """


# --------------------------------------------------------------------------
# Outside training
# --------------------------------------------------------------------------


@hookspec(firstresult=True)
def export(checkpoint: Any, checkpoint_path: Path, out_dir: Path) -> Path | None:
    """Export a checkpoint for inference (model plugin only).

    Called by ``slhub export`` in one process, outside training, on the
    installed plugin whose name the checkpoint records (or the one the user
    names with ``--plugin``); a v1 checkpoint, which records none, is offered
    to every installed plugin. A plugin that does not recognize the
    checkpoint returns None. Write an ``export.json`` with a ``kind`` that an
    entry point of group ``slhub.exports`` loads, so ``slhub.export.load``
    can read the result.
    Stops at the first non-None result.

    :param checkpoint: the loaded checkpoint as a :class:`slhub.export.Checkpoint`
        (``step``, ``model``, ``optimizer``, ``run``, ``ranks``, ``format``; v1 and v2
        files alike). ``model`` holds the weights to export: for a run with an ``ema``
        recipe section its moving average (``checkpoint.ema`` says so), and slhub
        records that in ``export.json`` after the hook returns.
    :param checkpoint_path: where it was read from (for provenance).
    :param out_dir: an empty directory to write the export into.
    :returns: the export directory, or None when the checkpoint is not this
        plugin's.
    """
