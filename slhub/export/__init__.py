"""Load an slhub export for inference: ``slhub.export.load(DIR)``.

An export directory holds ``export.json`` (its ``format`` and ``kind``) and
whatever the exporting plugin wrote beside it. The loader for a kind is the
entry point of that name in group ``slhub.exports``, so any installed package's
exports load here; the file only names a kind, it never chooses code to import
beyond what is installed under that name.

>>> from slhub.export import load
>>> predictor = load("exports/nerd_cartpole")
>>> predictor.input_names          # the order the last input axis must have
('x', 'theta', 'x_dot', 'theta_dot', 'force')
>>> next_state = predictor(tokens, input_names=predictor.input_names)

A directory that is not a readable export of an installed kind raises
:class:`slhub.ExportError` (a ``ValueError``). Exporters write the files of an
export directory with :func:`slhub.atomic_write`, ``export.json`` last, its text made by
:func:`manifest_json` (strict JSON: a non-finite value as ``"NaN"``/``"Infinity"``).

**Containment.** An export is data, often downloaded: loading one never opens
anything outside its directory. :func:`load` refuses, in one line and before any
loader runs, a directory holding a symlink that leads out of it or anything but
regular files, directories and symlinks to them inside (a FIFO, which would hang
a reader, a socket, a device), and a manifest naming a file (:func:`manifest_files`:
``weights``, every name of ``files``, the ``file`` of any top-level entry) that is
absolute, goes through ``..``, leads out by a symlink, or is not a regular file.
A loader opens the files its manifest names through :func:`export_file`, which
applies the same check and returns the path to open.

An export kind with an ONNX form gives its loaded predictor a
``write_onnx(directory)`` method, which ``slhub export --onnx`` calls on the
export it has just written; it calls :func:`require_onnx` first.
"""

from __future__ import annotations

import importlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from torch import nn

from slhub.errors import ExportError, one_line
from slhub.strictjson import dumps

#: The manifest of every export directory.
MANIFEST = "export.json"
#: At most this many entries of an export directory are checked (then it is refused).
MAX_ENTRIES = 10_000

SUPPORTED_FORMATS = ("slhub.export/1",)
#: What to run when the ONNX libraries are missing.
ONNX_EXTRA = "pip install 'slhub[onnx]'"
#: The modules ONNX export and its check need (the ``onnx`` extra).
ONNX_MODULES = ("onnx", "onnxscript", "onnxruntime")
#: Entry-point group mapping an export ``kind`` to ``loader(directory, manifest) -> nn.Module``.
LOADER_GROUP = "slhub.exports"

__all__ = [
    "LOADER_GROUP",
    "ONNX_EXTRA",
    "SUPPORTED_FORMATS",
    "Checkpoint",
    "check_directory",
    "export_file",
    "load",
    "loaders",
    "manifest_files",
    "manifest_json",
    "read_manifest",
    "require_onnx",
]


