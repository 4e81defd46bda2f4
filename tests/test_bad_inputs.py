"""Every bad input is one line naming the key, path or file, exit status 2, no traceback,
and no artifact lost or damaged; a user can start over without deleting by hand."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO, SL_DDP, cli_error, load, metrics_of, subprocess_env, two_update_checkpoint
from helpers import write_recipe as _write
from slhub import cli, train


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A real two-update checkpoint to damage."""
    return two_update_checkpoint(tmp_path_factory.mktemp("ckpt"))


def _train(capsys, tmp_path: Path, *args: str, **changes) -> tuple[int, str]:
    """``slhub train`` run in this process: its exit status and stderr."""
    recipe = _write(tmp_path / "r.yaml", trainer__output_dir=str(tmp_path / "out"), **changes)
    code = cli.main(["train", "--config", str(recipe), *args])
    return code, capsys.readouterr().err


def _train_limited(recipe: Path, kind: int, limit: int, timeout: float) -> str:
    """The one-line error of ``python -m slhub train`` in a process under a resource limit
    (``RLIMIT_FSIZE``: a full disk; ``RLIMIT_AS``: what reading /dev/zero would exhaust)."""
    proc = subprocess.run(
        [sys.executable, "-m", "slhub", "train", "--config", str(recipe)],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=timeout,
        preexec_fn=lambda: resource.setrlimit(kind, (limit, limit)),
    )  # fmt: skip
    return one_line_error_in(proc.returncode, proc.stderr)


def _train_error(capsys, tmp_path: Path, *args: str, **changes) -> str:
    """The one-line error of ``slhub train`` run in this process."""
    recipe = _write(tmp_path / "r.yaml", trainer__output_dir=str(tmp_path / "out"), **changes)
    return cli_error(capsys, "train", "--config", str(recipe), *args)


@pytest.mark.parametrize(
    ("args", "changes", "expected"),
    [
        (["--set", "trainer.seed=1e23"], {}, "--set trainer.seed=1e23: trainer.seed: must be an"),
        (["--set", "trainer.batch_size=1e12"], {}, "trainer.batch_size: must be an integer"),
        (["--set", "trainer.lr=-1"], {}, "--set trainer.lr=-1: trainer.lr: must be > 0"),
        (["--set", "model.hidden=0"], {}, "--set model.hidden=0: model.hidden: must be > 0"),
        (["--set", "modle.hidden=3"], {}, "--set modle.hidden=3: modle: unknown key"),
        ([], {"trainer__batch_size": True}, "r.yaml: trainer.batch_size: must be an integer"),
        ([], {"trainer__lr": float("inf")}, "r.yaml: trainer.lr: must be a finite number"),
        ([], {"trainer__steps": 2.5}, "r.yaml: trainer.steps: must be an integer"),
        ([], {"trainer__seed": 2**64}, "r.yaml: trainer.seed: must be <= "),
        ([], {"trainer__stop_signals": ["SIGKILL"]}, "trainer.stop_signals.0: must be one of"),
        (["--overwrite", "--resume", "auto"], {}, "--overwrite starts a run over"),
    ],
)
def test_bad_recipe_values(capsys, tmp_path: Path, args, changes, expected):
    line = _train_error(capsys, tmp_path, *args, **changes)
    assert expected in line
    assert not (tmp_path / "out").exists()


def test_duplicate_yaml_key(capsys, tmp_path: Path):
    text = SL_DDP.read_text().replace("  lr: 0.001", "  lr: 0.001\n  lr: 0.1")
    (tmp_path / "dup.yaml").write_text(text)
    line = cli_error(capsys, "train", "--config", str(tmp_path / "dup.yaml"))
    assert "dup.yaml" in line and "duplicate key 'lr'" in line


@pytest.mark.parametrize("folder", ["/proc/self", "/dev/null/sub"])
def test_unusable_output_dir_names_it(capsys, tmp_path: Path, folder: str):
    line = _train_error(capsys, tmp_path, "--set", f"trainer.output_dir={folder}")
    assert folder in line and "trainer.output_dir" in line


