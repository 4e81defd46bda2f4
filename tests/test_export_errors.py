"""A bad export directory raises ``slhub.ExportError`` (still a ``ValueError``); export
directories and dataset caches are written through the one atomic-write helper; and
``slhub.one_line`` is the one way an exception becomes a user's line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import slhub
from slhub import ExportError, SlhubError, one_line
from slhub.builtin.nerd.model import NerdArch, NerdModel
from slhub.builtin.nerd.predictor import load_export, write_export
from slhub.data import cached_arrays
from slhub.export import load, read_manifest


def _export(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = NerdModel(NerdArch(history=3, width=8, layers=1, heads=2, mlp_hidden=16))
    out = tmp_path / "export"
    out.mkdir()
    return write_export(model, out, {"source_run_id": None, "step": 1})


def test_export_error_is_public_a_slhub_error_and_a_value_error():
    assert slhub.ExportError is ExportError and "ExportError" in slhub.__all__
    assert issubclass(ExportError, SlhubError) and issubclass(ExportError, ValueError)


def test_a_good_export_is_written_atomically_and_loads(tmp_path: Path):
    out = _export(tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "model.safetensors"]
    predictor = load(out)
    assert predictor.input_names == ("x", "theta", "x_dot", "theta_dot", "force")


def test_failed_manifest_write_leaves_no_partial_export(tmp_path: Path, monkeypatch):
    import slhub.builtin.nerd.predictor as predictor

    real = predictor.atomic_write

    def fail_on_manifest(data, *paths):
        if Path(paths[-1]).name == "export.json":
            raise OSError(28, "No space left on device")
        real(data, *paths)

    monkeypatch.setattr(predictor, "atomic_write", fail_on_manifest)
    with pytest.raises(OSError, match="No space left"):
        _export(tmp_path)
    assert list((tmp_path / "export").iterdir()) == []


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda out: (out / "export.json").unlink(), "no export.json"),
        (lambda out: (out / "export.json").write_text("{not json"), "cannot be read"),
        (
            lambda out: (out / "export.json").write_text(json.dumps({"format": "other/9"})),
            "export format 'other/9'",
        ),
        (
            lambda out: (out / "export.json").write_text(
                json.dumps({"format": "slhub.export/1", "kind": "no-such-kind"})
            ),
            "kind 'no-such-kind', which no installed package loads",
        ),
        (lambda out: (out / "model.safetensors").unlink(), "has no model.safetensors"),
        (lambda out: (out / "model.safetensors").write_bytes(b"\0" * 40), "cannot be read"),
    ],
    ids=["no-manifest", "bad-json", "foreign-format", "unknown-kind", "no-weights", "bad-weights"],
)
def test_a_bad_export_dir_raises_export_error(tmp_path: Path, damage, match: str):
    out = _export(tmp_path)
    damage(out)
    with pytest.raises(ExportError, match=match) as caught:
        load(out)
    assert isinstance(caught.value, ValueError)  # what `except ValueError` callers catch
    assert "\n" not in str(caught.value)


def test_read_manifest_and_the_nerd_loader_raise_export_error(tmp_path: Path):
    out = _export(tmp_path)
    with pytest.raises(ExportError, match="no export.json"):
        read_manifest(tmp_path)
    manifest = json.loads((out / "export.json").read_text())
    tampered = dict(manifest, input_names=list(reversed(manifest["input_names"])))
    with pytest.raises(ExportError, match="input_names"):
        load_export(out, tampered)


def test_cached_arrays_leave_no_temporary_files(tmp_path: Path):
    folder = tmp_path / "split"
    made = cached_arrays(folder, {"n": 3}, ["a"], lambda: {"a": np.arange(3)})
    assert made["a"].tolist() == [0, 1, 2]
    assert sorted(p.name for p in folder.iterdir()) == ["a.npy", "meta.json"]
    again = cached_arrays(folder, {"n": 3}, ["a"], lambda: pytest.fail("made twice"))
    assert again["a"].tolist() == [0, 1, 2]


# ------------------------------------------------------------------------ one_line


def test_one_line_collapses_whitespace_and_names_the_class():
    assert one_line(ValueError("bad\n  value\tthere")) == "ValueError: bad value there"
    assert one_line(KeyError("x")) == "KeyError: 'x'"
    assert one_line(RuntimeError()) == "RuntimeError"
    assert one_line(SystemExit(3)) == "SystemExit: 3"


def test_one_line_gives_a_slhub_error_its_text_alone():
    assert one_line(slhub.RecipeError("line.size\n must be >= 1")) == "line.size must be >= 1"
    assert one_line(SlhubError()) == "SlhubError"


def test_one_line_cuts_at_a_word_boundary_within_the_limit():
    words = " ".join(f"word{i}" for i in range(200))
    line = one_line(ValueError(words))
    assert len(line) <= 300 and line.endswith(" ...")
    kept = line[: -len(" ...")].removeprefix("ValueError: ").split(" ")
    assert kept == [f"word{i}" for i in range(len(kept))]  # whole words only
    for limit in range(16, 60):  # from room for "ValueError: ..."
        cut = one_line(ValueError(words), limit=limit)
        assert len(cut) <= limit and cut.endswith(" ...")
        assert cut[: -len(" ...")].split(" ")[-1] in {"ValueError:", *words.split(" ")}
    exact = "ValueError: " + "a" * 8
    assert one_line(ValueError("a" * 8), limit=len(exact)) == exact


def test_one_line_cuts_inside_a_word_only_when_one_word_passes_the_limit():
    assert one_line(SlhubError("x" * 50), limit=20) == "x" * 16 + " ..."
