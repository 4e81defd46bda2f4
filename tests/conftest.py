"""Fixtures and hooks of slhub's tests. The helpers tests import are in helpers.py:
pytest loads conftest.py itself and it is not meant to be imported."""

from __future__ import annotations

import os

import pytest

# MuJoCo reads its OpenGL backend once, when first imported (a test module may import it
# while being collected): offscreen EGL for every test that renders
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(autouse=True)
def _single_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # console lines fit the log-file width the tests assert, whatever terminal runs them
    monkeypatch.delenv("COLUMNS", raising=False)
