"""The durable write the benchmarks' hand-written contestants use, written once for all.

``durable_write(data, *paths)``: the bytes go to a temporary file, fsynced once; every
path but the last gets a hard link to it, renamed over the path; the temporary is
renamed over the last path; the directory is fsynced once. With one path that is the
plain temporary-fsync-rename write; with ``last.pt`` and ``step_N.pt`` it is what
slhub does for a checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path


def durable_write(data: bytes, *paths: Path) -> None:
    tmp = paths[-1].with_name(f".{paths[-1].name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    for path in paths[:-1]:
        link = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        os.link(tmp, link)
        os.replace(link, path)
    os.replace(tmp, paths[-1])
    fd = os.open(paths[-1].parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
