"""``slhub sweep --summary``: the study's trials as a table, the best trial's recipe as a
file ``slhub train --config`` takes, and the best trials' runs drawn on shared axes
(:mod:`slhub.plot_compare`). Nothing is trained."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from slhub.errors import SlhubError, one_line
from slhub.recipe import apply_overrides, read_recipe_file
from slhub.sweep.spec import Sweep
from slhub.sweep.study import load_study, trial_dir

BEST_RECIPE = "best.yaml"
BEST_PLOT = "best_trials.png"
#: Where a run of best.yaml writes (inside the sweep's output_dir).
BEST_RUN = "best"


@dataclass
class Summary:
    """What ``--summary`` found and wrote."""

    rows: list[dict[str, Any]]
    best: dict[str, Any] | None = None
    recipe: Path | None = None
    plot: Path | None = None
    plotted: list[int] = field(default_factory=list)
    plot_error: str | None = None


def summarize(sweep: Sweep, top: int = 3) -> Summary:
    """The trials of the sweep's study; with a complete trial, ``best.yaml`` and the
    plot of the ``top`` best complete trials are written to the output directory."""
    study = load_study(sweep)
    rows = []
    for trial in study.get_trials(deepcopy=False):
        value = trial.value
        if value is None and trial.intermediate_values:  # a pruned trial's last report
            value = trial.intermediate_values[trial.last_step]
        rows.append(
            {
                "trial": trial.number,
                "state": trial.state.name.lower(),
                "params": dict(trial.params),
                "value": value,
                "step": trial.last_step,
                "dir": trial.user_attrs.get("dir", str(trial_dir(sweep, trial.number))),
            }
        )
    summary = Summary(rows)
    complete = [r for r in rows if r["state"] == "complete" and r["value"] is not None]
    if not complete:
        return summary
    maximize = sweep.spec.objective.direction == "maximize"
    ranked = sorted(complete, key=lambda r: (-r["value"] if maximize else r["value"], r["trial"]))
    summary.best = ranked[0]
    summary.recipe = write_best_recipe(sweep, summary.best)
    summary.plotted = [r["trial"] for r in ranked[:top]]
    try:
        summary.plot = _plot([Path(r["dir"]) for r in ranked[:top]], sweep.output_dir / BEST_PLOT)
    except SlhubError as exc:
        summary.plot_error = one_line(exc)
    return summary


def best_recipe(sweep: Sweep, params: dict[str, Any]) -> dict[str, Any]:
    """The sweep's recipe with its ``set``, ``params`` and an output directory of its own."""
    data = read_recipe_file(sweep.recipe)
    data = apply_overrides(data, sweep.overrides(params))
    trainer = dict(data.get("trainer") or {})
    trainer["output_dir"] = str(sweep.output_dir / BEST_RUN)
    data["trainer"] = trainer
    return data


def write_best_recipe(sweep: Sweep, best: dict[str, Any]) -> Path:
    path = sweep.output_dir / BEST_RECIPE
    header = (
        f"# The best trial ({best['trial']}) of sweep {sweep.study} ({sweep.path}): "
        f"{sweep.spec.objective.metric}={best['value']!r}\n"
        f"# Train it: slhub train --config {path}\n"
    )
    text = header + yaml.safe_dump(best_recipe(sweep, best["params"]), sort_keys=False)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise SlhubError(f"{path}: cannot write the best recipe ({exc.strerror})") from None
    return path


def _plot(run_dirs: list[Path], out: Path) -> Path:
    if len(run_dirs) == 1:
        from slhub.plot import plot_run

        return plot_run(run_dirs[0], out).path
    from slhub.plot_compare import plot_runs

    return plot_runs(run_dirs, out).path


def table(sweep: Sweep, summary: Summary) -> str:
    """The trials as aligned text columns: trial, state, each key of the space, the
    objective (a pruned trial's last reported value, in brackets) and the directory."""
    metric = sweep.spec.objective.metric
    keys = list(sweep.spec.space)
    header = ["trial", "state", *keys, metric, "update", "dir"]
    lines = [header]
    for row in summary.rows:
        value = row["value"]
        shown_value = "-" if value is None else _number(value)
        if value is not None and row["state"] == "pruned":
            shown_value = f"({shown_value})"
        lines.append(
            [
                str(row["trial"]),
                row["state"],
                *(_number(row["params"].get(k, "-")) for k in keys),
                shown_value,
                "-" if row["step"] is None else str(row["step"]),
                row["dir"],
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines
    )


def _number(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.6g}"
    return str(value)


def report(sweep: Sweep, summary: Summary) -> str:
    """The summary as the command prints it."""
    lines = [table(sweep, summary)]
    if summary.best is None:
        lines.append("best: none yet (no trial is complete)")
        return "\n".join(lines)
    best = summary.best
    lines.append(
        f"best: trial {best['trial']}, {sweep.spec.objective.metric}={best['value']!r}; "
        f"recipe: {summary.recipe} (train it: slhub train --config {summary.recipe})"
    )
    if summary.plot is not None:
        trials = ", ".join(map(str, summary.plotted))
        lines.append(f"plot: {summary.plot} (trials {trials}; slhub plot RUN_DIR ...)")
    else:
        lines.append(f"plot: not drawn ({summary.plot_error})")
    return "\n".join(lines)
