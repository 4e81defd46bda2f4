"""Checkpoint schema (v1 and v2), atomic writes, safe loads and resume compatibility.

v2 (written by slhub): ``format``, ``step``, ``run``, ``model``, ``optimizer``,
``scheduler``, ``ranks`` (one entry per global rank), ``plugins``.
v1 (single-device layout, before run identities): ``step``, ``model``,
``optimizer``, ``rng`` and no ``format``; read for export and for a resume into
a fresh destination only.

Checkpoints are always read with ``torch.load(weights_only=True)``: a file that
needs pickle to load is refused, never executed.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from slhub.errors import CheckpointError
from slhub.recipe import recipe_differences

FORMAT_V2 = "slhub.checkpoint/2"
V1_KEYS = frozenset({"step", "model", "optimizer", "rng"})
V2_KEYS = frozenset(
    {"format", "step", "run", "model", "optimizer", "scheduler", "ranks", "plugins"}
)


def serialize(checkpoint: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint, serialized once for however many files receive it."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


def atomic_write_bytes(data: bytes, path: Path) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over ``path``.

    A reader sees the old file or the new one, never a torn one; a failure
    leaves the previous file intact and removes the temporary.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(checkpoint: dict[str, Any], *paths: Path) -> None:
    """Serialize once and write atomically to every path."""
    data = serialize(checkpoint)
    for path in paths:
        atomic_write_bytes(data, path)


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a v1 or v2 checkpoint safely, or raise a one-line :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError) as exc:
        raise CheckpointError(f"{path}: damaged or not a checkpoint ({_reason(exc)})") from None
    except (PermissionError, IsADirectoryError) as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint ({exc.strerror or exc})") from None
    except OSError as exc:  # a truncated archive surfaces as EINVAL from the zip reader
        raise CheckpointError(f"{path}: damaged or not a checkpoint ({_reason(exc)})") from None
    check_layout(data, path)
    return data


def _reason(exc: BaseException) -> str:
    """The informative part of a torch.load failure, on one line."""
    text = " ".join(str(exc).split())
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = "needs pickle to load: " + text.split(marker, 1)[1].strip().split(". ", 1)[0]
    return text[:200] or exc.__class__.__name__


def check_layout(data: Any, path: str | Path) -> int:
    """The checkpoint's version (1 or 2); raise for anything else."""
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a slhub checkpoint (holds a {type(data).__name__})")
    fmt = data.get("format")
    if fmt is None:
        if V1_KEYS <= set(data):
            return 1
        raise CheckpointError(
            f"{path}: not a slhub checkpoint (keys: {', '.join(sorted(map(str, data))) or 'none'})"
        )
    if fmt != FORMAT_V2:
        raise CheckpointError(f"{path}: foreign checkpoint format {fmt!r} (expected {FORMAT_V2})")
    missing = V2_KEYS - set(data)
    if missing:
        raise CheckpointError(
            f"{path}: damaged v2 checkpoint (missing {', '.join(sorted(missing))})"
        )
    return 2


def version_of(checkpoint: dict[str, Any]) -> int:
    return 2 if checkpoint.get("format") == FORMAT_V2 else 1


def to_v1(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The single-device (v1) form of a v2 checkpoint: rank 0's RNG, no identity."""
    if version_of(checkpoint) == 1:
        return dict(checkpoint)
    return {
        "step": checkpoint["step"],
        "model": checkpoint["model"],
        "optimizer": checkpoint["optimizer"],
        "rng": checkpoint["ranks"][0]["rng"],
    }


def rank_state(checkpoint: dict[str, Any], rank: int) -> dict[str, Any]:
    """What the ``restore`` hook receives on ``rank``."""
    if version_of(checkpoint) == 1:
        return {"rng": checkpoint["rng"]}
    return checkpoint["ranks"][rank]


def check_resume_compatible(
    checkpoint: dict[str, Any],
    path: str | Path,
    *,
    recipe: dict[str, Any],
    plugin_source: dict[str, Any],
    world_size: int,
) -> None:
    """Refuse a resume whose world size, recipe or plugin source differs, naming the difference."""
    if version_of(checkpoint) == 1:
        if world_size != 1:
            raise CheckpointError(
                f"{path}: a v1 checkpoint holds one process's state; it was written with world "
                f"size 1 and cannot resume with world size {world_size}"
            )
        return
    run = checkpoint["run"]
    saved_world = run.get("world_size")
    if saved_world != world_size:
        raise CheckpointError(
            f"{path}: checkpoint was written with world size {saved_world}, this run has world "
            f"size {world_size}; exact recovery needs the same world size"
        )
    differences = recipe_differences(run.get("recipe", {}), recipe)
    if differences:
        shown = "; ".join(differences[:5]) + ("; ..." if len(differences) > 5 else "")
        raise CheckpointError(
            f"{path}: recipe differs from the checkpoint's (only trainer.output_dir and "
            f"trainer.steps may change): {shown}"
        )
    saved_plugin = run.get("source", {}).get("plugin")
    if saved_plugin != plugin_source:
        raise CheckpointError(
            f"{path}: plugin source differs: checkpoint has {_describe(saved_plugin)}, "
            f"this run has {_describe(plugin_source)}"
        )


def _describe(source: dict[str, Any] | None) -> str:
    if not source:
        return "none"
    dist = f"{source.get('dist')} {source.get('version')}" if source.get("dist") else "no dist"
    return f"{source.get('name')} ({source.get('object')}, {dist})"
