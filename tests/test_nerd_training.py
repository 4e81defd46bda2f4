"""NeRD through the real trainer: one process and two Gloo workers, exact recovery,
v1/v2 export to identical bytes, exact exported predictions and export errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import slhub
from helpers import (
    REPO,
    assert_tree_equal,
    cli_error,
    launch_workers_ok,
    load,
    metrics_of,
    train_stopped_then_resumed,
    write_recipe,
)
from slhub import Trainer, checkpoint
from slhub.builtin.nerd.plugin import NerdPlugin
from slhub.export import load as load_export
from slhub.export.writer import run_export
from slhub.testing import StandInTrainer, build

NERD = REPO / "examples" / "nerd" / "cartpole" / "sl.train.yaml"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A tiny NeRD recipe trained alone, under 2 workers, and under 2 workers stopped + resumed."""
    tmp = tmp_path_factory.mktemp("nerd")
    recipe = write_recipe(
        tmp / "tiny.yaml",
        base=NERD,
        trainer__steps=6,
        trainer__batch_size=8,
        trainer__validate_every=3,
        trainer__save_every=3,
        trainer__output_dir=str(tmp / "ddp"),
        trainer__device="cpu",  # the example's auto would take CUDA where it is visible
        model__history=4,
        model__width=16,
        model__layers=1,
        model__heads=2,
        model__mlp_hidden=32,
        data__cache_dir=str(tmp / "cache"),
        data__generated_train={"num_trajectories": 16, "length": 20, "seed": 0},
        data__generated_validation={"num_trajectories": 4, "length": 12, "seed": 1},
        validation__horizons=[2, 8],
    )
    return _Runs(recipe, tmp)


class _Runs(dict):
    """The tiny recipe's runs, each trained on first use: ``single`` (in this process),
    ``ddp`` (2 workers) and ``resumed`` (2 workers stopped at 3, resumed into a new
    directory; only the slow recovery test asks for it)."""

    def __init__(self, recipe: Path, tmp: Path) -> None:
        super().__init__(recipe=recipe, tmp=tmp)

    def __missing__(self, name: str) -> Path:
        recipe, tmp = self["recipe"], self["tmp"]
        if name == "single":
            slhub.train(recipe, [f"trainer.output_dir={tmp / 'single'}"])
        elif name == "ddp":
            launch_workers_ok("train", "--config", str(recipe))
        elif name == "resumed":
            train_stopped_then_resumed(recipe, 3, tmp / "stopped", tmp / "resumed")
        else:
            raise KeyError(name)
        self[name] = tmp / name
        return self[name]


def _rebuilt(ckpt: dict) -> tuple[NerdPlugin, Trainer, torch.nn.Module]:
    """The plugin and the trained model as the recipe builds them (not via the export
    path), with the checkpoint's weights, in eval mode."""
    recipe = ckpt["run"]["recipe"]
    plugin = NerdPlugin()
    sections = {name: recipe[name] for name in plugin.recipe_sections()}
    trainer = StandInTrainer(
        plugin, sections, seed=recipe["trainer"]["seed"], batch_size=recipe["trainer"]["batch_size"]
    )
    model = build(trainer, plugin)
    model.load_state_dict(ckpt["model"])
    return plugin, trainer, model.eval()


def test_training_logs_rollout_and_baseline_validation(runs):
    for name in ("single", "ddp"):
        lines = [m for m in metrics_of(runs[name]) if "validation/one_step_mse" in m]
        assert [m["step"] for m in lines] == [3, 6]
        logged = {k.removeprefix("validation/"): v for k, v in lines[-1].items() if k != "step"}
        assert set(logged) == {
            "one_step_mse",
            *(f"{kind}_mse_{k}" for kind in ("rollout", "baseline", "linear") for k in (2, 8)),
        }
        assert all(math.isfinite(v) and v > 0 for v in logged.values()), logged
        # What rank 0 logged at update 6 is what validating last.pt's weights gives.
        plugin, trainer, model = _rebuilt(load(runs[name] / "last.pt"))
        with torch.no_grad():
            assert plugin.validate(trainer=trainer, model=model, step=6) == logged
    assert load(runs["ddp"] / "last.pt")["run"]["world_size"] == 2


