"""Bootstrap of a run: everything around the loop, in the order a rank does it.

1. Launch settings: the recipe's device and timeout, read before the process
   group exists (or the device of the caller's ``distributed_run``).
2. Admission, on every rank: recipe, plugins, sections, the checkpoint to
   resume, the model and optimizer (:class:`slhub.trainer.Loop`). Rank 0 reads
   the checkpoint; a rank with no file at its path (a node without a shared
   filesystem) receives rank 0's bytes, a rank with one must hold the same
   bytes. Every rank agrees that every rank was admitted, or all fail with one
   message.
3. Rank 0 locks the run directory for the run's life, then claims a fresh one
   and writes the identity (run.json), or reopens the checkpoint's own run in
   place (appending a resume marker to metrics.jsonl). Agreed again.
4. The loop runs with the stop signals installed; the metrics log and the lock
   are released however it ends.

``resume="auto"`` resumes from ``output_dir/last.pt`` when it exists on rank 0
and starts fresh otherwise (every rank follows rank 0), so one command serves a
job's first start and every requeue.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path
from typing import Any

import torch

from slhub import artifacts, checkpoint, distributed, log, preemption, registry
from slhub._version import __version__
from slhub.errors import ArtifactError, CheckpointError, PluginError, SlhubError
from slhub.paths import path_errors
from slhub.recipe import Recipe, as_recipe
from slhub.trainer import Loop

LOG = log.get_logger()

RecipeInput = str | Path | dict[str, Any] | Recipe


AUTO = "auto"


def train(
    recipe: RecipeInput,
    overrides: list[str] | None = None,
    resume: str | Path | None = None,
    log_format: str = "console",
    *,
    plugin: Any = None,
    plugins: list[Any] | None = None,
    overwrite: bool = False,
    allow_source_change: bool = False,
) -> Path:
    """Run a recipe on this process (one rank of a torchrun job, or alone).

    :param recipe: a YAML path, a recipe mapping or a validated :class:`Recipe`.
    :param overrides: ``a.b=VALUE`` overrides, as ``--set`` on the command line.
    :param resume: a checkpoint to continue from, or ``"auto"``: the run
        directory's ``last.pt`` when it exists, else a fresh start.
    :param log_format: ``console`` or ``json``.
    :param overwrite: move the artifacts already in the output directory aside
        (into a dated ``superseded-*`` folder) and start fresh.
    :param allow_source_change: resume although the slhub or torch version or a
        plugin's code differs from the checkpoint's; the run records what changed.
    :param plugin: replaces the recipe's model plugin: a name or a plugin object
        (for example a class defined in a notebook cell).
    :param plugins: replaces the recipe's list of further plugins (names or objects).
    :returns: the output directory.
    :raises SlhubError: every rank-local error is agreed on, so all ranks raise
        the same error together.
    :raises Preempted: a stop signal arrived; every rank raises it after the
        checkpoint of the update it stopped at is written.

    Inside a caller's :func:`slhub.distributed_run` the run uses that scope's
    device and process group; otherwise it opens its own from the recipe.

    Arguments of the wrong type raise TypeError naming the argument (a ``str``
    as ``overrides`` or ``plugins`` too: it would be read one character at a
    time); a ``log_format`` other than ``console`` or ``json`` raises SlhubError.
    """
    if not isinstance(recipe, (str, dict, Recipe)) and not hasattr(recipe, "__fspath__"):
        raise TypeError(
            "recipe: expected a YAML path (str or os.PathLike), a mapping (dict) or a "
            f"Recipe, got {type(recipe).__name__}"
        )
    for name, value in (("overrides", overrides), ("plugins", plugins)):
        if value is not None and not isinstance(value, (list, tuple)):
            raise TypeError(f"{name}: expected a list, got {type(value).__name__}")
    if bad := [o for o in overrides or [] if not isinstance(o, str)]:
        raise TypeError(
            f"overrides: expected 'KEY.PATH=VALUE' strings, got {type(bad[0]).__name__} "
            f"{bad[0]!r:.60}"
        )
    if resume is not None and not isinstance(resume, str) and not hasattr(resume, "__fspath__"):
        raise TypeError(
            f"resume: expected a checkpoint path (str or os.PathLike) or 'auto', "
            f"got {type(resume).__name__}"
        )
    if not isinstance(log_format, str):
        raise TypeError(
            f"log_format: expected 'console' or 'json', got {type(log_format).__name__}"
        )
    if log_format not in log.FORMATS:
        raise SlhubError(f"log_format: expected 'console' or 'json', got {log_format!r:.60}")
    overrides = list(overrides or [])
    log.configure(log_format, distributed.env_rank(), distributed.env_world_size())
    if overwrite and resume is not None:
        raise SlhubError("--overwrite starts a run over; it cannot be combined with --resume")
    start = _Start(resume, overwrite, allow_source_change)

    def admit() -> Recipe:
        return as_recipe(recipe, overrides, plugin=plugin, plugins=plugins)

    if distributed.launched_by_torchrun():
        preemption.stop_with_parent()
    outer = distributed.current_device()
    if outer is not None:
        return _train_on(admit, start, outer)
    device_choice, timeout_s = _launch_settings(admit)
    with distributed.distributed_run(device_choice, timeout_s) as device:
        return _train_on(admit, start, device)


class _Start:
    """How a run starts: fresh, from a checkpoint, ``auto``, or over old artifacts."""

    def __init__(
        self, resume: str | Path | None, overwrite: bool, allow_source_change: bool = False
    ) -> None:
        self.requested = resume
        self.overwrite = overwrite
        self.allow_source_change = allow_source_change
        self.checkpoint: Path | None = None
        #: Code differences the user accepted with ``allow_source_change``.
        self.source_changes: list[str] = []

    def resolve(self, recipe: Recipe) -> Path | None:
        """The checkpoint to resume from (None: a fresh run)."""
        if self.requested is None:
            return None
        if str(self.requested) != AUTO:
            self.checkpoint = Path(self.requested)
        else:
            last = Path(recipe.trainer.output_dir) / "last.pt"
            with path_errors(last, ArtifactError, "cannot look for the checkpoint to resume"):
                found = last.is_file()  # raises for a name the OS refuses (too long)
            self.checkpoint = last if found else None
        return self.checkpoint

    @property
    def auto_fresh(self) -> bool:
        """``--resume auto`` found nothing to resume: a leftover run without checkpoints
        (failed before its first save) is moved aside instead of blocking the start."""
        return str(self.requested) == AUTO and self.checkpoint is None


def _launch_settings(read: Any) -> tuple[str, float]:
    """Device choice and timeout for the process group, read before admission.

    A recipe that does not load yields the defaults here; admission then fails
    on every rank together through the process group.
    """
    try:
        recipe = read()
    except SlhubError:
        return "auto", 600.0
    return recipe.trainer.device, recipe.trainer.timeout_s


def _train_on(read: Any, start: _Start, device: torch.device) -> Path:
    loop, ckpt, error = _admit(read, start, device)
    _agree_or_raise(error, device)
    assert loop is not None
    run_lock: artifacts.RunLock | None = None
    try:
        if loop.is_main:
            try:
                run_lock = _open_run_directory(loop, ckpt, start)
            except Exception as exc:  # noqa: BLE001 - agreed on below
                error = _logged(exc)
        _agree_or_raise(error, device)
        del ckpt
        return _fit(loop, device)
    finally:
        if run_lock is not None:
            run_lock.release()


def _fit(loop: Loop, device: torch.device) -> Path:
    run_id = distributed.broadcast_from_rank0(loop.identity["run_id"] if loop.identity else None)
    loop.run_id = run_id
    log.bind(run_id=run_id)
    LOG.info("start", step=loop.step, total=loop.config.steps, device=str(device))
    LOG.info(
        "recipe",
        path=loop.recipe.source,
        output_dir=str(loop.output_dir),
        plugins=",".join(source.name for source in loop.plugins.sources),
    )
    log.set_step(loop.step)
    try:
        with preemption.StopSignals(loop.config.stop_signals) as signals:
            loop.stop_signals = signals
            loop.fit()
    except preemption.Preempted as exc:
        LOG.warning("preempted", step=exc.step)
        raise
    except Exception as exc:
        _logged(exc)
        raise
    finally:
        if loop.metrics is not None:
            loop.metrics.close()
    LOG.info("done", step=loop.step)
    return loop.output_dir


def _admit(
    read: Any, start: _Start, device: torch.device
) -> tuple[Loop | None, dict[str, Any] | None, BaseException | None]:
    """Everything a rank builds before training, with no side effects.

    Returns the loop and the checkpoint it resumes, or this rank's error, held for
    the admission agreement. Every rank reaches the checkpoint exchange with rank 0
    (collectives), whatever failed before it.
    """
    error: BaseException | None = None
    try:
        recipe = read()
        start.resolve(recipe)
        plugins = registry.build_manager(recipe.plugin, recipe.plugins, recipe.objects)
        sections: dict[str, Any] = {}
        for part in plugins.hook.recipe_sections():
            for name, model in (part or {}).items():
                if name in sections or name in ("plugin", "plugins", "trainer"):
                    raise PluginError(f"recipe section {name!r} is claimed twice")
                sections[name] = model
        recipe.validate_sections(sections)
    except Exception as exc:  # noqa: BLE001 - held for the agreement
        error = _logged(exc)
    ckpt, ckpt_error = _resume_checkpoint(start, failed=error is not None)
    if error is not None or ckpt_error is not None:
        return None, None, error or _logged(ckpt_error)
    try:
        if ckpt is not None:
            start.source_changes = checkpoint.check_resume_compatible(
                ckpt,
                start.checkpoint,
                recipe=recipe.to_dict(),
                source=_source_identity(plugins),
                world_size=distributed.world_size(),
                allow_source_change=start.allow_source_change,
            )
        loop = Loop(recipe, plugins, device)
        if ckpt is not None:
            loop.load(ckpt)
    except Exception as exc:  # noqa: BLE001 - held for the agreement
        return None, None, _logged(exc)
    return loop, ckpt, None


def _resume_checkpoint(
    start: _Start, failed: bool
) -> tuple[dict[str, Any] | None, BaseException | None]:
    """The checkpoint every rank resumes from, as rank 0 reads it: ``(checkpoint, error)``.

    Rank 0 decides (under ``--resume auto``: whether its ``output_dir/last.pt``
    exists) and reads the file. A rank with no file at that path (a node without a
    shared filesystem) receives rank 0's bytes over the process group; a rank with
    one must hold the same bytes (sha256). A collective on every rank, also on a
    rank that already ``failed`` (it takes part and reads nothing).
    """
    if distributed.world_size() == 1:
        if failed or start.checkpoint is None:
            return None, None
        try:
            return checkpoint.load_checkpoint(start.checkpoint), None
        except Exception as exc:  # noqa: BLE001 - held for the agreement
            return None, exc
    is_main = distributed.rank() == 0
    data: bytes | None = None
    error: BaseException | None = None
    offer: dict[str, str] | None = None
    if is_main and not failed and start.checkpoint is not None:
        try:
            data = checkpoint.read_checkpoint_bytes(start.checkpoint)
            offer = {
                "path": str(start.checkpoint),
                "sha256": hashlib.sha256(data).hexdigest(),
                "host": socket.gethostname(),
            }
        except Exception as exc:  # noqa: BLE001 - held for the agreement
            error = exc
    offer = distributed.broadcast_from_rank0(offer)
    start.checkpoint = None if offer is None else Path(offer["path"])
    if offer is None:
        return None, error
    path = Path(offer["path"])
    missing = False
    if not is_main and not failed:
        if path.is_file():
            try:
                data = checkpoint.read_checkpoint_bytes(path)
                _check_same_file(path, data, offer)
            except Exception as exc:  # noqa: BLE001 - held for the agreement
                data, error = None, exc
        else:
            missing = True
    wanted = distributed.gather_to_rank0(missing)
    if distributed.broadcast_from_rank0(any(wanted) if is_main else None):
        if is_main:
            assert wanted is not None and data is not None
            ranks = ",".join(str(r) for r, flag in enumerate(wanted) if flag)
            LOG.info("checkpoint sent", path=str(path), bytes=len(data), to_ranks=ranks)
        received = distributed.broadcast_from_rank0(data if is_main else None)
        if missing:
            data = received
    if data is None:
        return None, error
    try:
        return checkpoint.checkpoint_from_bytes(data, path), None
    except Exception as exc:  # noqa: BLE001 - held for the agreement
        return None, exc


def _check_same_file(path: Path, data: bytes, offer: dict[str, str]) -> None:
    """A rank that sees a file at rank 0's checkpoint path must hold rank 0's bytes."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != offer["sha256"]:
        raise CheckpointError(
            f"{path}: rank {distributed.rank()} on host {socket.gethostname()} sees a different "
            f"file than rank 0 on host {offer['host']} (sha256 {digest} here, {offer['sha256']} "
            "on rank 0); remove it from this node (it then receives rank 0's checkpoint) or "
            "make it rank 0's file"
        )


