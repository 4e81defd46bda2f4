"""The console fits: the progress bar on a terminal of no size, of 80 and of 100 columns,
and every console line of every example recipe within 100 columns."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tqdm.std
import yaml

from helpers import REPO, SL_DDP, subprocess_env
from slhub import cli, log
from slhub.builtin import progress

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: NeRD's validation metrics, in the order its plugin returns them (the widest line).
NERD_VALIDATION = {
    "one_step_mse": 0.06284,
    "rollout_mse_10": 0.01242,
    "baseline_mse_10": 0.5086,
    "linear_mse_10": 0.3067,
    "rollout_mse_100": 3.231,
    "baseline_mse_100": 5.409,
    "linear_mse_100": 77.44,
}


def _pty(columns: int, rows: int) -> tuple[int, int]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    return master, slave


def _drain(master: int) -> str:
    chunks = []
    while select.select([master], [], [], 0.2)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the writer closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return ANSI.sub("", b"".join(chunks).decode(errors="replace"))


def _frames(screen: str) -> list[str]:
    """What the terminal showed: every redraw of the bar and every log line."""
    return [frame for frame in re.split(r"[\r\n]", screen) if frame.strip()]


def test_a_terminal_of_no_size_gets_a_bar(tmp_path: Path):
    """``script -qc`` and some CI terminals report 0x0: tqdm alone would draw nothing."""
    master, slave = _pty(0, 0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "slhub", "train", "--config", str(SL_DDP),
         "--set", "trainer.steps=60", "--set", "trainer.validate_every=20",
         "--set", f"trainer.output_dir={tmp_path / 'run'}"],
        cwd=REPO, env=subprocess_env(), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
    )  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=120) == 0
    screen = ANSI.sub("", b"".join(chunks).decode(errors="replace"))
    bars = [f for f in _frames(screen) if re.match(r" *\d+%\|", f)]
    assert bars and re.match(r"100%\|█+\| 60/60 ", bars[-1]), screen[-2000:]
    assert max(len(f) for f in bars) < progress.FIXED_COLUMNS
    assert "] progress " not in screen  # the bar, not the lines, on a terminal


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_events_wrap_at_the_terminals_width_between_fields(monkeypatch, columns: int):
    """A terminal narrower than the log-file width: the console splits an event between
    fields, so the terminal never wraps a line itself (inside a number)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    master, slave = _pty(columns, 24)
    terminal = os.fdopen(slave, "w", encoding="utf-8", errors="replace")
    monkeypatch.setattr(sys, "stderr", terminal)
    try:
        log.configure("console")
        assert log.console_width() == columns
        log.get_logger().info("validation", step=2000, **NERD_VALIDATION)
    finally:
        monkeypatch.undo()
        log.configure("console")
        terminal.close()
    lines = [line for line in re.split(r"[\r\n]", _drain(master)) if line.strip()]
    assert all(len(line) <= columns for line in lines), lines
    assert len(lines) >= 2  # the event is wider than every width here
    values = dict(f.split("=") for line in lines for f in line.split()[4:])
    assert values == {k: f"{v:.4g}" for k, v in NERD_VALIDATION.items()}  # every number whole


