"""What an MLflow run holds of an slhub run, computed from its files alone (no mlflow).

A metrics line becomes one MLflow metric per numeric key at MLflow step = the line's
``step``; a resume marker at update k becomes ``slhub/resume = k`` at step k + 1, the
first update the resumed process logged. The recipe becomes params (flattened, dotted
keys) and run.json's identity becomes ``slhub.*`` tags.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from typing import Any

#: The key of the value a resumed process adds at its first update: the update it resumed from.
RESUME_KEY = "slhub/resume"
#: What a resume marker in metrics.jsonl holds as ``event``.
RESUME_EVENT = "resume"
#: MLflow's limits on a param value, a tag value and a key (longer values are cut).
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
#: Characters MLflow refuses in a key; each becomes ``_``.
UNSAFE_KEY = re.compile(r"[^\w\-. /]")

#: What a metric value may be.
NUMBER = (int, float)
#: A step's values: ``{key: value}``.
Row = dict[str, float]


def numeric(metrics: dict[str, Any]) -> Row:
    """The values of a metrics line MLflow can hold: numbers (``step`` aside). A None (an
    update skipped because every weight was 0) or a text value has no MLflow metric."""
    row: Row = {}
    for key, value in metrics.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, NUMBER):
            continue
        row[safe_key(key)] = float(value)
    return row


@functools.lru_cache(maxsize=4096)
def safe_key(key: str) -> str:
    """``key`` as MLflow takes it (a run logs the same few keys every update: cached)."""
    return UNSAFE_KEY.sub("_", key)[:MAX_KEY]


def rows_before(records: list[dict[str, Any]], until: float) -> Iterator[tuple[int, Row]]:
    """The rows of an effective history (``slhub.read_metrics(..., markers=True)``) at
    steps below ``until``, in step order, each step once: its lines merged, and
    ``slhub/resume`` at the step after each resume marker."""
    rows: dict[int, Row] = {}
    for record in records:
        step = record["step"]
        if record.get("event") == RESUME_EVENT:
            step, row = step + 1, {RESUME_KEY: float(step)}
        else:
            row = numeric(record)
        if step < until and row:
            rows.setdefault(step, {}).update(row)
    yield from sorted(rows.items())


def resume_marker(records: list[dict[str, Any]], first_step: int) -> dict[str, Any] | None:
    """This process's resume marker: the last one, if it is at ``first_step - 1``."""
    markers = [r for r in records if r.get("event") == RESUME_EVENT]
    if markers and markers[-1]["step"] == first_step - 1:
        return markers[-1]
    return None


def resumes(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every resume of the effective history: the update and checkpoint it resumed from."""
    return [
        {"step": r["step"], "checkpoint": r.get("checkpoint")}
        for r in records
        if r.get("event") == RESUME_EVENT
    ]


def params(recipe: dict[str, Any]) -> dict[str, str]:
    """The recipe as MLflow params: nested keys dotted (``trainer.lr``), every value as text
    (lists, None and numbers as JSON), cut to MLflow's length limit."""
    out: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
            return
        text = node if isinstance(node, str) else json.dumps(node, sort_keys=True, default=str)
        out[safe_key(prefix[:-1])] = text[:MAX_PARAM_VALUE]

    for key, value in recipe.items():
        walk(value, f"{key}.")
    return out


def text(value: Any) -> str:
    """A tag value: text as it is, anything else as JSON, cut to MLflow's limit."""
    out = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return out[:MAX_TAG_VALUE]


def identity_tags(identity: dict[str, Any]) -> dict[str, str]:
    """run.json's identity as ``slhub.*`` tags; ``slhub.run_id`` finds the run again."""
    tags = {
        f"slhub.{key}": text(identity[key])
        for key in ("run_id", "recipe_digest", "world_size", "source", "datasets", "resumed_from")
        if identity.get(key) is not None
    }
    parent = identity.get("resumed_from") or {}
    if parent.get("run_id"):
        tags["slhub.parent"] = parent["run_id"]
        tags["mlflow.note.content"] = (
            f"resumed from slhub run {parent['run_id']} at update {parent.get('step')}"
        )
    return tags
