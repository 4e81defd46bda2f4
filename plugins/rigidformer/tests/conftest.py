"""Fixtures of the rigidformer tests: slhub's stand-in trainer and the repository root."""

from __future__ import annotations

from pathlib import Path

import pytest
from slhub import Trainer
from slhub.testing import StandInTrainer

from slhub_rigidformer.plugin import SECTION, RigidFormerPlugin

#: The slhub repository this package lives in: its examples/ and the recipes' cwd.
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def make_trainer():
    """``make_trainer(section, batch_size=8, seed=0)``: what the plugin's hooks receive as
    ``trainer`` (:class:`slhub.testing.StandInTrainer`), holding ``section`` as ``rigidformer``."""

    def make(section, batch_size: int = 8, seed: int = 0) -> Trainer:
        return StandInTrainer(
            RigidFormerPlugin(), {SECTION: section}, batch_size=batch_size, seed=seed
        )

    return make


@pytest.fixture
def repo() -> Path:
    return REPO
