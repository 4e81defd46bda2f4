"""Loading an export never opens anything outside its directory, whatever its kind.

A crafted manifest escaping through ``..``, an absolute path or a symlink, a FIFO where a
file belongs, and a stray symlink out of the directory are refused in one line by
:func:`slhub.export.load` for every installed export kind (NeRD, BC, RWM) and for a
loader of another package that does no check of its own.

"Nothing outside is opened" is proven, not assumed: every outside target is a FIFO,
and a watchdog process polls it with a non-blocking open for writing, which succeeds only
while some reader holds it open (a reader blocks in ``open`` until a writer comes, so
none can slip through); the watchdog's open also releases such a reader, so the test
never hangs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import slhub
from slhub import export
from slhub.export import load, loaders

KINDS = sorted(loaders())
CASES = ["dotdot", "absolute", "symlink", "fifo", "nested", "stray", "manifest"]


def test_every_export_kind_of_the_repository_is_installed():
    assert {"nerd", "bc", "rwm"} <= set(KINDS)


def _export_dir(tmp_path: Path, kind: str, case: str) -> tuple[Path, list[Path]]:
    """An export directory of ``kind`` crafted to escape as ``case`` says, and the FIFOs
    that opening anything outside (or the FIFO inside) would block on."""
    outside = tmp_path / "outside"
    outside.mkdir(parents=True)
    target = outside / "model.safetensors"
    os.mkfifo(target)
    out = tmp_path / "export"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"not opened")
    manifest: dict[str, Any] = {
        "format": "slhub.export/1",
        "kind": kind,
        "weights": "model.safetensors",
    }
    fifos = [target]
    if case == "dotdot":
        manifest["weights"] = "../outside/model.safetensors"
    elif case == "absolute":
        manifest["weights"] = str(target)
    elif case == "symlink":
        (out / "model.safetensors").unlink()
        (out / "model.safetensors").symlink_to(target)
    elif case == "fifo":
        (out / "model.safetensors").unlink()
        os.mkfifo(out / "model.safetensors")
        fifos.append(out / "model.safetensors")
    elif case == "nested":
        manifest["onnx"] = {"file": "../outside/model.safetensors"}
    elif case == "stray":  # named by no manifest key: a loader could still open it
        (out / "tokenizer.json").symlink_to(target)
    if case == "manifest":
        os.mkfifo(outside / "export.json")
        fifos.append(outside / "export.json")
        (out / "export.json").symlink_to(outside / "export.json")
    else:
        (out / "export.json").write_text(json.dumps(manifest))
    return out, fifos


def _guarded_load(directory: Path, fifos: list[Path]) -> tuple[Any, list[Path]]:
    """``load(directory)``'s result or error, and the FIFOs some reader opened meanwhile.

    The watchdog is another process: a reader blocked in ``open`` may hold the GIL
    (safetensors' Rust ``load_file`` does), so no thread of this process could run.
    """
    watchdog = subprocess.Popen(
        [sys.executable, "-c", WATCHDOG, *map(str, fifos)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert watchdog.stdout is not None and watchdog.stdout.readline() == "watching\n"
        try:
            result: Any = load(directory)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            result = exc
    finally:
        watchdog.terminate()
        remaining, _ = watchdog.communicate(timeout=60)
    return result, [Path(line) for line in remaining.splitlines()]


#: Polls FIFOs with a non-blocking open for writing until killed; prints each one that a
#: reader held open, and so released.
WATCHDOG = """
import os, sys, time
print("watching", flush=True)
while True:
    for fifo in sys.argv[1:]:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        os.close(fd)
        print(fifo, flush=True)
    time.sleep(0.005)
"""


EXPECTED = {
    "dotdot": "weights '../outside/model.safetensors' leaves the export directory (through '..')",
    "absolute": "leaves the export directory (an absolute path); refused",
    "symlink": "weights 'model.safetensors' leaves the export directory (a symlink to ",
    "fifo": "weights 'model.safetensors' is a FIFO (named pipe), not a regular file; refused",
    "nested": "onnx.file '../outside/model.safetensors' leaves the export directory",
    "stray": "export holds tokenizer.json, a symlink leading out of the export directory",
    "manifest": "export.json leaves the export directory (a symlink to ",
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_manifest_escaping_its_directory_is_refused_in_one_line_unopened(
    tmp_path: Path, kind: str, case: str
):
    directory, fifos = _export_dir(tmp_path, kind, case)
    result, opened = _guarded_load(directory, fifos)
    assert opened == [], f"loading opened {opened}"
    assert isinstance(result, slhub.ExportError), result
    message = str(result)
    assert "\n" not in message and EXPECTED[case] in message, message
    assert str(directory) in message


@pytest.mark.parametrize("kind", KINDS)
def test_a_symlink_inside_the_directory_is_accepted(tmp_path: Path, kind: str):
    """The check refuses what leaves the directory, nothing else: an inside symlink to
    the weights passes it, and the loader's own error (these are no weights) follows."""
    directory, fifos = _export_dir(tmp_path, kind, "none")
    (directory / "weights.bin").write_bytes(b"not safetensors")
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors").symlink_to("weights.bin")
    inside = (directory / "weights.bin").resolve()
    assert export.export_file(directory, "model.safetensors") == inside
    result, opened = _guarded_load(directory, fifos)
    assert opened == []
    assert isinstance(result, slhub.ExportError) and "refused" not in str(result), result


def test_a_loader_of_another_package_is_guarded_too(tmp_path: Path, monkeypatch):
    """A package's loader that opens what its manifest names without any check of its
    own: ``slhub.export.load`` refuses before calling it."""
    called: list[Path] = []

    def naive_loader(directory: Path, manifest: dict[str, Any]) -> Any:
        called.append(directory)
        return (Path(directory) / manifest["weights"]).read_bytes()

    class EntryPoint:
        name = "naive"

        def load(self) -> Any:
            return naive_loader

    monkeypatch.setattr(export, "loaders", lambda: {"naive": EntryPoint()})
    for case in ("dotdot", "absolute", "symlink", "fifo", "stray"):
        directory, fifos = _export_dir(tmp_path / case, "naive", case)
        result, opened = _guarded_load(directory, fifos)
        assert opened == [] and called == [], case
        assert isinstance(result, slhub.ExportError) and EXPECTED[case] in str(result), result
    # a contained export reaches the loader
    directory, _ = _export_dir(tmp_path / "fine", "naive", "none")
    assert load(directory) == b"not opened" and called == [directory]


@pytest.mark.parametrize("name", ["", "model\0.safetensors", 3, None])
def test_a_weights_entry_that_is_no_file_name_is_refused(tmp_path: Path, name: Any):
    directory, _ = _export_dir(tmp_path, "nerd", "none")
    with pytest.raises(slhub.ExportError, match="must be the name of a file inside the export"):
        export.export_file(directory, name)
