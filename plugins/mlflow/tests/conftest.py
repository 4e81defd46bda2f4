"""Fixtures of the mlflow plugin's tests: one real ``mlflow server`` for the session
(SQLite backend, artifacts served from a local folder, on 127.0.0.1), and this folder
importable (the run reader, the rank spy of the torchrun test)."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
#: slhub's own tests folder: its helpers run the CLI and torchrun as slhub's tests do,
#: also when pytest runs from this plugin's folder alone.
SLHUB_TESTS = HERE.parents[2] / "tests"
for folder in (HERE, SLHUB_TESTS):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

#: The server stops by itself after this long, even if pytest is killed.
SERVER_LIFETIME_S = 1800
#: The longest wait for a starting server to answer /health.
SERVER_START_S = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> Iterator[str]:
    """``mlflow server`` on a free port of 127.0.0.1 for the whole session: its URI.

    It runs under ``timeout`` in a process group of its own, so it ends at teardown
    (the whole group) or after :data:`SERVER_LIFETIME_S` if nothing ends it.
    """
    if importlib.util.find_spec("mlflow") is None:
        pytest.skip("mlflow is not installed: pip install mlflow (or -e plugins/mlflow)")
    home = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    command = [
        "timeout", str(SERVER_LIFETIME_S), sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{home}/mlflow.db",
        "--artifacts-destination", str(home / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    log = open(home / "server.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, cwd=home, start_new_session=True
    )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not healthy(uri):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (home / "server.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"mlflow server did not start at {uri}:\n{tail}")
            time.sleep(0.25)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its data lives in a temporary folder only
        proc.wait()
        log.close()
