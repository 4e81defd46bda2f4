"""The ``mlflow`` extra plugin: rank 0 mirrors metrics.jsonl into one MLflow run per slhub run.

metrics.jsonl is the run's source of truth; this plugin only mirrors it. Every
line rank 0 writes reaches :meth:`MlflowLogger.on_log` and each numeric value is
logged as an MLflow metric at step = the line's ``step``, from a background thread
(:mod:`slhub_mlflow.writer`), so training never waits for the server.

One MLflow run per slhub run, found again by the tag ``slhub.run_id``: a resume in
place continues it, a resume into a fresh directory (a new slhub run) starts a new
one naming its parent. Never a step twice: the server is asked the last step it
holds of each metric and only later values are sent; what an earlier process did
not get to the server is sent from metrics.jsonl first. The MLflow run's history
is then the effective history of metrics.jsonl (``slhub.read_metrics``).

Other ranks return at once from every hook: they never import mlflow (only
:mod:`slhub_mlflow.tracker` does, on rank 0) and never contact the server.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from slhub import Trainer, hookimpl

from slhub_mlflow.history import numeric
from slhub_mlflow.section import SECTION, MlflowSection, tracking_uri

if TYPE_CHECKING:
    from slhub_mlflow.writer import Writer

if importlib.util.find_spec("mlflow") is None:  # fail when the plugin loads, not mid-run
    raise ImportError(
        "the mlflow package is not installed: pip install mlflow (or pip install slhub-mlflow)"
    )


class MlflowLogger:
    """Logs every metrics line of rank 0 to an MLflow tracking server (one instance per run)."""

    def __init__(self) -> None:
        self.writer: Writer | None = None

    @hookimpl
    def recipe_sections(self) -> dict[str, type[BaseModel]]:
        return {SECTION: MlflowSection}

    @hookimpl
    def admit(self, trainer: Trainer) -> None:
        """Rank 0 refuses a server it cannot reach (or none named) before the run writes
        anything: the MLflow run starts only at the first metrics line."""
        if not trainer.is_main:
            return
        from slhub_mlflow import tracker

        section: MlflowSection = trainer.section(SECTION)
        tracker.check_server(tracking_uri(section), section.experiment)

    @hookimpl
    def on_log(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        if not trainer.is_main:
            return  # other ranks never import mlflow nor contact a tracker
        if self.writer is None:
            from slhub_mlflow.writer import Writer

            section: MlflowSection = trainer.section(SECTION)
            run_dir = Path(trainer.output_dir)
            name = section.run_name or run_dir.name
            self.writer = Writer(tracking_uri(section), section, run_dir, name, first_step=step)
        self.writer.log(step, numeric(metrics))

    @hookimpl
    def on_fit_end(self, trainer: Trainer, status: str) -> None:
        """Send what is queued and end the MLflow run: ``slhub.status`` (done, preempted or
        failed, also when another rank failed), ``slhub.step`` (the last committed
        update) and the run status FINISHED, KILLED or FAILED."""
        if self.writer is None:
            return
        writer, self.writer = self.writer, None
        section: MlflowSection = trainer.section(SECTION)
        writer.close(status, trainer.step, checkpoints=section.log_checkpoints)
