"""Fixtures and hooks of slhub's tests. The helpers tests import are in helpers.py:
pytest loads conftest.py itself and it is not meant to be imported."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _single_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
