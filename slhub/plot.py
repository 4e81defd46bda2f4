"""``slhub plot RUN_DIR``: a run's train loss, validation metrics and learning rate.

It reads the *effective* metrics history (slhub.artifacts.read_metrics: updates
redone after a resume replace the first attempt's) and marks every resume with a
dashed line, so a plot of a preempted and requeued run looks like the
uninterrupted run plus where it restarted. matplotlib is an optional extra
(``pip install 'slhub[plot]'``); the figure is drawn without pyplot, so no
display or global state is touched. The series drawn are returned and also
written into the PNG's text metadata (key :data:`METADATA_KEY`), so what a
picture shows can be checked without reading pixels.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slhub.artifacts import METRICS_FILE, RESUME_EVENT, read_metrics
from slhub.errors import SlhubError
from slhub.paths import path_errors, user_path

METADATA_KEY = "slhub-series"
DEFAULT_NAME = "metrics.png"


@dataclass
class Plotted:
    """What ``plot_run`` drew: each series as ``(updates, values)``, and the resumes."""

    path: Path
    series: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    resumed_at: list[int] = field(default_factory=list)


#: Updates beyond this are no update a run reached (and no x value a plot can place).
MAX_STEP = 2**63 - 1


def _step_of(record: dict[str, Any]) -> int | None:
    """The record's update number, or None when its ``step`` is missing or not a
    non-negative integer (a string, null, a float such as ``1e400``, a bool)."""
    step = record.get("step")
    if isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_STEP:
        return step
    return None


def _bad_step_line(path: Path) -> str:
    """Where the first record without a usable step is, for a one-line refusal."""
    with path_errors(path, SlhubError, "cannot read the metrics"):
        text = path.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and _step_of(record) is None:
            return f"line {number} has step {_short(record.get('step'))}"
    return "a record has no usable step"


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def collect(run_dir: Path) -> tuple[dict[str, tuple[list[int], list[float]]], list[int]]:
    """The series to plot (train/loss, every validation/*, train/lr) and the resume
    updates, from the run directory's effective metrics history.

    A record whose ``step`` is missing or not a non-negative integer cannot be
    placed on the update axis and is skipped; the rest of the run is plotted.
    So is a non-finite value (NaN, an infinity; metrics.jsonl writes them as
    ``"NaN"``/``"Infinity"``/``"-Infinity"``, read back as floats): its series
    shows a gap there.
    Only when such a record stands where a resume marker must be ordered against
    it (read_metrics compares steps there) is the file refused, naming the line.
    """
    path = run_dir / METRICS_FILE
    with path_errors(run_dir, SlhubError, "cannot read the run directory"):
        if not path.is_file():
            raise SlhubError(f"{run_dir} holds no {METRICS_FILE}: not a run directory")
        try:
            records = read_metrics(path, markers=True)
        except (TypeError, ValueError, KeyError, OverflowError) as exc:
            raise SlhubError(
                f"{path}: {_bad_step_line(path)}, not an update number; cannot apply the "
                f"resume markers ({exc.__class__.__name__})"
            ) from None
    series: dict[str, tuple[list[int], list[float]]] = {}
    resumed_at: list[int] = []
    for record in records:
        step = _step_of(record)
        if step is None:
            continue
        if record.get("event") == RESUME_EVENT:
            resumed_at.append(step)
            continue
        for key, value in record.items():
            wanted = key in ("train/loss", "train/lr") or key.startswith("validation/")
            if wanted and isinstance(value, (int, float)) and not isinstance(value, bool):
                if not math.isfinite(value):
                    continue  # NaN or an infinity has no place on the y axis: a gap
                steps, values = series.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value))
    if not series:
        raise SlhubError(f"{path} has no train/loss, validation or lr values to plot")
    return series, resumed_at


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Plotted:
    """Draw the run's metrics into ``out`` (default ``RUN_DIR/metrics.png``), exactly there.

    The format follows ``out``'s suffix, PNG without one (matplotlib would append
    ``.png`` to the name, and the path reported would not be the file written);
    an existing directory as ``out`` is refused.
    """
    run_dir = user_path(run_dir, "run directory")
    target = run_dir / DEFAULT_NAME if out is None else user_path(out, "--out")
    if out is not None:
        with path_errors(target, SlhubError, "cannot write the plot"):
            if target.is_dir():
                raise SlhubError(
                    f"{target}: is a directory; --out names the image file to write, "
                    f"e.g. {target / DEFAULT_NAME}"
                )
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise SlhubError("slhub plot needs matplotlib: pip install 'slhub[plot]'") from None
    series, resumed_at = collect(run_dir)
    panels = [("train loss", ["train/loss"], True)]
    validation = sorted(k for k in series if k.startswith("validation/"))
    panels += [(k.split("/", 1)[1], [k], True) for k in validation]
    panels.append(("learning rate", ["train/lr"], False))
    panels = [p for p in panels if any(k in series for k in p[1])]

    figure = Figure(figsize=(7, 2.2 * len(panels)), layout="constrained")
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    drawn = Plotted(path=target)
    for ax, (title, keys, log_scale) in zip(axes, panels):
        for key in keys:
            steps, values = series[key]
            (line,) = ax.plot(steps, values, marker="o" if len(steps) < 30 else None, label=key)
            drawn.series[key] = (
                [int(x) for x in line.get_xdata()],
                [float(y) for y in line.get_ydata()],
            )
            if log_scale and all(v > 0 for v in values):
                ax.set_yscale("log")
        for step in resumed_at:
            ax.axvline(step, color="grey", linestyle="--", linewidth=1)
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
    drawn.resumed_at = list(resumed_at)
    if resumed_at:
        axes[0].set_title(f"resumed at update {', '.join(map(str, resumed_at))} (dashed)")
    axes[-1].set_xlabel("update")
    metadata = {METADATA_KEY: json.dumps({"series": drawn.series, "resumed_at": resumed_at})}
    fmt = drawn.path.suffix[1:].lower() or "png"
    with path_errors(drawn.path, SlhubError, "cannot write the plot"):
        drawn.path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(drawn.path, dpi=100, format=fmt, metadata=_png_only(fmt, metadata))
    return drawn


def _png_only(fmt: str, metadata: dict[str, Any]) -> dict[str, Any] | None:
    """Text metadata is a PNG feature; other formats get none."""
    return metadata if fmt == "png" else None
