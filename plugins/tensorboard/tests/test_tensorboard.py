"""The tensorboard plugin, through real in-process runs of the sl_ddp example.

The event files are read back with TensorBoard's own reader (``EventAccumulator``),
which honours ``purge_step`` (the ``SessionLog.START`` event it writes); the
expected values come from the run's metrics.jsonl, read as slhub reads it.
TensorBoard stores a scalar as float32, so a logged value must equal the metrics
value rounded to float32, exactly.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import slhub
from slhub import SlhubError, hookimpl, read_metrics
from slhub.testing import STOP_AT_ENV, StandInTrainer, hooks_of
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from torch.utils.tensorboard import SummaryWriter

from slhub_tensorboard.plugin import (
    EVENT_FILE_PREFIX,
    TensorBoardLogger,
    scalars,
    wait_for_later_name,
)

#: The slhub repository this package lives in: its examples/ hold the recipe.
REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "examples" / "sl_ddp" / "cpu.yaml"
STEPS = 20
#: Validation every 5 updates and checkpoints at 10 and 20; clipping makes train/grad_norm.
OVERRIDES = [
    f"trainer.steps={STEPS}",
    "trainer.validate_every=5",
    "trainer.save_every=10",
    "trainer.grad_clip_norm=1.0",
    "data.train_size=256",
    "data.validation_size=64",
]


class CrashAt:
    """Fails update ``step`` after it is computed (None: never), as a crash between
    checkpoints would: the lines of the updates before it are already logged."""

    def __init__(self, step: int | None = None) -> None:
        self.step = step

    @hookimpl
    def on_commit(self, step: int) -> None:
        if step == self.step:
            raise RuntimeError(f"injected crash at update {step}")


def f32(value: float) -> float:
    """``value`` as TensorBoard stores it (float32), back as a Python float."""
    return struct.unpack("f", struct.pack("f", value))[0]


def train(out: Path, *extra: str, plugins: list[Any] | None = None, **kwargs: Any) -> Path:
    """One in-process run of the recipe into ``out`` with the tensorboard plugin."""
    overrides = [*OVERRIDES, *extra, f"trainer.output_dir={out}"]
    if plugins is None:
        overrides.append('plugins=["tensorboard"]')  # as a recipe lists it
    return slhub.train(RECIPE, overrides, plugins=plugins, **kwargs)


def logged(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series TensorBoard shows for ``log_dir``: ``tag -> [(step, value)]``."""
    reader = EventAccumulator(str(log_dir), size_guidance={SCALARS: 0})  # 0: keep all
    reader.Reload()
    return {
        tag: [(event.step, event.value) for event in reader.Scalars(tag)]
        for tag in reader.Tags()["scalars"]
    }


def expected(run: Path) -> dict[str, list[tuple[int, float]]]:
    """What the run's metrics history says TensorBoard should show."""
    series: dict[str, list[tuple[int, float]]] = {}
    for line in read_metrics(run / "metrics.jsonl"):
        for tag, value in scalars(line).items():
            series.setdefault(tag, []).append((line["step"], f32(value)))
    return {tag: sorted(points) for tag, points in series.items()}


def raw_steps(log_dir: Path, tag: str) -> Counter[int]:
    """How often each step of ``tag`` is on disk, over every event file (nothing purged)."""
    counts: Counter[int] = Counter()
    for path in sorted(log_dir.glob(EVENT_FILE_PREFIX + "*")):
        for event in LegacyEventFileLoader(str(path)).Load():
            if event.HasField("summary") and any(v.tag == tag for v in event.summary.value):
                counts[event.step] += 1
    return counts


