"""The checkpoint manager: when a boundary gathers and writes, what it writes, what is kept.

One manager per rank (torchtitan's CheckpointManager role). The loop calls
:meth:`CheckpointManager.load` once with the resume plan, and
:meth:`~CheckpointManager.boundary` after every update: when the update is a
boundary it gathers every rank's state (a collective on every rank), and on rank 0
validates, takes its own entry again and writes. Load and gather cover the model,
optimizer, schedule, scaler, moving average (``ema``), the plugins'
``state_dict``/``load_state_dict`` hooks and the objects registered with
:meth:`~CheckpointManager.register` (:mod:`slhub.checkpoint.states`).
``Trainer.save()`` is :meth:`~CheckpointManager.save`.

Retention: with ``trainer.keep_last: N`` the N newest boundary ``step_N.pt`` files
are kept (an older one is removed only after the newer write is durable;
``last.pt`` is always kept); with ``trainer.best`` the checkpoint of the boundary
whose validation was best so far is ``best.pt`` (one write, hard-linked to the
boundary's other names). What the policies did is part of every checkpoint
(:class:`~slhub.checkpoint.schema.Retention`), so a resumed run keeps, deletes
and picks exactly what the uninterrupted run would.

Retention is crash-consistent: a kill at any moment ends, after the next run
(in place, or ``--resume auto``), with the uninterrupted run's ``best.pt``,
run.json ``best`` and checkpoint files. Every write records its own intent, the
names it gets and the ``step_N.pt`` it removes
(:class:`~slhub.checkpoint.schema.Intent`), and its first name is ``last.pt``.
So a kill before that rename leaves none of the write in place (the resume from
the previous ``last.pt`` redoes the whole boundary), and a kill after it leaves
undone only the rest of the write ``last.pt`` holds: the other names, the
removals and run.json's ``best``, which :func:`finish_write` completes from that
file before the resume trains, each step idempotent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

import slhub.checkpoint.files as files
from slhub import log
from slhub.artifacts import MetricsLog, read_identity, record_best
from slhub.checkpoint.gather import gather_rank_states, snapshot
from slhub.checkpoint.resume import ResumePlan
from slhub.checkpoint.schema import (
    Checkpoint,
    EmaState,
    Intent,
    Retention,
    check_fits,
    check_state_loadable,
)
from slhub.checkpoint.states import StateRegistry
from slhub.errors import (
    ArtifactError,
    CheckpointError,
    PluginError,
    SlhubError,
    one_line,
    raised_by,
)
from slhub.paths import path_errors, real_path
from slhub.recipe import TrainerConfig

LOG = log.get_logger()

#: ``local_state() -> {key: state}``: this rank's merged ``state_dict`` hook contributions.
LocalState = Callable[[], dict[str, Any]]
#: ``validate(step) -> metrics line``: rank 0's validation (every plugin's ``validate``).
Validate = Callable[[int], dict[str, Any]]
#: A failure held for the next agreement: ``(phase, exception)``.
Held = tuple[str, BaseException]


class Owner(Protocol):
    """What the manager reads from the loop it checkpoints."""

    rank: int
    step: int
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    #: What hooks receive as ``trainer`` (:class:`slhub.view.TrainerView`).
    view: Any
    #: The moving average (:class:`slhub.ema.Ema`), or None without an ``ema`` section.
    ema: Any
    #: The datasets the plugins recorded while building (``Trainer.record_dataset``), by
    #: name: compared with the checkpoint's on :meth:`CheckpointManager.load`.
    datasets: dict[str, dict[str, Any]]

    @property
    def scaler(self) -> Any: ...


@dataclass(frozen=True)
class Boundary:
    """What happens after an update: validate, save, or both. ``unscheduled``: it saves
    only because the run stops there (not a ``save_every`` boundary, not the last)."""

    validate: bool
    save: bool
    unscheduled: bool = False


class CheckpointManager:
    """Cadence, rank-state gather, committed snapshot, writes and retention of one rank."""

    def __init__(
        self, owner: Owner, config: TrainerConfig, load_state_hook: Callable[..., Any]
    ) -> None:
        self._owner = owner
        #: The plugins' ``load_state_dict`` hook, called with the rank's entry on load.
        self._load_state_hook = load_state_hook
        self.config = config
        self.output_dir = Path(config.output_dir)
        self.retention = Retention()
        #: Set by the bootstrap on rank 0 (:meth:`bind`): the identity checkpoints carry
        #: and the metrics log synced after each write.
        self.identity: dict[str, Any] | None = None
        self._metrics: MetricsLog | None = None
        self._committed: list[dict[str, Any] | None] | None = None
        self._committed_step = -1
        #: True while rank 0 validates: ``save()`` then writes what was gathered.
        self._in_validation = False
        #: The stateful objects saved in each rank's entry besides the hooks' state.
        self.states = StateRegistry()
        #: The dataset differences a resume accepted (:meth:`load`), for the run identity.
        self.dataset_changes: list[str] = []

    def register(self, key: str, obj: Any) -> None:
        """Save ``obj.state_dict()`` under ``key`` in this rank's entry at every boundary,
        restore it on resume, and ``close()`` it when the run ends.

        :raises PluginError: ``key`` is registered already, or ``obj`` is not stateful.
        """
        self.states.register(key, obj)

    def close(self) -> None:
        """Close the registered objects that have ``close()`` (once; the run has ended)."""
        self.states.close()

    def bind(self, identity: dict[str, Any] | None, metrics: MetricsLog | None) -> None:
        """Rank 0: the run identity and metrics log of the opened run directory."""
        self.identity, self._metrics = identity, metrics

    # ---------------------------------------------------------------- cadence

    def due(self, step: int, stop: bool = False) -> Boundary | None:
        """The boundary after update ``step``, or None: validation every
        ``validate_every``, a checkpoint every ``save_every``, at the last update and
        when the run stops."""
        cfg = self.config
        validate = cfg.validate_every > 0 and step % cfg.validate_every == 0
        scheduled = (cfg.save_every > 0 and step % cfg.save_every == 0) or step == cfg.steps
        if not (validate or scheduled or stop):
            return None
        return Boundary(validate, scheduled or stop, stop and not scheduled)

    # ------------------------------------------------------------ the boundary

    def boundary(
        self,
        step: int,
        *,
        stop: bool,
        held: Held | None,
        local_state: LocalState,
        validate: Validate,
        state_failure: Callable[[BaseException], BaseException],
    ) -> Held | None:
        """After update ``step`` (every rank): when it is a boundary (:meth:`due`), gather
        every rank's state, then on rank 0 validate, take its own entry again and write.

        ``held`` is the failure already held for the next agreement (rank 0 then skips
        validation and the write); returns the failure held after the boundary: the
        gather's or the write's (``checkpoint I/O``, a plugin's state failure named by
        ``state_failure``), else validation's. A failed validation still writes the
        committed update.
        """
        boundary = self.due(step, stop=stop)
        if boundary is None:
            return held
        error = self.gather(local_state)
        if error is not None:
            log.failure("checkpoint state failed", error)
            held = held or ("checkpoint I/O", state_failure(error))
        if self._owner.rank != 0 or held is not None:
            return held
        failed_validation: BaseException | None = None
        best: float | None = None
        if boundary.validate:
            try:
                self._in_validation = True
                try:
                    metrics = validate(step)
                finally:
                    self._in_validation = False
                if self.improves(step, metrics):
                    assert self.config.best is not None
                    best = metrics[self.config.best.metric]
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - held for the next agreement
                log.failure("validation failed", exc)
                failed_validation = exc
            try:  # the checkpoint holds what validate changed (only rank 0 validates)
                self.refresh_own(local_state)
            except Exception as exc:  # noqa: BLE001 - held for the next agreement
                log.failure("checkpoint state failed", exc)
                return ("checkpoint I/O", state_failure(exc))
        try:  # the committed update is saved even when its validation failed
            self.write_boundary(boundary, step, best)
        except Exception as exc:  # noqa: BLE001 - held for the next agreement
            LOG.error("checkpoint write failed", error=one_line(exc))
            held = ("checkpoint I/O", exc)
        if failed_validation is not None:
            held = ("validation", failed_validation)
        return held

    def gather(self, local_state: LocalState) -> BaseException | None:
        """Gather every rank's state of the committed update to rank 0 (a collective on
        every rank). Returns this rank's own failure."""
        self._committed, error = gather_rank_states(self._with_registered(local_state))
        self._committed_step = self._owner.step
        return error

    def refresh_own(self, local_state: LocalState) -> None:
        """Rank 0: take its own entry again, after validation, so what ``validate``
        changed is what this boundary's checkpoint holds (no collective)."""
        if self._committed is not None:
            self._committed[0] = snapshot(self._with_registered(local_state)())

    def _with_registered(self, local_state: LocalState) -> LocalState:
        """The rank's whole entry: the hooks' contributions and the registered objects'."""
        return lambda: self.states.merged(local_state())

    # ---------------------------------------------------------------- writes

    def improves(self, step: int, metrics: dict[str, Any]) -> bool:
        """Whether this validation is the best so far under ``trainer.best``.

        :raises SlhubError: the metric is not among this validation's results.
        """
        best = self.config.best
        if best is None:
            return False
        if best.metric not in metrics:
            shown = ", ".join(sorted(metrics)) or "none"
            raise SlhubError(
                f"trainer.best.metric {best.metric} is not among the validation metrics of "
                f"update {step} ({shown})"
            )
        value = metrics[best.metric]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SlhubError(f"trainer.best.metric {best.metric} is {value!r}, not a number")
        if not math.isfinite(value):
            return False
        current = self.retention.best_value
        if current is None:
            return True
        return value < current if best.mode == "min" else value > current

    def write_boundary(self, boundary: Boundary, step: int, best_value: float | None) -> None:
        """Rank 0: write the committed state of boundary ``step``: ``last.pt`` and
        ``step_N.pt`` when it saves, ``best.pt`` when ``best_value`` is a new best (one
        write, the other names hard links), then apply ``keep_last``. Writes nothing when
        another rank failed to gather (its own error fails the run at the agreement)."""
        if self._committed is None:
            return
        old = self.retention
        kept, unscheduled, purge = old.kept, old.unscheduled, ()
        names: list[str] = []
        if boundary.save:
            names = [files.LAST, files.step_file(step)]
            if self.config.keep_last is not None and boundary.unscheduled:
                if unscheduled is not None and unscheduled != step:  # stopped twice in a row
                    purge = (unscheduled,)
                unscheduled = step
            elif self.config.keep_last is not None:
                candidates = (*kept, step)
                kept = candidates[-self.config.keep_last :]
                purge = tuple(s for s in candidates if s not in kept)
                if unscheduled is not None and unscheduled != step:
                    purge, unscheduled = (*purge, unscheduled), None
        retention = Retention(kept, old.best_step, old.best_value, unscheduled)
        if best_value is not None:  # after last.pt, before step_N.pt; last.pt also at a
            # validation-only boundary: --resume auto continues from the newest checkpoint
            retention = replace(retention, best_step=step, best_value=best_value)
            names = [files.LAST, files.BEST, *names[1:]]
        if not names:
            return
        self._write(names, retention, purge)
        self.retention = retention
        for old in purge:  # only now: the newer checkpoint is durable
            (self.output_dir / files.step_file(old)).unlink(missing_ok=True)
        if best_value is not None:
            assert self.config.best is not None
            record_best(
                self.output_dir,
                {"step": step, "metric": self.config.best.metric, "value": best_value,
                 "file": files.BEST},
            )  # fmt: skip
        shown = [n for n in names if n != files.LAST]
        LOG.info("checkpoint", file=",".join(shown))

    def save(self, local_state: LocalState, name: str | None = None) -> Path | None:
        """``Trainer.save()``: the committed state as ``name`` (default ``step_N.pt``) and
        ``last.pt``. From ``validate`` (rank 0) it writes what the boundary gathered, rank
        0's own as it was before validation; anywhere else it gathers first (a
        collective). Returns the path on rank 0, None elsewhere."""
        if not self._in_validation:
            error = self.gather(local_state)
            if error is not None:
                raise error
        if self._owner.rank != 0:
            return None
        name = name or files.step_file(self._committed_step)
        self._write([files.LAST, name], self.retention)
        LOG.info("checkpoint", file=name)
        return self.output_dir / name

    def _write(self, names: list[str], retention: Retention, removes: tuple[int, ...] = ()) -> None:
        if self._committed is None:
            raise SlhubError(f"no committed state to write to {names[-1]}: a rank failed to gather")
        assert self.identity is not None
        owner = self._owner
        ranks = self._committed
        check_state_loadable(ranks)
        scaler, ema = owner.scaler, owner.ema
        # the trained weights, also from validate while the averaged ones are in the model
        model = owner.model.state_dict() if ema is None else ema.trained_state_dict(owner.model)
        ckpt = Checkpoint(
            step=self._committed_step,
            run=self.identity,
            model=model,
            optimizer=owner.optimizer.state_dict(),
            schedule=owner.scheduler.state_dict() if owner.scheduler is not None else None,
            scaler=scaler.state_dict() if scaler is not None else None,
            ranks=ranks,
            retention=retention,
            ema=EmaState(ema.step, ema.weights) if ema is not None else None,
            intent=Intent(tuple(names), removes),
        )
        # last.pt first: it is what --resume auto continues from, so a kill between the
        # names must not leave step_N.pt without a last.pt (nor last.pt behind it)
        files.write(files.serialize(ckpt), *(self.output_dir / name for name in names))
        if self._metrics is not None:
            self._metrics.sync()

    # ------------------------------------------------------------ resume

    def load(self, plan: ResumePlan) -> None:
        """Continue from the plan's checkpoint (every rank; nothing for a fresh start):
        model, optimizer, schedule, scaler, moving average, the plugins'
        ``load_state_dict`` hooks, the registered objects, and the retention. The
        datasets the plugins recorded while building are checked against the
        checkpoint's first; the differences accepted with ``--allow-dataset-change`` are
        kept in :attr:`dataset_changes` for the run identity.

        :raises CheckpointError: the checkpoint does not fit, naming its file.
        """
        ckpt = plan.checkpoint
        if ckpt is None:
            return
        owner = self._owner
        self.dataset_changes = plan.check_datasets(owner.datasets)
        try:
            check_fits(ckpt, owner.model, owner.optimizer)
            try:
                owner.model.load_state_dict(ckpt.model)
                owner.optimizer.load_state_dict(ckpt.optimizer)
                if owner.scheduler is not None and ckpt.schedule is not None:
                    owner.scheduler.load_state_dict(ckpt.schedule)
                if owner.scaler is not None and ckpt.scaler is not None:
                    owner.scaler.load_state_dict(ckpt.scaler)
            except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise CheckpointError(
                    f"checkpoint does not fit this recipe's model: {one_line(exc)}"
                ) from None
        except CheckpointError as exc:  # every refusal of a checkpoint names its file
            if plan.path is None or str(exc).startswith(str(plan.path)):
                raise
            raise CheckpointError(f"{plan.path}: {exc}") from None
        if owner.ema is not None:
            assert ckpt.ema is not None
            owner.ema.load(ckpt.ema.step, ckpt.ema.weights)
        owner.step = ckpt.step
        state = ckpt.rank_state(owner.rank)
        hook = self._load_state_hook
        try:
            hook(trainer=owner.view, state=state)
        except SlhubError:
            raise
        except Exception as exc:  # noqa: BLE001 - a plugin's bug: its traceback, then one line
            log.failure("load_state_dict failed", exc)
            raise PluginError(
                f"{raised_by(exc, hook)} failed to load its state from the checkpoint of "
                f"update {ckpt.step} on rank {owner.rank} (load_state_dict: {one_line(exc)}); "
                "its traceback is in that rank's log"
            ) from None
        self.states.load(state, ckpt.step, owner.rank)
        self.retention = ckpt.retention


