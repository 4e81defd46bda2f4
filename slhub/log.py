"""structlog configuration: a compact console for people, JSON lines for pipelines.

JSON lines carry everything on every event: ``run_id``, ``rank``,
``world_size``, ``step`` (null before training), ``level`` and ``timestamp``,
and are strict JSON: a NaN or infinite value is written as ``"NaN"``,
``"Infinity"`` or ``"-Infinity"``, as in metrics.jsonl (:mod:`slhub.strictjson`).
The console says the run's identity once, in the ``start`` event, and then keeps
each line short: the time, the event, ``step`` and the event's own fields, with
floats at 4 significant digits (the exact values are in metrics.jsonl), and
within the terminal's width (:func:`console_width`: ``COLUMNS``, else the width of the
terminal stderr writes to, else :data:`CONSOLE_WIDTH` for a log file): an info or
warning event whose fields do not fit is split, between fields, onto a few lines,
each beginning with the event's time, level, name and ``step``, so that a terminal
never wraps it and grep still finds every part.
Rank 0 logs at INFO; other ranks log warnings and errors only (their console lines
name the rank), so a torchrun console is not N copies.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from functools import cache
from typing import Any

import structlog
import structlog.tracebacks

from slhub import strictjson
from slhub.errors import SlhubError

FORMATS = ("console", "json")

#: Context every JSON event carries and the console prints only in ``start``.
IDENTITY_KEYS = ("run_id", "world_size")
#: The width console lines are kept within when stderr is no terminal and ``COLUMNS`` is
#: unset (one field longer than the width is not cut).
CONSOLE_WIDTH = 100
#: The narrowest width honoured: below it every field would get a line of its own.
_NARROWEST = 40
#: What every part of a split console line repeats.
_HEAD_KEYS = ("timestamp", "level", "event", "step", "rank")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

_format = "console"
#: The update every event is about (None before training): a plain global, set once per
#: update (:func:`set_step`), where a context variable would cost a copy of the context.
_step: int | None = None
#: Wraps every console write while a progress bar is shown (it clears and redraws the bar).
_write_wrapper: Callable[..., AbstractContextManager] | None = None


class _StderrLogger:
    """structlog's print logger, but writing around a progress bar when one is shown."""

    def msg(self, message: str) -> None:
        wrapper = _write_wrapper
        with wrapper(file=sys.stderr) if wrapper is not None else nullcontext():
            # one write with its newline (print makes two): workers sharing a terminal or
            # a torchrun log cannot split a line between them
            sys.stderr.write(message + "\n")
            sys.stderr.flush()

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def set_write_wrapper(wrapper: Callable[..., AbstractContextManager] | None) -> None:
    """Route log lines around a progress bar (``tqdm.external_write_mode``), or stop."""
    global _write_wrapper
    _write_wrapper = wrapper