@pytest.fixture(scope="module")
def importable_examples():
    """The recipe names ``examples.sl_ddp.plugin:SlDdpPlugin``: importable from the repository."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO))
        patch.setenv("OMP_NUM_THREADS", "1")
        yield


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, importable_examples) -> Path:
    """A whole run, shared by the tests that compare against it."""
    return train(tmp_path_factory.mktemp("tb") / "uninterrupted")


def test_scalars_keep_numeric_train_and_validation_values():
    line = {
        "step": 3,
        "train/loss": 0.5,
        "train/lr": 1e-3,
        "train/grad_norm": None,  # absent when not finite
        "train/weight": 56,
        "train/flag": True,
        "train/note": "text",
        "validation/mse": 0.25,
        "other": 1.0,
    }
    assert scalars(line) == {
        "train/loss": 0.5,
        "train/lr": 1e-3,
        "train/weight": 56.0,
        "validation/mse": 0.25,
    }


def test_every_metrics_value_is_a_scalar_at_its_step(uninterrupted: Path):
    shown = logged(uninterrupted / "tensorboard")
    assert shown == expected(uninterrupted)
    assert [step for step, _ in shown["train/loss"]] == list(range(1, STEPS + 1))
    assert [step for step, _ in shown["validation/mse"]] == [5, 10, 15, 20]
    assert {"train/lr", "train/grad_norm"} <= set(shown)
    assert shown["train/lr"][0] == (1, f32(1e-3))


@pytest.mark.parametrize("interruption", ["crash", "preemption"])
def test_resume_in_place_shows_each_step_once(
    interruption: str, uninterrupted: Path, tmp_path: Path, monkeypatch
):
    run = tmp_path / "run"
    if interruption == "crash":  # after update 16: 11..16 and validation 15 logged, then lost
        with pytest.raises(SlhubError, match="injected crash at update 17"):
            train(run, plugins=["tensorboard", CrashAt(17)])
        plugins: list[Any] = ["tensorboard", CrashAt()]
        assert raw_steps(run / "tensorboard", "validation/mse") == {5: 1, 10: 1, 15: 1}
    else:  # preempted at update 13: step_13.pt and last.pt written, nothing logged past it
        plugins = ["tensorboard", "slhub.testing:StopAt"]
        monkeypatch.setenv(STOP_AT_ENV, "13")
        with pytest.raises(SlhubError, match="preempted by a stop signal at update 13"):
            train(run, plugins=plugins)
        monkeypatch.delenv(STOP_AT_ENV)
    train(run, plugins=plugins, resume="auto")

    shown = logged(run / "tensorboard")
    assert shown == expected(run)
    assert shown == logged(uninterrupted / "tensorboard")  # the same steps and values
    if interruption == "crash":  # the redone steps are on disk twice; the reader shows them once
        loss_on_disk = raw_steps(run / "tensorboard", "train/loss")
        assert [s for s, n in sorted(loss_on_disk.items()) if n == 2] == list(range(11, 17))
        assert raw_steps(run / "tensorboard", "validation/mse")[15] == 2


def test_a_run_started_over_hides_the_superseded_events(uninterrupted: Path, tmp_path: Path):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run)  # 20 updates logged; slhub leaves tensorboard/ there
    train(run, "trainer.steps=8", overwrite=True)
    shown = logged(run / "tensorboard")
    assert [step for step, _ in shown["train/loss"]] == list(range(1, 9))
    assert shown == expected(run)


def test_log_dir_is_relative_to_the_output_dir_and_only_rank_0_writes(tmp_path: Path):
    for rank in (1, 0):
        plugin = TensorBoardLogger()
        trainer = StandInTrainer(
            plugin,
            {"tensorboard": {"log_dir": "tb/events", "flush_secs": 1}},
            rank=rank,
            output_dir=str(tmp_path),
        )
        hooks = hooks_of(plugin)
        hooks.on_log(trainer=trainer, step=1, metrics={"step": 1, "train/loss": 2.0})
        hooks.on_fit_end(trainer=trainer, status="done")
        assert (tmp_path / "tb" / "events").is_dir() == (rank == 0)
    assert logged(tmp_path / "tb" / "events") == {"train/loss": [(1, 2.0)]}


def test_a_resume_within_the_second_of_the_crash_still_purges(tmp_path: Path):
    old = SummaryWriter(str(tmp_path))  # the crashed process: updates 1..5 logged
    for step in range(1, 6):
        old.add_scalar("train/loss", 10.0 + step, global_step=step)
    old.close()
    [written] = tmp_path.glob(EVENT_FILE_PREFIX + "*")
    # Created this second on a host whose name sorts after ours ("~" follows every
    # letter and digit): a new file of this second would be read before it.
    written.rename(tmp_path / f"{EVENT_FILE_PREFIX}{int(time.time()):010d}.~.1.1")
    plugin = TensorBoardLogger()
    trainer = StandInTrainer(plugin, {"tensorboard": {"log_dir": "."}}, output_dir=str(tmp_path))
    hooks = hooks_of(plugin)
    for step in (3, 4):  # resumed from the checkpoint at update 2
        hooks.on_log(trainer=trainer, step=step, metrics={"step": step, "train/loss": step / 8})
    hooks.on_fit_end(trainer=trainer, status="done")
    assert logged(tmp_path) == {"train/loss": [(1, 11.0), (2, 12.0), (3, 0.375), (4, 0.5)]}


def test_a_new_event_file_sorts_after_one_created_this_second(tmp_path: Path):
    now = int(time.time())
    (tmp_path / f"{EVENT_FILE_PREFIX}{now:010d}.zzz.99999.9").touch()
    assert wait_for_later_name(tmp_path)
    assert int(time.time()) > now
    (tmp_path / f"{EVENT_FILE_PREFIX}{now + 3600:010d}.host.1.1").touch()  # a clock far ahead
    started = time.monotonic()
    assert not wait_for_later_name(tmp_path, limit_s=0.1)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("case", ["file", "under_a_file", "read_only"])
def test_an_unwritable_log_dir_is_refused_before_any_artifact(tmp_path: Path, case: str):
    """Refused at admission, in one line naming tensorboard.log_dir: the writer opens
    only at the first metrics line, which left run.json and metrics.jsonl behind."""
    blocker = tmp_path / "blocker"
    if case == "read_only":
        blocker.mkdir(mode=0o555)
        if os.access(blocker, os.W_OK):
            pytest.skip("this user writes into read-only directories (root)")
    else:
        blocker.write_text("a regular file\n")
    log_dir = blocker if case == "file" else blocker / "events"
    out = tmp_path / "out"
    sets = [*OVERRIDES, f"trainer.output_dir={out}", 'plugins=["tensorboard"]',
            f"tensorboard.log_dir={log_dir}"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "slhub", "train", "--config", str(RECIPE),
         *(a for s in sets for a in ("--set", s))],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1",
             "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.splitlines()
    reason = "is not writable" if case == "read_only" else f"{blocker} is not a directory"
    assert line.startswith(f"slhub: error: tensorboard.log_dir: cannot write event files into "
                           f"{log_dir}: {reason}"), line  # fmt: skip
    assert not out.exists()


def test_only_rank_0_checks_the_log_dir(tmp_path: Path):
    """Other ranks never touch the run directory, nor a log_dir on rank 0's disk."""
    (tmp_path / "file").write_text("x")
    for rank in (1, 0):
        plugin = TensorBoardLogger()
        trainer = StandInTrainer(
            plugin, {"tensorboard": {"log_dir": "file/tb"}}, rank=rank, output_dir=str(tmp_path)
        )
        if rank == 0:
            with pytest.raises(SlhubError, match="is not a directory"):
                hooks_of(plugin).admit(trainer=trainer)
        else:
            hooks_of(plugin).admit(trainer=trainer)
    assert not (tmp_path / "file" / "tb").exists()
