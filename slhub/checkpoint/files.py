"""Checkpoint files: their names in a run directory, safe reads and atomic writes.

Every checkpoint file name is spelled here: ``step_N.pt`` for the boundary of
update N, ``last.pt`` (what ``--resume auto`` continues from) and ``best.pt``
(``trainer.best``). Files are read whole, their archive CRCs checked, and loaded
with ``torch.load(weights_only=True)`` only: a file that needs pickle to load is
refused, never executed, and nothing in a checkpoint ever chooses code to import.
"""

from __future__ import annotations

import hashlib
import io
import re
import stat
import zipfile
from pathlib import Path

import torch

from slhub.atomic import atomic_write
from slhub.checkpoint.schema import Checkpoint
from slhub.errors import CheckpointError, one_line

LAST = "last.pt"
BEST = "best.pt"
_STEP_FILE = re.compile(r"step_(\d+)\.pt")


def step_file(step: int) -> str:
    """The file name of update ``step``'s boundary checkpoint."""
    return f"step_{step}.pt"


def step_of_file(name: str) -> int | None:
    """The update a ``step_N.pt`` name holds, or None for any other name."""
    found = _STEP_FILE.fullmatch(name)
    return int(found.group(1)) if found else None


def last_path(folder: str | Path) -> Path:
    """Where a run directory's newest checkpoint is: what ``--resume auto`` reads."""
    return Path(folder) / LAST


def serialize(checkpoint: Checkpoint) -> bytes:
    """The bytes of a checkpoint, serialized once for however many files receive it."""
    buffer = io.BytesIO()
    torch.save(checkpoint.to_dict(), buffer)
    return buffer.getvalue()


def write(data: bytes, *paths: Path) -> None:
    """Write serialized checkpoint bytes atomically under every path, in order (one
    write and fsync; the other names are hard links: :func:`slhub.atomic.atomic_write`)."""
    atomic_write(data, *paths)


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load(path: str | Path) -> Checkpoint:
    """Load a v1 or v2 checkpoint safely, or raise a one-line :class:`CheckpointError`."""
    return from_bytes(read_bytes(path), path)


def read_bytes(path: str | Path) -> bytes:
    """The bytes of a checkpoint file, or a one-line :class:`CheckpointError` when there is
    no such file, it is not a regular file (a FIFO would block the read forever) or it
    cannot be read."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointError(f"{path}: no such checkpoint file") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint ({exc.strerror or exc})") from None
    except ValueError:  # a NUL byte in the path
        raise CheckpointError(f"{str(path)!r}: not a valid path (it holds a NUL byte)") from None
    if stat.S_ISDIR(mode):
        raise CheckpointError(
            f"{path}: is a directory, not a checkpoint file; name one, e.g. {path / 'last.pt'}"
        )
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path}: not a regular file (a pipe, socket or device)")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint ({exc.strerror or exc})") from None


def from_bytes(data: bytes, path: str | Path) -> Checkpoint:
    """Load the bytes of a v1 or v2 checkpoint (read from ``path``, or received from rank 0
    for that path) safely, or raise a one-line :class:`CheckpointError`."""
    buffer = io.BytesIO(data)
    if not zipfile.is_zipfile(buffer):  # torch.save writes a zip archive; anything else is not ours
        raise CheckpointError(
            f"{path}: damaged or not a checkpoint (not a complete torch.save archive)"
        )
    damaged = _damaged_record(buffer)
    if damaged is not None:
        raise CheckpointError(
            f"{path}: damaged checkpoint ({damaged} fails its CRC-32 check: the bytes changed "
            "after they were written)"
        )
    buffer.seek(0)
    try:
        loaded = torch.load(buffer, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch.load fails in many ways on foreign bytes
        pickled = _needs_pickle(exc)
        if pickled is not None:
            raise CheckpointError(_not_weights_only(path, pickled)) from None
        raise CheckpointError(f"{path}: damaged or not a checkpoint ({_reason(exc)})") from None
    return Checkpoint.from_dict(loaded, path)


def _needs_pickle(exc: BaseException) -> str | None:
    """What a weights-only load refused to unpickle (``it names argparse.Namespace``),
    or None when ``exc`` is another failure."""
    text = " ".join(str(exc).split())
    marker = "WeightsUnpickler error:"
    if marker not in text:
        return None
    detail = text.split(marker, 1)[1].strip()
    found = re.search(r"Unsupported global: GLOBAL (\S+)", detail)
    if found:
        return f"it names {found.group(1)}"
    return one_line(CheckpointError(detail.split(". ", 1)[0].rstrip(".")), limit=120)


def _not_weights_only(path: str | Path, pickled: str) -> str:
    """slhub's one line for a checkpoint that only a pickle load reads, with how to turn
    a trusted one into a v1 checkpoint of its model weights (what ``slhub export``,
    ``slhub inspect`` and a resume into a fresh directory read)."""
    converted = Path(path).with_suffix(".weights.pt")
    snippet = (
        f"import torch; c = torch.load({str(path)!r}, weights_only=False); "
        "m = c.state_dict() if hasattr(c, 'state_dict') else c['model']; "
        "torch.save({'step': c.get('step', 0) if isinstance(c, dict) else 0, "
        "'model': dict(m), 'optimizer': {}, 'rng': {}}, "
        f"{str(converted)!r})"
    )
    return (
        f"{path}: not a weights-only checkpoint (it needs pickle to load: {pickled}); slhub "
        "loads checkpoints with torch.load(weights_only=True) only, since unpickling can run "
        "any code. If you trust the file, save its model weights as a checkpoint slhub "
        f'reads: python -c "{snippet}"'
    )


def _damaged_record(buffer: io.BytesIO) -> str | None:
    """The first archive record whose CRC-32 does not match its bytes, if any.

    torch.load does not check the CRCs that torch.save records, so a flipped bit in a
    tensor's bytes would load as a silently different weight; zipfile checks them
    (2 GB/s here: half of torch.load's own time).
    """
    try:
        with zipfile.ZipFile(buffer) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as exc:
        return f"its archive ({_reason(exc)})"
    finally:
        buffer.seek(0)


def _reason(exc: BaseException) -> str:
    """The informative part of a torch.load failure, on one line, never cut mid-sentence."""
    text = " ".join(str(exc).split())
    marker = "WeightsUnpickler error:"
    if marker in text:
        detail = text.split(marker, 1)[1].strip()
        found = re.search(r"Unsupported global: GLOBAL (\S+)", detail)
        what = f"it names {found.group(1)}" if found else detail.split(". ", 1)[0].rstrip(".")
        return f"needs pickle to load: {what}; slhub loads checkpoints with weights_only=True"
    return one_line(exc, limit=200)
