"""Progress on rank 0: a tqdm bar on a terminal, a ``progress`` log event elsewhere.

A person at a terminal sees updates done/total, updates per second, the ETA,
the last training loss and the last validation metric on one bar that the log
lines scroll past. The bar follows the terminal's width and keeps at least
:data:`MIN_BAR` cells: on a narrow terminal the validation metric's name is
shortened, then left out, before the bar shrinks. A terminal that reports no size
(0x0: ``script -qc``, some container and CI terminals) gets a bar of
:data:`FIXED_COLUMNS`; tqdm would draw nothing there.

When stderr is not a terminal (a batch job's log file, a pipe) or the log
format is JSON, a bar would be noise, so the same fields go out as a
``progress`` event at the first update, every :data:`PERIOD_S` seconds and at
the last update. Both read the metrics lines rank 0 writes (``on_log``), so
they cost nothing on the other ranks.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from slhub import Trainer, get_logger, hookimpl, log_format, set_log_write_wrapper

#: Seconds between two ``progress`` events when there is no bar.
PERIOD_S = 10.0
#: Seconds between two refreshes of the bar's loss and validation fields.
POSTFIX_PERIOD_S = 0.5
#: The bar's width, and the rows tqdm is told of, on a terminal that reports no size.
FIXED_COLUMNS, FIXED_ROWS = 80, 24
#: The fewest cells the bar itself keeps; the fields beside it give way first.
MIN_BAR = 10
#: done/total, rate and ETA, then the fields (tqdm's default adds a description and the
#: elapsed time, which left NeRD's bar one cell at 80 columns).
BAR_FORMAT = "{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {rate_fmt} eta {remaining}{postfix}"

LOG = get_logger()


def bar_wanted() -> bool:
    """A bar only for people: console format on a terminal."""
    return log_format() == "console" and sys.stderr.isatty()


class Plugin:
    """One run's progress display (the registry makes a fresh one per run)."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._events = False
        self._started: tuple[float, int] | None = None  # (time, step) of the first update
        self._last_event = 0.0
        self._last_postfix = 0.0
        self._loss: float | None = None
        self._validation: tuple[str, float] | None = None

    @hookimpl(trylast=True)
    def on_log(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        total = trainer.config.steps
        if "train/loss" not in metrics:  # a validation line
            best = trainer.config.best.metric if trainer.config.best is not None else None
            shown = [k for k, v in metrics.items() if k.startswith("validation/")
                     and isinstance(v, (int, float)) and not isinstance(v, bool)]  # fmt: skip
            if shown:  # the metric trainer.best follows, else the first the plugins give
                key = best if best in shown else shown[0]
                self._validation = (key.split("/", 1)[1], float(metrics[key]))
            if self._bar is not None:
                self._bar.set_postfix_str(self._fitted_text(), refresh=step == total)
            elif self._events and step == total and self._started is not None:
                # the last progress line comes after the last validation, with its value
                LOG.info("progress", **self._fields(time.monotonic(), step, total))
            return
        if metrics["train/loss"] is not None:
            self._loss = metrics["train/loss"]
        now = time.monotonic()
        if self._started is None:
            self._start(now, step, total)
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            if now - self._last_postfix >= POSTFIX_PERIOD_S or step == total:
                self._bar.set_postfix_str(self._fitted_text(), refresh=step == total)
                self._last_postfix = now
        elif self._events and (
            now - self._last_event >= PERIOD_S
            or (step == total and not _validates(trainer.config, step))
            or step == self._started[1]
        ):
            self._last_event = now
            LOG.info("progress", **self._fields(now, step, total))

    @hookimpl(trylast=True)
    def on_fit_end(self, trainer: Trainer, status: str) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            set_log_write_wrapper(None)

    def _start(self, now: float, step: int, total: int) -> None:
        self._started = (now, step - 1)
        if bar_wanted():
            from tqdm import tqdm

            sized = min(_terminal_size()) > 0
            self._bar = tqdm(
                total=total,
                initial=step - 1,
                unit="upd",
                file=sys.stderr,
                bar_format=BAR_FORMAT,
                dynamic_ncols=sized,
                # both given: tqdm asks the terminal for whichever is None, and draws
                # nothing when it reports 0 rows; one cell short of the edge, as tqdm
                # sizes itself, so that a terminal of that width does not wrap
                ncols=None if sized else FIXED_COLUMNS - 1,
                nrows=None if sized else FIXED_ROWS,
                leave=True,
            )
            set_log_write_wrapper(tqdm.external_write_mode)
        else:
            self._events = True

    def _fields(self, now: float, step: int, total: int) -> dict[str, Any]:
        assert self._started is not None
        began, first = self._started
        elapsed = now - began
        rate = (step - first) / elapsed if elapsed > 0 else None
        fields: dict[str, Any] = {"total": total}
        fields["rate"] = rate
        fields["eta_s"] = (total - step) / rate if rate else None
        fields["loss"] = self._loss
        if self._validation is not None:
            name, value = self._validation
            fields[f"val_{name}"] = value
        return fields

    def _fitted_text(self) -> str:
        """The bar's fields, as long as the terminal leaves :data:`MIN_BAR` cells of bar."""
        candidates = self._fields_texts()
        meter = self._bar.format_dict
        columns = meter.get("ncols")
        if not columns:
            return candidates[0]
        from tqdm.utils import disp_len

        for text in candidates:
            # without ncols tqdm draws a bar of 10 cells: the rest is what the fields leave
            line = self._bar.format_meter(**{**meter, "ncols": None, "postfix": text})
            if columns - (disp_len(line) - 10) >= MIN_BAR:
                return text
        return ""

    def _fields_texts(self) -> list[str]:
        """The bar's fields, longest first: the validation name, then the metric, give way."""
        loss = [f"loss={_significant(self._loss)}"] if self._loss is not None else []
        if self._validation is None:
            return [", ".join(loss)]
        name, value = self._validation
        shown = _significant(value)
        shorter = [f"val_{name}={shown}", f"{name}={shown}", f"val={shown}"]
        return [", ".join([*loss, field]) for field in shorter] + [", ".join(loss)]


def _validates(config: Any, step: int) -> bool:
    """Whether update ``step`` is a validation boundary (its progress line then waits)."""
    return config.validate_every > 0 and step % config.validate_every == 0


def _significant(value: float) -> str:
    """4 significant digits, as the console log prints floats."""
    return f"{value:.4g}"


def _terminal_size() -> tuple[int, int]:
    """stderr's columns and rows; 0 for a terminal that reports none (a bare pseudo-terminal)."""
    try:
        return tuple(os.get_terminal_size(sys.stderr.fileno()))  # type: ignore[return-value]
    except (OSError, ValueError):
        return 0, 0
