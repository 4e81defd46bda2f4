"""RWM trained from a dataset on disk in every reader's format (the shared Hopper-v5
episodes of 50, 47, 23 and 45 steps, each written by its format's own library): an
exact resume at a random update on one process, 2 Gloo workers, and bad input as one
line with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from slhub.data import open_dataset
from slhub.testing import check_resume_and_revalidate

from slhub_rwm.model import LAYOUT_KEY, RwmLayout, WorldModel
from slhub_rwm.plugin import RwmPlugin

#: Every reader's format and the features RWM reads from it (as slhub's NeRD tests read them).
FORMATS = {
    "lerobot_v30": {"state": ["observation.state"], "action": ["action"]},
    "lerobot_v21": {"state": ["observation.state"], "action": ["action"]},
    "minari_hdf5": {"state": ["observations"], "action": ["actions"]},
    "minari_arrow": {"state": ["observations"], "action": ["actions"]},
    "robomimic.hdf5": {"state": ["obs/qpos", "obs/qvel"], "action": ["actions"]},
    "replay.zarr": {"state": ["state"], "action": ["action"]},
    "replay_v3.zarr": {"state": ["state"], "action": ["action"]},
    "nerd_trajectories.hdf5": {
        "state": ["states"],
        "action": ["joint_acts"],
        "extra": ["gravity_dir"],
    },
}
#: Short windows: the held-out episode (a quarter of four) may be the 23-step one.
SMALL = {"history": 4, "horizon": 3, "hidden": 16, "val_stride": 2}


@pytest.fixture(autouse=True)
def _statistics_cache(tmp_path, monkeypatch):
    """Statistics go to the user's cache, never into the dataset: keep it in tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def _recipe(repo: Path, tmp_path: Path, dataset: Path, features: dict, **changes) -> Path:
    raw = yaml.safe_load((repo / "examples/rwm/cartpole.yaml").read_text())
    raw["trainer"].update(
        steps=6, batch_size=8, validate_every=3, save_every=3, device="cpu",
        output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    raw["rwm"].update(SMALL, **changes.pop("rwm", {}))
    raw["data"] = {
        "path": str(dataset),
        "split": {"validation_ratio": 0.25, "seed": 0},
        "features": features,
        **changes.pop("data", {}),
    }
    path = tmp_path / "rwm.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _stop_at() -> int:
    return int(np.random.default_rng().integers(2, 6))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_rwm_trains_from_every_format_and_resumes_exactly(tmp_path, repo, copy_dataset, name):
    dataset = copy_dataset(name)
    recipe = _recipe(repo, tmp_path, dataset, FORMATS[name])
    check = check_resume_and_revalidate(
        recipe, RwmPlugin(), stop_at=_stop_at(), workdir=tmp_path / "runs", in_process=True
    )
    final = check.final("resumed")
    recorded = final.run["datasets"]["data"]
    opened = open_dataset(dataset)
    assert recorded["fingerprint"]["format"] == opened.format
    assert len(recorded["split"]["validation"]) == 1
    layout = RwmLayout.from_tensor(final.model[LAYOUT_KEY])
    width = sum(int(np.prod(opened.features[f].shape)) for f in FORMATS[name]["state"])
    assert len(layout.state_names) == width and layout.angles == ()
    assert bool(layout.extra_names) == ("extra" in FORMATS[name])
    cache = tmp_path / "xdg" / "slhub"
    names = [json.loads(m.read_text()).get("name") for m in cache.glob("statistics/*/meta.json")]
    assert names.count("changes") == 1  # the state-change statistics, in the user's cache
    assert not (dataset.is_dir() and any(dataset.rglob(".slhub")))  # nothing in the dataset
    metrics = check.metrics_after("resumed", 5)[-1]
    assert metrics["validation/baseline_relative_error"] > 0


def test_windows_decoded_ahead_resume_exactly(tmp_path, repo, copy_dataset):
    """With ``data.decode`` the drawn-ahead anchors are RWM's checkpointed state."""
    dataset = copy_dataset("replay.zarr")
    decode = {"decode": {"ahead": 2, "workers": 1}}
    recipe = _recipe(repo, tmp_path, dataset, FORMATS["replay.zarr"], data=decode)
    check = check_resume_and_revalidate(
        recipe, RwmPlugin(), stop_at=_stop_at(), workdir=tmp_path / "runs", in_process=True
    )
    (rank,) = check.final("stopped").ranks
    assert rank["rwm"]["pending"].shape == (2, 8, 2)


def test_the_checkpoint_alone_and_the_export_rebuild_the_trained_model(tmp_path, repo,
                                                                        copy_dataset):  # fmt: skip
    """Names, angles and normalization travel in the state dict and the export: both
    predict from the dataset's windows exactly as the trained model does, without the
    recipe."""
    import slhub
    from slhub.export import load, read_manifest

    dataset = copy_dataset("robomimic.hdf5")
    angles = {"rwm": {"angles": ["obs/qpos[2]"]}}
    recipe = _recipe(repo, tmp_path, dataset, FORMATS["robomimic.hdf5"], **angles)
    slhub.train(recipe)
    checkpoint = tmp_path / "run" / "last.pt"
    model = WorldModel.from_state_dict(torch.load(checkpoint, weights_only=True)["model"])
    assert model.layout.angle_names == ("obs/qpos[2]",)
    assert model.layout.state_names[:2] == ("obs/qpos[0]", "obs/qpos[1]")
    assert model.layout.state_names[6] == "obs/qvel[0]"
    assert model.layout.feature_dim == 12 + 3 + 1
    assert not torch.equal(model.delta_std, torch.ones(12))

    out = tmp_path / "export"
    command = [sys.executable, "-m", "slhub", "export", "--checkpoint", str(checkpoint),
               "--out", str(out)]  # fmt: skip
    proc = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    manifest = read_manifest(out)
    assert manifest["kind"] == "rwm" and manifest["layout"]["angles"] == ["obs/qpos[2]"]
    assert manifest["input_names"] == ["actions[0]", "actions[1]", "actions[2]"]
    exported = load(out)
    assert isinstance(exported, WorldModel) and not exported.training
    windows = torch.randn(5, 7, 12, dtype=torch.float64).float(), torch.randn(5, 6, 3)
    with torch.no_grad():
        assert torch.equal(exported(*windows, 3), model(*windows, 3))
    for key, value in model.state_dict().items():
        assert torch.equal(exported.state_dict()[key], value), key


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def test_two_gloo_workers_train_from_a_dataset(tmp_path, repo, copy_dataset):
    dataset = copy_dataset("nerd_trajectories.hdf5")
    recipe = _recipe(repo, tmp_path, dataset, FORMATS["nerd_trajectories.hdf5"])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                "--nproc-per-node=2", "-m", "slhub", "train", "--config", str(recipe)]  # fmt: skip
    proc = subprocess.run(torchrun, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["world_size"] == 2 and run["datasets"]["data"]["fingerprint"]["format"] == "nerd"
    ranks = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["ranks"]
    assert len(ranks) == 2 and not torch.equal(ranks[0]["sampler"], ranks[1]["sampler"])
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows if "validation/relative_error" in r] == [3, 6]


