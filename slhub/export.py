"""Load an slhub export for inference: ``slhub.export.load(DIR)``.

This module needs no training code, recipe or checkpoint: it reads the
export's ``export.json`` and ``model.safetensors`` (no pickle) and rebuilds the
model in its trained dtype.

>>> from slhub.export import load
>>> predictor = load("exports/nerd_cartpole")
>>> predictor.input_names          # the order the last input axis must have
('x', 'theta', 'x_dot', 'theta_dot', 'force')
>>> next_state = predictor(tokens, input_names=predictor.input_names)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

SUPPORTED_FORMATS = ("slhub.export/1",)


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The parsed ``export.json`` of an export directory; raises ValueError if unreadable."""
    path = Path(directory) / "export.json"
    if not path.is_file():
        raise ValueError(f"{directory} is not an slhub export: it has no export.json")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in SUPPORTED_FORMATS:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ValueError(
            f"{path} has export format {found!r}; this slhub reads {', '.join(SUPPORTED_FORMATS)}"
        )
    return manifest


def load(directory: str | Path) -> nn.Module:
    """Load the export in ``directory`` as a ready, eval-mode predictor.

    For a NeRD export this is a :class:`slhub.builtin.nerd.artifact.NerdPredictor`:
    call it with history tokens ``[batch, length, features]`` and
    ``input_names=`` naming their order, or use ``.rollout(...)``.

    :param directory: a directory written by ``slhub export``.
    :returns: the predictor (an ``nn.Module``).
    :raises ValueError: when the directory is not a readable export of a known kind.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    kind = manifest.get("kind")
    if kind == "nerd":
        from slhub.builtin.nerd.artifact import load_export

        return load_export(directory, manifest)
    raise ValueError(f"{directory} holds an export of kind {kind!r}, which slhub cannot load")