def _damaged(tmp_path: Path, ckpt: Path, case: str) -> Path:
    path = tmp_path / f"{case}.pt"
    data = load(ckpt)
    if case == "text":
        path.write_text("step: 3\n")
    elif case == "model_list":
        data["model"] = [1, 2]
        torch.save(data, path)
    elif case == "step_string":
        data["step"] = "2"
        torch.save(data, path)
    elif case == "ranks_short":
        data["ranks"] = []
        torch.save(data, path)
    elif case == "pickle":
        data["model"]["evil"] = Path("x")  # needs pickle's GLOBAL to load
        torch.save(data, path)
    return path


DAMAGE = {
    "text": "damaged or not a checkpoint (not a complete torch.save archive)",
    "model_list": "damaged v2 checkpoint (model is not a state dict of named tensors)",
    "step_string": "damaged v2 checkpoint (step is '2', expected an int >= 0)",
    "ranks_short": "damaged v2 checkpoint (ranks has 0 entries for world size 1)",
    "pickle": "not a weights-only checkpoint (it needs pickle to load: it names "
    "pathlib.PosixPath); slhub loads checkpoints with torch.load(weights_only=True) only",
}


@pytest.mark.parametrize("case", list(DAMAGE))
@pytest.mark.parametrize("command", ["inspect", "export", "resume"])
def test_damaged_or_foreign_checkpoint(capsys, tmp_path, ckpt: Path, case: str, command: str):
    path = _damaged(tmp_path, ckpt, case)
    if command == "inspect":
        line = cli_error(capsys, "inspect", str(path))
    elif command == "export":
        line = cli_error(capsys, "export", "--checkpoint", str(path), "--out", str(tmp_path / "e"))
    else:
        line = _train_error(capsys, tmp_path, "--resume", str(path))
    assert str(path) in line and DAMAGE[case] in line
    assert not (tmp_path / "e").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["inspect", "resume"])
def test_a_directory_where_a_checkpoint_file_belongs(
    capsys, tmp_path: Path, ckpt: Path, command: str
):
    folder = ckpt.parent
    line = (
        cli_error(capsys, "inspect", str(folder))
        if command == "inspect"
        else _train_error(capsys, tmp_path, "--resume", str(folder))
    )
    assert f"{folder}: is a directory, not a checkpoint file" in line and "last.pt" in line


def test_nothing_left_to_train_exits_2(capsys, tmp_path: Path, ckpt: Path):
    line = _train_error(capsys, tmp_path, "--resume", str(ckpt), trainer__steps=2)
    assert "nothing to train; raise trainer.steps" in line


def test_metrics_write_failure_is_one_line(tmp_path: Path):
    """A file-size limit stops metrics.jsonl mid-run: one line naming the file, exit 2."""
    recipe = _write(
        tmp_path / "r.yaml", trainer__steps=400, trainer__save_every=0, trainer__validate_every=0,
        trainer__output_dir=str(tmp_path / "out"),
    )  # fmt: skip

    line = _train_limited(recipe, resource.RLIMIT_FSIZE, 30_000, timeout=120)
    assert "metrics.jsonl: cannot append metrics (File too large)" in line


def one_line_error_in(returncode: int, stderr: str, plugin_bug: bool = False) -> str:
    """Exit 2, exactly one ``slhub: error:`` line (log lines may precede it), and no
    traceback, unless ``plugin_bug``: a plain exception raised in plugin code, whose
    traceback the failing rank logs before the run ends with the one line."""
    assert returncode == 2, stderr[-2000:]
    if plugin_bug:
        assert stderr.count("Traceback (most recent call last):") == 1, stderr[-3000:]
        assert 'slhub_testplugins.py", line' in stderr, stderr[-3000:]
        assert stderr.rstrip().splitlines()[-1].startswith("slhub: error:"), stderr[-3000:]
    else:
        assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("slhub: error:")]
    assert len(lines) == 1, stderr[-2000:]
    return lines[0]


