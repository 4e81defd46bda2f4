"""Fixtures of the rwm tests: slhub's stand-in trainer, the repository root and its
shared reference datasets."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from slhub import Trainer
from slhub.testing import StandInTrainer

from slhub_rwm.plugin import SECTION, RwmPlugin

#: The slhub repository this package lives in: its examples/ and the recipes' cwd.
REPO = Path(__file__).resolve().parents[3]
#: Every reader's format, as the format's own library wrote it (tests/data/datasets/README.md).
DATASETS = REPO / "tests" / "data" / "datasets"


@pytest.fixture
def make_trainer():
    """``make_trainer(section, data, batch_size=8, seed=0)``: what the plugin's hooks
    receive as ``trainer`` (:class:`slhub.testing.StandInTrainer`), holding ``section`` as
    ``rwm`` and ``data`` as ``data``."""

    def make(section, data, batch_size: int = 8, seed: int = 0) -> Trainer:
        sections = {SECTION: section, "data": data}
        return StandInTrainer(RwmPlugin(), sections, batch_size=batch_size, seed=seed)

    return make


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def copy_dataset(tmp_path):
    """``copy_dataset(name)``: a reference dataset copied into ``tmp_path`` (a test may
    change or remove it; the repository's copy stays as its library wrote it)."""

    def copy(name: str) -> Path:
        source, target = DATASETS / name, tmp_path / "datasets" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)
        return target

    return copy
