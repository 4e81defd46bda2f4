"""Turning a training checkpoint into a NeRD export directory (the ``export`` hook's work).

The checkpoint is recognized by the ``nerd_arch`` buffer in its ``model``
state dict, so v1 and v2 checkpoints export alike and no recipe is needed.
The export records where it came from (run, step, checkpoint file and its
SHA-256) so an exported model can be traced back to its training run.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from slhub import CheckpointError
from slhub.builtin.nerd.export_format import write_export
from slhub.builtin.nerd.model import ARCH_KEY, NerdModel


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def export_checkpoint(
    checkpoint: dict[str, Any], checkpoint_path: Path, out_dir: Path
) -> Path | None:
    """Write the NeRD model of ``checkpoint`` to ``out_dir``; None if it holds no NeRD model."""
    state = checkpoint.get("model") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or ARCH_KEY not in state:
        return None
    try:
        model = NerdModel.from_state_dict(state)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"{checkpoint_path} holds a NeRD model that cannot be rebuilt: {exc}"
        ) from None
    run = checkpoint.get("run") if isinstance(checkpoint.get("run"), dict) else {}
    step = checkpoint.get("step")
    provenance = {
        "source_run_id": run.get("run_id"),
        "source": run.get("source"),
        "step": int(step) if isinstance(step, int) else None,
        "checkpoint_format": checkpoint.get("format") or "slhub.checkpoint/1",
        "checkpoint_path": str(checkpoint_path),
        "checkpoint_sha256": file_sha256(Path(checkpoint_path)),
    }
    return write_export(model, Path(out_dir), provenance)