@pytest.mark.slow  # two more 2-worker launches: `python -m pytest -m slow`
def test_interrupted_and_resumed_two_worker_run_is_bit_identical(runs):
    a, b = load(runs["ddp"] / "last.pt"), load(runs["resumed"] / "last.pt")
    assert a["step"] == b["step"] == 6
    for key in ("model", "optimizer", "ranks"):
        assert_tree_equal(a[key], b[key], key)
    assert len(a["ranks"]) == 2
    later = lambda folder: [m for m in metrics_of(folder) if m["step"] > 3]  # noqa: E731
    assert later(runs["ddp"]) == later(runs["resumed"]) and len(later(runs["ddp"])) == 4


@pytest.mark.parametrize("name", ["single", "ddp"])
def test_v1_and_v2_export_identically_and_predict_exactly(runs, tmp_path, name):
    v2_path = runs[name] / "last.pt"
    v2 = load(v2_path)
    v1_path = tmp_path / "v1.pt"
    torch.save(checkpoint.load(v2_path).to_v1(), v1_path)
    done_v2 = run_export(v2_path, tmp_path / "v2_export")
    done_v1 = run_export(v1_path, tmp_path / "v1_export")
    assert done_v2.plugin.name == done_v1.plugin.name == "nerd"
    out_v2, out_v1 = done_v2.path, done_v1.path
    assert (out_v1 / "model.safetensors").read_bytes() == (
        out_v2 / "model.safetensors"
    ).read_bytes()

    manifest_v2 = json.loads((out_v2 / "export.json").read_text())
    manifest_v1 = json.loads((out_v1 / "export.json").read_text())
    run_id = json.loads((runs[name] / "run.json").read_text())["run_id"]
    assert manifest_v2["source_run_id"] == run_id and manifest_v1["source_run_id"] is None
    assert manifest_v2["step"] == manifest_v1["step"] == 6
    assert manifest_v2["checkpoint_format"] == "slhub.checkpoint/2"
    assert manifest_v1["checkpoint_format"] == "slhub.checkpoint/1"

    p1, p2 = load_export(out_v1), load_export(out_v2)
    _, _, trained = _rebuilt(v2)
    names = p1.input_names
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randn(5, 4, 5, generator=generator)
    future = torch.randn(5, 9, 1, generator=generator) * 5
    with torch.no_grad():
        expected = trained.next_state(tokens)
        assert torch.equal(p1(tokens, input_names=names), expected)
        assert torch.equal(p2(tokens, input_names=names), expected)
        rolled = trained.rollout(tokens, future)
        assert torch.equal(p1.rollout(tokens, future, input_names=names), rolled)
        assert torch.equal(p2.rollout(tokens, future, input_names=names), rolled)
    with pytest.raises(ValueError, match="wrong order"):
        p2(tokens, input_names=list(reversed(names)))
    with pytest.raises(ValueError, match="dtype"):
        p2(tokens.double(), input_names=names)


def test_export_command_writes_safetensors_and_manifest(runs, tmp_path, capsys):
    from slhub import cli

    code = cli.main(
        ["export", "--checkpoint", str(runs["single"] / "last.pt"), "--out", str(tmp_path / "e")]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "exported" in out.out
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == [
        "export.json",
        "model.safetensors",
    ]


def test_export_errors_exit_2_with_one_line(runs, tmp_path, capsys):
    foreign = tmp_path / "foreign.pt"
    torch.save({"step": 1, "model": {"w": torch.zeros(2)}, "optimizer": {}, "rng": {}}, foreign)
    line = cli_error(capsys, "export", "--checkpoint", str(foreign), "--out", str(tmp_path / "a"))
    assert "is not a checkpoint any plugin asked can export (asked: " in line and "nerd" in line
    assert not (tmp_path / "a").exists()

    damaged = tmp_path / "damaged.pt"
    data = (runs["single"] / "last.pt").read_bytes()
    damaged.write_bytes(data[: len(data) // 2])
    line = cli_error(capsys, "export", "--checkpoint", str(damaged), "--out", str(tmp_path / "b"))
    assert "damaged" in line and not (tmp_path / "b").exists()

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    ckpt = str(runs["single"] / "last.pt")
    line = cli_error(capsys, "export", "--checkpoint", ckpt, "--out", str(busy))
    assert "not empty" in line
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]

    line = cli_error(capsys, "export", "--checkpoint", str(tmp_path / "missing.pt"), "--out", "x")
    assert "no such checkpoint" in line
