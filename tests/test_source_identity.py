"""Resume compares the code, not only the recipe: the slhub and torch versions and every
plugin's source (a path plugin by a digest of its module). A difference is refused with
one line unless the user passes --allow-source-change, and the run records what changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers import REPO, cli_error, load, write_recipe
from slhub import cli
from slhub.artifacts import read_metrics


@pytest.fixture
def path_plugin_run(tmp_path: Path, monkeypatch, capsys) -> tuple[Path, Path]:
    """A run of a copy of the sl_ddp plugin living beside the recipe (no distribution)."""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(REPO / "examples/sl_ddp/plugin.py", code / "line_plugin.py")
    monkeypatch.syspath_prepend(str(code))
    recipe = write_recipe(
        tmp_path / "r.yaml", plugin="line_plugin:SlDdpPlugin", trainer__steps=4,
        trainer__save_every=2, trainer__validate_every=0,
        trainer__output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    assert cli.main(["train", "--config", str(recipe), "--set", "trainer.steps=2"]) == 0
    capsys.readouterr()
    return recipe, tmp_path / "run"


def test_identity_records_a_digest_of_a_path_plugin(path_plugin_run):
    _, run = path_plugin_run
    (plugin,) = json.loads((run / "run.json").read_text())["source"]["plugins"]
    assert plugin["dist"] is None and len(plugin["digest"]) == 64


def test_an_edited_path_plugin_is_refused_then_accepted_on_request(path_plugin_run, capsys):
    recipe, run = path_plugin_run
    import line_plugin

    source = Path(line_plugin.__file__)
    source.write_text(source.read_text() + "\n# edited after the checkpoint\n")
    args = ["train", "--config", str(recipe), "--resume", "auto"]
    line = cli_error(capsys, *args)
    assert (
        "code differs from the checkpoint's: plugin line_plugin:SlDdpPlugin module digest" in line
    )
    assert "--allow-source-change" in line
    assert cli.main([*args, "--allow-source-change"]) == 0
    records = read_metrics(run / "metrics.jsonl", markers=True)
    marker = [m for m in records if m.get("event") == "resume"][-1]
    assert "module digest" in marker["source_changes"][0]
    after = load(run / "last.pt")["run"]
    assert after["source_changes"][0]["step"] == 2
    assert (
        after["source"]["plugins"][0]["digest"]
        != json.loads((run / "run.json").read_text())["source"]["plugins"][0]["digest"]
    )  # later checkpoints carry the code that wrote them
    # the next requeue compares with the code that wrote the last checkpoint: no flag needed
    assert cli.main([*args, "--set", "trainer.steps=6"]) == 0
    assert load(run / "last.pt")["step"] == 6


def test_another_torch_version_is_refused_and_recorded_when_allowed(path_plugin_run, capsys):
    recipe, run = path_plugin_run
    ckpt = load(run / "step_2.pt")
    ckpt["run"]["source"]["torch"] = "1.0.0"
    forged = run.parent / "old_torch.pt"
    torch.save(ckpt, forged)
    fresh = run.parent / "fresh"
    args = ["train", "--config", str(recipe), "--set", f"trainer.output_dir={fresh}"]
    line = cli_error(capsys, *args, "--resume", str(forged))
    assert f"torch 1.0.0 -> {torch.__version__}" in line and not fresh.exists()
    assert cli.main([*args, "--resume", str(forged), "--allow-source-change"]) == 0
    resumed_from = json.loads((fresh / "run.json").read_text())["resumed_from"]
    assert resumed_from["source_changes"] == [f"torch 1.0.0 -> {torch.__version__}"]
