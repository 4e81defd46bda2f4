"""A stand-in for slhub's trainer: just the attributes the plugin's hooks read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


def fake_trainer(section, batch_size: int = 8, seed: int = 0):
    return SimpleNamespace(
        config=SimpleNamespace(batch_size=batch_size, seed=seed, lr=1e-3),
        section=lambda name: section,
        device=torch.device("cpu"),
        rank=0,
        world_size=1,
        is_main=True,
    )


@pytest.fixture
def make_trainer():
    return fake_trainer
