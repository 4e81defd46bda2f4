"""One process trains the sl_ddp recipe, refuses a used directory,
and resumes exactly."""

from __future__ import annotations

import gc
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import (
    REPO,
    SL_DDP,
    assert_tree_equal,
    cli_error,
    load,
    metrics_of,
    run_cli,
    subprocess_env,
)
from slhub import train
from slhub.artifacts import LOCK_FILE


def _digests(folder: Path) -> dict[str, str]:
    """Every file but the lock, whose holder record each attempt to write rewrites."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.name != LOCK_FILE
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The sl_ddp recipe trained in this process (the resume below runs in another)."""
    out = tmp_path_factory.mktemp("sl_ddp") / "D"
    train(str(SL_DDP), [f"trainer.output_dir={out}"])
    return out


def test_run_writes_artifacts_and_validation_falls(trained: Path):
    names = {p.name for p in trained.iterdir() if p.name != LOCK_FILE}
    assert names == {"run.json", "metrics.jsonl", "step_100.pt", "step_200.pt", "last.pt"}
    validation = [m for m in metrics_of(trained) if "validation/mse" in m]
    assert [m["step"] for m in validation] == [50, 100, 150, 200]
    mse = [m["validation/mse"] for m in validation]
    assert all(b < a for a, b in zip(mse, mse[1:])), mse
    train_steps = [m["step"] for m in metrics_of(trained) if "train/loss" in m]
    assert train_steps == list(range(1, 201))
    identity = json.loads((trained / "run.json").read_text())
    assert identity["world_size"] == 1 and len(identity["run_id"]) == 32
    assert identity["recipe"]["trainer"]["batch_size"] == 32


def test_every_checkpoint_loads_weights_only(trained: Path):
    for name in ("step_100.pt", "step_200.pt", "last.pt"):
        ckpt = load(trained / name)
        assert ckpt["format"] == "slhub.checkpoint/2"
        assert set(ckpt["ranks"][0]) == {"rng", "sampler", "buffers"}
    assert load(trained / "step_100.pt")["step"] == 100
    assert_tree_equal(load(trained / "step_200.pt"), load(trained / "last.pt"))


def test_same_command_into_used_directory_exits_2_and_leaves_it_unchanged(capsys, trained: Path):
    before = _digests(trained)
    line = cli_error(
        capsys, "train", "--config", str(SL_DDP), "--set", f"trainer.output_dir={trained}"
    )
    assert "already holds run artifacts" in line and str(trained) in line
    assert _digests(trained) == before


def test_resume_into_fresh_directory_is_exact(trained: Path, tmp_path: Path):
    """End to end: ``slhub train --resume`` in a separate process (helpers.run_cli)
    continues the run trained in this one bit for bit."""
    fresh = tmp_path / "E"
    proc = run_cli(
        "train",
        "--config",
        str(SL_DDP),
        "--set",
        f"trainer.output_dir={fresh}",
        "--resume",
        str(trained / "step_100.pt"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    original, resumed = load(trained / "last.pt"), load(fresh / "last.pt")
    for key in ("step", "model", "optimizer", "ranks", "scheduler"):
        assert_tree_equal(original[key], resumed[key], key)
    later = [m for m in metrics_of(trained) if m["step"] > 100]
    assert metrics_of(fresh) == later and len(later) == 102  # 100 updates + 2 validations
    identity = json.loads((fresh / "run.json").read_text())
    assert identity["resumed_from"]["step"] == 100
    assert identity["resumed_from"]["run_id"] == original["run"]["run_id"]
    assert identity["run_id"] != original["run"]["run_id"]


def test_the_train_command_freezes_the_heap_only_when_it_is_the_process(tmp_path: Path):
    """As the process (console script, ``python -m slhub``) train moves the import-time
    heap out of the collector's passes (gc.freeze: ~1 s less per worker exit); called
    with arguments, as from a caller's Python, it leaves the caller's heap alone."""
    from slhub import cli

    before = gc.get_freeze_count()
    args = ["train", "--config", str(SL_DDP), "--set", "trainer.steps=2"]
    assert cli.main([*args, "--set", f"trainer.output_dir={tmp_path / 'a'}"]) == 0
    assert gc.get_freeze_count() == before
    probe = (
        "import gc, sys\nfrom slhub import cli\nsys.argv = ['slhub', *sys.argv[1:]]\n"
        "code = cli.main()\nprint('frozen', gc.get_freeze_count())\nsys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *args, "--set", f"trainer.output_dir={tmp_path / 'b'}"],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split("frozen", 1)[1]) > 10_000  # torch's modules and more
    assert (tmp_path / "b" / "last.pt").is_file()
