"""Bootstrap of a run: everything around the loop, in the order a rank does it.

1. Launch settings: the recipe's device and timeout, read before the process
   group exists (or the device of the caller's ``distributed_run``).
2. Admission, on every rank: recipe, plugins, sections, the model and optimizer
   (:class:`slhub.trainer.Loop`) and the checkpoint to resume. Every rank agrees
   that every rank was admitted, or all fail with one message.
3. Rank 0 opens the run directory: claims a fresh one and writes the identity
   (run.json), or reopens the checkpoint's own run in place. Agreed again.
4. The loop runs; the metrics log is closed however it ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from slhub import artifacts, checkpoint, distributed, log, registry
from slhub._version import __version__
from slhub.errors import PluginError, SlhubError
from slhub.recipe import Recipe, as_recipe
from slhub.trainer import Loop

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
) -> Path:
    """Run a recipe on this process (one rank of a torchrun job, or alone).

    :param recipe: a YAML path, a recipe mapping or a validated :class:`Recipe`.
    :param overrides: ``a.b=VALUE`` overrides, as ``--set`` on the command line.
    :param resume: a checkpoint to continue from.
    :param log_format: ``console`` or ``json``.
    :param plugin: replaces the recipe's model plugin: a name or a plugin object
        (for example a class defined in a notebook cell).
    :param plugins: replaces the recipe's list of further plugins (names or objects).
    :returns: the output directory.
    :raises SlhubError: every rank-local error is agreed on, so all ranks raise
        the same error together.

    Inside a caller's :func:`slhub.distributed_run` the run uses that scope's
    device and process group; otherwise it opens its own from the recipe.
    """
    overrides = list(overrides or [])
    log.configure(log_format, distributed.env_rank(), distributed.env_world_size())

    def admit() -> Recipe:
        return as_recipe(recipe, overrides, plugin=plugin, plugins=plugins)

    outer = distributed.current_device()
    if outer is not None:
        return _train_on(admit, resume, outer)
    device_choice, timeout_s = _launch_settings(admit)
    with distributed.distributed_run(device_choice, timeout_s) as device:
        return _train_on(admit, resume, device)


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


def _train_on(read: Any, resume: str | Path | None, device: torch.device) -> Path:
    loop: Loop | None = None
    ckpt: dict[str, Any] | None = None
    error: BaseException | None = None
    try:
        loop, ckpt = _admit(read(), resume, device)
    except Exception as exc:  # noqa: BLE001 - agreed on below
        error = _logged(exc)
    _agree_or_raise(error, device)
    assert loop is not None
    if loop.is_main:
        try:
            _open_run_directory(loop, ckpt, resume)
        except Exception as exc:  # noqa: BLE001 - agreed on below
            error = _logged(exc)
    _agree_or_raise(error, device)
    del ckpt
    run_id = distributed.broadcast_from_rank0(loop.identity["run_id"] if loop.identity else None)
    log.bind(run_id=run_id)
    LOG.info(
        "start",
        recipe=loop.recipe.source,
        plugins=[source.name for source in loop.plugins.sources],
        device=str(device),
        start_step=loop.step,
        steps=loop.config.steps,
        output_dir=str(loop.output_dir),
    )
    try:
        loop.fit()
    except Exception as exc:
        _logged(exc)
        raise
    finally:
        if loop.metrics is not None:
            loop.metrics.close()
    LOG.info("done", step=loop.step)
    return loop.output_dir


def _admit(
    recipe: Recipe, resume: str | Path | None, device: torch.device
) -> tuple[Loop, dict[str, Any] | None]:
    """Everything a rank builds before training, with no side effects; raises on bad input."""
    plugins = registry.build_manager(recipe.plugin, recipe.plugins, recipe.objects)
    sections: dict[str, Any] = {}
    for part in plugins.hook.recipe_sections():
        for name, model in (part or {}).items():
            if name in sections or name in ("plugin", "plugins", "trainer"):
                raise PluginError(f"recipe section {name!r} is claimed twice")
            sections[name] = model
    recipe.validate_sections(sections)
    ckpt = None
    if resume is not None:
        ckpt = checkpoint.load_checkpoint(resume)
        checkpoint.check_resume_compatible(
            ckpt,
            resume,
            recipe=recipe.to_dict(),
            plugins=plugins.to_list(),
            world_size=distributed.world_size(),
        )
    loop = Loop(recipe, plugins, device)
    if ckpt is not None:
        loop.load(ckpt)
    return loop, ckpt


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


def _open_run_directory(loop: Loop, ckpt: dict[str, Any] | None, resume: str | Path | None) -> None:
    """Rank 0: claim a fresh output dir, or reopen the checkpoint's own run in place."""
    folder = loop.output_dir
    ckpt_run = checkpoint.run_of(ckpt) if ckpt is not None else None
    in_place = False
    if ckpt is not None:
        in_place = artifacts.check_resume_destination(folder, ckpt_run, checkpoint.step_of(ckpt))
    if in_place:
        loop.identity = ckpt_run
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
        loop.identity = artifacts.new_identity(
            recipe=loop.recipe.to_dict(),
            recipe_digest=loop.recipe.digest(),
            world_size=loop.world_size,
            source=_source_identity(loop.plugins),
            resumed_from=resumed_from,
        )
        artifacts.claim(folder, loop.identity)
    loop.metrics = artifacts.MetricsLog(folder / artifacts.METRICS_FILE)


def _source_identity(plugins: registry.Plugins) -> dict[str, Any]:
    """What run.json records of the code that ran: slhub, torch and every plugin."""
    return {"slhub": __version__, "torch": str(torch.__version__), "plugins": plugins.to_list()}


def _logged(exc: BaseException) -> BaseException:
    """Log a traceback for errors that are bugs rather than bad input."""
    if not isinstance(exc, SlhubError):
        LOG.error("unexpected error", exc_info=exc)
    return exc