def configure(fmt: str = "console", rank: int = 0, world_size: int = 1) -> None:
    """Configure structlog for this process (idempotent)."""
    global _format, _step
    _format = fmt
    _step = None
    level = logging.INFO if rank == 0 else logging.WARNING
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        _add_step,
        structlog.processors.add_log_level,
    ]
    if fmt == "json":
        processors += [
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # exc_info as structured frames, without locals (tensors, paths, secrets)
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            # strict JSON: a NaN or infinite field as "NaN"/"Infinity", as metrics.jsonl
            structlog.processors.JSONRenderer(serializer=strictjson.dumps),
        ]
    else:
        processors += [
            _compact,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            _Fitted(
                structlog.dev.ConsoleRenderer(
                    colors=sys.stderr.isatty(), pad_event_to=0, pad_level=False, sort_keys=False
                )
            ),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=lambda *_: _StderrLogger(),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(rank=rank, world_size=world_size)


def current_format() -> str:
    """The format :func:`configure` set: ``console`` or ``json``."""
    return _format


def bind(**values: Any) -> None:
    """Add context (``run_id``) to every later event of this process."""
    structlog.contextvars.bind_contextvars(**values)


def set_step(step: int | None) -> None:
    """The update every later event is about (an event's own ``step=`` wins)."""
    global _step
    _step = step


def get_logger() -> Any:
    return structlog.get_logger("slhub")


def failure(event: str, exc: BaseException) -> None:
    """Log an error where it happened. A plain exception (not a ``SlhubError``) is a bug,
    in slhub or a plugin: its traceback goes with it, which the one line the command
    ends with cannot show (console: Python's traceback; JSON: structured frames)."""
    if isinstance(exc, SlhubError):
        get_logger().error(event, error=str(exc))
    else:
        get_logger().error(event, error=f"{exc.__class__.__name__}: {exc}", exc_info=exc)


#: The ``timestamp`` of JSON events: ISO 8601 in UTC, as every logged event has it.
_TIMESTAMPER = structlog.processors.TimeStamper(fmt="iso", utc=True)


def final_line(message: str, fmt: str, event: str = "error", level: str = "error") -> str:
    """The CLI's last word on a failed or preempted command, in the command's log
    format: a JSON event with the fields every JSON event has (``timestamp``,
    ``run_id``, ``rank``, ``world_size``, ``step``; ``run_id`` and ``step`` are null
    when the command failed before a run or an update began), or one plain
    ``slhub: error: ...`` (``slhub: ...``) line."""
    if fmt != "json":
        return f"slhub: error: {message}" if level == "error" else f"slhub: {message}"
    context = {"run_id": None, "step": _step, **structlog.contextvars.get_contextvars()}
    line = {"event": event, "level": level, "message": message, **context}
    return strictjson.dumps(_TIMESTAMPER(None, event, line), default=str)


def significant(value: float, digits: int = 4) -> str:
    """``value`` at ``digits`` significant digits, without a trailing exponent for
    ordinary magnitudes (0.0001234 stays readable, 1.2e-07 does not pretend)."""
    return f"{value:.{digits}g}"


def _add_step(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event.setdefault("step", _step)
    return event


def _compact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Console only: identity once, the rank only where it is not 0, ``step`` first
    (as ``step/total`` when the event has a total), no empty fields, floats at 4
    significant digits."""
    identity = {key: event.pop(key) for key in IDENTITY_KEYS if key in event}
    if event.get("event") == "start":
        event.update(identity)  # at the end, in a fixed order
    if event.get("rank") == 0:
        event.pop("rank", None)
    step, total = event.pop("step", None), event.pop("total", None)
    head = {k: event.pop(k) for k in ("timestamp", "level", "event") if k in event}
    if step is not None:
        head["step"] = f"{step}/{total}" if total is not None else step
    elif total is not None:
        head["total"] = total
    for key, value in event.items():
        if value is not None:
            head[key] = significant(value) if isinstance(value, float) else value
    event.clear()
    event.update(head)
    return event


def console_width() -> int:
    """The columns a console line may take: ``COLUMNS`` when set (as Python's
    :func:`shutil.get_terminal_size` reads it), else the width of the terminal stderr
    writes to, else :data:`CONSOLE_WIDTH`. A terminal that wrapped a line itself would
    cut it anywhere, inside a number too."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return max(int(columns), _NARROWEST)
    try:
        columns_ = os.get_terminal_size(sys.stderr.fileno()).columns if sys.stderr.isatty() else 0
    except (AttributeError, OSError, ValueError):  # no real file behind sys.stderr
        columns_ = 0
    # a terminal that reports no size (``script -qc``, some CI consoles): the log-file width
    return max(columns_, _NARROWEST) if columns_ > 0 else CONSOLE_WIDTH


class _Fitted:
    """The console renderer, with an event too wide for :func:`console_width` split onto
    the fewest lines that fit, its fields in order and spread evenly over them (NeRD's
    validation line of 7 metrics is 188 columns). Errors and events with a traceback
    stay one line: a failure's one line is a promise."""

    def __init__(self, render: Callable[..., str]) -> None:
        self._render = render

    def __call__(self, logger: Any, name: str, event: MutableMapping[str, Any]) -> str:
        line = self._render(logger, name, dict(event))
        width = console_width()
        if (
            _width(line) <= width
            or event.get("level") not in ("info", "warning")
            or "exc_info" in event
            or "exception" in event
        ):
            return line
        head = {key: event[key] for key in _HEAD_KEYS if key in event}
        fields = [(key, value) for key, value in event.items() if key not in head]
        base = _width(self._render(logger, name, dict(head)))
        widths = tuple(
            _width(self._render(logger, name, {**head, key: value})) - base for key, value in fields
        )
        parts = _spread(widths, width - base)
        return "\n".join(
            self._render(logger, name, {**head, **dict(fields[start:end])}) for start, end in parts
        )


def _width(text: str) -> int:
    """Columns a rendered line takes (colour codes take none)."""
    return len(_ANSI.sub("", text))


def _spread(widths: tuple[int, ...], room: int) -> list[tuple[int, int]]:
    """Contiguous ``(start, end)`` groups of fields: as few as fit in ``room`` each (a
    field wider than that alone), then the widest group as narrow as it can be, and
    of equally narrow spreads the one with the shortest first group."""
    lines = 0
    used = room + 1
    for width in widths:  # the fewest lines: fill each as far as it goes
        if used + width > room:
            lines, used = lines + 1, 0
        used += width

    @cache
    def best(start: int, left: int) -> tuple[int, tuple[int, ...]]:
        """(widest group, group ends) for fields[start:] over ``left`` lines."""
        if left == 1:
            return sum(widths[start:]), (len(widths),)
        found: tuple[int, tuple[int, ...]] | None = None
        for end in range(start + 1, len(widths) - left + 2):
            first = sum(widths[start:end])
            if first > room and end > start + 1:
                break
            widest, ends = best(end, left - 1)
            candidate = (max(first, widest), (end, *ends))
            if found is None or candidate[0] < found[0]:
                found = candidate
        assert found is not None
        return found

    _, ends = best(0, max(lines, 1))
    return list(zip((0, *ends[:-1]), ends))
