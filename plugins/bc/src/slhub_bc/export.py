"""The BC export directory: ``model.safetensors`` + ``export.json``, and its loader.

``slhub export CKPT OUT`` on a BC run writes the policy's state dict (weights and the
normalization buffers: observation and action mean and std, and the camera shapes)
in the trained dtype, and a manifest naming the architecture, the dataset features
each input reads and the window offsets, so inference standardizes inputs and turns
predictions into actions exactly as training did. :func:`load_export` (the entry point
``bc`` of group ``slhub.exports``) rebuilds the policy from those two files alone:

>>> policy = slhub.export.load("exports/bc")
>>> chunk = policy.act({"observation": history})   # [B, chunk, A], the dataset's units
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save
from slhub import CheckpointError, ExportError, atomic_write, one_line
from slhub.export import export_file, manifest_json

from slhub_bc.model import Policy, StatePolicy, VisualPolicy

EXPORT_FORMAT = "slhub.export/1"
KIND = "bc"
WEIGHTS = "model.safetensors"
MANIFEST = "export.json"
#: The ``bc`` recipe keys that shape the network.
ARCHITECTURE = ("observation", "history", "frame_gap", "chunk", "hidden", "channels", "crop")


def export_checkpoint(checkpoint: Any, checkpoint_path: Path, out_dir: Path) -> Path | None:
    """Write the BC policy of ``checkpoint`` to ``out_dir``; None if it holds none."""
    from slhub_bc.data import ACTION, IMAGE, STATE
    from slhub_bc.sections import BcDataSection, BcSection

    recipe = checkpoint.recipe or {}
    state = checkpoint.model
    if "bc" not in recipe or "action_std" not in state:
        return None
    cfg = BcSection.model_validate(recipe["bc"])
    chosen = BcDataSection.model_validate(recipe.get("data") or {}).features
    defaults = {"observation": [STATE], "action": [ACTION]}
    if cfg.observation == "visual":
        defaults = {"observation": [], "image": [IMAGE], "action": [ACTION]}
    features = {role: list(chosen.get(role, names)) for role, names in defaults.items()}
    manifest = {
        "format": EXPORT_FORMAT,
        "kind": KIND,
        "dtype": str(state["action_std"].dtype).removeprefix("torch."),
        "architecture": {key: getattr(cfg, key) for key in ARCHITECTURE},
        "features": {role: names for role, names in features.items() if names},
        "offsets": {role: list(steps) for role, steps in cfg.offsets().items()},
        "output": "normalized action chunk [B, chunk, A]; act() returns the dataset's units",
        "weights": WEIGHTS,
        "source_run_id": checkpoint.run_id,
        "step": checkpoint.step,
        "checkpoint_format": checkpoint.format,
        "checkpoint_path": str(checkpoint_path),
        "checkpoint_sha256": _sha256(Path(checkpoint_path)),
    }
    try:
        model = _build(manifest, state)
        model.load_state_dict(state)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(
            f"{checkpoint_path}: its BC policy cannot be rebuilt: {exc}"
        ) from None
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}
    out_dir = Path(out_dir)
    atomic_write(
        save(tensors, metadata={"slhub_export": f"{EXPORT_FORMAT} {KIND}"}), out_dir / WEIGHTS
    )
    try:
        atomic_write(manifest_json(manifest), out_dir / MANIFEST)
    except BaseException:
        (out_dir / WEIGHTS).unlink(missing_ok=True)
        raise
    return out_dir


def load_export(directory: str | Path, manifest: dict[str, Any]) -> Policy:
    """The exported policy (eval mode), from ``model.safetensors`` and its manifest."""
    directory = Path(directory)
    # inside the export, a regular file: never ../x, an absolute path, a symlink out, a FIFO
    weights = export_file(directory, manifest.get("weights", WEIGHTS))
    try:
        state = load_file(weights)
        model = _build(manifest, state)
        model.load_state_dict(state)
    except Exception as exc:  # noqa: BLE001 - safetensors' own error, a damaged manifest
        raise ExportError(f"{directory}: not a readable BC export ({one_line(exc)})") from None
    model.features = manifest.get("features", {})  # type: ignore[assignment]
    return model.eval().requires_grad_(False)


def _build(manifest: dict[str, Any], state: dict[str, torch.Tensor]) -> Policy:
    """An untrained policy of the manifest's architecture, sized from ``state``."""
    arch = manifest["architecture"]
    observation = (np.zeros(len(state["observation_mean"])), np.ones(len(state["observation_std"])))
    action = (np.zeros(len(state["action_mean"])), np.ones(len(state["action_std"])))
    common = {"history": arch["history"], "chunk": arch["chunk"], "hidden": arch["hidden"]}
    if arch["observation"] == "state":
        model: Policy = StatePolicy(observation, action, **common)
    else:
        cameras = [tuple(int(v) for v in row) for row in state["camera_shapes"].tolist()]
        model = VisualPolicy(
            observation,
            action,
            cameras=cameras,
            channels=arch["channels"],
            crop=arch.get("crop"),  # exports before augmentation record none
            **common,
        )
    return model.to(state["action_std"].dtype)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
