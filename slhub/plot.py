"""``slhub plot RUN_DIR``: a run's train loss, validation metrics and learning rate.

It reads the *effective* metrics history (slhub.artifacts.read_metrics: updates
redone after a resume replace the first attempt's) and marks every resume with a
dashed line, so a plot of a preempted and requeued run looks like the
uninterrupted run plus where it restarted. matplotlib is an optional extra
(``pip install 'slhub[plot]'``); the figure is drawn without pyplot, so no
display or global state is touched.

What the figure shows, so that it reads without a legend hunt:

- a title naming the run (its directory and run.json's ``run_id``), the updates
  drawn and the resumes, and every *constant* series (two or more values, all
  equal: a constant learning rate) as ``key = value`` instead of a panel holding a
  flat line;
- a panel per metric titled with its full name (``validation/mse``), except that
  **validation metrics differing only in their first word share a panel**: every
  ``validation/<word>_<rest>`` with the same ``<rest>``. NeRD's
  ``rollout_mse_10``, ``baseline_mse_10`` and ``linear_mse_10`` share
  ``validation/*_mse_10``, so each horizon's rollout error is drawn against the two
  baselines that bound it. A constant member of a shared panel stays there as a
  flat reference whose legend entry gives its value; members whose first word is
  in :data:`REFERENCE_WORDS` are dashed;
- a log y axis for a positive series spanning 3x or more, with at most
  :data:`MAX_TICKS` ticks at 1, 2 and 5 x 10^k (fewer on wide ranges) written as
  plain numbers.

:func:`plot_run` returns the figure and a description read back from its objects
(lines, titles, legends, ticks); the description is also written into the PNG's
text metadata (key :data:`METADATA_KEY`), so what a picture shows can be checked
without reading pixels.
"""

from __future__ import annotations

import io
import json
import math
import re
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slhub.artifacts import METRICS_FILE, RESUME_EVENT, ArtifactError, read_identity, read_metrics
from slhub.errors import SlhubError
from slhub.paths import path_errors, user_path

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

METADATA_KEY = "slhub-series"
DEFAULT_NAME = "metrics.png"
DPI = 100

#: First words that name a reference rather than the model (drawn dashed on a shared panel).
REFERENCE_WORDS = frozenset({"baseline", "linear"})
#: The most y ticks a log axis gets, so labels never crowd a panel.
MAX_TICKS = 6
#: Series drawn on a linear axis whatever their range (a schedule reads naturally so).
LINEAR_KEYS = frozenset({"train/lr"})

Series = dict[str, tuple[list[int], list[float]]]


@dataclass
class Panel:
    """One panel as drawn, read back from its matplotlib Axes."""

    title: str
    keys: list[str]  # the series drawn, in drawing order
    legend: list[str]  # legend texts; [] for a panel of one series
    yscale: str
    yticks: list[float]  # the major ticks inside the view
    yticklabels: list[str]


@dataclass
class Plotted:
    """What ``plot_run`` drew. ``series`` is every series shown as ``(updates, values)``:
    the lines as read back from the figure, then the constants folded into the title."""

    path: Path
    series: Series = field(default_factory=dict)
    resumed_at: list[int] = field(default_factory=list)
    title: str = ""
    panels: list[Panel] = field(default_factory=list)
    constants: dict[str, float] = field(default_factory=dict)
    figure: Figure | None = None


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


def _natural(text: str) -> list[Any]:
    """Sort key that orders ``mse_10`` before ``mse_100`` (numbers compared as numbers)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _shared_rest(key: str) -> str | None:
    """``<rest>`` of ``validation/<word>_<rest>``: the part that panel-mates share."""
    if not key.startswith("validation/"):
        return None
    word, sep, rest = key.removeprefix("validation/").partition("_")
    return rest if word and sep and rest else None


def _member_order(key: str) -> tuple[bool, list[Any]]:
    """The model's series first, then its references, so colours match across panels."""
    word = key.removeprefix("validation/").partition("_")[0]
    return word in REFERENCE_WORDS, _natural(key)


def layout(keys: list[str]) -> list[tuple[str, list[str]]]:
    """The panels as ``(title, keys)``: train/loss, the validation metrics (those
    differing only in their first word together, see the module docstring), train/lr."""
    validation = [k for k in keys if k.startswith("validation/")]
    by_rest: dict[str, list[str]] = {}
    for key in validation:
        rest = _shared_rest(key)
        if rest is not None:
            by_rest.setdefault(rest, []).append(key)
    shared = {rest: members for rest, members in by_rest.items() if len(members) > 1}
    grouped = {k for members in shared.values() for k in members}
    panels = [("train/loss", ["train/loss"])] if "train/loss" in keys else []
    panels += [(k, [k]) for k in sorted(set(validation) - grouped, key=_natural)]
    panels += [
        (f"validation/*_{rest}", sorted(shared[rest], key=_member_order))
        for rest in sorted(shared, key=_natural)
    ]
    if "train/lr" in keys:
        panels.append(("train/lr", ["train/lr"]))
    return panels


