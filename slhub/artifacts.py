"""The output directory of a run: exclusive claim, run.json identity, append-only metrics.

Only rank 0 calls anything here that touches the filesystem.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from pathlib import Path
from typing import Any

from slhub.errors import ArtifactError

RUN_FORMAT = "slhub.run/1"
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"


def is_artifact(name: str) -> bool:
    """Files a run writes; a directory holding any of them is not fresh."""
    return name in (RUN_FILE, METRICS_FILE) or name.endswith(".pt") or ".pt.tmp-" in name


def artifacts_in(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if is_artifact(p.name))


def new_identity(
    *,
    recipe: dict[str, Any],
    recipe_digest: str,
    world_size: int,
    source: dict[str, Any],
    resumed_from: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A fresh run identity: what run.json and every checkpoint's ``run`` hold."""
    return {
        "format": RUN_FORMAT,
        "run_id": uuid.uuid4().hex,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "world_size": world_size,
        "recipe_digest": recipe_digest,
        "recipe": recipe,
        "source": source,
        "resumed_from": resumed_from,
    }


def claim(folder: Path, identity: dict[str, Any]) -> None:
    """Claim an artifact-free directory by creating run.json exclusively."""
    if folder.exists() and not folder.is_dir():
        raise ArtifactError(f"{folder}: trainer.output_dir exists and is not a directory")
    found = artifacts_in(folder)
    if found:
        raise ArtifactError(
            f"{folder}: output directory already holds run artifacts ({', '.join(found[:4])}); "
            "choose a fresh trainer.output_dir, or --resume a checkpoint of that run"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / RUN_FILE, "x") as handle:
            json.dump(identity, handle, indent=2, sort_keys=True, default=str)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
    except FileExistsError:
        raise ArtifactError(f"{folder}: another run claimed this directory first") from None
    except OSError as exc:
        raise ArtifactError(f"{folder}: cannot create output directory ({exc.strerror})") from None


def read_identity(folder: Path) -> dict[str, Any] | None:
    path = folder / RUN_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: unreadable run identity ({exc})") from None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every line of a metrics.jsonl; a torn last line (a crash mid-append) is ignored."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:
                break
            raise ArtifactError(f"{path}: line {i + 1} is not JSON") from None
    return out


def check_resume_destination(
    folder: Path, checkpoint_run: dict[str, Any] | None, checkpoint_step: int
) -> bool:
    """Decide whether a resume writes into a fresh directory (False) or in place (True).

    In place is allowed only when run.json belongs to the checkpoint's run and
    the metrics history is not ahead of the checkpoint.
    """
    found = artifacts_in(folder)
    if not found:
        return False
    identity = read_identity(folder)
    if identity is None:
        raise ArtifactError(
            f"{folder}: holds run artifacts ({', '.join(found[:4])}) but no run.json; "
            "resume into a fresh trainer.output_dir"
        )
    if checkpoint_run is None:
        raise ArtifactError(
            f"{folder}: a v1 checkpoint has no run identity and resumes only into a fresh "
            "trainer.output_dir"
        )
    if identity.get("run_id") != checkpoint_run.get("run_id"):
        raise ArtifactError(
            f"{folder}: run.json belongs to run {identity.get('run_id')}, the checkpoint to run "
            f"{checkpoint_run.get('run_id')}; resume into a fresh trainer.output_dir"
        )
    steps = [int(m["step"]) for m in read_metrics(folder / METRICS_FILE) if "step" in m]
    if steps and max(steps) > checkpoint_step:
        raise ArtifactError(
            f"{folder}: metrics history reaches update {max(steps)}, ahead of the checkpoint's "
            f"update {checkpoint_step}; resume into a fresh trainer.output_dir"
        )
    return True


class MetricsLog:
    """Append-only metrics.jsonl: one JSON object per line, each with ``step``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def append(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record, sort_keys=True) + "\n")
        self._handle.flush()

    def sync(self) -> None:
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()
