"""``slhub.distributed_run``: creates a group only under torchrun, destroys only its own."""

from __future__ import annotations

import torch
import torch.distributed as dist

from conftest import free_port, torchrun_env
from slhub import distributed_run


def _torchrun_env(monkeypatch) -> None:
    for key, value in torchrun_env(0, 1, free_port()).items():
        monkeypatch.setenv(key, value)


def test_without_torchrun_environment_no_group_is_made(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    with distributed_run("cpu") as device:
        assert device == torch.device("cpu")
        assert not dist.is_initialized()


def test_group_it_creates_is_destroyed(monkeypatch):
    _torchrun_env(monkeypatch)
    with distributed_run("auto") as device:
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        assert device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert not dist.is_initialized()


def test_pre_existing_group_stays_the_callers(monkeypatch):
    _torchrun_env(monkeypatch)
    dist.init_process_group("gloo")
    try:
        with distributed_run("cpu"):
            assert dist.is_initialized()
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()
