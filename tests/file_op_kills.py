"""A kill -9 placed at one file operation of a run, from the test (not by timing).

``file_op_kills:KillAt`` is an extra plugin. With ``SLHUB_TEST_KILL_STEP=N`` rank 0
starts counting at the commit of update N (right before that update's boundary)
every link, rename and delete of a name in ``trainer.output_dir`` (the deletes of
``.NAME.tmp-PID`` temporaries aside: a writer clears those before using the name).
With ``SLHUB_TEST_KILL_AT=K:before`` or ``K:after`` the process SIGKILLs itself right
before or right after the K-th of them; with ``SLHUB_TEST_FILE_OPS=PATH`` every
counted operation is appended to PATH as ``OP NAME`` (``link last.pt`` for the hard
link a write makes under ``.last.pt.tmp-PID`` to rename onto ``last.pt``). Unset, the
plugin does nothing, so the killed run, its resume and the uninterrupted run share
one recipe and plugin set.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from slhub import hookimpl

KILL_STEP_ENV = "SLHUB_TEST_KILL_STEP"
KILL_AT_ENV = "SLHUB_TEST_KILL_AT"
OPS_LOG_ENV = "SLHUB_TEST_FILE_OPS"


def _name(path: Any) -> str:
    """The name an operation is for: ``.last.pt.tmp-123`` is for ``last.pt``."""
    name = Path(os.fsdecode(path)).name
    if name.startswith(".") and ".tmp-" in name:
        return name[1:].rsplit(".tmp-", 1)[0]
    return name


class _Counter:
    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()
        self.count = 0
        at = os.environ.get(KILL_AT_ENV, "")
        index, _, self.when = at.partition(":")
        self.kill_at = int(index) if index else 0
        self.log = os.environ.get(OPS_LOG_ENV) or None

    def watched(self, path: Any) -> bool:
        return Path(os.path.abspath(os.fsdecode(path))).parent.resolve() == self.folder

    def around(self, op: str, target: Any, call, *args: Any) -> Any:
        self.count += 1
        if self.log is not None:
            with open(self.log, "a", encoding="utf-8") as handle:
                handle.write(f"{op} {_name(target)}\n")
        mine = self.count == self.kill_at
        if mine and self.when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        result = call(*args)
        if mine and self.when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return result


def _install(counter: _Counter) -> None:
    link, replace, rename, unlink = os.link, os.replace, os.rename, os.unlink

    def counted_link(src, dst, *args, **kwargs):
        if not counter.watched(dst):
            return link(src, dst, *args, **kwargs)
        return counter.around("link", dst, link, src, dst, *args)

    def counted_replace(src, dst, *args, **kwargs):
        if not counter.watched(dst):
            return replace(src, dst, *args, **kwargs)
        return counter.around("rename", dst, replace, src, dst, *args)

    def counted_rename(src, dst, *args, **kwargs):
        if not counter.watched(dst):
            return rename(src, dst, *args, **kwargs)
        return counter.around("rename", dst, rename, src, dst, *args)

    def counted_unlink(path, *args, **kwargs):
        name = Path(os.fsdecode(path)).name
        if not counter.watched(path) or (name.startswith(".") and ".tmp-" in name):
            return unlink(path, *args, **kwargs)
        return counter.around("delete", path, unlink, path, *args)

    os.link, os.replace, os.rename, os.unlink = (
        counted_link, counted_replace, counted_rename, counted_unlink,
    )  # fmt: skip


class KillAt:
    """Arms the counting at the commit of update ``SLHUB_TEST_KILL_STEP`` on rank 0."""

    @hookimpl
    def on_commit(self, trainer: Any, step: int) -> None:
        target = int(os.environ.get(KILL_STEP_ENV, "0") or 0)
        if target and trainer.rank == 0 and step == target:
            _install(_Counter(Path(trainer.output_dir)))
