"""``slhub export --checkpoint CKPT --out DIR``: hand a checkpoint to the plugin that can export it.

The checkpoint is loaded safely (``torch.load(weights_only=True)``, v1 or v2
layout), every installed plugin is asked through the ``export`` hook, and the
first that recognizes the checkpoint writes the export. Every user error is a
one-line :class:`~slhub.errors.SlhubError` (the CLI exits 2).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from slhub.checkpoint import load_checkpoint
from slhub.errors import ArtifactError, CheckpointError
from slhub.registry import export_manager


def _refuse_unusable(out_dir: Path) -> None:
    """Raise unless ``out_dir`` is absent or an empty directory."""
    if out_dir.exists() or out_dir.is_symlink():
        if not out_dir.is_dir():
            raise ArtifactError(f"export destination {out_dir} exists and is not a directory")
        if any(out_dir.iterdir()):
            raise ArtifactError(
                f"export destination {out_dir} is not empty; exports go into a new or empty "
                "directory and never overwrite files"
            )


def _claim_out_dir(out_dir: Path) -> bool:
    """Make sure ``out_dir`` is an empty directory; returns True when it was created here."""
    _refuse_unusable(out_dir)
    if out_dir.is_dir():
        return False
    try:
        out_dir.mkdir(parents=True)
    except OSError as exc:
        raise ArtifactError(
            f"cannot create export destination {out_dir}: {exc.strerror or exc}"
        ) from None
    return True


def run_export(checkpoint_path: str | Path, out_dir: str | Path) -> Path:
    """Export ``checkpoint_path`` into the new or empty directory ``out_dir``.

    :returns: the export directory.
    :raises ArtifactError: ``out_dir`` is not empty, not a directory or cannot be made.
    :raises CheckpointError: the checkpoint is missing or damaged, or no installed
        plugin recognizes it.
    """
    checkpoint_path = Path(checkpoint_path)
    out_dir = Path(out_dir)
    _refuse_unusable(out_dir)  # before the (possibly slow) checkpoint load
    checkpoint = load_checkpoint(checkpoint_path)
    run = checkpoint.get("run") or {}
    pm = export_manager(also=(run.get("source") or {}).get("plugin", {}).get("object"))
    created = _claim_out_dir(out_dir)
    try:
        result = pm.hook.export(
            checkpoint=checkpoint, checkpoint_path=checkpoint_path, out_dir=out_dir
        )
    except BaseException:
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    if result is None:
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise CheckpointError(
            f"{checkpoint_path} is not a checkpoint any installed plugin can export"
        )
    return Path(result)
