"""Recipe validation, overrides and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SL_DDP, cli_error, one_line_error, run_cli, write_recipe
from slhub.errors import RecipeError
from slhub.recipe import apply_overrides, load_recipe, recipe_differences


def test_overrides_later_wins_and_parse_yaml_scalars():
    data = apply_overrides(
        {"trainer": {"lr": 0.1}},
        ["trainer.lr=0.5", "trainer.lr=1e-3", "trainer.device=cpu", "model.hidden=8"],
    )
    assert data == {"trainer": {"lr": 0.001, "device": "cpu"}, "model": {"hidden": 8}}


def test_override_validated_like_the_file_and_named_in_the_error():
    with pytest.raises(RecipeError, match=r"^--set trainer\.lr=0: trainer\.lr: must be > 0"):
        load_recipe(SL_DDP, ["trainer.lr=0"])
    with pytest.raises(RecipeError, match=r"trainer\.device: must be one of 'auto', 'cpu' or"):
        load_recipe(SL_DDP, ["trainer.device=tpu"])


def test_malformed_override_is_refused():
    with pytest.raises(RecipeError, match="expected KEY.PATH=VALUE"):
        load_recipe(SL_DDP, ["trainer.lr"])


def test_a_key_absent_from_a_recorded_recipe_equals_one_set_to_none():
    """A section key added since a checkpoint was written (default None) is no
    difference; a value where the record had none still is."""
    recorded = {"model": {"width": 8}, "trainer": {"lr": 0.1}}
    now = {"model": {"width": 8, "frame": None}, "trainer": {"lr": 0.1, "best": None}}
    assert recipe_differences(recorded, now) == []
    assert recipe_differences(recorded, {**now, "model": {"width": 8, "frame": "body"}}) == [
        "model.frame (absent -> 'body')"
    ]


def test_recipe_differences_ignore_resumable_keys():
    a = {"trainer": {"steps": 1, "output_dir": "a", "lr": 0.1}, "model": {"hidden": 3}}
    b = {"trainer": {"steps": 9, "output_dir": "b", "lr": 0.2}, "model": {}}
    assert recipe_differences(a, b) == ["model.hidden (3 -> absent)", "trainer.lr (0.1 -> 0.2)"]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown_key", "bad.yaml: trainer.batchsize: unknown key"),
        ("negative_batch", "bad.yaml: trainer.batch_size: must be > 0"),
        ("missing_plugin", 'slhub plugin "no_such_plugin" is not installed'),
        ("yaml_syntax", "bad.yaml: YAML syntax error at line"),
        ("missing_file", "missing.yaml: no such recipe file"),
        ("plugin_section", "bad.yaml: model.hidden: must be > 0"),
        ("unknown_section", "bad.yaml: optimiser: unknown key"),
        ("not_a_mapping", "bad.yaml: a recipe must be a YAML mapping"),
    ],
)
def test_bad_recipes_exit_2_with_one_line(capsys, tmp_path: Path, case: str, expected: str):
    bad = tmp_path / "bad.yaml"
    out = f"trainer__output_dir={tmp_path / 'out'}"
    key, value = out.split("=")
    if case == "unknown_key":
        write_recipe(bad, trainer__batchsize=3, **{key: value})
    elif case == "negative_batch":
        write_recipe(bad, trainer__batch_size=-4, **{key: value})
    elif case == "missing_plugin":
        write_recipe(bad, plugin="no_such_plugin", **{key: value})
    elif case == "yaml_syntax":
        bad.write_text("plugin: x\ntrainer: {steps: 3\n")
    elif case == "missing_file":
        bad = tmp_path / "missing.yaml"
    elif case == "plugin_section":
        write_recipe(bad, model__hidden=0, **{key: value})
    elif case == "unknown_section":
        write_recipe(bad, optimiser={"kind": "sgd"}, **{key: value})
    elif case == "not_a_mapping":
        bad.write_text("- just\n- a list\n")
    line = cli_error(capsys, "train", "--config", str(bad))
    assert expected in line
    assert not (tmp_path / "out").exists()


def test_unknown_cli_option_exits_2():
    """End to end, in a separate process (helpers.run_cli): argparse's exit is one line, 2."""
    proc = run_cli("train", "--config", str(SL_DDP), "--bogus")
    assert one_line_error(proc).startswith("slhub: error: unrecognized arguments: --bogus")
