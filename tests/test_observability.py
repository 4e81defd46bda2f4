"""What a person or a log pipeline sees of a run: the progress bar, the compact
console, JSON events, ``slhub plot``, and the CLI's help, version and listings."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

import slhub
from helpers import REPO, SL_DDP, metrics_of, subprocess_env
from slhub import cli
from slhub.artifacts import read_metrics
from slhub.plot import METADATA_KEY, plot_run
from slhub.testing import STOP_AT_ENV

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
SHORT = ("--set", "trainer.steps=60", "--set", "trainer.validate_every=20")


def _train_under_pty(out: Path, columns: int = 120) -> tuple[int, str]:
    """``slhub train`` with stderr on a pseudo-terminal ``columns`` wide."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "slhub", "train", "--config", str(SL_DDP), *SHORT,
         "--set", f"trainer.output_dir={out}"],
        cwd=REPO, env=subprocess_env(), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
    )  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=120), b"".join(chunks).decode(errors="replace")


def test_progress_bar_on_a_terminal_and_events_in_a_pipe(tmp_path: Path, capsys):
    code, screen = _train_under_pty(tmp_path / "tty")
    assert code == 0, screen[-2000:]
    # tqdm's bar: done/total, rate, and the last loss and validation metric
    bar = re.findall(r"100%\|.*?\| 60/60 \S*upd/s eta \S+, loss=([\d.e+-]+), val_mse=", screen)
    assert bar, screen[-2000:]
    last = read_metrics(tmp_path / "tty" / "metrics.jsonl")
    final_loss = [r["train/loss"] for r in last if "train/loss" in r][-1]
    assert float(bar[-1]) == pytest.approx(final_loss, rel=1e-3)  # shown at 4 digits
    assert "] progress " not in ANSI.sub("", screen)  # no event lines beside the bar

    # captured stderr is not a terminal, as a pipe or a batch job's log file is not
    code = cli.main(["train", "--config", str(SL_DDP), *SHORT, "--set",
                     f"trainer.output_dir={tmp_path / 'pipe'}"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert "%|" not in err and "\r" not in err  # no bar
    progress = [line for line in err.splitlines() if " progress " in line]
    assert progress and "step=1/60" in progress[0] and "step=60/60" in progress[-1]
    assert "val_mse=" in progress[-1] and "eta_s=0" in progress[-1]


def test_default_console_lines_are_short_and_say_the_identity_once(
    tmp_path: Path, monkeypatch, capsys
):
    # a default run as a user starts it: the example recipe, its default output_dir
    shutil.copy(SL_DDP, tmp_path / "cpu.yaml")
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "--config", "cpu.yaml"])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = err.splitlines()
    assert len(lines) >= 10
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    run_id = json.loads((tmp_path / "outputs" / "sl_ddp_cpu" / "run.json").read_text())["run_id"]
    # only in `start`, continued on its second line (the first would pass 100 columns)
    assert [line for line in lines if run_id in line] == [lines[1]] and " start " in lines[1]
    assert all("world_size" not in line for line in lines[2:])
    validation = [line for line in lines if " validation " in line]
    assert len(validation) == 4 and re.search(r"step=200 mse=\d\.\d{1,4}$", validation[-1])
    # 4 significant digits, never 17
    assert not re.search(r"\d\.\d{5,}", err), err
    # README shows what the console looks like: the same lines, up to numbers and paths
    readme = (REPO / "README.md").read_text().split("## What a run looks like", 1)[1]
    shown = readme.split("```\n", 2)[1].splitlines()
    assert [_shape(line) for line in shown] == [_shape(line) for line in lines]


def _shape(line: str) -> str:
    """A console line with its times, numbers, ids and recipe path masked."""
    line = re.sub(r"run_id=[0-9a-f]{32}", "run_id=ID", line)
    line = re.sub(r"path=\S+", "path=P", line)
    return re.sub(r"\d+(\.\d+)?(e[+-]?\d+)?", "N", line)


