"""Everything slhub-mlflow asks of a tracking server, through ``mlflow.MlflowClient``.

Only rank 0 imports this module (the plugin imports it inside its hooks), so no
other rank ever loads mlflow or opens a connection.

One MLflow run per slhub run: the MLflow run carries slhub's ``run_id`` as the tag
``slhub.run_id`` and is found again by it (``search_runs``), so a resume in place
continues it even when the process before died before its first checkpoint. What
the server already holds is read back per key (the last step of each metric), and a
value is sent only past it: the run's history never holds a step twice.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.store.artifact.artifact_repo import ArtifactRepository
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.tracking import MlflowClient
from slhub import SlhubError, one_line, read_metrics

from slhub_mlflow.history import Row, identity_tags, params, resumes, rows_before, text
from slhub_mlflow.section import SECTION, MlflowSection

#: MLflow's HTTP settings unless the environment sets them: a lost server costs
#: seconds (a 5 s timeout, 2 retries), not MLflow's default minutes; and no run URL
#: printed on stdout, which slhub leaves to its own log.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
#: The MLflow run status of each ``on_fit_end`` status.
RUN_STATUS = {"done": "FINISHED", "preempted": "KILLED", "failed": "FAILED"}
#: Where run.json goes among the MLflow run's artifacts.
IDENTITY_ARTIFACT = "slhub/run.json"
#: Where checkpoints go among the MLflow run's artifacts.
CHECKPOINT_ARTIFACTS = "checkpoints"
RUN_ID_TAG = "slhub.run_id"
#: An operating system's error inside the text of a failed request.
OS_ERROR = re.compile(r"\[Errno -?\d+\] [^'\")\]]+|timed out")
#: Where slhub writes a run's identity and its metrics history.
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"


def client(uri: str) -> MlflowClient:
    """A client of the server at ``uri``, with :data:`HTTP_DEFAULTS` in the environment."""
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    return MlflowClient(tracking_uri=uri)


def check_server(uri: str, experiment: str) -> None:
    """Refuse, in one line, a server that does not answer or an experiment it deleted."""
    try:
        found = client(uri).get_experiment_by_name(experiment)
    except Exception as exc:  # noqa: BLE001 - any failure to answer is the same mistake
        raise SlhubError(
            f"{SECTION}.tracking_uri: cannot reach the MLflow tracking server at {uri} "
            f"({reason(exc)}); start it, or name a running one"
        ) from None
    if found is not None and found.lifecycle_stage != "active":
        raise SlhubError(
            f"{SECTION}.experiment: {experiment!r} is deleted on {uri}; restore it "
            "(mlflow experiments restore) or name another experiment"
        )


def reason(exc: BaseException) -> str:
    """Why a request failed, short: the operating system's words when the connection
    failed (``[Errno 111] Connection refused``), else the error as one line."""
    found = OS_ERROR.search(str(exc))
    return found.group(0) if found else one_line(exc, limit=200)


def experiment_id(mlflow: MlflowClient, name: str) -> str:
    """The id of experiment ``name``, created when absent."""
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return mlflow.create_experiment(name)
    except Exception:  # another process created it meanwhile
        found = mlflow.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def find_run(mlflow: MlflowClient, experiment: str, slhub_run_id: str) -> str | None:
    """The MLflow run of slhub run ``slhub_run_id`` in the experiment (the oldest), if any."""
    runs = mlflow.search_runs(
        [experiment],
        filter_string=f"tags.`{RUN_ID_TAG}` = '{slhub_run_id}'",
        order_by=["attributes.start_time ASC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def held_steps(mlflow: MlflowClient, run_id: str) -> dict[str, int]:
    """The last step the server holds of each metric of the run."""
    keys = mlflow.get_run(run_id).data.metrics
    return {key: max(m.step for m in mlflow.get_metric_history(run_id, key)) for key in keys}


@dataclass
class Link:
    """One MLflow run being written: sends each value once, past what the server holds."""

    mlflow: MlflowClient
    run_id: str
    experiment_id: str
    created: bool
    held: dict[str, int] = field(default_factory=dict)
    store: ArtifactRepository | None = None

    def send(self, rows: list[tuple[int, Row, int]]) -> int:
        """Log ``(step, row, timestamp_ms)`` rows in one batch (MLflow splits it to its
        limits); a value at or before the step the server holds of its key is left out.
        Returns how many values were sent."""
        metrics = []
        for step, row, stamp in rows:
            for key, value in row.items():
                if step > self.held.get(key, 0):
                    metrics.append(Metric(key, value, stamp, step))
                    self.held[key] = step
        if metrics:
            self.mlflow.log_batch(self.run_id, metrics=metrics)
        return len(metrics)

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.mlflow.log_batch(
            self.run_id, tags=[RunTag(key, text(value)) for key, value in tags.items()]
        )

    def artifacts(self) -> ArtifactRepository:
        """The run's artifact store, reached through this client's server. (MlflowClient's
        own artifact calls keep one store per run id for the whole process, reached
        through the first server it was asked with: a second run of the same process
        against another server would upload to the first.)"""
        if self.store is None:
            location = self.mlflow.get_run(self.run_id).info.artifact_uri
            self.store = get_artifact_repository(location, tracking_uri=self.mlflow.tracking_uri)
        return self.store

    def log_identity(self, run_dir: Path) -> None:
        """run.json, whole, as the artifact ``slhub/run.json`` (replaced each time)."""
        folder, name = IDENTITY_ARTIFACT.rsplit("/", 1)
        with tempfile.TemporaryDirectory() as scratch:
            copy = Path(scratch) / name
            copy.write_bytes((run_dir / RUN_FILE).read_bytes())
            self.artifacts().log_artifact(str(copy), folder)

    def log_checkpoints(self, run_dir: Path) -> None:
        for name in ("last.pt", "best.pt"):
            if (run_dir / name).is_file():
                self.artifacts().log_artifact(str(run_dir / name), CHECKPOINT_ARTIFACTS)

    def end(self, status: str, step: int) -> None:
        """Record how the run ended: tags ``slhub.status``, ``slhub.step``, and the MLflow
        run status (FINISHED, KILLED when preempted, FAILED)."""
        self.set_tags({"slhub.status": status, "slhub.step": step})
        self.mlflow.set_terminated(self.run_id, RUN_STATUS.get(status, "FAILED"))


def open_run(uri: str, section: MlflowSection, identity: dict[str, Any], run_name: str) -> Link:
    """The MLflow run of this slhub run: found by its ``slhub.run_id`` tag and set
    running again, or created with the recipe as params and the identity as tags (a
    run resumed into a fresh directory also names its parent's MLflow run)."""
    mlflow = client(uri)
    experiment = experiment_id(mlflow, section.experiment)
    found = find_run(mlflow, experiment, identity["run_id"])
    if found is not None:
        mlflow.update_run(found, status="RUNNING")
        return Link(mlflow, found, experiment, False, held_steps(mlflow, found))
    tags = {**identity_tags(identity), **section.tags, "slhub.status": "running"}
    parent = (identity.get("resumed_from") or {}).get("run_id")
    parent_run = find_run(mlflow, experiment, parent) if parent else None
    if parent_run is not None:
        tags["slhub.parent_mlflow_run_id"] = parent_run
    run = mlflow.create_run(experiment, run_name=run_name, tags=tags)
    link = Link(mlflow, run.info.run_id, experiment, True)
    recipe = params(identity.get("recipe", {}))
    mlflow.log_batch(link.run_id, params=[Param(key, value) for key, value in recipe.items()])
    return link


def attach(
    uri: str, section: MlflowSection, run_dir: Path, run_name: str, until: float
) -> tuple[Link, list[tuple[int, Row, int]]]:
    """Open the MLflow run of the slhub run in ``run_dir`` and return it with the rows
    of the run's effective history at steps below ``until`` (what an earlier process,
    or one that lost the server, may not have logged; :meth:`Link.send` leaves out
    what the server holds). Tags the run with its resumes and logs run.json."""
    identity = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    records = read_metrics(run_dir / METRICS_FILE, markers=True)
    link = open_run(uri, section, identity, run_name)
    stamp = now_ms()
    rows = [(step, row, stamp) for step, row in rows_before(records, until)]
    link.set_tags({"slhub.resumes": resumes(records)})
    link.log_identity(run_dir)
    return link, rows


def now_ms() -> int:
    return int(time.time() * 1000)
