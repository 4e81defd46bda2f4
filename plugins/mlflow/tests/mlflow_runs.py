"""Read an MLflow run back from the tracking server, and what it should hold.

What it should hold is the effective history of the slhub run's metrics.jsonl, as
``slhub.read_metrics`` returns it: every numeric value of every line at its step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from slhub import read_metrics

from slhub_mlflow.history import RESUME_KEY

EXPERIMENT = "slhub-tests"


def runs_of(client: MlflowClient, slhub_run_id: str) -> list[Run]:
    """Every MLflow run of the test experiment tagged with ``slhub_run_id``."""
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return []
    return client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`slhub.run_id` = '{slhub_run_id}'"
    )


def the_run(client: MlflowClient, slhub_run_id: str) -> Run:
    runs = runs_of(client, slhub_run_id)
    assert len(runs) == 1, f"{len(runs)} MLflow runs of slhub run {slhub_run_id}"
    return runs[0]


def history(client: MlflowClient, run_id: str) -> dict[int, dict[str, float]]:
    """What the MLflow run holds: ``step -> {key: value}``, each (step, key) at most once."""
    rows: dict[int, dict[str, float]] = {}
    for key in client.get_run(run_id).data.metrics:
        for metric in client.get_metric_history(run_id, key):
            row = rows.setdefault(metric.step, {})
            assert key not in row, f"{key} logged twice at step {metric.step}"
            row[key] = metric.value
    return rows


def shown(client: MlflowClient, run_id: str) -> dict[int, dict[str, float]]:
    """The run's history without the resume key."""
    rows = {
        step: {key: value for key, value in row.items() if key != RESUME_KEY}
        for step, row in history(client, run_id).items()
    }
    return {step: row for step, row in rows.items() if row}


def resume_rows(client: MlflowClient, run_id: str) -> list[tuple[int, float]]:
    """``(step, resumed from)`` of every step that carries the resume key."""
    return sorted(
        (step, row[RESUME_KEY])
        for step, row in history(client, run_id).items()
        if RESUME_KEY in row
    )


def expected(run: Path) -> dict[int, dict[str, Any]]:
    """The effective history of the run's metrics.jsonl, merged by step: every number."""
    rows: dict[int, dict[str, Any]] = {}
    for line in read_metrics(run / "metrics.jsonl"):
        numbers = {
            key: float(value)
            for key, value in line.items()
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
        }
        rows.setdefault(line["step"], {}).update(numbers)
    return rows
