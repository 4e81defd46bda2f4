"""A file never chooses code to import.

A checkpoint loads with ``weights_only=True``, but the names inside it are data
too: ``slhub export``, ``slhub inspect`` and ``slhub train --resume`` must never
import a ``module:object`` recorded in a checkpoint. The crafted checkpoints
here name a module, placed beside them in the working directory, that creates a
file when it is imported; the file must never appear.

The commands run in this process, from the crafted checkpoint's directory with
that directory on ``sys.path`` (as ``python -m slhub`` there has it) and with
neither named module imported yet, so an import would run the module's code and
leave it in ``sys.modules``. One check runs in a fresh interpreter, end to end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO, SL_DDP, load, one_line_error, subprocess_env, write_recipe
from slhub import cli, train

PAYLOAD = """from pathlib import Path
Path(__file__).with_name("IMPORTED").write_text("code chosen by a file ran")


class Plugin:
    pass
"""

#: The modules the crafted checkpoints name: one beside them, and ``this``, whose import
#: prints the Zen of Python.
NAMED = ("evil_module", "this")


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


def _in_process(capsys, *argv: str) -> subprocess.CompletedProcess:
    """``slhub ARGV`` in this process, reported as a finished process would be."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["slhub", *argv], code, out, err)


@pytest.fixture
def in_dir(tmp_path: Path, monkeypatch) -> Path:
    """This process as ``python -m slhub`` started in ``tmp_path`` would be: that directory
    current and on ``sys.path`` (with the repository), no module of :data:`NAMED` imported.
    All of it is restored after the test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in NAMED:
        monkeypatch.setitem(sys.modules, name, None)  # restores the entry after the test
        monkeypatch.delitem(sys.modules, name)
    return tmp_path


def _imported(cwd: Path) -> list[str]:
    """Evidence that a named module was imported in this process."""
    found = [name for name in NAMED if name in sys.modules]
    return [*found, "IMPORTED"] if (cwd / "IMPORTED").exists() else found


@pytest.fixture(scope="module")
def real_checkpoint(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("real")
    recipe = write_recipe(tmp / "r.yaml", trainer__steps=2, trainer__output_dir=str(tmp / "o"))
    train(str(recipe))
    return load(tmp / "o" / "last.pt")


def _crafted(folder: Path, spec: str, real_checkpoint: dict) -> Path:
    """A checkpoint whose run names ``spec`` as its plugin, in every known place, beside
    the module ``evil_module``."""
    (folder / "evil_module.py").write_text(PAYLOAD)
    ckpt = dict(real_checkpoint)
    run = dict(ckpt["run"])
    source = {"name": spec, "object": spec, "dist": None, "version": None, "role": "model"}
    run["source"] = {**run["source"], "plugins": [source], "plugin": source}
    run["recipe"] = {**run["recipe"], "plugin": spec}
    ckpt["run"] = run
    path = folder / "crafted.pt"
    torch.save(ckpt, path)
    return path


@pytest.fixture(params=["evil_module:Plugin", "this:"])
def crafted(request, in_dir: Path, real_checkpoint: dict) -> tuple[Path, Path]:
    return in_dir, _crafted(in_dir, request.param, real_checkpoint)


def test_export_never_imports_the_plugin_a_checkpoint_names(capsys, crafted):
    cwd, path = crafted
    proc = _in_process(capsys, "export", "--checkpoint", str(path), "--out", str(cwd / "exported"))
    line = one_line_error(proc)
    assert "never imports code a checkpoint names" in line and "--plugin" in line
    assert _imported(cwd) == []
    assert "Zen of Python" not in proc.stdout + proc.stderr
    assert not (cwd / "exported").exists()


def test_export_never_imports_it_in_a_fresh_interpreter(tmp_path: Path, real_checkpoint: dict):
    """End to end: ``python -m slhub export`` started beside the module the checkpoint names."""
    path = _crafted(tmp_path, "evil_module:Plugin", real_checkpoint)
    proc = _slhub(tmp_path, "export", "--checkpoint", str(path), "--out", str(tmp_path / "e"))
    line = one_line_error(proc)
    assert "never imports code a checkpoint names" in line and "--plugin" in line
    assert not (tmp_path / "IMPORTED").exists()
    assert not (tmp_path / "e").exists()


def test_inspect_never_imports_the_plugin_a_checkpoint_names(capsys, crafted):
    cwd, path = crafted
    proc = _in_process(capsys, "inspect", str(path))
    assert proc.returncode == 0, proc.stderr
    assert _imported(cwd) == []
    assert "Zen of Python" not in proc.stdout + proc.stderr


def test_resume_never_imports_the_plugin_a_checkpoint_names(capsys, crafted):
    cwd, path = crafted
    proc = _in_process(
        capsys, "train", "--config", str(SL_DDP), "--set", f"trainer.output_dir={cwd / 'o'}",
        "--resume", str(path),
    )  # fmt: skip
    assert "plugins differ" in one_line_error(proc)
    assert _imported(cwd) == []
    assert "Zen of Python" not in proc.stdout + proc.stderr


def test_the_user_may_name_a_path_plugin_explicitly(capsys, in_dir: Path, real_checkpoint: dict):
    """A name on the command line is the user's choice: that plugin is asked to export."""
    path = in_dir / "ckpt.pt"
    torch.save(real_checkpoint, path)
    (in_dir / "evil_module.py").write_text(PAYLOAD)
    proc = _in_process(
        capsys, "export", "--checkpoint", str(path), "--out", str(in_dir / "e"),
        "--plugin", "evil_module:Plugin",
    )  # fmt: skip
    assert (in_dir / "IMPORTED").exists()  # imported because the user named it
    assert "evil_module" in sys.modules
    line = one_line_error(proc)
    assert "not a checkpoint any plugin asked can export (asked: evil_module:Plugin)" in line
