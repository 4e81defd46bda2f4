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
export directory with :func:`atomic_write`, ``export.json`` last.

An export kind with an ONNX form gives its loaded predictor a
``write_onnx(directory)`` method, which ``slhub export --onnx`` calls on the
export it has just written; it calls :func:`require_onnx` first.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from torch import nn

from slhub.atomic import atomic_write
from slhub.errors import ExportError, one_line

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
    "atomic_write",
    "load",
    "loaders",
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

    :raises slhub.ExportError: (a ``ValueError``) when it is missing, unreadable or
        of a format this slhub does not read.
    """
    path = Path(directory) / "export.json"
    if not path.is_file():
        raise ExportError(f"{directory} is not an slhub export: it has no export.json")
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
    :raises slhub.ExportError: (a ``ValueError``) when the directory is not a
        readable export of an installed kind; a loader may raise it too.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
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
