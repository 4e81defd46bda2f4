"""Bootstrap of a run: everything around the loop, in the order a rank does it.

1. The recipe is read once; its device and timeout open the process group
   (or the caller's ``distributed_run`` gives them).
2. Admission, on every rank: plugins, sections, an output directory outside
   every dataset the recipe reads (:func:`slhub.data.training.check_output_dir`), the resume plan
   (:func:`slhub.checkpoint.plan_resume`: the checkpoint every rank resumes
   from, read by rank 0, checked against this run, and whether anything is left
   to train), the model and optimizer (:class:`slhub.trainer.Loop`) with the
   plan's checkpoint loaded into them, then every plugin's ``admit`` hook. Every
   rank agrees that every rank was admitted, or all fail with one message.
3. Rank 0 locks the run directory for the run's life, then opens it as the plan
   says (:func:`slhub.checkpoint.directory.open_run`: claimed fresh with a new
   identity, or the checkpoint's own run reopened in place). Agreed again.
4. The loop runs with the stop signals installed; the metrics log, the lock and
   what the plugins registered (streams, readers) are released however it ends.

These are the bootstrap's only calls into the checkpoint component: ``plan_resume``
once, then ``open_run`` once (``finish_complete`` instead for a finished run).

``resume="auto"`` resumes from the run directory's last checkpoint when it exists
on rank 0 and starts fresh otherwise (every rank follows rank 0), so one command
serves a job's first start and every requeue.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from slhub import artifacts, distributed, log, preemption, registry
from slhub.checkpoint import ResumePlan, StartRequest, plan_resume
from slhub.checkpoint.directory import finish_complete, open_run
from slhub.errors import PluginError, SlhubError
from slhub.recipe import CORE_KEYS, Recipe, as_recipe
from slhub.trainer import Loop, RunContext

LOG = log.get_logger()

RecipeInput = str | Path | dict[str, Any] | Recipe


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
    allow_dataset_change: bool = False,
) -> Path:
    """Run a recipe on this process (one rank of a torchrun job, or alone).

    :param recipe: a YAML path, a recipe mapping or a validated :class:`Recipe`.
    :param overrides: ``a.b=VALUE`` overrides, as ``--set`` on the command line.
    :param resume: a checkpoint to continue from, or ``"auto"``: the run
        directory's last checkpoint when it exists, else a fresh start.
    :param log_format: ``console`` or ``json``.
    :param overwrite: move the artifacts already in the output directory aside
        (into a dated ``superseded-*`` folder) and start fresh.
    :param allow_source_change: resume although the slhub or torch version or a
        plugin's code differs from the checkpoint's; the run records what changed.
    :param allow_dataset_change: resume although a dataset a plugin recorded differs
        from the checkpoint's (content, episodes, split); the run records what changed.
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
    request = StartRequest(resume, overwrite, allow_source_change, allow_dataset_change)
    if distributed.launched_by_torchrun():
        preemption.stop_with_parent()
    # read once, on every rank; a recipe that does not load fails admission on every
    # rank together, through the process group that the defaults open
    admitted: Recipe | Exception
    try:
        admitted = as_recipe(recipe, overrides, plugin=plugin, plugins=plugins)
    except Exception as exc:  # noqa: BLE001 - held for the admission agreement
        admitted = exc
    outer = distributed.current_device()
    if outer is not None:
        return _train_on(admitted, request, outer)
    if isinstance(admitted, Recipe):
        device_choice, timeout_s = admitted.trainer.device, admitted.trainer.timeout_s
    else:
        device_choice, timeout_s = "auto", 600.0
    with distributed.distributed_run(device_choice, timeout_s) as device:
        return _train_on(admitted, request, device)


def _train_on(admitted: Recipe | Exception, request: StartRequest, device: torch.device) -> Path:
    run_lock: artifacts.RunLock | None = None
    identity: dict[str, Any] | None = None
    metrics: artifacts.MetricsLog | None = None
    loop: Loop | None = None
    try:
        if isinstance(admitted, Recipe):
            _set_threads(admitted.trainer.threads, device)
        run_lock, loop, plan, error = _admit(admitted, request, device)
        _agree_or_raise(error, device)
        assert plan is not None and isinstance(admitted, Recipe)
        if plan.complete:  # a requeue of a finished run: nothing to do, exit 0
            assert plan.checkpoint is not None
            LOG.info(
                "done", step=plan.checkpoint.step, already="complete", checkpoint=str(plan.path)
            )
            return Path(admitted.trainer.output_dir)
        assert loop is not None
        if loop.is_main:
            try:
                run_lock, identity, metrics = _open_run_directory(loop, admitted, plan, run_lock)
            except Exception as exc:  # noqa: BLE001 - agreed on below
                error = _logged(exc)
        _agree_or_raise(error, device)
        del plan
        return _fit(loop, admitted, device, identity, metrics)
    finally:
        if loop is not None:  # streams and readers, also when admission failed elsewhere
            loop.close()
        if metrics is not None:
            metrics.close()
        if run_lock is not None:
            run_lock.release()


def _set_threads(threads: str | int, device: torch.device) -> None:
    """``trainer.threads``: torch's intra-op threads for this process (see the recipe key)."""
    if threads == "auto":
        if device.type != "cpu" or os.environ.get("OMP_NUM_THREADS"):
            return
        threads = 1
    torch.set_num_threads(int(threads))


