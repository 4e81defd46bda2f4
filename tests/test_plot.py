"""``slhub plot`` draws what a reader needs: checked on the matplotlib objects drawn (lines,
titles, legends, ticks), not on pixels, and on the description stored in the PNG."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slhub import cli
from slhub.plot import MAX_TICKS, METADATA_KEY, layout, log_ticks, plot_run

pytest.importorskip("matplotlib")

RUN_ID = "0123456789abcdef0123456789abcdef"
ROLLOUT = {100: 0.9, 200: 0.2, 300: 0.05, 400: 0.01}


def _nerd_like_run(folder: Path, *, steps: int = 400, planned: int = 500) -> Path:
    """A run directory with NeRD's metric names: a rollout error per horizon and its two
    baselines (constant: the validation episodes do not change), a constant lr."""
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(
        json.dumps({"run_id": RUN_ID, "recipe": {"trainer": {"steps": planned}}})
    )
    lines = []
    for step in range(1, steps + 1):
        record: dict = {"step": step, "train/loss": 1.0 / step, "train/lr": 0.001}
        if step in ROLLOUT:
            for k, scale in ((10, 1.0), (100, 30.0)):
                record[f"validation/rollout_mse_{k}"] = ROLLOUT[step] * scale
                record[f"validation/baseline_mse_{k}"] = 0.5 * scale
                record[f"validation/linear_mse_{k}"] = 0.3 * scale
            record["validation/one_step_mse"] = ROLLOUT[step] / 10
        lines.append(json.dumps(record))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_layout_groups_metrics_that_differ_only_in_their_first_word():
    keys = [
        "train/loss", "train/lr", "validation/mse", "validation/one_step_mse",
        "validation/linear_mse_100", "validation/rollout_mse_100", "validation/baseline_mse_100",
        "validation/rollout_mse_10", "validation/baseline_mse_10", "validation/ema_acc_5",
    ]  # fmt: skip
    assert layout(keys) == [
        ("train/loss", ["train/loss"]),
        ("validation/ema_acc_5", ["validation/ema_acc_5"]),  # alone: nothing shares acc_5
        ("validation/mse", ["validation/mse"]),
        ("validation/one_step_mse", ["validation/one_step_mse"]),
        ("validation/*_mse_10", ["validation/rollout_mse_10", "validation/baseline_mse_10"]),
        (
            "validation/*_mse_100",  # after 10: horizons are compared as numbers
            [
                "validation/rollout_mse_100",
                "validation/baseline_mse_100",
                "validation/linear_mse_100",
            ],  # the model first, then its references
        ),  # fmt: skip
        ("train/lr", ["train/lr"]),
    ]


def test_a_nerd_run_puts_each_horizon_with_its_baselines(tmp_path: Path):
    run = _nerd_like_run(tmp_path / "cartpole_a")
    plotted = plot_run(run, tmp_path / "figure.png")
    figure = plotted.figure
    assert figure is not None

    title = figure.get_suptitle()
    assert title.splitlines()[0] == f"cartpole_a · run {RUN_ID}"
    assert "updates 1–400 of 500" in title  # the range drawn, of the recipe's steps
    assert "constant: train/lr = 0.001" in title  # folded: no panel of a flat line
    titles = [ax.get_title(loc="left") for ax in figure.axes]
    assert titles == [
        "train/loss", "validation/one_step_mse", "validation/*_mse_10", "validation/*_mse_100",
    ]  # fmt: skip

    by_title = {ax.get_title(loc="left"): ax for ax in figure.axes}
    for k, scale in ((10, 1.0), (100, 30.0)):
        ax = by_title[f"validation/*_mse_{k}"]
        lines = {line.get_gid(): line for line in ax.get_lines() if line.get_gid() != "resume"}
        assert list(lines) == [f"validation/{w}_mse_{k}" for w in ("rollout", "baseline", "linear")]
        rollout = lines[f"validation/rollout_mse_{k}"]
        assert list(rollout.get_xdata()) == list(ROLLOUT)
        assert list(rollout.get_ydata()) == [v * scale for v in ROLLOUT.values()]
        assert list(lines[f"validation/baseline_mse_{k}"].get_ydata()) == [0.5 * scale] * 4
        assert rollout.get_linestyle() == "-"
        assert {lines[key].get_linestyle() for key in list(lines)[1:]} == {"--"}
        legend = [text.get_text() for text in ax.get_legend().get_texts()]
        assert legend == [
            f"validation/rollout_mse_{k}",
            f"validation/baseline_mse_{k} = {0.5 * scale:.4g} (constant)",
            f"validation/linear_mse_{k} = {0.3 * scale:.4g} (constant)",
        ]
    assert plotted.constants == {"train/lr": 0.001}
    assert plotted.series["train/lr"] == (list(range(1, 401)), [0.001] * 400)


def test_log_axes_have_few_plain_ticks(tmp_path: Path):
    plotted = plot_run(_nerd_like_run(tmp_path / "r"), tmp_path / "figure.png")
    assert plotted.figure is not None
    for ax, panel in zip(plotted.figure.axes, plotted.panels):
        assert ax.get_yscale() == panel.yscale == "log", panel.title
        low, high = sorted(ax.get_ylim())
        shown = [t for t in ax.yaxis.get_major_ticks() if low <= t.get_loc() <= high]
        labels = [t.label1.get_text() for t in shown]
        assert 2 <= len(labels) <= MAX_TICKS, (panel.title, labels)
        assert all(re.fullmatch(r"[0-9.]+(e[+-][0-9]+)?", text) for text in labels), labels
        assert labels == panel.yticklabels
        minor = [t.label1.get_text() for t in ax.yaxis.get_minor_ticks()]
        assert not any(minor), (panel.title, minor)  # unlabelled: the crowding of before
    assert plotted.panels[0].yticklabels == ["0.01", "0.1", "1"]  # 1-2-5 would give 9


def test_log_ticks():
    assert log_ticks(0.35, 3.07) == [0.5, 1.0, 2.0]
    assert log_ticks(3e-4, 0.9) == [0.001, 0.01, 0.1]  # 1-2-5 would give 8
    assert log_ticks(1e-9, 1e3) == [1e-9, 1e-6, 1e-3, 1.0, 1e3]  # every 3rd power of ten
    assert log_ticks(0.4, 0.9) == []  # too narrow: the panel gets a linear axis
    assert log_ticks(0.0, 1.0) == [] and log_ticks(-1.0, 1.0) == []


def test_a_narrow_or_signed_series_gets_a_linear_axis(tmp_path: Path):
    lines = [{"step": s, "train/loss": 0.5 + s / 100, "validation/score": s - 2} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    plotted = plot_run(tmp_path)
    assert [(p.title, p.yscale) for p in plotted.panels] == [
        ("train/loss", "linear"),
        ("validation/score", "linear"),
    ]
    assert plotted.title.splitlines() == [tmp_path.name, "updates 1–3"]  # no run.json


def test_a_run_where_nothing_changes_keeps_its_panels(tmp_path: Path):
    lines = [{"step": s, "train/loss": 1.0, "train/lr": 0.1} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    plotted = plot_run(tmp_path)
    assert [p.title for p in plotted.panels] == ["train/loss", "train/lr"]
    assert plotted.constants == {}


def test_the_png_holds_the_description_and_stays_small(tmp_path: Path, capsys):
    from PIL import Image

    run = _nerd_like_run(tmp_path / "r")
    records = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    records.insert(200, '{"event": "resume", "step": 200}\n')  # resumed from update 200
    (run / "metrics.jsonl").write_text("".join(records))
    assert cli.main(["plot", str(run)]) == 0, capsys.readouterr().err
    assert "validation/rollout_mse_10" in capsys.readouterr().out
    with Image.open(run / "metrics.png") as image:
        assert image.format == "PNG" and image.mode == "P"  # a palette: a few colours
        stored = json.loads(image.text[METADATA_KEY])
    assert (run / "metrics.png").stat().st_size < 60_000
    assert "resumed at update 200 (dashed)" in stored["title"]
    assert stored["constants"] == {"train/lr": 0.001}
    assert [p["title"] for p in stored["panels"]][2] == "validation/*_mse_10"
    assert stored["panels"][2]["keys"][0] == "validation/rollout_mse_10"


def test_other_formats_are_written_without_metadata(tmp_path: Path):
    plotted = plot_run(_nerd_like_run(tmp_path / "r"), tmp_path / "figure.svg")
    assert plotted.path.read_text().lstrip().startswith("<?xml")