def is_constant(values: list[float]) -> bool:
    """Two or more values, all equal: a flat line that says no more than its value."""
    return len(values) > 1 and all(math.isclose(v, values[0], rel_tol=1e-9) for v in values)


def log_ticks(low: float, high: float, most: int = MAX_TICKS) -> list[float]:
    """Ticks for a log axis over ``[low, high]``: 1, 2, 5 x 10^k when at most ``most`` of
    them fall inside, else the powers of ten (every n-th on a wide range). [] when fewer
    than two would show: the range is too narrow for a log axis to help."""
    if not 0 < low <= high:
        return []
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    for subs in ((1, 2, 5), (1,)):
        ticks = [float(f"{m}e{e}") for e in range(first, last + 1) for m in subs]
        ticks = [t for t in ticks if low <= t <= high]
        if len(ticks) <= most:
            return ticks if len(ticks) >= 2 else []
    every = math.ceil(len(ticks) / most)
    return [t for t in ticks if round(math.log10(t)) % every == 0]


def _plain(value: float, _position: Any = None) -> str:
    """A tick label as a plain number (0.001, 20), not 10^-3 or 2 x 10^1."""
    return f"{value:g}"


def _number(value: float) -> str:
    return f"{value:.4g}"


def _title(
    run_dir: Path, series: Series, resumed_at: list[int], constants: dict[str, float]
) -> str:
    """Which run, which updates, the resumes, and the constants not given a panel."""
    try:
        identity = read_identity(run_dir) or {}
    except ArtifactError:
        identity = {}
    run_id = identity.get("run_id")
    name = run_dir.resolve().name or str(run_dir)
    lines = [f"{name} · run {run_id}" if isinstance(run_id, str) else name]
    steps = [s for updates, _ in series.values() for s in updates]
    span = f"updates {min(steps)}–{max(steps)}"
    recipe = identity.get("recipe")
    planned = recipe.get("trainer", {}).get("steps") if isinstance(recipe, dict) else None
    if isinstance(planned, int) and planned > max(steps):
        span += f" of {planned}"
    if resumed_at:
        span += f" · resumed at update {', '.join(map(str, resumed_at))} (dashed)"
    if constants:
        span += " · constant: " + ", ".join(f"{k} = {_number(v)}" for k, v in constants.items())
    lines += textwrap.wrap(span, width=90)
    return "\n".join(lines)


def _draw_panel(
    ax: Axes, title: str, keys: list[str], series: Series, resumed_at: list[int]
) -> None:
    colours = [f"C{i}" for i in range(10)]
    for index, key in enumerate(keys):
        steps, values = series[key]
        flat = is_constant(values)
        word = key.removeprefix("validation/").partition("_")[0]
        ax.plot(
            steps,
            values,
            color=colours[index % len(colours)],
            linestyle="--" if word in REFERENCE_WORDS and len(keys) > 1 else "-",
            marker="o" if len(steps) < 30 and not flat else None,
            markersize=4,
            label=f"{key} = {_number(values[0])} (constant)" if flat else key,
            gid=key,
        )
    for step in resumed_at:
        ax.axvline(step, color="grey", linestyle="--", linewidth=1, gid="resume")
    style_panel(ax, title, keys, [v for key in keys for v in series[key][1]])
    if len(keys) > 1:
        ax.legend(fontsize=7, framealpha=0.8)