def test_a_failed_run_can_start_over_without_deleting_by_hand(capsys, tmp_path: Path):
    out = tmp_path / "out"
    code, err = _train(capsys, tmp_path, trainer__steps=4)
    assert code == 0, err[-2000:]
    line = _train_error(capsys, tmp_path, trainer__steps=4)  # the same command again
    assert "already holds run artifacts" in line and "--overwrite" in line
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name[0] != "."}
    code, err = _train(capsys, tmp_path, "--overwrite", trainer__steps=4)
    assert code == 0, err[-2000:]
    (aside,) = [p for p in out.iterdir() if p.name.startswith("superseded-")]
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == before  # nothing deleted
    assert (
        json.loads((out / "run.json").read_text())["run_id"]
        != json.loads(before["run.json"])["run_id"]
    )


def test_resume_auto_starts_over_a_run_that_failed_before_its_first_checkpoint(
    capsys, monkeypatch, tmp_path: Path
):
    out = tmp_path / "out"
    env = {"SLHUB_FAULT_PHASE": "sampling", "SLHUB_FAULT_RANK": "0", "SLHUB_FAULT_STEP": "2"}
    recipe = _write(
        tmp_path / "r.yaml", plugin="slhub_testplugins:FaultInjector", trainer__steps=4,
        trainer__save_every=0, trainer__output_dir=str(out),
    )  # fmt: skip
    with monkeypatch.context() as faulty:
        for name, value in env.items():
            faulty.setenv(name, value)
        code = cli.main(["train", "--config", str(recipe), "--resume", "auto"])
        err = capsys.readouterr().err
    assert "failed during sampling" in one_line_error_in(code, err, plugin_bug=True)
    assert (out / "run.json").exists() and not (out / "last.pt").exists()
    code = cli.main(["train", "--config", str(recipe), "--resume", "auto"])
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert [m["step"] for m in metrics_of(out) if "train/loss" in m] == [1, 2, 3, 4]
    assert len([p for p in out.iterdir() if p.name.startswith("superseded-")]) == 1