def _agree_or_raise(error: BaseException | None, device: torch.device) -> None:
    """Admission agreement: every rank fails together, naming the origin rank.

    On one process a bad-input error is raised as it is (its message is the
    whole story); anything else is reported like a rank failure.
    """
    if distributed.world_size() == 1 and (error is None or isinstance(error, SlhubError)):
        if error is not None:
            raise error
        return
    agreed = distributed.agree(0.0, 0.0, "admission" if error else None, device)
    if agreed.failed:
        distributed.raise_agreed_failure(agreed, error)


def _open_run_directory(
    loop: Loop, ckpt: dict[str, Any] | None, start: _Start
) -> artifacts.RunLock:
    """Rank 0: lock the output dir, then claim it fresh or reopen the checkpoint's run in place."""
    run_lock = artifacts.lock(loop.output_dir)
    try:
        _claim_or_reopen(loop, ckpt, start)
    except BaseException:
        run_lock.release()
        raise
    return run_lock


def _claim_or_reopen(loop: Loop, ckpt: dict[str, Any] | None, start: _Start) -> None:
    folder = loop.output_dir
    resume = start.checkpoint
    if start.overwrite or start.auto_fresh:
        if start.auto_fresh and any(n.endswith(".pt") for n in artifacts.artifacts_in(folder)):
            raise ArtifactError(
                f"{folder}: holds checkpoints but no last.pt, so --resume auto cannot tell where "
                "to continue; --resume one of them, or pass --overwrite to start over"
            )
        moved = artifacts.move_aside(folder)
        if moved is not None:
            LOG.warning("moved old artifacts aside", folder=str(moved))
    ckpt_run = checkpoint.run_of(ckpt) if ckpt is not None else None
    in_place = False
    if ckpt is not None:
        in_place = artifacts.check_resume_destination(folder, ckpt_run)
    if in_place:
        assert ckpt_run is not None
        loop.identity = ckpt_run
        if start.source_changes:  # later checkpoints carry the code that wrote them
            history = [*ckpt_run.get("source_changes", []), _change_record(ckpt, start)]
            loop.identity = {
                **ckpt_run,
                "source": _source_identity(loop.plugins),
                "source_changes": history,
            }
    else:
        resumed_from = None
        if ckpt is not None:
            assert resume is not None
            resumed_from = {
                "run_id": ckpt_run.get("run_id") if ckpt_run else None,
                "step": checkpoint.step_of(ckpt),
                "checkpoint": str(resume),
                "sha256": checkpoint.sha256_file(resume),
            }
            if start.source_changes:
                resumed_from["source_changes"] = start.source_changes
        loop.identity = artifacts.new_identity(
            recipe=loop.recipe.to_dict(),
            recipe_digest=loop.recipe.digest(),
            world_size=loop.world_size,
            source=_source_identity(loop.plugins),
            resumed_from=resumed_from,
        )
        artifacts.claim(folder, loop.identity)
    loop.metrics = artifacts.MetricsLog(folder / artifacts.METRICS_FILE)
    if in_place:
        assert ckpt is not None
        loop.metrics.mark_resume(
            checkpoint.step_of(ckpt), str(resume), source_changes=start.source_changes
        )


def _change_record(ckpt: dict[str, Any], start: _Start) -> dict[str, Any]:
    return {"step": checkpoint.step_of(ckpt), "changes": start.source_changes}


def _source_identity(plugins: registry.Plugins) -> dict[str, Any]:
    """What run.json records of the code that ran: slhub, torch and every plugin."""
    return {"slhub": __version__, "torch": str(torch.__version__), "plugins": plugins.to_list()}


def _logged(exc: BaseException) -> BaseException:
    """Log a traceback for errors that are bugs rather than bad input."""
    if not isinstance(exc, SlhubError):
        log.failure("unexpected error", exc)
    return exc
