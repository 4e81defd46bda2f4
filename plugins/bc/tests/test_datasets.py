"""State and visual BC trained from every shared reference format (tests/data/datasets:
files written by LeRobot, Minari, h5py in robomimic's and NeRD's layouts, and zarr),
with observation histories, padded action chunks and an exact resume at a random update;
on one process, and on 2 Gloo workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import slhub
import torch
import yaml
from slhub.data import open_dataset
from slhub.testing import StandInTrainer, assert_tree_equal, build, check_resume_and_revalidate

from slhub_bc.plugin import BcPlugin

#: Every format, the features state BC reads from it.
STATE = {
    "lerobot_v30": {"observation": ["observation.state"], "action": ["action"]},
    "lerobot_v30_images": {"observation": ["observation.state"], "action": ["action"]},
    "lerobot_v21": {"observation": ["observation.state"], "action": ["action"]},
    "minari_hdf5": {"observation": ["observations"], "action": ["actions"]},
    "minari_arrow": {"observation": ["observations"], "action": ["actions"]},
    "robomimic.hdf5": {"observation": ["obs/qpos", "obs/qvel"], "action": ["actions"]},
    "replay.zarr": {"observation": ["state"], "action": ["action"]},
    "replay_v3.zarr": {"observation": ["state"], "action": ["action"]},
    "nerd_trajectories.hdf5": {"observation": ["states"], "action": ["joint_acts"]},
}
#: Every format with frames (48 x 48 RGB), the features visual BC reads: cameras only, or
#: cameras and a state vector; robomimic's two image features stand for two cameras.
VISUAL = {
    "lerobot_v30": {"image": ["observation.images.front"], "action": ["action"]},
    "lerobot_v30_images": {
        "image": ["observation.images.front"],
        "observation": ["observation.state"],
        "action": ["action"],
    },
    "lerobot_v21": {"image": ["observation.images.front"], "action": ["action"]},
    "robomimic.hdf5": {
        "image": ["obs/front_image", "next_obs/front_image"],
        "observation": ["obs/qpos"],
        "action": ["actions"],
    },
    "replay.zarr": {"image": ["img"], "action": ["action"]},
}


def _recipe(tmp_path: Path, repo: Path, dataset: Path, observation: str, features: dict) -> Path:
    """The example recipe made tiny, training on ``dataset``: 2 observation steps, a
    padded 16-step action chunk, one validation episode; an EMA of the weights, and for
    the visual policy a random 40 x 40 crop of the 48 x 48 frames (every format
    resumes bit-exact with both on)."""
    raw = yaml.safe_load((repo / f"examples/bc/{observation}.yaml").read_text())
    raw["trainer"].update(
        steps=6, batch_size=4 if observation == "visual" else 8, validate_every=3,
        save_every=3, device="cpu", output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    raw["bc"].update(
        history=2, frame_gap=1, chunk=16, hidden=16, channels=4, val_stride=2, rollouts=0
    )
    if observation == "visual":
        raw["bc"]["crop"] = 40
    raw["ema"] = {"decay": 0.9}
    raw["data"] = {
        "path": str(dataset),
        "split": {"validation_ratio": 0.25, "seed": 0},
        "window": {"pad": True},
        "features": features,
    }
    path = tmp_path / f"{observation}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _check(tmp_path, repo, copy_dataset, name, observation, features, **resume):
    dataset = copy_dataset(name)
    recipe = _recipe(tmp_path, repo, dataset, observation, features)
    stop_at = int(np.random.default_rng().integers(2, 6))
    check = check_resume_and_revalidate(
        recipe, BcPlugin(), stop_at=stop_at, workdir=tmp_path / "runs", cwd=repo, **resume
    )
    final = check.final("resumed")
    assert final.ema is not None and final.ema.step == final.step
    recorded = final.run["datasets"]["data"]
    assert recorded["fingerprint"]["format"] == open_dataset(dataset).format
    assert len(recorded["split"]["validation"]) == 1
    return check


@pytest.mark.parametrize("name", sorted(STATE))
def test_state_bc_trains_from_every_format_and_resumes_exactly(tmp_path, repo, copy_dataset, name):
    check = _check(tmp_path, repo, copy_dataset, name, "state", STATE[name], in_process=True)
    model = check.final("resumed").model
    dims = {"robomimic.hdf5": 12, "nerd_trajectories.hdf5": 12}.get(name, 11)
    assert model["observation_mean"].shape == (dims,)
    assert model["net.0.weight"].shape[1] == 2 * dims  # two observation steps
    assert model["net.4.weight"].shape[0] == 16 * model["action_mean"].shape[0]  # the chunk


@pytest.mark.parametrize("name", sorted(VISUAL))
def test_visual_bc_trains_from_every_format_and_resumes_exactly(tmp_path, repo, copy_dataset, name):
    check = _check(tmp_path, repo, copy_dataset, name, "visual", VISUAL[name], in_process=True)
    model = check.final("resumed").model
    cameras = len(VISUAL[name]["image"])
    assert [model[f"encoders.{i}.0.weight"].shape[1] for i in range(cameras)] == [6] * cameras
    assert f"encoders.{cameras}.0.weight" not in model  # 2 RGB frames per camera


def test_decode_threads_do_not_change_visual_bc(tmp_path, repo, copy_dataset):
    """Video windows decoded ahead on 2 threads (``data.decode``) resume exactly, and the
    run equals the one decoding in the loop's own thread, bit for bit."""
    ahead = ["data.decode.ahead=2", "data.decode.workers=2"]
    check = _check(tmp_path, repo, copy_dataset, "lerobot_v30", "visual", VISUAL["lerobot_v30"],
                   in_process=True, overrides=ahead)  # fmt: skip
    assert check.final("resumed").ranks[0]["bc"]["pending"].shape == (2, 4, 2)
    inline = tmp_path / "inline"
    slhub.train(tmp_path / "visual.yaml", ["data.decode.ahead=2", f"trainer.output_dir={inline}"])
    threaded = torch.load(check.uninterrupted / "last.pt", weights_only=True)
    assert_tree_equal(threaded["model"], torch.load(inline / "last.pt", weights_only=True)["model"])