def _faulty_run(
    capsys, monkeypatch, tmp_path: Path, phase: str, *args: str, **changes
) -> tuple[int, str]:
    """``slhub train`` in this process with ``FaultInjector`` failing in ``phase`` on rank 0
    at update 2: exit status and stderr."""
    monkeypatch.setenv("SLHUB_FAULT_PHASE", phase)
    monkeypatch.setenv("SLHUB_FAULT_RANK", "0")
    recipe = _write(
        tmp_path / "r.yaml", plugin="slhub_testplugins:FaultInjector", trainer__steps=4,
        trainer__output_dir=str(tmp_path / "out"), **changes,
    )  # fmt: skip
    code = cli.main(["train", "--config", str(recipe), *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_a_plugin_bug_is_logged_with_its_traceback_then_one_line(
    capsys, monkeypatch, tmp_path: Path, fmt: str
):
    """A plain exception raised in a plugin's objective is a bug in that plugin: the rank
    logs where it was raised (console: the traceback; JSON: structured frames, no
    locals), then the run ends with the one-line rank failure, exit status 2."""
    code, err = _faulty_run(capsys, monkeypatch, tmp_path, "objective", "--log-format", fmt)
    if fmt == "console":
        line = one_line_error_in(code, err, plugin_bug=True)
    else:
        assert code == 2 and "Traceback" not in err, err[-2000:]
        (event,) = [json.loads(x) for x in err.splitlines() if '"objective failed"' in x]
        (exception,) = event["exception"]
        assert exception["exc_type"] == "RuntimeError" and event["step"] == 2
        assert exception["frames"][-1]["filename"].endswith("slhub_testplugins.py")
        assert not any("locals" in frame for frame in exception["frames"])
        line = json.loads(err.strip().splitlines()[-1])["message"]
    assert "rank 0 failed during objective: RuntimeError: injected objective failure" in line


def test_a_non_finite_loss_is_one_line_without_a_traceback(capsys, monkeypatch, tmp_path: Path):
    line = one_line_error_in(*_faulty_run(capsys, monkeypatch, tmp_path, "nonfinite"))
    assert "rank 0 failed during non-finite loss: loss is nan at update 2" in line


def test_rank0_state_that_cannot_be_pickled_fails_the_run_without_a_checkpoint(
    capsys, monkeypatch, tmp_path: Path
):
    """Rank 0 keeps its own state unpickled until the write: a state a checkpoint cannot
    hold (here a lambda) fails that write, before any file is touched, as checkpoint I/O."""
    out = tmp_path / "out"
    code, err = _faulty_run(
        capsys, monkeypatch, tmp_path, "state", trainer__save_every=1, trainer__validate_every=2
    )
    line = one_line_error_in(code, err)
    assert "failed during checkpoint I/O" in line and "ranks[0].fault: a builtins.function" in line
    assert load(out / "last.pt")["step"] == 1 and not (out / "step_2.pt").exists()
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_torchrun_summary_names_the_real_cause(tmp_path: Path):
    recipe = _write(
        tmp_path / "r.yaml", plugin="slhub_testplugins:FaultInjector", trainer__steps=4,
        trainer__output_dir=str(tmp_path / "out"),
    )  # fmt: skip
    env = subprocess_env(
        {"SLHUB_FAULT_PHASE": "sampling", "SLHUB_FAULT_RANK": "1", "SLHUB_FAULT_STEP": "2"}
    )
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
         "--nproc-per-node=2", "-m", "slhub", "train", "--config", str(recipe)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode != 0
    summary = proc.stderr[proc.stderr.rfind("Failures:") :]
    assert "rank 1 failed during sampling: RuntimeError: injected sampling failure" in summary


# ------------------------------------------------ paths and files the OS or slhub refuses

LONG = "a" * 300  # one path component over the file system's 255-byte name limit


@pytest.mark.parametrize(
    "case", ["config-too-long", "config-loop", "output-dir-too-long", "resume-auto-too-long",
             "export-out-too-long", "plot-run-dir-too-long"],
)  # fmt: skip
def test_a_path_the_os_refuses_is_one_line(capsys, tmp_path: Path, ckpt: Path, case: str):
    """pathlib raises OSError even from ``exists()`` for such a name: one line naming it."""
    long = tmp_path / LONG
    if case == "config-too-long":
        line = cli_error(capsys, "train", "--config", f"{long}.yaml")
        expected = f"{long}.yaml: cannot read recipe (File name too long)"
    elif case == "config-loop":
        (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
        (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
        line = cli_error(capsys, "train", "--config", str(tmp_path / "loop1"))
        expected = "loop1: cannot read recipe (Too many levels of symbolic links)"
    elif case == "output-dir-too-long":
        line = _train_error(capsys, tmp_path, "--set", f"trainer.output_dir={long}")
        expected = f"{long}: cannot use trainer.output_dir (File name too long)"
    elif case == "resume-auto-too-long":
        out = f"trainer.output_dir={long}"
        line = _train_error(capsys, tmp_path, "--set", out, "--resume", "auto")
        # the run directory is locked before --resume auto looks into it
        expected = f"{long}: cannot use trainer.output_dir (File name too long)"
    elif case == "export-out-too-long":
        line = cli_error(
            capsys, "export", "--checkpoint", str(ckpt), "--out", str(long),
            "--plugin", "examples.sl_ddp.plugin:SlDdpPlugin",
        )  # fmt: skip
        expected = f"{long}: cannot use export destination (File name too long)"
    else:
        line = cli_error(capsys, "plot", str(long))
        expected = f"{long}: cannot read the run directory (File name too long)"
    assert expected in line
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["r.yaml"], ["loop1", "loop2"])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "--config", ""], "slhub: error: --config: empty path"),
        (["train", "--config", "{recipe}", "--resume", ""], "--resume: empty path"),
        (["inspect", ""], "slhub: error: CKPT: empty path"),
        (["export", "--checkpoint", "{ckpt}", "--out", ""], "slhub: error: --out: empty path"),
        (["plot", "{run}", "--out", ""], "slhub: error: --out: empty path"),
        (["export", "--checkpoint", "{ckpt}", "--out", "e\0x"],
         "--out 'e\\x00x': a path cannot hold a NUL byte"),
        (["train", "--config", "{recipe}", "--set", 'trainer.output_dir="o\\0x"'],
         'trainer.output_dir="o\\0x": trainer.output_dir: must not contain a NUL byte'),
    ],
    ids=["config", "resume", "inspect", "export-out", "plot-out", "nul-export-out",
         "nul-output-dir"],
)  # fmt: skip
def test_an_empty_path_or_a_nul_byte_is_one_line(capsys, tmp_path, ckpt: Path, argv, expected):
    """``Path("")`` quietly means the current directory, and no OS call takes a NUL byte."""
    recipe = _write(tmp_path / "r.yaml", trainer__output_dir=str(tmp_path / "out"))
    names = {"recipe": recipe, "ckpt": ckpt, "run": ckpt.parent}
    line = cli_error(capsys, *[word.format(**names) for word in argv])
    assert expected in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml"]


