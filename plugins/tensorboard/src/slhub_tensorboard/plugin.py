"""The ``tensorboard`` extra plugin: rank 0 mirrors metrics.jsonl into TensorBoard event files.

metrics.jsonl is the run's source of truth; this plugin only mirrors it. Every
line rank 0 writes reaches :meth:`TensorBoardLogger.on_log`, and each numeric
``train/*`` and ``validation/*`` value becomes a scalar at ``global_step = step``.

Resuming in place. A run that crashed between checkpoints has events past its
last checkpoint on disk; the resumed process redoes those updates. The writer
is therefore opened lazily at the first logged line, with ``purge_step`` = that
line's step: TensorBoard's reader then drops every event at or after that step
from the files written before (a ``SessionLog.START`` event marks the restart),
so every step is shown once, with the values of the process that continued.
Readers load a directory's event files in name order, and a name begins with
the second the file was created in, so a new file must start in a later second
than every file already there for the purge to apply to them (see
:func:`wait_for_later_name`).
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Mapping
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator
from slhub import SlhubError, Trainer, hookimpl, unwritable_reason

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

if importlib.util.find_spec("tensorboard") is None:  # fail when the plugin loads, not mid-run
    raise ImportError("the tensorboard package is not installed: pip install tensorboard")

#: The recipe section this plugin owns (optional: every key has a default).
SECTION = "tensorboard"
#: Metric keys mirrored as scalars.
PREFIXES = ("train/", "validation/")
#: How TensorBoard event file names begin: ``events.out.tfevents.<unix seconds>.<host>...``.
EVENT_FILE_PREFIX = "events.out.tfevents."
#: The longest wait for a file name that sorts after the existing ones (clock skew between hosts).
MAX_NAME_WAIT_S = 2.0

LOG = structlog.get_logger("slhub")


class TensorBoardSection(BaseModel):
    """``tensorboard:`` in a recipe; omitted, the defaults apply."""

    model_config = ConfigDict(extra="forbid")

    #: Where the event files go; a relative path is relative to ``trainer.output_dir``.
    log_dir: str = Field(default="tensorboard", min_length=1)

    @field_validator("log_dir")
    @classmethod
    def _home(cls, value: str) -> str:
        """``~`` is the user's home, as in a shell, never a directory named ``~``."""
        return os.path.expanduser(value)

    #: Seconds between flushes to disk: what a killed process can lose at most.
    flush_secs: float = Field(default=30.0, gt=0)


#: How metrics.jsonl writes non-finite values (strict JSON has none); a line read back
#: from the file may hold them, and they are the NaN and infinities TensorBoard shows.
NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The scalars of one metrics line: numeric ``train/*`` and ``validation/*`` values.

    NaN and infinities are kept (TensorBoard shows them), whether given as floats
    or as the names metrics.jsonl writes them by (:data:`NON_FINITE`). None (an
    update skipped because every weight was 0) and anything else that is not a real
    number (a bool, another string, a list) is left out.
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not key.startswith(PREFIXES):
            continue
        if isinstance(value, str) and value in NON_FINITE:
            out[key] = NON_FINITE[value]
        elif isinstance(value, Real) and not isinstance(value, bool):
            out[key] = float(value)
    return out


def latest_event_second(log_dir: Path) -> int:
    """The creation second in the newest event file name of ``log_dir`` (0: none there)."""
    if not log_dir.is_dir():
        return 0
    seconds = [
        int(stamp)
        for path in log_dir.iterdir()
        if path.name.startswith(EVENT_FILE_PREFIX)
        and (stamp := path.name[len(EVENT_FILE_PREFIX) :].split(".", 1)[0]).isdigit()
    ]
    return max(seconds, default=0)


def wait_for_later_name(log_dir: Path, limit_s: float = MAX_NAME_WAIT_S) -> bool:
    """Wait (at most ``limit_s``) until a new event file would sort after every file there.

    Event file names start with the creation second, then host, pid and a counter,
    and readers load them in name order; a file created in the same second as an
    older one (a resume right after a crash) could sort before it, and its purge
    would then not apply to the older file's events. Returns whether it will sort last.
    """
    latest = latest_event_second(log_dir)
    deadline = time.monotonic() + limit_s
    while int(time.time()) <= latest:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def log_dir_of(trainer: Trainer) -> Path:
    """Where the event files go: ``tensorboard.log_dir``, relative to the output directory."""
    return Path(trainer.output_dir) / trainer.section(SECTION).log_dir


def check_writable(log_dir: Path) -> None:
    """Refuse, in one line naming ``tensorboard.log_dir``, a directory that could not be
    made or written: it, or the nearest folder of it that exists, must be a directory
    this process may write into. Nothing is created."""
    problem = unwritable_reason(log_dir)
    if problem is not None:
        raise SlhubError(
            f"{SECTION}.log_dir: cannot write event files into {log_dir}: {problem}; "
            "choose a writable directory"
        )


class TensorBoardLogger:
    """Writes every metrics line of rank 0 as TensorBoard scalars (one instance per run)."""

    def __init__(self) -> None:
        self.writer: SummaryWriter | None = None

    @hookimpl
    def recipe_sections(self) -> dict[str, type[BaseModel]]:
        return {SECTION: TensorBoardSection}

    @hookimpl
    def admit(self, trainer: Trainer) -> None:
        """Rank 0 refuses a ``log_dir`` it could not write before the run writes anything:
        the writer opens only at the first metrics line, too late for one line."""
        if trainer.is_main:
            check_writable(log_dir_of(trainer))

    @hookimpl
    def on_log(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        if not trainer.is_main:
            return
        writer = self.writer or self._open(trainer, step)  # the first line fixes purge_step
        for tag, value in scalars(metrics).items():
            writer.add_scalar(tag, value, global_step=step)

    @hookimpl
    def on_fit_end(self, trainer: Trainer, status: str) -> None:
        if self.writer is None:
            return
        writer, self.writer = self.writer, None
        writer.flush()
        writer.close()

    def _open(self, trainer: Trainer, step: int) -> SummaryWriter:
        """The writer, opened at the first logged line so that its step is known.

        ``purge_step`` is that step on every open: a resumed run (step > 1) hides the
        events an earlier process wrote from this step on; a fresh run (step 1) hides
        those of a run that ``--overwrite`` superseded, whose ``tensorboard/`` slhub
        does not move aside; in an empty directory it hides nothing.
        """
        from torch.utils.tensorboard import SummaryWriter

        section: TensorBoardSection = trainer.section(SECTION)
        log_dir = log_dir_of(trainer)
        try:
            log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SlhubError(
                f"{SECTION}.log_dir: cannot create {log_dir} ({exc.strerror or exc})"
            ) from None
        if not wait_for_later_name(log_dir):
            LOG.warning(
                "tensorboard event file may sort before older ones (clock behind theirs)",
                log_dir=str(log_dir),
            )
        self.writer = SummaryWriter(
            log_dir=str(log_dir), flush_secs=section.flush_secs, purge_step=step
        )
        return self.writer
