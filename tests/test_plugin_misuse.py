"""Plugins that misbehave at run time (found by probing the CLI): each ends the run with
one line naming the problem, agreed on every rank, before a checkpoint could be damaged.

Before the fixes: a detached loss failed in ``backward`` after the agreement, on its rank
alone (exit 1, no slhub line; under torchrun the other rank lost its connection);
``sys.exit()`` in plugin code ended the command with status 0 and no checkpoint; a numpy
array in ``save`` state was written into checkpoints that no resume could load.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from examples.sl_ddp.plugin import SlDdpPlugin
from helpers import SL_DDP, load
from slhub import LossResult, hookimpl, train
from slhub.errors import PluginError, RankFailure

SHORT = ["trainer.steps=4", "trainer.validate_every=2", "trainer.save_every=2"]


def _train(tmp_path: Path, plugin=None, plugins=None) -> Path:
    out = tmp_path / "out"
    train(SL_DDP, [*SHORT, f"trainer.output_dir={out}"], log_format="json", plugin=plugin,
          plugins=plugins)  # fmt: skip
    return out


class _DetachedLoss(SlDdpPlugin):
    @hookimpl
    def objective(self, trainer, model, batch):
        result = super().objective(trainer, model, batch)
        return LossResult(loss=result.loss.detach(), weight=result.weight)


class _ConstantLoss(SlDdpPlugin):
    @hookimpl
    def objective(self, trainer, model, batch):
        return LossResult(loss=torch.tensor(3.0), weight=4.0)


@pytest.mark.parametrize("plugin", [_DetachedLoss, _ConstantLoss], ids=["detached", "constant"])
def test_a_loss_without_grad_is_an_agreed_objective_failure(tmp_path: Path, plugin):
    with pytest.raises(RankFailure, match="during objective: LossResult.loss does not require"):
        _train(tmp_path, plugin=plugin())


class _ExitsIn(SlDdpPlugin):
    """Calls ``sys.exit(0)`` in one hook at update 2."""

    def __init__(self, hook: str) -> None:
        super().__init__()
        self.hook = hook

    @hookimpl
    def objective(self, trainer, model, batch):
        if self.hook == "objective" and trainer.step == 1:
            sys.exit(0)
        return super().objective(trainer, model, batch)

    @hookimpl
    def on_commit(self, trainer, step):
        if self.hook == "on_commit" and step == 2:
            sys.exit(0)

    @hookimpl
    def validate(self, trainer, model, step):
        if self.hook == "validate":
            sys.exit(0)
        return super().validate(trainer, model, step)


@pytest.mark.parametrize(
    ("hook", "phase"), [("objective", "objective"), ("on_commit", "commit"),
                        ("validate", "validation")],
)  # fmt: skip
def test_sys_exit_in_a_hook_is_a_rank_failure_not_a_silent_exit(tmp_path: Path, hook, phase):
    with pytest.raises(RankFailure, match=f"during {phase}: SystemExit: 0"):
        _train(tmp_path, plugin=_ExitsIn(hook))


def test_sys_exit_at_a_plugins_import_is_a_one_line_plugin_error(tmp_path: Path, monkeypatch):
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="exits_at_import:P.*failed to import: SystemExit: 0"):
        _train(tmp_path, plugins=["exits_at_import:P"])


class _OptimizerTriple(SlDdpPlugin):
    @hookimpl
    def configure_optimizers(self, trainer, model):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return optimizer, None, "extra"


def test_configure_optimizers_tuple_of_three_is_named(tmp_path: Path):
    with pytest.raises(PluginError, match=r"configure_optimizers returned a tuple of 3, expected"):
        _train(tmp_path, plugin=_OptimizerTriple())


class _RewritesStep(SlDdpPlugin):
    @hookimpl
    def on_commit(self, trainer, step, metrics):
        metrics["step"] = "zzz"
        metrics["train/extra"] = 1.0


def test_on_commit_may_add_metrics_but_not_change_the_step(tmp_path: Path):
    out = _train(tmp_path, plugin=_RewritesStep())
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_lines = [line for line in lines if "train/loss" in line]
    assert [line["step"] for line in train_lines] == [1, 2, 3, 4]
    assert all(line["train/extra"] == 1.0 for line in train_lines)


class _SavesNumpy(SlDdpPlugin):
    @hookimpl
    def state_dict(self, trainer):
        return {"counts": np.ones(3)}


def test_save_state_a_weights_only_load_refuses_fails_before_any_write(tmp_path: Path):
    with pytest.raises(
        RankFailure, match=r"checkpoint I/O: rank 0's save state holds ranks\[0\]\.counts: a "
        r"numpy\.ndarray, which a checkpoint loaded with weights_only=True cannot hold",
    ):  # fmt: skip
        _train(tmp_path, plugin=_SavesNumpy())
    assert not list((tmp_path / "out").glob("*.pt"))


def test_a_checkpoint_missing_a_ranks_random_state_is_refused(tmp_path: Path):
    """Resumed without it, the rank would continue with fresh streams: silently inexact."""
    from slhub import checkpoint
    from slhub.errors import CheckpointError

    out = _train(tmp_path)
    ckpt = load(out / "last.pt")
    ckpt["ranks"][0] = {"buffers": {}}
    torch.save(ckpt, tmp_path / "no_rng.pt")
    with pytest.raises(CheckpointError, match=r"ranks\[0\] has no rng and no sampler state"):
        checkpoint.load(tmp_path / "no_rng.pt")
    for key, value, expected in [
        ("recipe", "x", "run.recipe is a str, expected a mapping"),
        ("source", {"plugins": [1, 2]}, "run.source.plugins is not a list of plugin sources"),
    ]:
        ckpt = load(out / "last.pt")
        ckpt["run"][key] = value
        torch.save(ckpt, tmp_path / "bad_run.pt")
        with pytest.raises(CheckpointError, match=expected):
            checkpoint.load(tmp_path / "bad_run.pt")


def test_a_run_json_that_is_no_object_is_one_line(tmp_path: Path):
    from slhub.errors import ArtifactError

    out = _train(tmp_path)
    (out / "run.json").write_text("[]")
    with pytest.raises(ArtifactError, match=r"run.json: not a run identity \(holds a JSON list"):
        train(SL_DDP, [*SHORT, "trainer.steps=6", f"trainer.output_dir={out}"], resume="auto",
              log_format="json")  # fmt: skip


class _SavesInCommit(SlDdpPlugin):
    @hookimpl
    def on_commit(self, trainer, step):
        if step == 2:
            trainer.save("mine.pt")


def test_save_from_on_commit_is_refused_not_a_hang(tmp_path: Path):
    """Called there on one rank it waited the whole trainer.timeout_s for the others."""
    with pytest.raises(RankFailure, match=r"during commit: trainer.save\(\) from on_commit"):
        _train(tmp_path, plugin=_SavesInCommit())
    assert not (tmp_path / "out" / "mine.pt").exists()


class _SamplesNothing(SlDdpPlugin):
    @hookimpl
    def sample(self, trainer, generator):
        return None


def test_a_sample_returning_none_is_named(tmp_path: Path):
    with pytest.raises(RankFailure, match="during sampling: sample returned None"):
        _train(tmp_path, plugin=_SamplesNothing())


class _WeightAsText(SlDdpPlugin):
    @hookimpl
    def objective(self, trainer, model, batch):
        result = super().objective(trainer, model, batch)
        return LossResult(loss=result.loss, weight=str(int(result.weight)))


def test_a_weight_given_as_text_is_refused(tmp_path: Path):
    """float() would have read "5" as 5.0."""
    with pytest.raises(RankFailure, match="LossResult.weight must be a number or a tensor, got '"):
        _train(tmp_path, plugin=_WeightAsText())