def _torchrun(recipe: Path, repo: Path, *sets: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
        "--nproc-per-node=2", "-m", "slhub", "train", "--config", str(recipe),
        *(arg for item in sets for arg in ("--set", item)),
    ]  # fmt: skip
    return subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=300)


def test_visual_bc_trains_on_two_gloo_workers(tmp_path, repo, copy_dataset):
    """Two ranks draw their own windows from a video dataset (each its own decoder) and
    average their gradients: the run ends at its last update, validated on rank 0."""
    dataset = copy_dataset("lerobot_v30")
    recipe = _recipe(tmp_path, repo, dataset, "visual", VISUAL["lerobot_v30"])
    proc = _torchrun(recipe, repo, "trainer.steps=3", "trainer.validate_every=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert last["step"] == 3 and len(last["ranks"]) == 2
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert any("validation/mse" in line for line in lines)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "observation"), [("robomimic.hdf5", "state"), ("lerobot_v30", "visual")]
)
def test_bc_resumes_exactly_on_two_gloo_workers(tmp_path, repo, copy_dataset, name, observation):
    features = (STATE if observation == "state" else VISUAL)[name]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    _check(tmp_path, repo, copy_dataset, name, observation, features, workers=2, env=env)


@pytest.mark.parametrize(
    ("name", "observation"), [("robomimic.hdf5", "visual"), ("minari_arrow", "state")]
)
def test_the_export_carries_the_normalization_and_acts_as_the_checkpoint(
    tmp_path, repo, copy_dataset, name, observation
):
    from slhub.export import load
    from slhub.export.writer import run_export

    features = (STATE if observation == "state" else VISUAL)[name]
    dataset = copy_dataset(name)
    slhub.train(_recipe(tmp_path, repo, dataset, observation, features))
    run_export(tmp_path / "run" / "last.pt", tmp_path / "export")
    policy = load(tmp_path / "export")
    last = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    # the weights the run validated: the moving average in place of the trained parameters
    validated = {**last["model"], **last["ema"]["weights"]}
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in validated.items())
    assert set(policy.state_dict()) == set(last["model"])
    manifest = json.loads((tmp_path / "export" / "export.json").read_text())
    assert manifest["kind"] == "bc" and manifest["features"] == features
    assert manifest["offsets"] == {"observation": [-1, 0], "action": list(range(16))}
    plugin = BcPlugin()
    trainer = StandInTrainer(plugin, {k: last["run"]["recipe"][k] for k in ("bc", "data")},
                             **last["run"]["recipe"]["trainer"])  # fmt: skip
    trained = build(trainer, plugin)
    trained.load_state_dict(validated)
    batch = plugin.sample(trainer=trainer, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(policy.act(batch), trained.eval().act(batch))
    mean, std = batch["action"].mean(), policy.action_std
    assert (
        policy.act(batch).shape == batch["action"].shape and bool(mean.isfinite()) and std.min() > 0
    )
