"""The RWM export directory: ``model.safetensors`` + ``export.json``, and its loader.

``slhub export`` hands the ``export`` hook a checkpoint; one whose ``model`` holds
the ``rwm_layout`` buffer is written here as its state dict (weights, layout and
normalization buffers, no pickle) with a manifest naming the robot's components,
the angles and the statistics, so inference needs neither the recipe nor the
dataset. :func:`load_export` is the ``rwm`` loader of the entry-point group
``slhub.exports``: ``slhub.export.load(DIR)`` returns the :class:`WorldModel` in
eval mode.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save
from slhub import CheckpointError, ExportError, atomic_write, one_line
from slhub.export import export_file, manifest_json

from slhub_rwm.model import LAYOUT_KEY, STAT_KEYS, WorldModel

EXPORT_FORMAT = "slhub.export/1"
KIND = "rwm"
WEIGHTS = "model.safetensors"
MANIFEST = "export.json"


def export_checkpoint(checkpoint: Any, checkpoint_path: Path, out_dir: Path) -> Path | None:
    """Write the world model of ``checkpoint`` to ``out_dir``; None if it holds none."""
    state = checkpoint.model
    if LAYOUT_KEY not in state:
        return None
    try:
        model = WorldModel.from_state_dict(state)
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise CheckpointError(
            f"{checkpoint_path} holds an RWM model that cannot be rebuilt: {one_line(exc)}"
        ) from None
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}
    layout = model.layout
    manifest = {
        "format": EXPORT_FORMAT,
        "kind": KIND,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "layout": layout.to_dict(),
        "state_names": list(layout.state_names),
        "input_names": list(layout.action_names + layout.extra_names),
        "output": "the next horizon states; angle components wrapped to [-pi, pi)",
        "normalization": {key: [float(v) for v in tensors[key].double()] for key in STAT_KEYS},
        "weights": WEIGHTS,
        "source_run_id": checkpoint.run_id,
        "step": checkpoint.step,
        "checkpoint_path": str(checkpoint_path),
        "checkpoint_sha256": _sha256(Path(checkpoint_path)),
    }
    out_dir = Path(out_dir)
    # one metadata key: safetensors writes a multi-key header in hash order
    atomic_write(save(tensors, metadata={"slhub_export": f"{EXPORT_FORMAT} {KIND}"}),
                 out_dir / WEIGHTS)  # fmt: skip
    try:
        atomic_write(manifest_json(manifest), out_dir / MANIFEST)
    except BaseException:
        (out_dir / WEIGHTS).unlink(missing_ok=True)
        raise
    return out_dir


def load_export(directory: Path, manifest: dict[str, Any]) -> WorldModel:
    """The exported :class:`WorldModel`, in eval mode (the ``rwm`` export loader)."""
    # inside the export, a regular file: never ../x, an absolute path, a symlink out, a FIFO
    path = export_file(Path(directory), manifest.get("weights", WEIGHTS))
    try:
        model = WorldModel.from_state_dict(load_file(path))
    except Exception as exc:  # safetensors' own error, a damaged layout, a missing file
        raise ExportError(f"{path} is not a loadable RWM export: {one_line(exc)}") from None
    return model.eval()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