def finish_write(
    folder: Path, ckpt: Checkpoint, path: str | Path, sha256: str | None, config: TrainerConfig
) -> list[str]:
    """Rank 0, holding the run directory's lock, before a run resumed in place trains (or
    a requeue of a finished run exits): finish the newest checkpoint's write where a
    kill cut it short, as the uninterrupted write would have ended.

    Only a resume from the directory's own ``last.pt`` (read as ``sha256``) does
    anything: ``last.pt`` is the first name of every write, so a kill can leave undone
    only the rest of the write ``last.pt`` holds, never of an older one, and that file
    records what the rest is (:class:`~slhub.checkpoint.schema.Intent`). Its other names
    that do not hold it get its bytes (``best.pt`` at a new best, ``step_N.pt``), the
    files it removes are removed, and run.json's ``best`` is set to its retention's best.
    Every step is idempotent: a kill in here is finished by the next resume. Returns
    what it did, in words (nothing when the write was whole).
    """
    last = files.last_path(folder)
    if ckpt.version != 2 or sha256 is None or real_path(path) != real_path(last):
        return []
    with path_errors(folder, ArtifactError, "cannot finish the interrupted checkpoint write"):
        identity = read_identity(folder)
        if identity is None or identity.get("run_id") != ckpt.run_id:
            return []
        if files.sha256_file(last) != sha256:  # replaced since it was read: not this write
            return []
        done = []
        stale = [name for name in ckpt.intent.names if name != files.LAST and not _holds(
            folder / name, last, sha256)]  # fmt: skip
        if stale:
            files.write(files.read_bytes(last), *(folder / name for name in stale))
            done.append(f"wrote {','.join(stale)}")
        removed = [files.step_file(s) for s in ckpt.intent.removes]
        removed = [name for name in removed if (folder / name).exists()]
        for name in removed:
            (folder / name).unlink(missing_ok=True)
        if removed:
            done.append(f"removed {','.join(removed)}")
        retention = ckpt.retention
        if config.best is not None and retention.best_step is not None:
            best = {"step": retention.best_step, "metric": config.best.metric,
                    "value": retention.best_value, "file": files.BEST}  # fmt: skip
            if identity.get("best") != best:
                record_best(folder, best)
                done.append(f"recorded best update {retention.best_step} in run.json")
    if done:
        LOG.warning("finished the checkpoint write a kill interrupted", step=ckpt.step,
                    done="; ".join(done))  # fmt: skip
    return done


def _holds(name: Path, last: Path, sha256: str) -> bool:
    """Whether file ``name`` holds the checkpoint ``last`` does (its hard link, or a copy
    where the file system has no hard links)."""
    try:
        if name.samefile(last):
            return True
    except FileNotFoundError:
        return False
    return files.sha256_file(name) == sha256
