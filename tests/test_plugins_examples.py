"""Each model package's README shows its example recipes exactly as they are in examples/;
the model examples choose their device with ``auto``, which is CPU without CUDA."""

from __future__ import annotations

import re

import pytest
import torch
import yaml

import slhub
from helpers import REPO, assert_same_final_state, metrics_of, write_recipe
from slhub.distributed import resolve_device

#: README -> the example recipes its ```yaml blocks show, in order.
READMES = {
    "plugins/rwm/README.md": ["examples/rwm/cartpole.yaml"],
    "plugins/rigidformer/README.md": ["examples/rigidformer/boxes.yaml"],
    "plugins/bc/README.md": ["examples/bc/state.yaml", "examples/bc/visual.yaml"],
}


@pytest.mark.parametrize("readme", list(READMES))
def test_readme_recipes_match_the_examples(readme: str) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / readme).read_text(), re.S)
    # whole recipes (a model plugin named) must be the example files, in order; a fragment
    # showing one section is not a recipe
    blocks = [b for b in blocks if "plugin" in (yaml.safe_load(b) or {})]
    assert len(blocks) == len(READMES[readme])
    for block, example in zip(blocks, READMES[readme], strict=True):
        assert yaml.safe_load(block) == yaml.safe_load((REPO / example).read_text()), example


#: The model examples choose their device with ``auto``; sl_ddp/cpu.yaml is CPU by name.
AUTO = [
    "examples/nerd/cartpole/sl.train.yaml",
    "examples/rwm/cartpole.yaml",
    "examples/rigidformer/boxes.yaml",
    "examples/bc/state.yaml",
    "examples/bc/visual.yaml",
]


def test_model_examples_choose_the_device_with_auto(monkeypatch) -> None:
    """``auto`` is CUDA (``cuda:LOCAL_RANK``) when visible and CPU otherwise."""
    for example in AUTO:
        assert yaml.safe_load((REPO / example).read_text())["trainer"]["device"] == "auto"
    sl_ddp = yaml.safe_load((REPO / "examples/sl_ddp/cpu.yaml").read_text())
    assert sl_ddp["trainer"]["device"] == "cpu"
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda", 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto is CPU only where CUDA is not")
def test_auto_trains_exactly_as_cpu_without_cuda(tmp_path) -> None:
    """A tiny NeRD run with the example's ``auto`` equals the same run with ``cpu``."""
    recipe = write_recipe(
        tmp_path / "tiny.yaml", base=REPO / AUTO[0], trainer__steps=4, trainer__batch_size=8,
        trainer__validate_every=2, trainer__save_every=4, model__history=4, model__width=16,
        model__layers=1, model__heads=2, model__mlp_hidden=32,
        data__cache_dir=str(tmp_path / "cache"),
        data__generated_train={"num_trajectories": 8, "length": 20, "seed": 0},
        data__generated_validation={"num_trajectories": 2, "length": 12, "seed": 1},
        validation__horizons=[2],
    )  # fmt: skip
    for device in ("auto", "cpu"):
        sets = [f"trainer.device={device}", f"trainer.output_dir={tmp_path / device}"]
        slhub.train(recipe, sets)
    assert_same_final_state(*(tmp_path / d / "last.pt" for d in ("auto", "cpu")))
    assert metrics_of(tmp_path / "auto") == metrics_of(tmp_path / "cpu")
