"""Durable, atomic file writes: the one helper every slhub writer uses.

A reader (another process, a resume after a crash) sees each name's old file or
its new one, never a torn one: the bytes go to a temporary ``.NAME.tmp-PID``
(which :func:`slhub.artifacts.is_temporary` recognizes and the next run-directory
lock holder removes), are fsynced, then renamed over the name, and the directory
is fsynced. Checkpoints, dataset caches and export directories all write this way.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


def atomic_write(data: bytes | str, *paths: str | Path) -> None:
    """Write ``data`` once and give it every name in ``paths``, in order, atomically.

    The bytes go to one temporary file, flushed and fsynced once. Every path but
    the last then gets a hard link to it, renamed over the path; the temporary
    itself is renamed over the last path; each directory is fsynced once. So a
    checkpoint and ``last.pt`` cost one write and one fsync, not two, and share
    their blocks on disk (every later write replaces a name with a new file; no
    file is ever changed in place, so sharing is safe: a temporary left by a
    killed writer may be such a link, so it is unlinked, never written into).
    Where hard links are not supported the path gets its own copy. A reader sees
    each name's old file or its new one, never a torn one; a failure removes the
    temporaries and leaves every name not yet replaced as it was.
    """
    if isinstance(data, str):
        data = data.encode()
    if not paths:
        raise ValueError("atomic_write needs at least one path")
    names = list({os.path.abspath(path): Path(path) for path in paths}.values())
    tmp = _temporary(names[-1])
    made = [tmp]  # temporaries to remove if anything fails
    try:
        _write_synced(data, tmp)
        for path in names[:-1]:
            link = _temporary(path)
            made.append(link)
            link.unlink(missing_ok=True)
            try:
                os.link(tmp, link)
            except OSError as exc:
                if exc.errno not in _NO_HARD_LINKS:
                    raise
                _write_synced(data, link)
            os.replace(link, path)
            made.remove(link)
        os.replace(tmp, names[-1])
    except BaseException:
        for leftover in made:
            leftover.unlink(missing_ok=True)
        raise
    for folder in dict.fromkeys(path.parent for path in names):
        _fsync_dir(folder)


#: What ``os.link`` fails with where a file system has no hard links (FAT, some
#: network and FUSE mounts): the name then gets its own copy.
_NO_HARD_LINKS = frozenset(
    {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOSYS, errno.EOPNOTSUPP}
    | {getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}
)


def _temporary(path: Path) -> Path:
    """``.NAME.tmp-PID``: what :func:`slhub.artifacts.is_temporary` recognizes."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _write_synced(data: bytes, path: Path) -> None:
    """A new file at ``path`` (one already there is unlinked first, not overwritten:
    it may be a hard link to a checkpoint) holding ``data``, fsynced."""
    path.unlink(missing_ok=True)
    with open(path, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


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