@pytest.mark.parametrize("case", ["file", "set-unparsable", "set-parsed"])
def test_a_deeply_nested_recipe_is_one_line(capsys, tmp_path: Path, case: str):
    """Deep nesting would overflow the recursive YAML parser, or later the validation."""
    if case == "file":
        deep = tmp_path / "deep.yaml"
        deep.write_text("model:\n  hidden: " + "[" * 100_000 + "]" * 100_000 + "\n")
        line = cli_error(capsys, "train", "--config", str(deep))
        assert f"{deep}: YAML nested too deeply (more than 100 levels)" in line
        return
    levels = 5000 if case == "set-unparsable" else 300
    line = _train_error(capsys, tmp_path, "--set", "model.hidden=" + "[" * levels + "]" * levels)
    assert line.startswith("slhub: error: --set model.hidden=[[[") and len(line) < 200
    what = "value is" if case == "set-unparsable" else "characters): model.hidden:"
    assert f"{what} nested too deeply (more than 100 levels)" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["directory", "huge"])
def test_a_recipe_must_be_a_small_regular_file(capsys, tmp_path: Path, case: str):
    path = tmp_path / "r.yaml"
    if case == "directory":
        path.mkdir()
        expected = f"{path}: is a directory, not a recipe file"
    else:
        path.touch()
        os.truncate(path, 17 * 2**20)  # sparse: no disk used
        expected = f"{path}: {17 * 2**20} bytes; a recipe is at most 16 MiB"
    assert expected in cli_error(capsys, "train", "--config", str(path))


@pytest.mark.parametrize("case", ["dev-zero", "fifo"])
def test_a_recipe_that_is_no_regular_file_is_refused_unread(tmp_path: Path, case: str):
    """In a process of its own, limited: reading /dev/zero would fill memory, and a FIFO
    with no writer would block forever."""
    path = Path("/dev/zero") if case == "dev-zero" else tmp_path / "fifo.yaml"
    if case == "fifo":
        os.mkfifo(path)

    line = _train_limited(path, resource.RLIMIT_AS, 2 * 2**30, timeout=60)
    assert f"{path}: not a regular file (a FIFO, socket or device)" in line


NOT_PLUGINS = """
from slhub import hookimpl

class NotAPlugin:
    pass

class Unmarked:
    def build_model(self, trainer):
        return None

class NoModel:
    @hookimpl
    def objective(self, trainer, model, batch):
        return None

Instance = 42
"""


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--set", "plugin=not_plugins:NotAPlugin"], '"not_plugins:NotAPlugin" (no distribution) '
         "is not a plugin: its NotAPlugin object implements no slhub hook (a model plugin "
         "implements build_model, sample and objective, each marked @slhub.hookimpl)"),
        (["--set", "plugin=not_plugins:Instance"],
         "is not a plugin: its int object implements no slhub hook"),
        (["--set", "plugin=not_plugins:Unmarked"], "is not a plugin: its Unmarked object defines "
         "build_model but marks none with @slhub.hookimpl"),
        (["--set", 'plugins=["not_plugins:NotAPlugin"]'],
         "its NotAPlugin object implements no slhub hook (e.g. on_log"),
        (["--set", "plugin=not_plugins:NoModel"], '"not_plugins:NoModel" (no distribution) is '
         "the recipe's model plugin (plugin:) but implements no build_model"),
        (["export", "--plugin", "not_plugins:NotAPlugin"],
         "is not a plugin: its NotAPlugin object implements no slhub hook"),
    ],
    ids=["class", "instance", "unmarked", "extra", "no-build-model", "export"],
)  # fmt: skip
def test_an_object_that_is_no_plugin_is_named_so(
    capsys, monkeypatch, tmp_path: Path, ckpt: Path, argv, expected
):
    """pluggy registers an object without hook implementations silently; without a check
    the run failed later as an unknown recipe section or a model of None."""
    (tmp_path / "not_plugins.py").write_text(NOT_PLUGINS)
    monkeypatch.syspath_prepend(str(tmp_path))
    if argv[0] == "export":
        out = tmp_path / "e"
        line = cli_error(capsys, "export", "--checkpoint", str(ckpt), "--out", str(out), *argv[1:])
        assert not out.exists()
    else:
        line = _train_error(capsys, tmp_path, *argv)
        assert not (tmp_path / "out").exists()
    assert expected in line


