"""A lock file the disk refuses, a plugin whose
``load_state_dict`` fails, and metric tensors in ``LossResult.metrics``. Each is one
``slhub: error:`` line with exit 2 (a plugin's bug with its traceback before it) and
leaves no artifact behind; a good input (a metric tensor that requires grad) just works."""

from __future__ import annotations

import errno
import io
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from examples.sl_ddp.plugin import SlDdpPlugin, masked_mse
from helpers import SL_DDP, cli_error, metrics_of
from slhub import LossResult, artifacts, cli, hookimpl

SHORT = ["--set", "trainer.steps=3", "--set", "trainer.save_every=2"]


def _artifacts(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _files(folder: Path) -> dict[str, bytes]:
    """The run's files and their bytes (the lock file records only its latest holder)."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != artifacts.LOCK_FILE}


# --- the lock file: an I/O error is one line naming it, before any artifact -------------


def test_a_lock_file_the_device_refuses_is_one_line_naming_it(capsys, tmp_path: Path):
    """/dev/full refuses every write: the lock's record of its holder cannot be written."""
    out = tmp_path / "out"
    out.mkdir()
    (out / artifacts.LOCK_FILE).symlink_to("/dev/full")
    line = cli_error(capsys, "train", "--config", str(SL_DDP), *SHORT,
                     "--set", f"trainer.output_dir={out}")  # fmt: skip
    assert line.startswith(f"slhub: error: {out / artifacts.LOCK_FILE}: cannot write the run")
    assert _artifacts(out) == [artifacts.LOCK_FILE]


class _FullDisk(io.TextIOWrapper):
    """A text file on a disk with no space left: opening works, writing does not."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("name", [artifacts.LOCK_FILE, artifacts.RUN_FILE])
def test_a_full_disk_at_admission_is_one_line_and_leaves_no_artifact(
    capsys, monkeypatch, tmp_path: Path, name: str
):
    """The disk fills when the lock records its holder, or when run.json is written: one
    line naming the file, and a run.json begun is removed (else the next try would find
    the directory holding run artifacts)."""
    out = tmp_path / "out"
    real_open = open

    def full_for(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if Path(path).name == name:
            binary = mode.replace("+", "").replace("t", "") + "b+"
            return _FullDisk(real_open(path, binary), encoding="utf-8")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(artifacts, "open", full_for, raising=False)
    line = cli_error(capsys, "train", "--config", str(SL_DDP), *SHORT,
                     "--set", f"trainer.output_dir={out}")  # fmt: skip
    assert "(No space left on device)" in line and str(out) in line
    if name == artifacts.LOCK_FILE:
        assert f"{out / artifacts.LOCK_FILE}: cannot write the run directory's lock" in line
    else:
        assert f"{out}: cannot write run.json into trainer.output_dir" in line
    assert _artifacts(out) == [artifacts.LOCK_FILE]  # no run.json, no metrics.jsonl


# --- a plugin's state_dict and load_state_dict: its traceback, then one line naming it --


class FailsToSave:
    """An extra plugin whose ``state_dict`` has a bug."""

    @hookimpl
    def state_dict(self, trainer) -> dict[str, Any]:
        return {"fails_to_save": {"mean": sum([]) / len([])}}


def test_a_failing_state_dict_shows_the_plugins_traceback_then_one_line(capsys, tmp_path: Path):
    out = tmp_path / "out"
    code = cli.main(["train", "--config", str(SL_DDP), *SHORT, "--set", f"trainer.output_dir={out}",
                     "--set", f'plugins=["{__name__}:FailsToSave"]'])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("Traceback (most recent call last):") == 1, err
    assert 'test_plugin_and_disk_failures.py", line' in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("slhub: error:")]
    assert err.rstrip().endswith(line)
    assert line == (
        f"slhub: error: rank 0 failed during checkpoint I/O: plugin {__name__}:FailsToSave "
        "failed in state_dict: ZeroDivisionError: division by zero"
    )
    assert not list(out.glob("*.pt"))  # no checkpoint of a state that could not be made


class FailsToLoad:
    """An extra plugin with state that its own ``load_state_dict`` cannot read back."""

    @hookimpl
    def state_dict(self, trainer) -> dict[str, Any]:
        return {"fails_to_load": {"seen": trainer.step}}

    @hookimpl
    def load_state_dict(self, trainer, state) -> None:
        state["fails_to_load"]["count"] += 1  # a bug: a key state_dict never wrote


def test_a_failing_load_state_dict_shows_the_plugins_traceback_then_one_line(
    capsys, tmp_path: Path
):
    out = tmp_path / "out"
    argv = ["train", "--config", str(SL_DDP), *SHORT, "--set", f"trainer.output_dir={out}",
            "--set", f'plugins=["{__name__}:FailsToLoad"]']  # fmt: skip
    assert cli.main(argv) == 0
    capsys.readouterr()
    before = _files(out)
    code = cli.main([*argv, "--set", "trainer.steps=5", "--resume", "auto"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("Traceback (most recent call last):") == 1, err
    assert 'test_plugin_and_disk_failures.py", line' in err and "KeyError: 'count'" in err
    (line,) = [x for x in err.splitlines() if x.startswith("slhub: error:")]
    assert err.rstrip().endswith(line)
    assert line == (
        f"slhub: error: plugin {__name__}:FailsToLoad failed to load its "
        "state from the checkpoint of update 3 on rank 0 (load_state_dict: KeyError: "
        "'count'); its traceback is in that rank's log"
    )
    assert _files(out) == before  # no resume marker, no checkpoint: nothing written


# --- metric tensors: detached and read, or refused in one line --------------------------


class TensorMetrics(SlDdpPlugin):
    """sl_ddp whose metrics are tensors: one that requires grad, an integer one, and (when
    ``shape`` is set) one of several elements."""

    shape: tuple[int, ...] | None = None

    @hookimpl
    def objective(self, trainer, model, batch) -> LossResult:
        x, y, mask = batch
        loss, count = masked_mse(model(x), y, mask)
        metrics: dict[str, Any] = {"doubled": loss * 2, "count": count.sum().long()}
        if self.shape is not None:
            metrics["per_output"] = loss.expand(self.shape)
        return LossResult(loss=loss, weight=float(count), metrics=metrics)


class SeveralElements(TensorMetrics):
    shape = (2,)


def test_metric_tensors_are_detached_and_read_without_a_warning(capsys, tmp_path: Path):
    out = tmp_path / "out"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = cli.main(["train", "--config", str(SL_DDP), *SHORT,
                         "--set", f"trainer.output_dir={out}",
                         "--set", f"plugin={__name__}:TensorMetrics"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert not caught, [str(w.message) for w in caught]
    assert "requires_grad" not in err
    lines = [r for r in metrics_of(out) if "train/loss" in r]
    assert all(type(r["train/doubled"]) is float and type(r["train/count"]) is int for r in lines)
    assert all(r["train/doubled"] == pytest.approx(2 * r["train/loss"]) for r in lines)


def test_a_metric_tensor_of_several_elements_is_one_line(capsys, tmp_path: Path):
    code = cli.main(["train", "--config", str(SL_DDP), *SHORT,
                     "--set", f"trainer.output_dir={tmp_path / 'out'}",
                     "--set", "plugin=test_plugin_and_disk_failures:SeveralElements"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("slhub: error:")]
    assert line.endswith(
        "metric train/per_output is a tensor of shape [2]; a metric is one number "
        "(a float or a one-element tensor)"
    )


def test_torch_does_warn_on_float_of_such_a_tensor():
    """Why the loop detaches: the warning the user saw once per rank and update."""
    with pytest.warns(UserWarning, match="requires_grad"):
        float(torch.ones(1, requires_grad=True) * 2)
