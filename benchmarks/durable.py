"""The durable write every benchmark's hand-written contestant uses: temporary file, fsync,
rename, directory fsync (what slhub does for a checkpoint), written once for all of them."""

from __future__ import annotations

import os
from pathlib import Path


def durable_write(data: bytes, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
