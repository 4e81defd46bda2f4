"""Everything slhub writes as JSON is strict JSON, NaN and infinities included.

Log events (``--log-format json``), run.json and export manifests write a non-finite
value as ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, as metrics.jsonl does, so that
``jq`` and any strict parser read every line.
"""

from __future__ import annotations

import math
from pathlib import Path

from helpers import strict_json, write_recipe
from slhub import artifacts, cli, strictjson
from slhub.export import manifest_json


def test_a_run_with_non_finite_metrics_writes_only_strict_json(capsys, tmp_path: Path):
    out = tmp_path / "out"
    recipe = write_recipe(
        tmp_path / "r.yaml",
        plugins=["slhub_testplugins:NonFinite"],
        trainer__steps=2,
        trainer__validate_every=1,
        trainer__output_dir=str(out),
    )
    argv = ["train", "--config", str(recipe), "--log-format", "json"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    events = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert events
    parsed = [strict_json(line) for line in events]  # every log event
    assert any("NaN" in line for line in events) and any("Infinity" in line for line in events)
    assert any(isinstance(event, dict) and "-Infinity" in event.values() for event in parsed)
    for line in (out / "metrics.jsonl").read_text().splitlines():
        strict_json(line)
    strict_json((out / "run.json").read_text())

    # run.json's one mutable entry, with a non-finite value, stays strict
    artifacts.record_best(out, {"step": 2, "metric": "validation/nan", "value": math.nan})
    identity = strict_json((out / "run.json").read_text())
    assert identity["best"]["value"] == "NaN"


def test_manifests_encode_non_finite_values_as_metrics_jsonl_does():
    """Every exporter (NeRD, its ONNX entry, BC, RWM, the EMA record) writes its
    export.json with :func:`slhub.export.manifest_json`."""
    manifest = {"normalization": {"mean": [1.0, math.nan], "std": [math.inf, -math.inf]}}
    text = manifest_json(manifest)
    assert text.endswith("}\n")
    assert strict_json(text) == {
        "normalization": {"mean": [1.0, "NaN"], "std": ["Infinity", "-Infinity"]}
    }
    assert set(strictjson.NON_FINITE) == {"NaN", "Infinity", "-Infinity"}
    assert strictjson.dumps({"a": (math.nan,)}) == '{"a": ["NaN"]}'
    assert strictjson.dumps({"a": 1.5}) == '{"a": 1.5}'
