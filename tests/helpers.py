"""Shared helpers of slhub's tests: run the CLI (alone or under torchrun), write recipes,
compare trees. Tests import them (``from helpers import ...``; pyproject.toml puts tests/
on the path); tests/conftest.py holds only fixtures and hooks, as pytest advises."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import warm_processes
import yaml

from slhub.recipe import as_recipe
from slhub.testing import (
    STOP_AT_ENV,
    assert_tree_equal,  # noqa: F401 - shared with the tests
    check_resume_and_revalidate,
)

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
SL_DDP = REPO / "examples" / "sl_ddp" / "cpu.yaml"


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TESTS), str(REPO), env.get("PYTHONPATH", "")) if p
    )
    env.update(extra or {})
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    """``python -m slhub ARGS`` in the repository root, as a fresh process forked from
    a warm server (tests/warm_processes.py: no interpreter start-up)."""
    _, [(code, out, err)] = warm_processes.run(args, [subprocess_env(env)], REPO, timeout)
    return subprocess.CompletedProcess(["slhub", *args], code, out, err)


def run_torchrun(*args: str, nproc: int = 2, env: dict[str, str] | None = None, timeout=180):
    """``torchrun --standalone --nproc-per-node=N -m slhub ARGS`` in the repository root."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes=1",
            f"--nproc-per-node={nproc}",
            "-m",
            "slhub",
            *args,
        ],
        cwd=REPO,
        env=subprocess_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def train_stopped_then_resumed(
    recipe: Path, stop_at: int, stopped: Path, resumed: Path | None = None
) -> Path:
    """Under 2 torchrun workers: train the recipe, preempted at update ``stop_at`` by the
    extra plugin ``slhub.testing:StopAt`` (as a real job is stopped), into ``stopped``;
    then resume from its ``step_{stop_at}.pt`` to the recipe's ``trainer.steps``, into
    ``resumed`` (in place when None). ``trainer.steps`` is never changed, so a schedule
    over it is the uninterrupted run's. Returns the directory holding the finished run."""
    plugins = [*as_recipe(recipe).plugins, "slhub.testing:StopAt"]
    stop = ("--set", f"plugins={json.dumps(plugins)}")
    proc = run_torchrun(
        "train", "--config", str(recipe), *stop, "--set", f"trainer.output_dir={stopped}",
        env={STOP_AT_ENV: str(stop_at)},
    )  # fmt: skip
    # torchrun reports its workers' preempted exit (75) as its own failure
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert f"stop signal at update {stop_at}:" in proc.stderr, proc.stderr[-3000:]
    target = resumed or stopped
    proc = run_torchrun(
        "train", "--config", str(recipe), *stop, "--set", f"trainer.output_dir={target}",
        "--resume", str(stopped / f"step_{stop_at}.pt"), env={STOP_AT_ENV: ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return target


def write_recipe(path: Path, base: Path = SL_DDP, **changes: Any) -> Path:
    """Copy a recipe with ``section__key=value`` changes applied."""
    data = yaml.safe_load(base.read_text())
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    path.write_text(yaml.safe_dump(data))
    return path


def metrics_of(folder: Path) -> list[dict[str, Any]]:
    """Every line of a run's metrics.jsonl, read as slhub itself reads it."""
    from slhub.artifacts import METRICS_FILE, read_metrics

    return read_metrics(folder / METRICS_FILE)


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The CLI's error: exit 2, exactly one stderr line, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("slhub: error: ")
    return lines[0]


def cli_error(capsys, *argv: str) -> str:
    """``slhub ARGV`` in this process (no interpreter start-up): exit 2 and one stderr line,
    and no Python warning (a process would print it on stderr; pytest would record it)."""
    from slhub import cli

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = cli.main(list(argv))
    err = capsys.readouterr().err
    assert not caught, [f"{w.category.__name__}: {w.message}" for w in caught]
    assert code == 2, (code, err[-2000:])
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("slhub: error: "), err
    return lines[0]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_env(
    rank: int,
    world_size: int,
    port: int | str,
    local_rank: int | None = None,
    per_node: int | None = None,
) -> dict[str, str]:
    """The variables torchrun gives worker ``rank`` of ``world_size`` (rendezvous on
    127.0.0.1:``port``); ``local_rank``/``per_node`` for workers on separate "nodes"
    (default: all on one node)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size if per_node is None else per_node),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def launch_workers(*args: str, nproc: int = 2, env: dict[str, str] | None = None, timeout=120):
    """Start N ``slhub`` workers with torchrun's environment, without torchrun.

    torchrun tears the other workers down as soon as one exits, which hides how
    each rank ends; launching them directly shows every rank's exit status and
    message. Each is a fresh process forked from a warm server
    (tests/warm_processes.py). Returns ``(seconds, [(returncode, stderr), ...])``
    by rank.
    """
    port = free_port()
    envs = [{**subprocess_env(env), **torchrun_env(rank, nproc, port)} for rank in range(nproc)]
    seconds, results = warm_processes.run(args, envs, REPO, timeout)
    return seconds, [(code, err) for code, _, err in results]


def warm_launcher(argv, workers, env, cwd, timeout) -> tuple[list[int], str]:
    """A ``launcher`` for :func:`slhub.testing.check_resume_exact`: workers forked from the
    warm server with torchrun's environment (tests/warm_processes.py)."""
    port = free_port()
    envs = [
        {**env, **torchrun_env(rank, workers, port)} if workers > 1 else dict(env)
        for rank in range(workers)
    ]
    _, results = warm_processes.run(argv, envs, cwd, timeout)
    return [code for code, _, _ in results], "\n".join(err for _, _, err in results)


def launch_workers_ok(*args: str, **kwargs: Any) -> None:
    """:func:`launch_workers`, asserting that every worker exits 0."""
    _, results = launch_workers(*args, **kwargs)
    assert [rc for rc, _ in results] == [0] * len(results), results[0][1][-2000:]


def assert_same_final_state(expected: Path, actual: Path) -> None:
    """Two checkpoint files hold the same training state (``torch.equal`` throughout)."""
    from slhub import checkpoint
    from slhub.testing import assert_same_state

    assert_same_state(checkpoint.load(expected), checkpoint.load(actual))


#: The reference dataset files and their own libraries' outputs (tests/data/datasets/README.md).
DATASETS = TESTS / "data" / "datasets"


def oracle(name: str) -> dict[str, Any]:
    """What a format's own library returned for its reference file (``oracle/NAME.npz``)."""
    import numpy as np

    with np.load(DATASETS / "oracle" / f"{name}.npz") as z:
        return {key: z[key] for key in z.files}


def assert_exact(got: Any, want: Any, what: str) -> None:
    """Element for element: the same dtype, shape and values."""
    import numpy as np

    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.array_equal(got, want), f"{what}: values differ"


def one_line_naming(exc: Any, path: Path) -> str:
    """The raised error's message: one line that names ``path``."""
    message = str(exc.value)
    assert "\n" not in message, message
    assert str(path) in message, message
    return message


def two_update_checkpoint(folder: Path) -> Path:
    """A real checkpoint (``last.pt``) of a two-update run of the default test recipe,
    trained in ``folder``: what refusal tests damage or resume."""
    from slhub import train

    recipe = write_recipe(
        folder / "r.yaml", trainer__steps=2, trainer__output_dir=str(folder / "o")
    )
    train(str(recipe))
    return folder / "o" / "last.pt"


def _refuse_constant(name: str):
    raise ValueError(f"not strict JSON: {name}")


def strict_json(text: str):
    """``text`` parsed as strict JSON: NaN and infinities as bare constants are refused."""
    return json.loads(text, parse_constant=_refuse_constant)


def script_module(name: str) -> ModuleType:
    """scripts/NAME.py as a module, registered in sys.modules so that its dataclasses
    (which look their module up there) can be built."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def check_nerd_resume(recipe: Path, overrides: list[str], workdir: Path, workers: int = 1) -> None:
    """A NeRD run of 8 updates (validation and checkpoints every 4) stopped at a random
    update and resumed ends as the uninterrupted one does: in this process, or on
    ``workers`` Gloo workers."""
    from slhub.builtin.nerd.plugin import NerdPlugin

    common: dict[str, Any] = {
        "stop_at": int(np.random.default_rng().integers(2, 8)),
        "workdir": workdir,
        "overrides": [*overrides, "trainer.steps=8", "trainer.validate_every=4",
                      "trainer.save_every=4"],
    }  # fmt: skip
    if workers == 1:
        check_resume_and_revalidate(recipe, NerdPlugin(), in_process=True, **common)
    else:
        check_resume_and_revalidate(
            recipe, NerdPlugin(), workers=workers, launcher=warm_launcher, cwd=REPO,
            timeout=600, **common,
        )  # fmt: skip