def __getattr__(name: str) -> Any:
    """``Checkpoint`` (what the ``export`` hook receives), imported on first use so that
    loading an export does not import the recipe and checkpoint machinery."""
    if name == "Checkpoint":
        from slhub.checkpoint.schema import Checkpoint

        return Checkpoint
    raise AttributeError(f"module 'slhub.export' has no attribute {name!r}")


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The parsed ``export.json`` of an export directory.

    :raises slhub.ExportError: (a ``ValueError``) when it is missing, unreadable,
        of a format this slhub does not read, or not a regular file inside the
        directory (a symlink out of it, a FIFO).
    """
    if not (Path(directory) / MANIFEST).exists() and not (Path(directory) / MANIFEST).is_symlink():
        raise ExportError(f"{directory} is not an slhub export: it has no {MANIFEST}")
    path = _contained(Path(directory), Path(MANIFEST), str(Path(directory) / MANIFEST))
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path} cannot be read ({one_line(exc)})") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in SUPPORTED_FORMATS:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ExportError(
            f"{path} has export format {found!r}; this slhub reads {', '.join(SUPPORTED_FORMATS)}"
        )
    return manifest


def manifest_json(manifest: dict[str, Any]) -> str:
    """The text of ``export.json`` for ``manifest``: strict JSON (a NaN or infinite value
    as ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, as in metrics.jsonl), indented,
    with a final newline."""
    return dumps(manifest, indent=2) + "\n"


def manifest_files(manifest: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """The files a manifest names, as ``(key, name)``: ``weights``, every name of
    ``files`` (a list or a mapping), and the ``file`` of every top-level entry that is
    a mapping (e.g. ``onnx.file``). :func:`load` checks each of them with
    :func:`export_file` before the loader runs; a loader of another kind names its
    files under these keys so that they are checked too."""
    if "weights" in manifest:
        yield "weights", manifest["weights"]
    files = manifest.get("files")
    if isinstance(files, dict):
        yield from ((f"files.{key}", name) for key, name in files.items())
    elif isinstance(files, list):
        yield from ((f"files[{index}]", name) for index, name in enumerate(files))
    elif files is not None:
        yield "files", files
    for key, value in manifest.items():
        if isinstance(value, dict) and "file" in value:
            yield f"{key}.file", value["file"]


def export_file(directory: str | Path, name: Any, *, key: str = "weights") -> Path:
    """The file ``name`` that an export's manifest names under ``key``, checked to be a
    regular file inside ``directory`` before anything opens it: the path to open.

    A manifest is data: ``../x``, an absolute path or a symlink leading out of the
    directory would make loading an export read a file the export does not hold, and a
    FIFO would hang the reader. Only names and file types are looked at (``lstat``,
    ``resolve``); nothing is opened.

    :raises slhub.ExportError: (a ``ValueError``) one line naming the manifest, the key
        and the name, for a name that is not a string, is absolute, goes through
        ``..``, leads out of the directory, names nothing, or is not a regular file.
    """
    directory = Path(directory)
    where = f"{directory / MANIFEST}: {key}"
    if not isinstance(name, str) or not name or "\0" in name:
        raise ExportError(f"{where} must be the name of a file inside the export, got {name!r}")
    relative = Path(name)
    if relative.is_absolute():
        raise ExportError(
            f"{where} {name!r} leaves the export directory (an absolute path); refused"
        )
    if ".." in relative.parts:
        raise ExportError(f"{where} {name!r} leaves the export directory (through '..'); refused")
    return _contained(directory, relative, f"{where} {name!r}", f" (its {MANIFEST}'s {key})")


def _contained(directory: Path, relative: Path, what: str, named: str = "") -> Path:
    """``directory / relative`` resolved, if it is a regular file inside ``directory``."""
    try:
        root = directory.resolve(strict=True)
        real = (directory / relative).resolve(strict=True)
        inside = real.is_relative_to(root)
        mode = real.stat().st_mode if inside else 0  # resolved: stat opens nothing
    except FileNotFoundError:
        raise ExportError(f"{directory} has no {relative}{named}") from None
    except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long
        raise ExportError(f"{what} cannot be checked ({one_line(exc)}); refused") from None
    if not inside:
        raise ExportError(f"{what} leaves the export directory (a symlink to {real}); refused")
    if not stat.S_ISREG(mode):
        raise ExportError(f"{what} is {_described(mode)}, not a regular file; refused")
    return real


def _described(mode: int) -> str:
    """What a file of ``mode`` is, for a refusal."""
    for test, text in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return text
    return "not a plain file"


def check_directory(directory: str | Path) -> None:
    """Refuse an export directory holding anything a loader could be led out by or hang
    on: a symlink whose target is outside the directory, and anything but regular
    files, directories and symlinks to them (a FIFO, a socket, a device). Looks at
    names and file types only (``lstat``); nothing is opened.

    :raises slhub.ExportError: one line naming the entry.
    """
    directory = Path(directory)
    try:
        root = directory.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise ExportError(f"{directory} cannot be read ({one_line(exc)})") from None
    pending, seen = [root], 0
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except OSError as exc:
            raise ExportError(f"{folder} cannot be listed ({one_line(exc)})") from None
        for entry in entries:
            seen += 1
            if seen > MAX_ENTRIES:
                raise ExportError(f"{directory} holds more than {MAX_ENTRIES} files; refused")
            path = Path(entry.path)
            what = f"{directory}: export holds {path.relative_to(root)},"
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    target = path.resolve()
                    if not target.is_relative_to(root):
                        raise ExportError(
                            f"{what} a symlink leading out of the export directory (to "
                            f"{target}); refused"
                        )
                    mode = target.stat().st_mode if target.exists() else stat.S_IFREG
            except (OSError, RuntimeError) as exc:  # a symlink loop
                raise ExportError(f"{what} which cannot be checked ({one_line(exc)})") from None
            if stat.S_ISDIR(mode):
                if not entry.is_symlink():  # a symlinked folder inside is listed where it is
                    pending.append(path)
            elif not stat.S_ISREG(mode):
                raise ExportError(f"{what} {_described(mode)}; refused (an export holds files)")


def require_onnx() -> None:
    """Raise :class:`slhub.ExportError` naming the ``onnx`` extra unless every module of
    :data:`ONNX_MODULES` imports (a half-installed extra fails here, not mid-export).
    """
    missing = []
    for name in ONNX_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ExportError(
            f"ONNX export needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'}"
            f" not installed: {ONNX_EXTRA}"
        )


def loaders() -> dict[str, Any]:
    """Installed export loaders by kind (entry points of group ``slhub.exports``, not loaded)."""
    found: dict[str, Any] = {}
    for ep in entry_points(group=LOADER_GROUP):
        found.setdefault(ep.name, ep)
    return found


def load(directory: str | Path) -> nn.Module:
    """Load the export in ``directory`` as a ready, eval-mode predictor.

    For a NeRD export this is a predictor module: call it with history tokens
    ``[batch, length, features]`` and ``input_names=`` naming their order, or
    use ``.rollout(...)``.

    :param directory: a directory written by ``slhub export``.
    :returns: the predictor (an ``nn.Module``).
    Before the loader of the manifest's kind runs, the directory and every file its
    manifest names are checked to lie inside it (:func:`check_directory`,
    :func:`manifest_files`, :func:`export_file`), whoever wrote the loader.

    :raises slhub.ExportError: (a ``ValueError``) when the directory is not a
        readable export of an installed kind, or names or holds a file outside it, a
        FIFO or a device; a loader may raise it too.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    for key, name in manifest_files(manifest):
        export_file(directory, name, key=key)
    check_directory(directory)
    kind = manifest.get("kind")
    available = loaders()
    if not isinstance(kind, str) or kind not in available:
        known = ", ".join(sorted(available)) or "none installed"
        raise ExportError(
            f"{directory} holds an export of kind {kind!r}, which no installed package loads "
            f"(kinds: {known})"
        )
    loader: Callable[[Path, dict[str, Any]], nn.Module] = available[kind].load()
    return loader(directory, manifest)
