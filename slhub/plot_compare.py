"""``slhub plot RUN_DIR RUN_DIR ...``: several runs on shared axes.

The panels are those :func:`slhub.plot.plot_run` draws for one run (train/loss,
the validation metrics, train/lr), over every metric any of the runs logged;
each run is a line, in its own colour, in every panel where it has the metric,
from its effective metrics history. A constant series keeps its panel here: a
learning rate that differs between runs is what a comparison is about.

A run is labelled by its name (its directory's name; its run.json ``run_id``
when two directories share a name) and the recipe keys whose values differ
between the runs (``model.width=64, trainer.lr=0.001``); keys equal in every
run, and ``trainer.output_dir``, are left out. The default output is
``compare.png`` in the first run's directory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slhub.artifacts import METRICS_FILE, RUN_FILE, ArtifactError, read_identity
from slhub.errors import SlhubError
from slhub.paths import path_errors, user_path
from slhub.plot import (
    REFERENCE_WORDS,
    Panel,
    Series,
    collect,
    figure_class,
    layout,
    output_path,
    read_back,
    save,
    style_panel,
)
from slhub.recipe import differing_keys

DEFAULT_NAME = "compare.png"
#: Recipe keys that differ between runs without making them different experiments.
IGNORED_KEYS = frozenset({"trainer.output_dir"})
#: Separates a line's run index from its metric key in the line's gid.
_GID = "|"


@dataclass
class Run:
    """One run to compare: where it is, what it logged, how its lines are labelled."""

    path: Path
    run_id: str | None
    recipe: dict[str, Any]
    series: Series
    resumed_at: list[int]
    name: str = ""
    label: str = ""


@dataclass
class Compared:
    """What ``plot_runs`` drew; ``series`` is keyed by run name, then metric, as read
    back from the figure's lines."""

    path: Path
    labels: dict[str, str] = field(default_factory=dict)  # run name -> its label
    series: dict[str, Series] = field(default_factory=dict)
    title: str = ""
    panels: list[Panel] = field(default_factory=list)
    figure: Any = None


def read_run(run_dir: str | Path) -> Run:
    """A run directory's identity and metrics; one line when it is not a run."""
    path = user_path(run_dir, "run directory")
    with path_errors(path, SlhubError, "cannot read the run directory"):
        if not (path / METRICS_FILE).is_file() or not (path / RUN_FILE).is_file():
            raise SlhubError(f"{path} holds no {METRICS_FILE} and {RUN_FILE}: not a run directory")
    try:
        identity = read_identity(path) or {}
    except ArtifactError as exc:
        raise SlhubError(str(exc)) from None
    recipe = identity.get("recipe")
    run_id = identity.get("run_id")
    series, resumed_at = collect(path)
    return Run(
        path=path,
        run_id=run_id if isinstance(run_id, str) else None,
        recipe=recipe if isinstance(recipe, dict) else {},
        series=series,
        resumed_at=resumed_at,
    )


def _lookup(recipe: dict[str, Any], dotted: str) -> str:
    node: Any = recipe
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "absent"
        node = node[part]
    return str(node)


def label_runs(runs: list[Run]) -> None:
    """Set each run's name and label (see the module docstring)."""
    names = [run.path.resolve().name or str(run.path) for run in runs]
    for index, run in enumerate(runs):
        name = names[index]
        if names.count(name) > 1:
            name = run.run_id or str(run.path)
        run.name = name
    taken = [run.name for run in runs]
    for run in runs:  # a copied run keeps its run_id: the path as given tells them apart
        if taken.count(run.name) > 1:
            run.name = str(run.path)
    first = runs[0].recipe
    keys = sorted({k for run in runs[1:] for k in differing_keys(first, run.recipe, IGNORED_KEYS)})
    for run in runs:
        shown = ", ".join(f"{key}={_lookup(run.recipe, key)}" for key in keys)
        run.label = f"{run.name}: {shown}" if shown else run.name


def plot_runs(run_dirs: list[str | Path], out: str | Path | None = None) -> Compared:
    """Draw the runs into ``out`` (default ``compare.png`` in the first run directory)."""
    paths = [user_path(d, "run directory") for d in run_dirs]
    seen: dict[Path, Path] = {}
    for path in paths:
        with path_errors(path, SlhubError, "cannot read the run directory"):
            resolved = path.resolve()
        if resolved in seen:
            raise SlhubError(f"{path}: the same run as {seen[resolved]}; name each run once")
        seen[resolved] = path
    target = output_path(paths[0] / DEFAULT_NAME, out)
    Figure = figure_class()
    runs = [read_run(path) for path in paths]
    label_runs(runs)

    keys = list(dict.fromkeys(key for run in runs for key in run.series))
    panels = layout(keys)
    figure = Figure(figsize=(8, 1.2 + 2.1 * len(panels)), layout="constrained")
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (title, members) in zip(axes, panels):
        _draw(ax, title, members, runs)
    axes[-1].set_xlabel("update", fontsize=9)
    steps = [s for run in runs for updates, _ in run.series.values() for s in updates]
    figure.suptitle(
        f"{len(runs)} runs: {', '.join(run.name for run in runs)}\n"
        f"updates {min(steps)}–{max(steps)}",
        fontsize=10,
    )

    drawn = Compared(path=target, labels={run.name: run.label for run in runs}, figure=figure)
    drawn.series = {run.name: {} for run in runs}
    for ax in axes:
        panel, lines = read_back(ax)
        for gid, line in lines.items():
            index, _, key = gid.partition(_GID)
            drawn.series[runs[int(index)].name][key] = line
        drawn.panels.append(panel)
    drawn.title = figure.get_suptitle()
    description = {
        "title": drawn.title,
        "labels": drawn.labels,
        "series": drawn.series,
        "panels": [asdict(p) for p in drawn.panels],
    }
    save(figure, target, description)
    return drawn


def _draw(ax: Any, title: str, members: list[str], runs: list[Run]) -> None:
    """Every run's line for every member key it logged; a run's colour is the same in
    every panel, a reference member (a baseline) is dashed."""
    values: list[float] = []
    for index, run in enumerate(runs):
        colour = f"C{index % 10}"
        for key in members:
            if key not in run.series:
                continue
            steps, ys = run.series[key]
            word = key.removeprefix("validation/").partition("_")[0]
            ax.plot(
                steps,
                ys,
                color=colour,
                linestyle="--" if word in REFERENCE_WORDS and len(members) > 1 else "-",
                marker="o" if len(steps) < 30 else None,
                markersize=3,
                label=run.label if len(members) == 1 else f"{run.label} · {key}",
                gid=f"{index}{_GID}{key}",
            )
            values += ys
        if not any(key in run.series for key in members):
            continue
        for step in run.resumed_at:
            ax.axvline(step, color=colour, linestyle=":", linewidth=1, gid="resume")
    style_panel(ax, title, members, values)
    ax.legend(fontsize=7, framealpha=0.8)
