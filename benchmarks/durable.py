"""The durable writes the benchmarks' hand-written contestants use, written once for all of them.

- :func:`durable_write`: one file: temporary file, fsync, rename, directory fsync.
- :func:`durable_write_linked`: what slhub does for a checkpoint and ``last.pt``: the
  bytes written and fsynced once, the other names hard links, the directory fsynced once.
"""

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


def durable_write_linked(data: bytes, *paths: Path) -> None:
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
