"""Bad inputs a user may give (a recipe, a path, a plugin's values): each is refused in
one line, exit 2 (or the documented status), and leaves no artifact behind; or, where the
input is good (a YAML merge key, ``~`` in a path), it works as the user meant."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

import slhub
from helpers import REPO, SL_DDP, cli_error, strict_json
from helpers import write_recipe as _write
from slhub import cli, hookimpl
from slhub.recipe import MAX_ALIAS_NODES, load_recipe

#: Nine levels of ten aliases each, as keys of a section: 10**9 nodes once expanded from
#: 400 bytes written.
BOMB = "".join(
    f"  {name}: &{name} [{', '.join([f'*{prev}' if prev else 'x'] * 10)}]\n"
    for prev, name in zip(["", *"abcdefgh"], "abcdefghi")
)


class FreeFormSection(BaseModel):
    """A plugin section that takes any keys (as loggers' and trackers' options often do)."""

    model_config = ConfigDict(extra="allow")


class FreeForm:
    """An extra plugin owning the free-form section ``notes``."""

    @hookimpl
    def recipe_sections(self):
        return {"notes": FreeFormSection}


def _free_form(tmp_path: Path) -> Path:
    """sl_ddp with the extra plugin FreeForm, writing into tmp_path/out."""
    return _write(
        tmp_path / "r.yaml",
        plugins=["test_newcomer_inputs:FreeForm"],
        trainer__output_dir=str(tmp_path / "out"),
        trainer__steps=2,
    )


def _recipe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


# --- YAML: merge keys accepted, alias expansion bounded --------------------------------


def test_yaml_merge_key_is_accepted(capsys, tmp_path: Path):
    text = f"""
plugin: examples.sl_ddp.plugin:SlDdpPlugin
plugins: [test_newcomer_inputs:FreeForm]
notes:
  defaults: &defaults
    steps: 2
    batch_size: 8
    lr: 0.001
    output_dir: {tmp_path / "out"}
    device: cpu
trainer:
  <<: *defaults
  batch_size: 4