def test_columns_sets_the_console_width(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    log.configure("console")
    log.get_logger().info("validation", step=2000, **NERD_VALIDATION)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3 and all(len(line) <= 80 for line in lines), lines
    monkeypatch.delenv("COLUMNS")
    assert log.console_width() == log.CONSOLE_WIDTH  # captured stderr is no terminal


class _Clock:
    """tqdm's clock, moved by the test: rates and ETAs as a real NeRD run has them."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("size", [(80, 24), (100, 24), (0, 0)])
def test_the_bar_keeps_its_cells_beside_nerds_fields(monkeypatch, size: tuple[int, int]):
    """NeRD's 2000 updates and its long validation name: at 80 columns the name gives way,
    never the bar (it shrank to one cell); at 100 all of it shows."""
    master, slave = _pty(*size)
    terminal = os.fdopen(slave, "w", encoding="utf-8", errors="replace")
    clock = _Clock()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(tqdm.std, "time", clock)
    monkeypatch.setattr(progress, "POSTFIX_PERIOD_S", 0.0)
    log.configure("console")
    config = SimpleNamespace(steps=2000, best=None, validate_every=500)
    trainer = SimpleNamespace(config=config)
    shown = progress.Plugin()
    try:
        for step, loss in ((1, 1.087), (500, 0.2151), (1000, 0.05764), (2000, 0.04321)):
            clock.now = step / 31.5
            shown.on_log(trainer=trainer, step=step, metrics={"step": step, "train/loss": loss})
            if step % config.validate_every == 0:
                metrics = {f"validation/{k}": v for k, v in NERD_VALIDATION.items()}
                shown.on_log(trainer=trainer, step=step, metrics={"step": step, **metrics})
        shown.on_fit_end(trainer=trainer, status="done")
    finally:
        monkeypatch.undo()  # stderr back before the logger is configured for it
        log.configure("console")
        terminal.close()
    bars = [f for f in _frames(_drain(master)) if re.match(r" *\d+%\|", f)]
    columns = size[0] or progress.FIXED_COLUMNS
    assert bars and all(len(bar) < columns for bar in bars), bars
    for bar in bars:
        cells = re.match(r" *\d+%\|([^|]*)\|", bar)
        assert cells and len(cells.group(1)) >= progress.MIN_BAR, bar
    assert re.search(r"2000/2000 \S+upd/s eta 00:00, loss=0.04321", bars[-1]), bars[-1]
    if columns >= 100:
        assert bars[-1].endswith(", val_one_step_mse=0.06284"), bars[-1]
    else:  # the value stays, under a shorter name
        assert bars[-1].endswith("=0.06284"), bars[-1]


#: Every example recipe that trains on a CPU, with the settings that make it quick here
#: (smaller data and fewer rollouts: the same events and metric names; a key the recipe
#: no longer has is left out, not refused).
EXAMPLES = {
    "examples/sl_ddp/cpu.yaml": [],
    "examples/nerd/cartpole/sl.train.yaml": [
        "data.generated_train.num_trajectories=16",
        "data.generated_validation.num_trajectories=4",
    ],
    "examples/rwm/cartpole.yaml": [
        "data.generated_train.num_trajectories=8",
        "data.generated_validation.num_trajectories=4",
    ],
    "examples/rigidformer/boxes.yaml": [
        "rigidformer.scenes.train_scenes=16",
        "rigidformer.scenes.val_scenes=4",
    ],
    "examples/bc/state.yaml": ["data.demos.train_episodes=4", "data.demos.val_episodes=2"],
    "examples/bc/visual.yaml": [
        "data.demos.train_episodes=4",
        "data.demos.val_episodes=2",
        "bc.rollouts=2",
    ],
    "examples/bc/pendulum_state.yaml": ["validation.env.episodes=1"],
    "examples/bc/reacher_state.yaml": ["validation.env.episodes=1"],
    "examples/bc/pendulum_visual.yaml": ["validation.env.episodes=1"],
}
#: Examples whose data ``slhub data collect`` makes first (as their comments say), here
#: fewer and shorter episodes (long enough for the largest validation horizon): folder,
#: env and, where the recipe reads more than smooth random actions, how to act.
PENDULUM_EXPERT = ("--actions", "policy", "--policy", "slhub.sim.experts:inverted_pendulum")
REACHER_EXPERT = ("--actions", "policy", "--policy", "slhub.sim.experts:reacher")
COLLECTED: dict[str, tuple[str, ...]] = {
    "examples/nerd/hopper/sl.train.yaml": ("datasets/hopper", "gymnasium:Hopper-v5"),
    "examples/nerd/pendulum/sl.train.yaml": (
        "datasets/inverted_pendulum",
        "gymnasium:InvertedPendulum-v5",
    ),
    "examples/rwm/halfcheetah.yaml": ("datasets/halfcheetah", "gymnasium:HalfCheetah-v5"),
    "examples/nerd/ant/sl.train.yaml": ("datasets/ant", "gymnasium:Ant-v5"),
    # BC learns the expert's policy_action (DART), the visual policy from its frames
    "examples/bc/pendulum_state.yaml": (
        "datasets/pendulum_dart",
        "gymnasium:InvertedPendulum-v5",
        *PENDULUM_EXPERT,
        *("--noise", "0.5"),
    ),
    "examples/bc/reacher_state.yaml": (
        "datasets/reacher_dart",
        "gymnasium:Reacher-v5",
        *REACHER_EXPERT,
        *("--noise", "0.1"),
    ),
    "examples/bc/pendulum_visual.yaml": (
        "datasets/pendulum_visual_dart",
        "gymnasium:InvertedPendulum-v5",
        *PENDULUM_EXPERT,
        *("--noise", "0.5", "--render", "--size", "64", "--camera", "fixed"),
    ),
}
for _example in COLLECTED:
    EXAMPLES.setdefault(_example, [])
#: The widest value a float takes at 4 significant digits.
WIDEST = -1.234e-05


def test_every_example_recipe_is_listed():
    found = {str(p.relative_to(REPO)) for p in (REPO / "examples").rglob("*.yaml")}
    # sweep files name a recipe and are no recipe (tests/test_sweep.py reads them)
    sweeps = {name for name in found if name.endswith("/sweep.yaml")}
    assert sweeps == {"examples/nerd/cartpole/sweep.yaml"}
    assert found - {"examples/sl_ddp/cuda.yaml"} - sweeps == set(EXAMPLES)


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_console_lines_of_every_example_fit_100_columns(
    example: str, tmp_path: Path, monkeypatch, capsys
):
    """A default run of the example as a user starts it (from the folder holding the
    recipe path, its default output_dir), a few updates long; then its validation and
    progress events again at the recipe's own length with every value at its widest."""
    recipe = yaml.safe_load((REPO / example).read_text())
    if recipe["plugin"] in ("bc", "rwm", "rigidformer"):
        pytest.importorskip(f"slhub_{recipe['plugin']}")
    (tmp_path / example).parent.mkdir(parents=True)
    shutil.copy(REPO / example, tmp_path / example)
    monkeypatch.chdir(tmp_path)
    if example in COLLECTED:
        pytest.importorskip("mujoco")
        folder, env, *how = COLLECTED[example]
        how = how or ["--actions", "smooth", "--through-termination"]
        argv = ["data", "collect", folder, "--env", env, "--episodes", "10", "--steps", "120",
                "--seed", "0", *how]  # fmt: skip
        assert cli.main(argv) == 0, capsys.readouterr().err
        capsys.readouterr()
    sets = ["trainer.steps=2", "trainer.validate_every=1", "trainer.save_every=2"]
    sets += [s for s in EXAMPLES[example] if _has(recipe, s.split("=", 1)[0])]
    code = cli.main(["train", "--config", example, *(a for s in sets for a in ("--set", s))])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = err.splitlines()
    assert max(map(len, lines)) <= log.CONSOLE_WIDTH, max(lines, key=len)
    assert sum(" validation step=2 " in line for line in lines) >= 1

    # the same events at update trainer.steps of the full run, every value at its widest
    steps = recipe["trainer"]["steps"]
    validation = {k: WIDEST for k in _validation_names(Path(recipe["trainer"]["output_dir"]))}
    first = next(iter(validation))
    log.configure("console")
    logger = log.get_logger()
    logger.info("validation", step=steps, **validation)
    logger.info("progress", step=steps, total=steps, rate=WIDEST, eta_s=WIDEST, loss=WIDEST,
                **{f"val_{first}": WIDEST})  # fmt: skip
    lines = capsys.readouterr().err.splitlines()
    assert max(map(len, lines)) <= log.CONSOLE_WIDTH, max(lines, key=len)
    fields = [f for line in lines for f in line.split() if "=" in f and not f.startswith("step")]
    assert sorted(f.split("=")[0] for f in fields) == sorted(
        [*validation, "rate", "eta_s", "loss", f"val_{first}"]
    )  # every field once, none lost to the split


def _has(recipe: dict[str, Any], key: str) -> bool:
    """Whether the recipe sets ``key`` (``a.b.c``)."""
    node: Any = recipe
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _validation_names(out: Path) -> list[str]:
    import slhub

    names: dict[str, None] = {}
    for record in slhub.read_metrics(out / "metrics.jsonl"):
        for key in record:
            if key.startswith("validation/"):
                names[key.split("/", 1)[1]] = None
    assert names
    return list(names)


def test_a_wide_event_is_spread_over_the_fewest_lines_and_an_error_stays_one(capsys):
    log.configure("console")
    logger = log.get_logger()
    logger.info("validation", step=2000, **NERD_VALIDATION)
    lines = capsys.readouterr().err.splitlines()
    assert all(len(line) <= log.CONSOLE_WIDTH for line in lines)
    assert all(re.match(r"\d\d:\d\d:\d\d \[info\] validation step=2000 \w", x) for x in lines)
    fields = [f.split("=")[0] for line in lines for f in line.split()[4:]]
    assert fields == list(NERD_VALIDATION)  # in order, each once
    # no two neighbouring lines would fit on one: the fewest lines
    widths = [len(line) - len(lines[0].split(" one_step_mse")[0]) for line in lines]
    head = len(lines[0]) - widths[0]
    assert all(head + a + b > log.CONSOLE_WIDTH for a, b in zip(widths, widths[1:]))

    message = "x" * 60
    logger.error("commit failed", error=message, phase="commit", detail=message)
    assert len(capsys.readouterr().err.splitlines()) == 1
    logger.info("short", a=1, b="two")  # a line that fits is left alone
    assert capsys.readouterr().err.split("] ", 1)[1] == "short a=1 b=two\n"
