"""The temporary folder a dataset writer builds DST in, ``.DST.tmp-PID``, and its cleanup.

:func:`slhub.data.write_store` (``slhub data convert``, ``slhub data collect``) and the
LeRobot writer build DST under ``.DST.tmp-PID`` beside it and rename it into place, so
a reader never sees half a dataset. A SIGKILL (kill -9, the OOM killer) before the
rename leaves that folder behind; :func:`start_building` removes it the next time DST
is written. Only a folder that is certainly stale goes: its name is DST's own, its PID
is not a running process here, and the writer's host, recorded in :data:`WRITER`
inside it, is this one (a PID on another host sharing the file system says nothing
about its process). Anything else is left alone.

A folder named like a temporary is never a dataset: :func:`refuse_temporary` is the one
line :func:`slhub.data.open_dataset` answers for it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from pathlib import Path

from slhub.errors import DatasetError

#: ``.NAME.tmp-PID``: what every slhub writer names its temporaries.
TEMPORARY = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>[0-9]+)")
#: Inside a temporary folder while it is built: the writer's host name. Removed just
#: before the folder is renamed into place, so a finished dataset never holds it.
WRITER = ".slhub-writer"


def parse(name: str) -> tuple[str, int] | None:
    """``(NAME, PID)`` for a temporary's name ``.NAME.tmp-PID``, else None."""
    found = TEMPORARY.fullmatch(name)
    return None if found is None else (found["name"], int(found["pid"]))


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process on this host (one of another user counts)."""
    if pid <= 0:
        return False  # never a writer's PID
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OverflowError:
        return False  # no process has such a PID
    except OSError:
        return True  # EPERM: someone else's process; anything else: assume it runs
    return True


def temporary(destination: Path) -> Path:
    """This process's temporary folder for ``destination``."""
    return destination.parent / f".{destination.name}.tmp-{os.getpid()}"


def start_building(destination: Path) -> Path:
    """Remove ``destination``'s stale temporaries, then make this process's own (empty,
    with :data:`WRITER`) and return it. The caller fills it, calls :func:`finish_building`,
    and removes it on failure."""
    parent = destination.parent
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale(destination)
    building = temporary(destination)
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    (building / WRITER).write_text(socket.gethostname() + "\n", encoding="utf-8")
    return building


def finish_building(building: Path, destination: Path) -> None:
    """Rename the filled ``building`` onto ``destination`` (``os.replace``: raises
    OSError where ``destination`` appeared meanwhile)."""
    (building / WRITER).unlink(missing_ok=True)
    os.replace(building, destination)


def remove_stale(destination: Path) -> list[Path]:
    """Remove the temporaries of ``destination`` left by dead writers of this host; the
    ones removed."""
    parent = destination.parent
    try:
        entries = list(parent.iterdir())
    except OSError:
        return []
    removed = []
    for entry in entries:
        parsed = parse(entry.name)
        if parsed is None or parsed[0] != destination.name:
            continue
        if parsed[1] == os.getpid() or alive(parsed[1]):
            continue
        if entry.is_symlink() or not entry.is_dir() or not _this_host(entry):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
    return removed


def _this_host(folder: Path) -> bool:
    """The folder's writer ran on this host (or recorded no host: a writer that died
    before writing it, or one older than :data:`WRITER`)."""
    try:
        host = (folder / WRITER).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return True
    except (OSError, UnicodeDecodeError):
        return False
    return host == socket.gethostname()


def refuse_temporary(path: Path) -> None:
    """One line for a path named like a writer's temporary (``.NAME.tmp-PID``): an
    unfinished write, never a dataset."""
    parsed = parse(Path(path).name)
    if parsed is None:
        return
    name, pid = parsed
    if alive(pid):
        raise DatasetError(
            f"{path}: the temporary of a write of {name} in progress (process {pid}), not a "
            f"dataset; open {name} once it has finished"
        )
    raise DatasetError(
        f"{path}: the temporary of a write of {name} that did not finish (process {pid} is "
        f"no longer running), not a dataset; write {name} again (that removes it)"
    )