def _fit(
    loop: Loop,
    recipe: Recipe,
    device: torch.device,
    identity: dict[str, Any] | None,
    metrics: artifacts.MetricsLog | None,
) -> Path:
    run_id = distributed.broadcast_from_rank0(identity["run_id"] if identity else None)
    log.bind(run_id=run_id)
    LOG.info(
        "start",
        step=loop.step,
        total=loop.config.steps,
        device=str(device),
        threads=torch.get_num_threads(),
    )
    LOG.info(
        "recipe",
        path=recipe.path,
        output_dir=str(loop.output_dir),
        plugins=",".join(source["name"] for source in loop.code_identity()["plugins"]),
    )
    log.set_step(loop.step)
    try:
        with preemption.StopSignals(loop.config.stop_signals) as signals:
            loop.fit(RunContext(run_id, identity, metrics, signals))
    except preemption.Preempted as exc:
        LOG.warning("preempted", step=exc.step)
        raise
    except Exception as exc:
        _logged(exc)
        raise
    LOG.info("done", step=loop.step)
    return loop.output_dir


def _admit(
    admitted: Recipe | Exception, request: StartRequest, device: torch.device
) -> tuple[artifacts.RunLock | None, Loop | None, ResumePlan | None, BaseException | None]:
    """Everything a rank builds before training, with no side effects but one: under
    ``--resume auto`` rank 0 locks the run directory before it reads ``last.pt``, so a
    run waiting on another writer never resumes from a checkpoint that writer replaced.

    Returns the lock (rank 0, ``--resume auto``), the loop and the resume plan, or this
    rank's error, held for the admission agreement. Every rank reaches the checkpoint
    exchange with rank 0 (collectives), whatever failed before it. The loop is not
    built for a run that is already complete.
    """
    run_lock: artifacts.RunLock | None = None
    error: BaseException | None = None
    recipe: Recipe | None = None
    plugins: registry.Plugins | None = None
    try:
        if isinstance(admitted, Exception):
            raise admitted
        recipe = admitted
        plugins = validate_sections(recipe)
        # before the run directory exists: a run never writes into a dataset it reads
        from slhub.data.training import check_output_dir  # the data layer, when a run has data

        check_output_dir(recipe.trainer.output_dir, recipe.sections)
        if request.auto and distributed.rank() == 0:
            run_lock = artifacts.lock(Path(recipe.trainer.output_dir))
    except Exception as exc:  # noqa: BLE001 - held for the agreement
        error = _logged(exc)
    ok = error is None and recipe is not None and plugins is not None
    plan, plan_error = plan_resume(
        request,
        output_dir=recipe.trainer.output_dir if ok else None,
        recipe=recipe.to_dict() if ok else None,
        source=plugins.code_identity() if ok else None,
        failed=not ok,
    )
    if error is not None or plan_error is not None:
        return run_lock, None, None, error or _logged(plan_error)
    assert recipe is not None and plugins is not None and plan is not None
    if plan.complete:
        if run_lock is not None:  # rank 0: a kill may have cut the last write short
            try:
                finish_complete(plan, recipe)
            except Exception as exc:  # noqa: BLE001 - held for the agreement
                return run_lock, None, None, _logged(exc)
        return run_lock, None, plan, None
    loop: Loop | None = None
    try:
        loop = Loop(recipe, plugins, device, plan)  # closes what it opened when it fails
        loop.admit()  # the plugins' last word, before any artifact
    except Exception as exc:  # noqa: BLE001 - held for the agreement
        if loop is not None:
            loop.close()
        return run_lock, None, None, _logged(exc)
    return run_lock, loop, plan, None


def validate_sections(recipe: Recipe) -> registry.Plugins:
    """The run's plugins, with every plugin section of ``recipe`` validated against the
    models they declare: what admission checks of a recipe before anything is written
    (``slhub sweep`` checks its search space with it)."""
    plugins = registry.build_manager(recipe.plugin, recipe.plugins, recipe.objects)
    sections: dict[str, Any] = {}
    for part in plugins.hook.recipe_sections():
        for name, model in (part or {}).items():
            if name in sections or name in CORE_KEYS:
                raise PluginError(f"recipe section {name!r} is claimed twice")
            sections[name] = model
    recipe.validate_sections(sections)
    return plugins


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
    loop: Loop, recipe: Recipe, plan: ResumePlan, held: artifacts.RunLock | None = None
) -> tuple[artifacts.RunLock, dict[str, Any], artifacts.MetricsLog]:
    """Rank 0: lock the output dir (unless admission ``held`` it already), then claim it
    fresh or reopen the checkpoint's run in place. Returns the lock, the identity
    checkpoints carry and the metrics log."""
    run_lock = held if held is not None else artifacts.lock(loop.output_dir)
    try:
        identity, metrics = open_run(
            plan,
            recipe=recipe,
            world_size=loop.world_size,
            source=loop.code_identity(),
            datasets=loop.datasets,
            dataset_changes=loop.dataset_changes,
        )
    except BaseException:
        run_lock.release()
        raise
    return run_lock, identity, metrics


def _logged(exc: BaseException) -> BaseException:
    """Log a traceback for errors that are bugs rather than bad input."""
    if not isinstance(exc, SlhubError):
        log.failure("unexpected error", exc)
    return exc
