"""slhub's own line for every refused checkpoint, naming the file.

A pickled (not weights-only) checkpoint says so, names the file and how to convert a
trusted one (and the conversion it gives works); a checkpoint whose tensors do not fit
the recipe's model (wrong shapes, a missing EMA) names the file too. Each through
``slhub inspect`` and ``slhub train --resume``: exit 2, one stderr line.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import cli_error, subprocess_env, two_update_checkpoint
from helpers import write_recipe as _write


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A real two-update checkpoint."""
    return two_update_checkpoint(tmp_path_factory.mktemp("ckpt"))


def _resume_error(capsys, tmp_path: Path, path: Path, **changes) -> str:
    recipe = _write(tmp_path / "r.yaml", trainer__output_dir=str(tmp_path / "out"), **changes)
    return cli_error(capsys, "train", "--config", str(recipe), "--resume", str(path))


def _pickled(tmp_path: Path, ckpt: Path) -> Path:
    """The checkpoint with one object only a pickle load reads (an argparse.Namespace)."""
    data = torch.load(ckpt, weights_only=True)
    data["ranks"][0]["extra"] = argparse.Namespace(seen=1)
    path = tmp_path / "pickled.pt"
    torch.save(data, path)
    return path


@pytest.mark.parametrize("command", ["inspect", "resume"])
def test_a_pickled_checkpoint_is_refused_in_slhubs_own_line(
    capsys, tmp_path: Path, ckpt: Path, command: str
):
    path = _pickled(tmp_path, ckpt)
    if command == "inspect":
        line = cli_error(capsys, "inspect", str(path))
    else:
        line = _resume_error(capsys, tmp_path, path)
    assert line.startswith(f"slhub: error: {path}: not a weights-only checkpoint ("), line
    assert "it names argparse.Namespace" in line and "weights_only=True" in line
    assert "If you trust the file" in line and "torch.load(" in line and "torch.save(" in line
    assert "Weights only load failed" not in line  # torch's own text is not passed on
    assert not (tmp_path / "out").exists()


def test_the_conversion_a_refusal_gives_makes_a_checkpoint_slhub_reads(
    capsys, tmp_path: Path, ckpt: Path
):
    path = _pickled(tmp_path, ckpt)
    line = cli_error(capsys, "inspect", str(path))
    snippet = re.search(r'python -c "(.*)"$', line)
    assert snippet is not None, line
    subprocess.run(
        [sys.executable, "-c", snippet.group(1)], check=True, env=subprocess_env(), timeout=120
    )
    converted = path.with_suffix(".weights.pt")
    from slhub import cli

    assert cli.main(["inspect", str(converted)]) == 0
    shown = capsys.readouterr().out
    assert "v1" in shown and "step:       2" in shown
    model = torch.load(converted, weights_only=True)["model"]
    original = torch.load(ckpt, weights_only=True)["model"]
    assert model.keys() == original.keys()
    assert all(torch.equal(model[key], original[key]) for key in model)


def test_wrong_tensor_shapes_name_the_checkpoint_file(capsys, tmp_path: Path, ckpt: Path):
    data = torch.load(ckpt, weights_only=True)
    key = next(k for k, v in data["model"].items() if v.dim() == 2)
    rows, cols = data["model"][key].shape
    data["model"][key] = torch.zeros(rows + 1, cols, dtype=data["model"][key].dtype)
    path = tmp_path / "reshaped.pt"
    torch.save(data, path)
    line = _resume_error(capsys, tmp_path, path)
    assert line.startswith(f"slhub: error: {path}: "), line
    assert "does not fit this recipe's model" in line and key in line
    assert not (tmp_path / "out").exists()
