"""A file never chooses code to import.

A checkpoint loads with ``weights_only=True``, but the names inside it are data
too: ``slhub export``, ``slhub inspect`` and ``slhub train --resume`` must never
import a ``module:object`` recorded in a checkpoint. The crafted checkpoints
here name a module, placed beside them in the working directory, that creates a
file when it is imported; the file must never appear.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, SL_DDP, load, one_line_error, subprocess_env, write_recipe

PAYLOAD = """from pathlib import Path
Path(__file__).with_name("IMPORTED").write_text("code chosen by a file ran")


class Plugin:
    pass
"""


def _slhub(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env["PYTHONPATH"]])
    return subprocess.run(
        [sys.executable, "-m", "slhub", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def real_checkpoint(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("real")
    recipe = write_recipe(tmp / "r.yaml", trainer__steps=2, trainer__output_dir=str(tmp / "o"))
    proc = _slhub(REPO, "train", "--config", str(recipe))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return load(tmp / "o" / "last.pt")


@pytest.fixture(params=["evil_module:Plugin", "this:"])
def crafted(request, tmp_path: Path, real_checkpoint: dict) -> tuple[Path, Path]:
    """A checkpoint whose run names ``request.param`` as its plugin, in every known place."""
    spec = request.param
    (tmp_path / "evil_module.py").write_text(PAYLOAD)
    ckpt = dict(real_checkpoint)
    run = dict(ckpt["run"])
    source = {"name": spec, "object": spec, "dist": None, "version": None, "role": "model"}
    run["source"] = {**run["source"], "plugins": [source], "plugin": source}
    run["recipe"] = {**run["recipe"], "plugin": spec}
    ckpt["run"] = run
    path = tmp_path / "crafted.pt"
    torch.save(ckpt, path)
    return tmp_path, path


def test_export_never_imports_the_plugin_a_checkpoint_names(crafted):
    cwd, path = crafted
    proc = _slhub(cwd, "export", "--checkpoint", str(path), "--out", str(cwd / "exported"))
    line = one_line_error(proc)
    assert "never imports code a checkpoint names" in line and "--plugin" in line
    assert not (cwd / "IMPORTED").exists()
    assert "Zen of Python" not in proc.stdout + proc.stderr
    assert not (cwd / "exported").exists()


def test_inspect_never_imports_the_plugin_a_checkpoint_names(crafted):
    cwd, path = crafted
    proc = _slhub(cwd, "inspect", str(path))
    assert proc.returncode == 0, proc.stderr
    assert not (cwd / "IMPORTED").exists()
    assert "Zen of Python" not in proc.stdout + proc.stderr


def test_resume_never_imports_the_plugin_a_checkpoint_names(crafted):
    cwd, path = crafted
    proc = _slhub(
        cwd, "train", "--config", str(SL_DDP), "--set", f"trainer.output_dir={cwd / 'o'}",
        "--resume", str(path),
    )  # fmt: skip
    assert "plugins differ" in one_line_error(proc)
    assert not (cwd / "IMPORTED").exists()
    assert "Zen of Python" not in proc.stdout + proc.stderr


def test_the_user_may_name_a_path_plugin_explicitly(tmp_path: Path, real_checkpoint: dict):
    """A name on the command line is the user's choice: that plugin is asked to export."""
    path = tmp_path / "ckpt.pt"
    torch.save(real_checkpoint, path)
    (tmp_path / "evil_module.py").write_text(PAYLOAD)
    proc = _slhub(
        tmp_path, "export", "--checkpoint", str(path), "--out", str(tmp_path / "e"),
        "--plugin", "evil_module:Plugin",
    )  # fmt: skip
    assert (tmp_path / "IMPORTED").exists()  # imported because the user named it
    line = one_line_error(proc)
    assert "not a checkpoint any plugin asked can export (asked: evil_module:Plugin)" in line