def test_plot_out_is_the_file_written(capsys, tmp_path: Path, ckpt: Path):
    """matplotlib appends ``.png`` to a name without a suffix: the plot is written exactly
    at --out (PNG), and a directory as --out is refused rather than reported as written."""
    run = ckpt.parent
    folder = tmp_path / "figures"
    folder.mkdir()
    line = cli_error(capsys, "plot", str(run), "--out", str(folder))
    assert f"{folder}: is a directory; --out names the image file to write" in line
    assert sorted(tmp_path.iterdir()) == [folder] and not any(folder.iterdir())
    assert cli.main(["plot", str(run), "--out", str(tmp_path / "plain")]) == 0
    assert f"to {tmp_path / 'plain'}\n" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures", "plain"]
    assert (tmp_path / "plain").read_bytes().startswith(b"\x89PNG")


# --- final lines in one write; export hooks that fail; plot steps; train() argument types ---

from slhub.errors import SlhubError  # noqa: E402 - this section's own import


class _Writes:
    """A stderr that records each write() call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        self.calls.append("<flush>")

    def isatty(self) -> bool:
        return False


def test_final_line_is_one_write_with_its_newline(monkeypatch, tmp_path: Path):
    """torchrun workers share stderr: a line written apart from its newline was glued to
    another worker's line (``...(admission)slhub: error: rank 0 failed...``)."""
    stderr = _Writes()
    monkeypatch.setattr(sys, "stderr", stderr)
    assert cli.main(["inspect", str(tmp_path / "missing.pt")]) == 2
    with pytest.raises(SystemExit):
        cli.main(["train"])  # a usage error: argparse's one line
    lines = [c for c in stderr.calls if c != "<flush>"]
    assert len(lines) == 2, stderr.calls
    assert all(c.startswith("slhub: error: ") and c.endswith("\n") for c in lines), lines
    assert all(c.count("\n") == 1 for c in lines), lines
    assert stderr.calls[-1] == "<flush>" and stderr.calls[1] == "<flush>"


