"""An HDF5 file as a file, before any reader reads it: its signature, opening it for
format detection, and the one line for a damaged one. Imports no reader, so format
detection (:func:`slhub.data.open_dataset`) can name a truncated file whatever
format it was meant to be.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from slhub.errors import DatasetError, one_line

#: The 8 bytes an HDF5 file starts with (at 0, or after a user block of 512 * 2**k bytes).
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_USER_BLOCKS = (0, 512, 1024, 2048, 4096)

_TRUNCATED = re.compile(r"truncated file: eof = (?P<eof>\d+).*?stored_eof = (?P<stored>\d+)")


def has_hdf5_signature(path: Path) -> bool:
    """Whether ``path`` is a file with the HDF5 signature: cheap, and never imports h5py."""
    try:
        if not path.is_file():
            return False
        with path.open("rb") as fh:
            head = fh.read(_USER_BLOCKS[-1] + len(HDF5_SIGNATURE))
    except OSError:
        return False
    return any(head[at : at + len(HDF5_SIGNATURE)] == HDF5_SIGNATURE for at in _USER_BLOCKS)


def probe_hdf5(path: Path) -> Any | None:
    """``path`` opened read-only with h5py for ``detect``, or None: not HDF5, h5py missing,
    or a file h5py cannot open (``detect`` answers False rather than raise)."""
    if not has_hdf5_signature(path):
        return None
    try:
        import h5py
    except ImportError:
        return None
    try:
        return h5py.File(path, "r")
    except Exception:  # noqa: BLE001 - a damaged file is simply not detected
        return None


def damaged_hdf5(path: Path, exc: BaseException) -> str:
    """The one line for an HDF5 file h5py cannot open: a truncated one says how much of it
    is left (h5py's ``truncated file: eof = N, ..., stored_eof = M``)."""
    cut = _TRUNCATED.search(str(exc))
    if cut is not None:
        return (
            f"{path}: damaged HDF5 file, truncated ({cut['eof']} of its {cut['stored']} "
            "bytes): copy it again"
        )
    return f"{path}: not a readable HDF5 file, truncated or corrupt? ({one_line(exc, limit=200)})"


def refuse_damaged_hdf5(path: Path) -> None:
    """Raise :func:`damaged_hdf5`'s line when ``path`` has the HDF5 signature but h5py
    cannot open it (what no reader's ``detect`` recognizes); otherwise return."""
    if not has_hdf5_signature(path):
        return
    try:
        import h5py
    except ImportError:
        return
    try:
        h5py.File(path, "r").close()
    except Exception as exc:  # noqa: BLE001 - truncated, corrupt: one line
        raise DatasetError(damaged_hdf5(path, exc)) from None
