"""What a requeue loop needs: ``--resume auto`` of a finished run exits 0, it reads the
run directory only under its lock, and a stop signal after the last update leaves the
exit status alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, SL_DDP, cli_error, metrics_of, subprocess_env
from slhub import artifacts, cli, train

SHORT = ["trainer.steps=4", "trainer.validate_every=2", "trainer.save_every=2"]


def test_resume_auto_of_a_complete_run_exits_0_and_changes_nothing(tmp_path: Path, capsys):
    out = tmp_path / "run"
    args = ["train", "--config", str(SL_DDP), *(f"--set={s}" for s in SHORT)]
    args += [f"--set=trainer.output_dir={out}", "--resume", "auto"]
    assert cli.main(args) == 0

    def artifacts_now() -> dict[str, bytes]:  # the lock file records its last holder
        return {p.name: p.read_bytes() for p in out.iterdir() if artifacts.is_artifact(p.name)}

    before = artifacts_now()
    capsys.readouterr()
    assert cli.main(args) == 0  # the requeue after the run finished
    err = capsys.readouterr().err
    assert "done step=4 already=complete" in err and "start" not in err
    assert artifacts_now() == before and len(before) == 5
    assert [r["step"] for r in metrics_of(out) if "train/loss" in r] == [1, 2, 3, 4]


def test_resume_auto_takes_the_lock_before_it_reads_the_checkpoint(tmp_path: Path, capsys):
    out = tmp_path / "run"
    train(str(SL_DDP), [*SHORT, f"trainer.output_dir={out}"])
    (out / "last.pt").write_bytes(b"being rewritten by the live run")
    capsys.readouterr()
    holder = artifacts.lock(out)  # another run writes here
    try:
        line = cli_error(
            capsys, "train", "--config", str(SL_DDP), "--set", f"trainer.output_dir={out}",
            "--resume", "auto",
        )  # fmt: skip
    finally:
        holder.release()
    assert "another slhub run writes into this directory" in line  # not "damaged checkpoint"


def test_a_stop_signal_after_the_last_update_leaves_exit_status_0(tmp_path: Path):
    """A SIGTERM that arrives once the run is over (here: at interpreter exit) used to
    end the process with -15 instead of the run's 0."""
    probe = (
        "import atexit, os, signal, sys\nfrom slhub import cli\n"
        "atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))\n"
        "sys.argv = ['slhub', *sys.argv[1:]]\nsys.exit(cli.main())"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "train", "--config", str(SL_DDP), "--set", "trainer.steps=2",
         "--set", f"trainer.output_dir={tmp_path / 'run'}"],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


@pytest.mark.parametrize("signal_name", ["SIGTERM"])
def test_the_python_api_gets_its_handlers_back(tmp_path: Path, signal_name: str):
    import signal

    before = signal.getsignal(getattr(signal, signal_name))
    train(str(SL_DDP), ["trainer.steps=2", f"trainer.output_dir={tmp_path / 'run'}"])
    assert signal.getsignal(getattr(signal, signal_name)) is before


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["train", "--help"], "typo"])
def test_answers_that_need_no_plugin_do_not_import_torch(tmp_path: Path, argv):
    """``--version``, ``--help`` and a recipe typo answer before torch is imported (it
    took seconds of every such answer)."""
    if argv == "typo":
        recipe = tmp_path / "typo.yaml"
        recipe.write_text("plugin: examples.sl_ddp.plugin:SlDdpPlugin\ntrainer:\n  step: 5\n")
        argv = ["train", "--config", str(recipe)]
    probe = (
        "import sys\nfrom slhub import cli\n"
        "try:\n    code = cli.main(sys.argv[1:])\nexcept SystemExit as exc:\n    code = exc.code\n"
        "print('torch' in sys.modules, code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv], cwd=REPO, env=subprocess_env(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    imported, code = done.stdout.split()[-2:]
    assert imported == "False", done.stdout[-500:]
    assert code == ("2" if "train" in argv and "--help" not in argv else "0"), done.stderr


@pytest.fixture
def restore_threads():
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("omp", "setting", "expected"), [(None, "auto", 1), ("2", "auto", 2), (None, "2", 2)]
)
def test_threads_auto_is_one_on_the_cpu_unless_omp_num_threads_says(
    tmp_path: Path, monkeypatch, capsys, restore_threads, omp, setting, expected
):
    import torch

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    torch.set_num_threads(2)  # what torch starts with on this 2-core machine
    train(str(SL_DDP), ["trainer.steps=2", f"trainer.threads={setting}",
                        f"trainer.output_dir={tmp_path / 'run'}"])  # fmt: skip
    assert torch.get_num_threads() == expected
    (start,) = [x for x in capsys.readouterr().err.splitlines() if " threads=" in x]
    assert f" threads={expected} " in start + " "  # the field may end the line