@pytest.mark.slow
def test_two_gloo_workers_resume_exactly(tmp_path, repo, copy_dataset):
    dataset = copy_dataset("lerobot_v30")
    recipe = _recipe(repo, tmp_path, dataset, FORMATS["lerobot_v30"])
    check_resume_and_revalidate(
        recipe, RwmPlugin(), stop_at=_stop_at(), workdir=tmp_path / "runs", workers=2, cwd=repo
    )


@pytest.mark.parametrize(
    ("features", "changes", "match"),
    [
        ({"state": ["nope"], "action": ["action"]}, {}, "names feature 'nope'"),
        (FORMATS["replay.zarr"], {"rwm": {"horizon": 25}},
         "rwm.history 4 + rwm.horizon 25 need validation episodes of 29 steps; the longest has"),
        (FORMATS["replay.zarr"], {"rwm": {"horizon": 60}}, "every train episode is shorter"),
        (FORMATS["replay.zarr"], {"rwm": {"angles": ["theta"]}}, "angle 'theta' is not a state"),
        (FORMATS["replay.zarr"], {"data": {"window": {"pad": True}}}, "whole windows only"),
        (FORMATS["replay.zarr"], {"data": {"max_force": 3.0}}, "belongs to the cart-pole"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_leaves_no_run(tmp_path, repo, copy_dataset, features,
                                                 changes, match):  # fmt: skip
    dataset = copy_dataset("replay.zarr")
    recipe = _recipe(repo, tmp_path, dataset, features, **changes)
    proc = subprocess.run(
        [sys.executable, "-m", "slhub", "train", "--config", str(recipe)],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("slhub: error: ") and match in lines[0], lines[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