"""
    recipe = load_recipe(_recipe(tmp_path, text))
    assert (recipe.trainer.steps, recipe.trainer.batch_size) == (2, 4)  # merged, then overridden
    assert cli.main(["train", "--config", str(tmp_path / "r.yaml")]) == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "last.pt").is_file()


def test_yaml_merge_key_in_a_set_value():
    recipe = load_recipe(SL_DDP, ["model={<<: {hidden: 8}, extra: 1}"])
    assert recipe.data["model"] == {"hidden": 8, "extra": 1}


def test_repeated_keys_beside_a_merge_key_are_still_refused(capsys, tmp_path: Path):
    text = SL_DDP.read_text().replace("model:\n", "base: &b {hidden: 3}\nmodel:\n  <<: *b\n")
    text = text.replace("  hidden: 32", "  hidden: 32\n  hidden: 16")
    line = cli_error(capsys, "train", "--config", str(_recipe(tmp_path, text)))
    assert "duplicate key 'hidden'" in line


def test_alias_bomb_in_a_recipe_is_refused_before_any_artifact(capsys, tmp_path: Path):
    text = _free_form(tmp_path).read_text() + "notes:\n" + BOMB + "  bomb: *i\n"
    line = cli_error(capsys, "train", "--config", str(_recipe(tmp_path, text)))
    assert "r.yaml: YAML aliases expand to" in line and str(MAX_ALIAS_NODES) in line
    assert not (tmp_path / "out").exists()


def test_alias_bomb_in_a_set_value_is_refused_before_any_artifact(capsys, tmp_path: Path):
    value = "{" + BOMB.strip().replace("\n  ", ", ") + "}"
    recipe = str(_free_form(tmp_path))
    line = cli_error(capsys, "train", "--config", recipe, "--set", f"notes.bomb={value}")
    assert line.startswith("slhub: error: --set notes.bomb=") and "YAML aliases expand" in line
    assert len(line) < 300
    assert not (tmp_path / "out").exists()


def test_a_free_form_section_trains(capsys, tmp_path: Path):
    text = _free_form(tmp_path).read_text() + "notes:\n  a: &s [1, 2]\n  b: *s\n"
    assert cli.main(["train", "--config", str(_recipe(tmp_path, text))]) == 0
    assert (tmp_path / "out" / "last.pt").is_file()


# --- `~` in every path a user writes -----------------------------------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    """A home directory of its own and a working directory apart from it."""
    monkeypatch.syspath_prepend(str(REPO))  # the example plugin, from any directory
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path / "home"


def test_tilde_in_output_dir_is_the_home_directory(capsys, home: Path):
    _write(home / "r.yaml", trainer__steps=2, trainer__output_dir="~/runs/a")
    assert cli.main(["train", "--config", "~/r.yaml"]) == 0, capsys.readouterr().err
    assert (home / "runs" / "a" / "last.pt").is_file()
    assert load_recipe(home / "r.yaml").trainer.output_dir == str(home / "runs" / "a")
    assert not list(home.parent.glob("*/~"))  # no directory literally named ~


def test_tilde_in_set_and_cli_path_arguments(capsys, home: Path):
    _write(home / "r.yaml", trainer__steps=2, trainer__save_every=1)
    argv = ["train", "--config", "~/r.yaml", "--set", "trainer.output_dir=~/runs/b"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert (home / "runs" / "b" / "step_1.pt").is_file()
    resumed = [*argv[:-1], "trainer.output_dir=~/runs/c", "--resume", "~/runs/b/step_1.pt"]
    assert cli.main(resumed) == 0, capsys.readouterr().err
    assert (home / "runs" / "c" / "last.pt").is_file()
    capsys.readouterr()
    assert cli.main(["inspect", "~/runs/c/last.pt"]) == 0, capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert cli.main(["plot", "~/runs/c", "--out", "~/c.png"]) == 0, capsys.readouterr().err
    assert (home / "c.png").is_file()
    assert not list(home.parent.glob("*/~"))


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "~nosuchuser-slhub/last.pt"],
        ["train", "--config", "~nosuchuser-slhub/r.yaml"],
        ["train", "--config", "{recipe}", "--set", "trainer.output_dir=~nosuchuser-slhub/x"],
    ],
)
def test_tilde_of_an_unknown_user_is_refused(capsys, tmp_path: Path, argv):
    recipe = _write(tmp_path / "r.yaml", trainer__output_dir=str(tmp_path / "out"))
    line = cli_error(capsys, *[a.replace("{recipe}", str(recipe)) for a in argv])
    assert "~nosuchuser-slhub: no such user's home directory" in line
    assert not (tmp_path / "out").exists()


# --- `--set` cannot index into a list ----------------------------------------------------


@pytest.mark.parametrize("given", [False, True])
def test_set_into_a_list_says_how_to_give_one(capsys, tmp_path: Path, given: bool):
    changes = {"trainer__stop_signals": ["SIGTERM"]} if given else {}
    recipe = _write(tmp_path / "r.yaml", trainer__output_dir=str(tmp_path / "out"), **changes)
    line = cli_error(
        capsys, "train", "--config", str(recipe), "--set", "trainer.stop_signals.0=SIGINT"
    )
    assert "--set cannot index into a list" in line
    assert """--set 'trainer.stop_signals=["SIGINT"]'""" in line
    assert not (tmp_path / "out").exists()


# --- metrics.jsonl is strict JSON, non-finite values included ----------------------------


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_metrics_jsonl_is_strict_json_and_reads_back_non_finite_values(
    capsys, tmp_path: Path, log_format: str
):
    recipe = _write(
        tmp_path / "r.yaml",
        plugins=["slhub_testplugins:NonFinite"],
        trainer__steps=2,
        trainer__validate_every=1,
        trainer__output_dir=str(tmp_path / "out"),
    )
    argv = ["train", "--config", str(recipe), "--log-format", log_format]
    assert cli.main(argv) == 0, capsys.readouterr().err
    path = tmp_path / "out" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    for line in lines:
        strict_json(line)  # jq and other parsers accept it
    assert any('"validation/nan": "NaN"' in line for line in lines)
    records = slhub.read_metrics(str(path))  # a str, as well as a Path
    assert records == slhub.read_metrics(path)
    validation = [r for r in records if "validation/ok" in r]
    assert len(validation) == 2
    for record in validation:
        assert math.isnan(record["validation/nan"])
        assert record["validation/inf"] == math.inf and record["validation/ninf"] == -math.inf
    assert all(math.isnan(r["train/nan"]) for r in records if "train/loss" in r)


def test_old_bare_non_finite_lines_still_read(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": NaN}\n{"step": 2, "train/loss": "-Infinity"}\n')
    records = slhub.read_metrics(path)
    assert math.isnan(records[0]["train/loss"]) and records[1]["train/loss"] == -math.inf


def test_plot_and_tensorboard_take_non_finite_values(tmp_path: Path):
    from slhub.plot import collect

    path = tmp_path / "metrics.jsonl"
    path.write_text(  # as written now, and the bare constants of older files
        '{"step": 1, "train/loss": 2.0, "validation/mse": "NaN"}\n'
        '{"step": 2, "train/loss": Infinity, "validation/mse": 1.0}\n'
        '{"step": 3, "train/loss": 1.0, "validation/mse": -Infinity}\n'
        '{"step": 4, "train/loss": NaN, "validation/mse": "Infinity"}\n'
    )
    series, _ = collect(tmp_path)
    assert series == {"train/loss": ([1, 3], [2.0, 1.0]), "validation/mse": ([2], [1.0])}
    tensorboard = pytest.importorskip("slhub_tensorboard.plugin")
    shown = tensorboard.scalars({"train/a": "NaN", "train/b": float("inf"), "train/c": "-Infinity"})
    assert math.isnan(shown["train/a"]) and shown["train/b"] == math.inf
    assert shown["train/c"] == -math.inf


# --- an export cannot name a file outside itself; a damaged one is an slhub error ---------


@pytest.fixture
def export(tmp_path: Path) -> Path:
    """A real NeRD export of a tiny model, and a copy of its weights outside it."""
    from test_nerd_model import build, export_v1

    _, _, model = build(tmp_path)
    out = export_v1(model, tmp_path)
    shutil.copy(out / "model.safetensors", tmp_path / "outside.safetensors")
    return out


def _name_weights(export: Path, name: str) -> None:
    manifest = json.loads((export / "export.json").read_text())
    (export / "export.json").write_text(json.dumps({**manifest, "weights": name}))


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_export_weights_outside_the_directory_are_refused(export: Path, how: str):
    from slhub.export import load

    outside = export.parent / "outside.safetensors"
    if how == "dotdot":
        _name_weights(export, "../outside.safetensors")
    elif how == "absolute":
        _name_weights(export, str(outside))
    else:
        (export / "model.safetensors").unlink()
        (export / "model.safetensors").symlink_to(outside)
    with pytest.raises(slhub.ExportError, match="leaves the export directory"):
        load(export)


def _damage_arch(export: Path, field: str, value: int) -> None:
    from safetensors.torch import load_file, save_file

    from slhub.builtin.nerd.model import NerdArch

    path = export / "model.safetensors"
    state = {key: tensor.clone() for key, tensor in load_file(str(path)).items()}
    state["nerd_arch"][1 + NerdArch.FIELDS.index(field)] = value
    save_file(state, str(path))


@pytest.mark.parametrize(
    ("damage", "value", "expected"),
    [
        ("truncated", None, "cannot be read"),
        ("width", 2**60, "position has shape [5, 16], the architecture needs [5, 2**60]"),
        ("history", 10**9, "position has shape [5, 16], the architecture needs [10**9, 16]"),
        ("layers", 10**6, "blocks.999999.mlp.0.weight has shape none (absent)"),
        ("mlp_hidden", 2**40, "blocks.0.mlp.0.weight has shape [64, 16], the architecture"),
    ],
)
def test_a_damaged_export_is_an_export_error(export: Path, damage: str, value, expected: str):
    """Refused on shapes, before a model of the size the damaged buffer says is built."""
    from slhub.export import load

    weights = export / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    else:
        _damage_arch(export, damage, value)
    with pytest.raises(slhub.ExportError) as caught:
        load(export)
    expected = expected.replace("2**60", str(2**60)).replace("10**9", str(10**9))
    assert expected in str(caught.value) and str(weights) in str(caught.value)


# --- a plugin named by its file is pointed to the module:object form ---------------------


@pytest.mark.parametrize(
    ("key", "spec", "expected"),
    [
        (
            "plugin",
            "my_plugin.py",
            "my_plugin.py is a file path; name the plugin as module:object, e.g. "
            "my_plugin:MyPlugin, with its folder on PYTHONPATH or as the working directory",
        ),
        (
            "plugin",
            "examples/sl_ddp/plugin.py:SlDdpPlugin",
            "e.g. plugin:SlDdpPlugin with examples/sl_ddp on PYTHONPATH, or "
            "examples.sl_ddp.plugin:SlDdpPlugin run from the folder that holds examples",
        ),
        ("plugins", "/opt/loggers/csv_logger.py", "e.g. csv_logger:CsvLogger with /opt/loggers"),
    ],
)
def test_a_plugin_given_as_a_file_path(capsys, tmp_path: Path, key: str, spec: str, expected):
    value = [spec] if key == "plugins" else spec
    recipe = _write(tmp_path / "r.yaml", trainer__output_dir=str(tmp_path / "out"), **{key: value})
    line = cli_error(capsys, "train", "--config", str(recipe))
    assert expected in line
    assert not (tmp_path / "out").exists()


def test_a_plugin_module_not_found_says_where_to_run(capsys, tmp_path: Path):
    recipe = _write(
        tmp_path / "r.yaml", plugin="no_such_pkg_xyz.plugin:P", trainer__output_dir=str(tmp_path)
    )
    line = cli_error(capsys, "train", "--config", str(recipe))
    assert "No module named 'no_such_pkg_xyz'" in line
    assert "run slhub from the folder that holds no_such_pkg_xyz, or put that folder on" in line


# --- JSON error events carry timestamp and run_id like every other event -----------------


class FailsAtUpdate2:
    """An extra plugin whose update 2 fails with an slhub error (a run already under way)."""

    @hookimpl
    def on_commit(self, trainer, step, metrics):
        if step == 2:
            raise slhub.SlhubError("injected failure at update 2")


def _json_events(err: str) -> list[dict]:
    return [json.loads(line) for line in err.splitlines() if line.strip()]


def test_json_error_event_of_a_failed_run_has_timestamp_and_run_id(capsys, tmp_path: Path):
    recipe = _write(
        tmp_path / "r.yaml",
        plugins=["test_newcomer_inputs:FailsAtUpdate2"],
        trainer__steps=4,
        trainer__output_dir=str(tmp_path / "out"),
    )
    assert cli.main(["train", "--config", str(recipe), "--log-format", "json"]) == 2
    events = _json_events(capsys.readouterr().err)
    start, last = events[0], events[-1]
    assert start["event"] == "start" and last["event"] == "error"
    assert "injected failure at update 2" in last["message"]
    assert last["run_id"] == start["run_id"] and last["run_id"]
    assert set(start) - {"total", "device", "threads"} <= set(last)  # every field an event has
    assert last["timestamp"].endswith("Z") and last["timestamp"] >= start["timestamp"]


def test_json_error_event_before_any_run_has_timestamp_and_a_null_run_id(capsys, tmp_path):
    recipe = _write(tmp_path / "r.yaml", trainer__output_dir=str(tmp_path / "out"))
    argv = ["train", "--config", str(recipe), "--set", "trainer.lr=-1", "--log-format", "json"]
    assert cli.main(argv) == 2
    (event,) = _json_events(capsys.readouterr().err)
    assert event["event"] == "error" and "trainer.lr: must be > 0" in event["message"]
    assert event["run_id"] is None and event["timestamp"].endswith("Z")
    assert not (tmp_path / "out").exists()


def test_tilde_in_plugin_owned_paths_is_the_home_directory():
    """``data.cache_dir`` (NeRD, RWM) and ``tensorboard.log_dir`` expand ``~`` too."""
    import os

    from slhub_rwm.sections import RwmDataSection as RwmData
    from slhub_tensorboard.plugin import TensorBoardSection

    from slhub.builtin.nerd.sections import NerdDataSection

    home = os.path.expanduser("~/slhub-cache")
    assert NerdDataSection(cache_dir="~/slhub-cache").cache_dir == home
    assert RwmData(cache_dir="~/slhub-cache").cache_dir == home
    assert TensorBoardSection(log_dir="~/slhub-cache").log_dir == home
