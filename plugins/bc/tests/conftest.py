"""Fixtures of the bc tests: slhub's stand-in trainer, the repository root and the
shared reference datasets copied where a test may write beside them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from slhub import Trainer
from slhub.testing import StandInTrainer

# MuJoCo reads its OpenGL backend once, when first imported (a test module may import it
# while being collected): offscreen EGL for every test that renders
os.environ.setdefault("MUJOCO_GL", "egl")

from slhub_bc.plugin import SECTION, BcPlugin

#: The slhub repository this package lives in: its examples/ and the recipes' cwd.
REPO = Path(__file__).resolve().parents[3]
#: Reference datasets written by each format's own library (tests/data/datasets/README.md).
DATASETS = REPO / "tests" / "data" / "datasets"


@pytest.fixture
def make_trainer(tmp_path):
    """``make_trainer(bc, data=None, batch_size=8, seed=0)``: what the plugin's hooks
    receive as ``trainer`` (:class:`slhub.testing.StandInTrainer`), holding ``bc`` and
    ``data`` (default: the expert's demonstrations cached under ``tmp_path``)."""

    def make(bc, data=None, batch_size: int = 8, seed: int = 0) -> Trainer:
        data = {"cache_dir": str(tmp_path / "cache")} if data is None else data
        sections = {SECTION: bc, "data": data}
        return StandInTrainer(BcPlugin(), sections, batch_size=batch_size, seed=seed)

    return make


@pytest.fixture
def copy_dataset(tmp_path):
    """``copy_dataset(name)``: the reference dataset ``name`` copied under ``tmp_path``
    (its statistics are cached beside it, never in the repository)."""

    def copy(name: str) -> Path:
        source, target = DATASETS / name, tmp_path / "data" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)
        return target

    return copy


@pytest.fixture
def repo() -> Path:
    return REPO