def style_panel(ax: Axes, title: str, keys: list[str], values: list[float]) -> None:
    """Title, y scale and ticks, x ticks and grid of a panel drawing ``keys``, whose
    lines hold ``values``: a log axis for a positive range of 3x or more."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter

    ticks = [] if set(keys) <= LINEAR_KEYS else log_ticks(min(values), max(values))
    if len(ticks) >= 2 and max(values) / min(values) >= 3:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.yaxis.set_major_locator(MaxNLocator(5))
    ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10]))
    ax.set_title(title, loc="left", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)


def read_back(ax: Axes) -> tuple[Panel, Series]:
    """The panel and its lines as the Axes holds them (not as they were asked for)."""
    lines = [line for line in ax.get_lines() if line.get_gid() not in (None, "resume")]
    drawn: Series = {
        str(line.get_gid()): (
            [int(x) for x in line.get_xdata()],
            [float(y) for y in line.get_ydata()],
        )
        for line in lines
    }
    low, high = sorted(ax.get_ylim())
    ticks = [float(t) for t in ax.get_yticks() if low <= t <= high]
    legend = ax.get_legend()
    panel = Panel(
        title=ax.get_title(loc="left"),
        keys=list(drawn),
        legend=[text.get_text() for text in legend.get_texts()] if legend else [],
        yscale=ax.get_yscale(),
        yticks=ticks,
        yticklabels=list(ax.yaxis.get_major_formatter().format_ticks(ticks)),
    )
    return panel, drawn


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Plotted:
    """Draw the run's metrics into ``out`` (default ``RUN_DIR/metrics.png``), exactly there.

    The format follows ``out``'s suffix, PNG without one (matplotlib would append
    ``.png`` to the name, and the path reported would not be the file written);
    an existing directory as ``out`` is refused.
    """
    run_dir = user_path(run_dir, "run directory")
    target = output_path(run_dir / DEFAULT_NAME, out)
    Figure = figure_class()
    series, resumed_at = collect(run_dir)
    panels = layout(list(series))
    constants: dict[str, float] = {}
    kept = [p for p in panels if not all(is_constant(series[k][1]) for k in p[1])]
    if kept:  # a run where nothing changed keeps its flat panels: a figure needs one
        for _, keys in panels:
            if all(is_constant(series[k][1]) for k in keys):
                constants.update({k: series[k][1][0] for k in keys})
        panels = kept

    figure = Figure(figsize=(7, 0.9 + 1.9 * len(panels)), layout="constrained")
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (title, keys) in zip(axes, panels):
        _draw_panel(ax, title, keys, series, resumed_at)
    axes[-1].set_xlabel("update", fontsize=9)
    figure.suptitle(_title(run_dir, series, resumed_at, constants), fontsize=10)

    drawn = Plotted(path=target, resumed_at=list(resumed_at), constants=constants, figure=figure)
    for ax in axes:
        panel, lines = read_back(ax)
        drawn.panels.append(panel)
        drawn.series.update(lines)
    drawn.series.update({k: series[k] for k in constants})
    drawn.title = figure.get_suptitle()
    description = {
        "title": drawn.title,
        "series": drawn.series,
        "resumed_at": drawn.resumed_at,
        "constants": drawn.constants,
        "panels": [asdict(p) for p in drawn.panels],
    }
    save(figure, drawn.path, description)
    return drawn


def output_path(default: Path, out: str | Path | None) -> Path:
    """Where the figure goes: ``out`` when given (never an existing directory), else
    ``default``."""
    if out is None:
        return default
    target = user_path(out, "--out")
    with path_errors(target, SlhubError, "cannot write the plot"):
        if target.is_dir():
            raise SlhubError(
                f"{target}: is a directory; --out names the image file to write, "
                f"e.g. {target / DEFAULT_NAME}"
            )
    return target


def figure_class() -> type[Figure]:
    """matplotlib's Figure, or the one line saying how to install it (an optional extra)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise SlhubError("slhub plot needs matplotlib: pip install 'slhub[plot]'") from None
    return Figure


def save(figure: Figure, path: Path, description: dict[str, Any]) -> None:
    """Write the figure in the format ``path``'s suffix names (PNG without one), the
    description in a PNG's text metadata under :data:`METADATA_KEY`."""
    fmt = path.suffix[1:].lower() or "png"
    with path_errors(path, SlhubError, "cannot write the plot"):
        path.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "png":
            _save_png(figure, path, {METADATA_KEY: json.dumps(description)})
        else:  # text metadata is a PNG feature; other formats get none
            figure.savefig(path, dpi=DPI, format=fmt)


def _save_png(figure: Figure, path: Path, text: dict[str, str]) -> None:
    """The PNG in a 64-colour palette (a fifth of the bytes of matplotlib's RGBA, the
    same picture: a plot has a few colours and their anti-aliased edges), so plots
    committed to docs stay small. Pillow comes with matplotlib."""
    from PIL import Image, PngImagePlugin

    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=DPI, format="png")
    buffer.seek(0)
    info = PngImagePlugin.PngInfo()
    for key, value in text.items():
        info.add_text(key, value, zip=True)  # zTXt: the series compress well
    with Image.open(buffer) as image:
        palette = image.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    palette.save(path, format="PNG", optimize=True, pnginfo=info)
