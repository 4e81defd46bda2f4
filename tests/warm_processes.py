"""Fresh ``slhub`` processes without the interpreter start-up: forked from a warm server.

Most of a short test run's time under ``python -m slhub`` is starting Python and
importing torch (seconds per process on a 2-core machine; a 2-worker torchrun
launch starts three). A forkserver that imported torch and slhub once forks each
worker from that state instead: every worker is still a new process with its own
pid, environment, working directory, signal handlers, process group and exit
status, running the same ``slhub.cli.main`` as ``python -m slhub``; it only
skips the imports. Tests whose claim is about the launcher itself (torchrun, a
real interpreter's start-up, a package installed into another environment)
keep starting real processes.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

#: Imported once by the server, before it forks any worker.
PRELOAD = [
    "numpy",
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "yaml",
    "pydantic",
    "structlog",
    "tqdm",
    "slhub.cli",
    "slhub.run",
    "slhub.trainer",
    "slhub.builtin.nerd.plugin",
    "warm_server_preload",  # one tiny run: the lazy first-use work, done once
]

_context: multiprocessing.context.ForkServerContext | None = None


def _server() -> multiprocessing.context.ForkServerContext:
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        _context = context
    return _context


def _main(argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """A worker: the environment and directory of the launch, stdout and stderr into
    files, then ``python -m slhub ARGV``'s entry; its return is the exit status."""
    for target, path in ((1, out), (2, err)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, target)
        os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # PYTHONPATH as a fresh interpreter reads it (entry points are found on sys.path)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = extra
    importlib.invalidate_caches()
    from slhub.cli import main

    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def run(
    argv: Sequence[str],
    envs: Sequence[dict[str, str]],
    cwd: str | Path,
    timeout: float,
) -> tuple[float, list[tuple[int, str, str]]]:
    """Start one forked ``slhub ARGV`` per environment, wait for all; returns
    ``(seconds, [(exit status, stdout, stderr), ...])`` in order. A process still
    running at ``timeout`` is killed and the launch raises TimeoutError."""
    context = _server()
    with tempfile.TemporaryDirectory(prefix="slhub-warm-") as logs:
        files = [(f"{logs}/{i}.out", f"{logs}/{i}.err") for i in range(len(envs))]
        procs = [
            context.Process(target=_main, args=(list(argv), dict(env), str(cwd), *names))
            for env, names in zip(envs, files)
        ]
        start = time.monotonic()
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(max(0.1, timeout - (time.monotonic() - start)))
        late = [proc for proc in procs if proc.exitcode is None]
        for proc in late:
            proc.kill()
            proc.join()
        seconds = time.monotonic() - start
        results = []
        for proc, names in zip(procs, files):
            code = proc.exitcode
            assert code is not None
            out, err = (Path(n).read_text(encoding="utf-8", errors="replace") for n in names)
            results.append((code if code >= 0 else 128 - code, out, err))
        if late:
            raise TimeoutError(f"slhub {' '.join(argv)} still ran after {timeout} s: {results}")
        return seconds, results
