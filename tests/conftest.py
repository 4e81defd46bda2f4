"""Fixtures and hooks of slhub's tests. The helpers tests import are in helpers.py:
pytest loads conftest.py itself and it is not meant to be imported."""

from __future__ import annotations

import os

import pytest

# MuJoCo reads its OpenGL backend once, when first imported (a test module may import it
# while being collected): offscreen EGL for every test that renders
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(scope="session", autouse=True)
def _user_cache(tmp_path_factory):
    """slhub's user cache (``$XDG_CACHE_HOME/slhub``: statistics, dataset digests) is one
    folder of this session's, for every test and the processes they start: never the
    real user's ~/.cache. A test that looks at it reads ``XDG_CACHE_HOME``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(autouse=True)
def _single_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # console lines fit the log-file width the tests assert, whatever terminal runs them
    monkeypatch.delenv("COLUMNS", raising=False)
