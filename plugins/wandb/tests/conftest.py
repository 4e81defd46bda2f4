"""Fixtures of the wandb plugin's tests: W&B kept offline, quiet and out of ~/.config,
and this folder importable (the offline-file reader, the rank spy of the torchrun test),
with slhub's test helpers, also when pytest runs from this plugin's folder alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
#: slhub's own tests folder: its helpers run the CLI and torchrun as slhub's tests do.
SLHUB_TESTS = HERE.parents[2] / "tests"
for folder in (HERE, SLHUB_TESTS):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def wandb_env(home: Path) -> dict[str, str]:
    """What every test process runs W&B with: offline, silent, its files under ``home``."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CONFIG_DIR": str(home / "config"),
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_DATA_DIR": str(home / "data"),
        "WANDB_ARTIFACT_DIR": str(home / "artifacts"),
    }


@pytest.fixture(scope="session")
def offline_wandb(tmp_path_factory):
    """W&B's environment for the whole session (in-process runs read it at ``wandb.init``)."""
    env = wandb_env(tmp_path_factory.mktemp("wandb-home"))
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        yield env
