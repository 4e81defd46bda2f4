"""The run directory a plan starts in: claimed fresh, or the checkpoint's own reopened.

Rank 0 calls one of these, holding the directory's lock, once admission is agreed:

- :func:`open_run` claims the directory with a new identity (run.json) or reopens
  the checkpoint's run in place, and returns the identity every checkpoint carries
  and the metrics log;
- :func:`finish_complete`, for a requeue of a finished run, only finishes the
  newest checkpoint's write where a kill cut it short.

What run.json records of a resume is decided here from the :class:`ResumePlan`:
``resumed_from`` for a fresh destination, and for either destination the history of
the code (``source_changes``) and data (``dataset_changes``) changes it accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slhub import artifacts, log
from slhub.checkpoint.files import LAST
from slhub.checkpoint.manager import finish_write
from slhub.checkpoint.resume import ResumePlan
from slhub.errors import ArtifactError
from slhub.recipe import Recipe

LOG = log.get_logger()


def finish_complete(plan: ResumePlan, recipe: Recipe) -> None:
    """Rank 0, holding the lock, for a plan that is ``complete``: a kill may have cut the
    last write short; finish it as the uninterrupted run would have."""
    assert plan.complete and plan.checkpoint is not None and plan.path is not None
    folder = Path(recipe.trainer.output_dir)
    finish_write(folder, plan.checkpoint, plan.path, plan.sha256, recipe.trainer)


def open_run(
    plan: ResumePlan,
    *,
    recipe: Recipe,
    world_size: int,
    source: dict[str, Any],
    datasets: dict[str, dict[str, Any]],
    dataset_changes: list[str],
) -> tuple[dict[str, Any], artifacts.MetricsLog]:
    """Rank 0, holding the lock: claim the output directory fresh or reopen the
    checkpoint's run in place. Returns the identity checkpoints carry and the metrics log.

    ``source`` is this run's code (slhub, torch, plugins); ``datasets`` what the plugins
    recorded and ``dataset_changes`` the differences the resume accepted
    (:meth:`ResumePlan.check_datasets`).
    """
    folder = Path(recipe.trainer.output_dir)
    ckpt = plan.checkpoint
    if plan.request.overwrite or plan.auto_fresh:
        if plan.auto_fresh and any(n.endswith(".pt") for n in artifacts.artifacts_in(folder)):
            raise ArtifactError(
                f"{folder}: holds checkpoints but no {LAST}, so --resume auto cannot tell "
                "where to continue; --resume one of them, or pass --overwrite to start over"
            )
        moved = artifacts.move_aside(folder)
        if moved is not None:
            LOG.warning("moved old artifacts aside", folder=str(moved))
    changes = list(plan.source_changes)
    data_changes = list(dataset_changes)
    in_place = ckpt is not None and artifacts.check_resume_destination(folder, ckpt.run)
    if in_place:
        assert ckpt is not None and ckpt.run is not None and plan.path is not None
        # a kill may have cut the resumed checkpoint's write short: finish it first
        finish_write(folder, ckpt, plan.path, plan.sha256, recipe.trainer)
        identity = ckpt.run
        if changes:  # later checkpoints carry the code that wrote them
            history = [*ckpt.run.get("source_changes", []), {"step": ckpt.step, "changes": changes}]
            identity = {**identity, "source": source, "source_changes": history}
        if data_changes:  # ... and the data they trained on
            history = [
                *ckpt.run.get("dataset_changes", []),
                {"step": ckpt.step, "changes": data_changes},
            ]
            identity = {**identity, "datasets": datasets, "dataset_changes": history}
    else:
        resumed_from = None
        if ckpt is not None:
            resumed_from = {
                "run_id": ckpt.run_id,
                "step": ckpt.step,
                "checkpoint": str(plan.path),
                "sha256": plan.sha256,
            }
            if changes:
                resumed_from["source_changes"] = changes
            if data_changes:
                resumed_from["dataset_changes"] = data_changes
        identity = artifacts.new_identity(
            recipe=recipe.to_dict(),
            recipe_digest=recipe.digest(),
            world_size=world_size,
            source=source,
            resumed_from=resumed_from,
        )
        if datasets:
            identity["datasets"] = datasets
        artifacts.claim(folder, identity)
    metrics = artifacts.MetricsLog(folder / artifacts.METRICS_FILE)
    if in_place:
        assert ckpt is not None
        metrics.mark_resume(ckpt.step, str(plan.path), source_changes=changes)
    return identity, metrics
