"""Preemption: a stop signal becomes an agreed, checkpointed stop at an update boundary.

SLURM, Kubernetes and spot instances send SIGTERM (or a configured signal such
as SIGUSR1) some seconds before they kill a job. The handler only records the
request; the loop carries it in the per-update agreement it already makes, so
every rank learns it at the same update without an extra collective. Every
rank then finishes that update, the run writes ``step_N.pt`` and ``last.pt``,
and every rank exits with :data:`EXIT_PREEMPTED`. A second signal, at least
:data:`REPEAT_AFTER_S` seconds after the first, exits at once with
``128 + signal`` (no checkpoint). Closer repeats are the same request delivered
twice (torchrun forwarding a signal the worker also received, the parent-death
signal) and are ignored, as is any signal once the stop is checkpointed. Under
the command line, which owns its process (:func:`own_process`), they stay ignored
until the process exits.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from slhub.errors import SlhubError

#: Exit status of a preempted run: "temporary failure, try again" (sysexits.h EX_TEMPFAIL).
EXIT_PREEMPTED = 75
#: A repeat of a stop signal sooner than this is taken as the same request delivered twice.
REPEAT_AFTER_S = 3.0

_owns_process = False


def own_process() -> None:
    """Declare that slhub owns this process (``slhub train``), called before training.

    Then a run that received a stop signal leaves the stop signals ignored
    (``SIG_IGN``) instead of restoring the previous handlers: the process only has
    its orderly exit left (status 75), and a repeat (torchrun's teardown SIGTERM)
    must not kill it, not even during interpreter shutdown, which resets Python-level
    handlers but keeps ``SIG_IGN``. The Python API does not call this: a notebook or
    script calling ``slhub.train`` gets its own handlers back (a later Ctrl-C works).
    A process-wide flag rather than an argument, since it describes the process.
    """
    global _owns_process
    _owns_process = True


class Preempted(SlhubError):
    """Raised on every rank after the checkpoint of a preempted run is written."""

    exit_code = EXIT_PREEMPTED

    def __init__(self, message: str, *, step: int) -> None:
        super().__init__(message)
        self.step = step


class StopSignals:
    """Installs stop handlers for the life of a run (main thread only) and remembers the first.

    Use as a context manager; the previous handlers come back on exit, unless slhub
    owns the process (:func:`own_process`): then the signals stay ignored until the
    process exits, so a signal after the last update leaves its exit status alone.
    """

    def __init__(self, names: list[str] | tuple[str, ...]) -> None:
        self.signals = [getattr(signal, name) for name in names]
        self.received: int | None = None
        self._first_at = 0.0
        #: Set once the stop is checkpointed: a later signal (torchrun tearing down the
        #: other workers) must not cut the orderly exit short.
        self.done = False
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.received is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.done:
            return
        if self.received is not None:
            if time.monotonic() - self._first_at < REPEAT_AFTER_S:
                return
            sys.stderr.write(
                f"slhub: error: second {signal.Signals(signum).name}: exiting now, "
                "without a checkpoint of the current update\n"
            )
            sys.stderr.flush()
            os._exit(128 + signum)
        self.received = signum
        self._first_at = time.monotonic()

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        # a process slhub owns has only its exit left, whatever the run's outcome: a stop
        # signal now (a requeue racing the end) must not turn status 0, 2 or 75 into 143
        keep_out = _owns_process
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if keep_out else previous)
        self._previous.clear()


def stop_with_parent() -> None:
    """Ask Linux to send this worker SIGTERM when its parent (the torchrun agent) dies.

    Without it, workers of a SIGKILLed agent train on and keep writing while a
    requeued job starts; with it they stop at the next update with a checkpoint.
    A no-op where ``prctl`` is unavailable.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