def test_every_json_line_parses_and_has_a_step(tmp_path: Path, capsys):
    out = tmp_path / "json"
    code = cli.main(["train", "--config", str(SL_DDP), *SHORT, "--log-format", "json",
                     "--set", f"trainer.output_dir={out}"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    events = [json.loads(line) for line in err.splitlines()]
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert all("step" in e and e["run_id"] == run_id and e["rank"] == 0 for e in events)
    assert [e["step"] for e in events if e["event"] == "start"] == [0]
    progress = [e for e in events if e["event"] == "progress"]
    assert progress[-1]["step"] == 60 and progress[-1]["total"] == 60
    history = {r["step"]: r for r in metrics_of(out) if "train/loss" in r}
    assert progress[-1]["loss"] == history[60]["train/loss"]  # full precision in JSON
    assert {e["step"] for e in events if e["event"] == "validation"} == {20, 40, 60}

    # errors are JSON events too, with the context known so far
    code = cli.main(["train", "--config", str(SL_DDP), "--log-format", "json",
                     "--set", "trainer.bogus=1"])  # fmt: skip
    assert code == 2
    (line,) = capsys.readouterr().err.splitlines()
    error = json.loads(line)
    assert error["event"] == "error" and error["level"] == "error" and error["step"] is None
    assert "trainer.bogus" in error["message"]


def _stopped_then_resumed_in_place(out: Path, monkeypatch) -> None:
    recipe = {"trainer": {"steps": 40, "validate_every": 10, "save_every": 10}}
    sets = [f"trainer.{k}={v}" for k, v in recipe["trainer"].items()]
    sets += [f"trainer.output_dir={out}", 'plugins=["slhub.testing:StopAt"]']
    monkeypatch.setenv(STOP_AT_ENV, "25")
    with pytest.raises(slhub.SlhubError, match="stop signal at update 25"):
        slhub.train(SL_DDP, sets)
    monkeypatch.setenv(STOP_AT_ENV, "")
    slhub.train(SL_DDP, sets, resume="auto")


def test_plot_draws_the_effective_history_and_marks_the_resume(tmp_path: Path, monkeypatch):
    out = tmp_path / "run"
    _stopped_then_resumed_in_place(out, monkeypatch)
    plotted = plot_run(out, tmp_path / "figure.png")

    history = read_metrics(out / "metrics.jsonl")
    for key in ("train/loss", "train/lr", "validation/mse"):
        expected = [(r["step"], r[key]) for r in history if r.get(key) is not None]
        steps, values = plotted.series[key]
        assert list(zip(steps, values)) == expected, key
    assert plotted.series["train/loss"][0] == list(range(1, 41))
    assert plotted.resumed_at == [25]

    from PIL import Image

    with Image.open(tmp_path / "figure.png") as image:
        assert image.format == "PNG" and image.size[0] > 300
        stored = json.loads(image.text[METADATA_KEY])
    assert stored["resumed_at"] == [25]
    assert stored["series"]["validation/mse"] == [list(s) for s in plotted.series["validation/mse"]]


def test_plot_from_the_command_line(tmp_path: Path, capsys):
    assert cli.main(["plot", str(tmp_path)]) == 2
    assert "holds no metrics.jsonl" in capsys.readouterr().err
    slhub.train(SL_DDP, ["trainer.steps=20", f"trainer.output_dir={tmp_path / 'r'}"])
    assert cli.main(["plot", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "metrics.png").stat().st_size > 1000
    assert "train/loss" in capsys.readouterr().out


def test_plot_without_matplotlib_is_one_line(tmp_path: Path, monkeypatch, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\n')
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    assert cli.main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "slhub: error: slhub plot needs matplotlib: pip install 'slhub[plot]'"


def test_version_help_and_plugin_listing(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"slhub {slhub.__version__}"

    for command in ("train", "plugins", "inspect", "export", "plot"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        text = capsys.readouterr().out
        assert f"examples:\n  slhub {command}" in text or f"examples:\n  {command}" in text, text
        assert "exit status:" in text
        # only training can be preempted; the other commands list what they can return
        assert (" 75 " in text) == (command == "train"), text

    assert cli.main(["plugins"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["NAME", "KIND", "DISTRIBUTION", "HOOKS"]
    assert any(row.split()[:2] == ["progress", "built-in"] for row in rows)


def test_inspect_shows_recipe_digest_and_last_metrics(tmp_path: Path, capsys):
    out = tmp_path / "run"
    slhub.train(SL_DDP, ["trainer.steps=30", "trainer.validate_every=20",
                         "trainer.save_every=20", f"trainer.output_dir={out}"])  # fmt: skip
    assert cli.main(["inspect", str(out / "step_20.pt")]) == 0
    text = capsys.readouterr().out
    recorded = json.loads((out / "run.json").read_text())["recipe_digest"]
    # the digest run.json records, whole: one digest, comparable by grep
    assert f"recipe:     sha256 {recorded} (" in text
    resumed = tmp_path / "resumed"
    slhub.train(SL_DDP, ["trainer.steps=40", "trainer.validate_every=20",
                         "trainer.save_every=20", f"trainer.output_dir={resumed}"],
                resume=out / "step_20.pt")  # fmt: skip
    assert json.loads((resumed / "run.json").read_text())["recipe_digest"] == recorded
    history = {r["step"]: r for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r}
    # the checkpoint's own update, not the run's later ones
    assert f"train:      update 20: loss={history[20]['train/loss']:.4g}" in text
    assert re.search(r"validation: update 20: mse=\d", text)
    assert "world size: 1" in text and "examples.sl_ddp.plugin:SlDdpPlugin" in text


def test_a_log_line_is_one_write_with_its_newline(monkeypatch):
    """print() writes the text and the newline separately: two workers sharing a log
    could split each other's lines."""
    import io

    from slhub import log

    writes: list[str] = []

    class Recorder(io.StringIO):
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

    monkeypatch.setattr(sys, "stderr", Recorder())
    log.configure("json")
    log.get_logger().info("probe", value=1)
    assert len(writes) == 1 and writes[0].endswith("}\n") and '"event": "probe"' in writes[0]


def test_the_last_progress_line_follows_the_last_validation_and_shows_the_best_metric(
    tmp_path: Path, capsys
):
    """Without a terminal: the final ``progress`` event comes after the last validation
    and carries its value, and with ``trainer.best`` it is that metric (not the first)."""
    code = cli.main([
        "train", "--config", str(SL_DDP), "--log-format", "json",
        "--set", "plugin=slhub_testplugins:ValidationTracker", "--set", "trainer.steps=20",
        "--set", "trainer.validate_every=10",
        "--set", 'trainer.best={"metric": "validation/score"}',
        "--set", f"trainer.output_dir={tmp_path / 'run'}",
    ])  # fmt: skip
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert code == 0
    names = [e["event"] for e in events]
    last_validation = max(i for i, n in enumerate(names) if n == "validation")
    last_progress = max(i for i, n in enumerate(names) if n == "progress")
    assert last_progress > last_validation
    assert events[last_progress]["val_score"] == events[last_validation]["score"]
    assert "val_mse" not in events[last_progress]