EXPORT_PLUGINS = """
import os
from slhub import hookimpl
from examples.sl_ddp.plugin import SlDdpPlugin

class P(SlDdpPlugin):
    @hookimpl
    def export(self, checkpoint, checkpoint_path, out_dir):
        mode = os.environ["SLHUB_TEST_EXPORT"]
        if mode == "raise":
            (out_dir / "half.bin").write_bytes(b"x")
            raise RuntimeError("boom export")
        if mode == "int":
            return 42
        if mode == "exit":
            raise SystemExit(3)
        if mode == "no-manifest":
            (out_dir / "model.pt").write_bytes(b"x")
        return out_dir
"""


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("raise", 'slhub plugin "exp_plugins:P" (no distribution) failed in its export hook: '
         "RuntimeError: boom export"),
        ("int", 'the export hook of slhub plugin "exp_plugins:P" (no distribution) returned int '
         "42; it must return the export directory (a path) or None"),
        ("exit", 'slhub plugin "exp_plugins:P" (no distribution) failed in its export hook: '
         "SystemExit: 3"),
        ("nothing", "but wrote nothing there: nothing exported"),
        ("no-manifest", "but wrote no export.json there"),
    ],
    ids=["raise", "int", "exit", "nothing", "no-manifest"],
)  # fmt: skip
def test_a_failing_export_hook_is_one_line_and_leaves_no_directory(
    capsys, monkeypatch, tmp_path: Path, ckpt: Path, mode: str, expected: str
):
    """A plugin's plain exception or a return that is not a path exited 1 with a bare
    traceback; a hook that wrote nothing was reported as exported."""
    (tmp_path / "exp_plugins.py").write_text(EXPORT_PLUGINS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SLHUB_TEST_EXPORT", mode)
    out = tmp_path / "new" / "e"
    argv = ["export", "--checkpoint", str(ckpt), "--out", str(out), "--plugin", "exp_plugins:P"]
    if mode in ("raise", "exit"):  # a plugin's bug: its traceback is logged, then one line
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        *logged, line = err.strip().splitlines()
        assert "Traceback" in "\n".join(logged) and expected.split(": ", 1)[1] in logged[-1]
        assert line.startswith("slhub: error: ") and "Traceback" not in line
    else:
        line = cli_error(capsys, *argv)
    assert expected in line
    assert not out.exists()


def _metrics_run(tmp_path: Path, *extra: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    good = [json.dumps({"step": s, "train/loss": 1.0 / s, "train/lr": 0.1}) for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("\n".join([*good[:2], *extra, good[2]]) + "\n")
    return run


@pytest.mark.parametrize(
    "record",
    ['{"step": "zzz", "train/loss": 5.0}', '{"step": null, "train/loss": 5.0}',
     '{"train/loss": 5.0}', '{"step": 1e400, "train/loss": 5.0}',
     '{"step": true, "train/loss": 5.0}'],
    ids=["str", "null", "missing", "inf", "bool"],
)  # fmt: skip
def test_plot_skips_records_without_an_update_number(capsys, tmp_path: Path, record: str):
    """A record whose step is not an integer crashed ``slhub plot`` with a traceback."""
    run = _metrics_run(tmp_path, record)
    assert cli.main(["plot", str(run)]) == 0, capsys.readouterr().err
    assert "plotted train/loss, train/lr to" in capsys.readouterr().out
    from slhub.plot import collect

    series, _ = collect(run)
    assert series["train/loss"][0] == [1, 2, 3]


def test_plot_refuses_a_bad_step_a_resume_marker_must_order(capsys, tmp_path: Path):
    run = _metrics_run(
        tmp_path, '{"step": "zzz", "train/loss": 5.0}', '{"event": "resume", "step": 2}'
    )
    line = cli_error(capsys, "plot", str(run))
    assert "metrics.jsonl: line 3 has step 'zzz', not an update number" in line
    assert not (run / "metrics.png").exists()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"log_format": "xml"}, SlhubError,
         r"^log_format: expected 'console' or 'json', got 'xml'$"),
        ({"log_format": None}, TypeError,
         r"^log_format: expected 'console' or 'json', got NoneType$"),
        ({"overrides": "trainer.steps=1"}, TypeError, r"^overrides: expected a list, got str$"),
        ({"overrides": ["trainer.steps=1", 3]}, TypeError,
         r"^overrides: expected 'KEY.PATH=VALUE' strings, got int 3$"),
        ({"recipe": b"r.yaml"}, TypeError, r"^recipe: expected a YAML path \(str or os.PathLike\), "
         r"a mapping \(dict\) or a Recipe, got bytes$"),
        ({"recipe": 42}, TypeError, r"^recipe: .* got int$"),
        ({"resume": 42}, TypeError, r"^resume: expected a checkpoint path \(str or os.PathLike\) "
         r"or 'auto', got int$"),
        ({"plugins": "examples.sl_ddp.plugin:SlDdpPlugin"}, TypeError,
         r"^plugins: expected a list, got str$"),
    ],
    ids=["log-format-xml", "log-format-none", "overrides-str", "overrides-item", "recipe-bytes",
         "recipe-int", "resume-int", "plugins-str"],
)  # fmt: skip
def test_train_refuses_arguments_of_the_wrong_type(tmp_path: Path, kwargs, error, match):
    """slhub.train iterated a str of overrides or plugins per character and accepted any
    log_format; a recipe or resume of another type failed deep inside, unnamed."""
    recipe = _write(tmp_path / "r.yaml", trainer__steps=1, trainer__output_dir=str(tmp_path / "o"))
    kwargs = {"recipe": str(recipe), **kwargs}
    with pytest.raises(error, match=match):
        train(**kwargs)
    assert not (tmp_path / "o").exists()
