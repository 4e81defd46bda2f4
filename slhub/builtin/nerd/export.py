"""Turning a training checkpoint into a NeRD export directory (the ``export`` hook's work).

The checkpoint is recognized by the ``nerd_arch`` buffer in its ``model``
state dict, so v1 and v2 checkpoints export alike and no recipe is needed.
The export records where it came from (run, step, checkpoint file and its
SHA-256) so an exported model can be traced back to its training run.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from slhub import CheckpointError
from slhub.builtin.nerd.model import ARCH_KEY, NerdModel
from slhub.builtin.nerd.predictor import write_export

if TYPE_CHECKING:
    from slhub.export import Checkpoint


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def export_checkpoint(checkpoint: Checkpoint, checkpoint_path: Path, out_dir: Path) -> Path | None:
    """Write the NeRD model of ``checkpoint`` to ``out_dir``; None if it holds no NeRD model."""
    state = checkpoint.model
    if ARCH_KEY not in state:
        return None
    try:
        model = NerdModel.from_state_dict(state)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"{checkpoint_path} holds a NeRD model that cannot be rebuilt: {exc}"
        ) from None
    provenance = {
        "source_run_id": checkpoint.run_id,
        "source": (checkpoint.run or {}).get("source"),
        "step": checkpoint.step,
        "checkpoint_format": checkpoint.format,
        "checkpoint_path": str(checkpoint_path),
        "checkpoint_sha256": file_sha256(Path(checkpoint_path)),
    }
    return write_export(model, Path(out_dir), provenance)
