"""``slhub.distributed_run``: creates a group only under torchrun, destroys only its own;
a group of one trains as no group does, without a collective."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import SL_DDP, assert_tree_equal, free_port, load, metrics_of, torchrun_env
from slhub import distributed_run, train
from slhub.errors import SlhubError


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


def test_a_group_of_one_trains_as_no_group_does_without_a_collective(monkeypatch, tmp_path: Path):
    """``--nproc-per-node=1`` (one GPU under torchrun): the agreement, the checkpoint
    gather and the run-id broadcast are local, so an update pays no device transfer or
    sync for them; every metric and weight equals the run without a group."""
    settings = ["trainer.steps=6", "trainer.validate_every=2", "trainer.save_every=3"]
    alone = train(
        SL_DDP, [*settings, f"trainer.output_dir={tmp_path / 'alone'}"], log_format="json"
    )
    _torchrun_env(monkeypatch)
    calls: list[str] = []
    for name in ("all_reduce", "gather_object", "broadcast_object_list", "all_gather_object"):
        real = getattr(dist, name)
        monkeypatch.setattr(
            dist, name, lambda *a, _n=name, _f=real, **k: (calls.append(_n), _f(*a, **k))[1]
        )
    with distributed_run("cpu"):
        assert dist.get_world_size() == 1
        grouped = train(
            SL_DDP, [*settings, f"trainer.output_dir={tmp_path / 'group'}"], log_format="json"
        )
    assert calls == []
    assert metrics_of(alone) == metrics_of(grouped)
    a, b = load(alone / "last.pt"), load(grouped / "last.pt")
    for key in ("model", "optimizer", "ranks"):
        assert_tree_equal(a[key], b[key], key)


def test_a_group_that_cannot_form_is_one_line(monkeypatch):
    """Rank 1 of 2 with no rank 0 listening: the store's connection times out, which
    torch raises as DistNetworkError with C++ frames; slhub says which group it was."""
    port = free_port()
    for key, value in torchrun_env(1, 2, port).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SlhubError, match=rf"cannot form the process group \(rank 1 of 2, "
                       rf"127.0.0.1:{port}\): "):  # fmt: skip
        with distributed_run("cpu", timeout_s=1.0):
            pass
    assert not dist.is_initialized()
