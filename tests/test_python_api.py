"""The Python entry is as good as the CLI: ``slhub.train`` with a path, a dict or a
Recipe, plugin objects defined in the caller, a caller's ``distributed_run``, the
update number handed to ``sample``/``objective``, and ``slhub.SlhubError`` as a
plugin's one-line user error."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import yaml

import slhub
from examples.sl_ddp.plugin import SlDdpPlugin
from helpers import REPO, SL_DDP, load, metrics_of, one_line_error, run_cli, write_recipe
from slhub import hookimpl
from slhub.errors import RecipeError
from slhub.recipe import load_recipe
from slhub_testplugins import RECORD, CommitLog


def _dict_recipe(out: Path, steps: int = 4) -> dict:
    data = yaml.safe_load(SL_DDP.read_text())
    data["trainer"].update(steps=steps, output_dir=str(out), validate_every=2, save_every=2)
    return data


def test_train_accepts_a_dict_with_plugin_objects_defined_by_the_caller(tmp_path: Path):
    calls: list[int] = []

    class CellPlugin(SlDdpPlugin):  # as a notebook cell would define it
        @hookimpl
        def on_commit(self, step):
            calls.append(step)

    log = CommitLog()
    data = _dict_recipe(tmp_path / "o")
    data["commit_log"] = {"draws": 2}
    out = slhub.train(data, plugin=CellPlugin(), plugins=[log])
    assert calls == [1, 2, 3, 4] and log.commits == 4
    identity = load(out / "last.pt")["run"]
    names = [p["name"] for p in identity["source"]["plugins"]]
    assert names[0].endswith("CellPlugin") and names[1] == "slhub_testplugins:CommitLog"
    assert identity["recipe"]["plugins"] == ["slhub_testplugins:CommitLog"]


def test_train_accepts_a_path_and_a_validated_recipe_alike(tmp_path: Path):
    recipe = write_recipe(tmp_path / "r.yaml", trainer__steps=3, trainer__output_dir="x")
    a = slhub.train(recipe, [f"trainer.output_dir={tmp_path / 'a'}"])
    b = slhub.train(load_recipe(recipe, [f"trainer.output_dir={tmp_path / 'b'}"]))
    assert torch.equal(
        load(a / "last.pt")["model"]["0.weight"], load(b / "last.pt")["model"]["0.weight"]
    )


def test_train_inside_a_callers_distributed_run_uses_its_device(tmp_path: Path):
    data = _dict_recipe(tmp_path / "o", steps=2)
    data["trainer"]["device"] = "cuda"  # would be refused on this CPU-only machine...
    with slhub.distributed_run("cpu") as device:  # ...but the caller chose the device
        out = slhub.train(data)
    assert device == torch.device("cpu") and (out / "step_2.pt").is_file()


def test_sample_and_objective_receive_the_update_they_compute(tmp_path: Path):
    RECORD.pop("sample_steps", None)
    RECORD.pop("objective_steps", None)
    data = _dict_recipe(tmp_path / "o", steps=4)
    out = slhub.train(data, plugin="slhub_testplugins:SteppedProbe")
    assert RECORD["sample_steps"] == RECORD["objective_steps"] == [1, 2, 3, 4]
    RECORD["sample_steps"].clear()
    RECORD["objective_steps"].clear()
    data["trainer"]["steps"] = 6
    slhub.train(data, plugin="slhub_testplugins:SteppedProbe", resume=out / "step_4.pt")
    assert RECORD["sample_steps"] == RECORD["objective_steps"] == [5, 6]
    assert [m["step"] for m in metrics_of(out) if "train/loss" in m] == [1, 2, 3, 4, 5, 6]


def test_a_plugins_user_error_is_one_line(tmp_path: Path):
    recipe = write_recipe(
        tmp_path / "r.yaml",
        plugin="slhub_testplugins:UserErrorInBuild",
        trainer__output_dir=str(tmp_path / "o"),
    )
    line = one_line_error(run_cli("train", "--config", str(recipe)))
    assert line == "slhub: error: model.hidden must be even for this plugin (got 33)"
    assert not (tmp_path / "o").exists()


def test_a_bad_dict_recipe_raises_the_one_line_error(tmp_path: Path):
    data = _dict_recipe(tmp_path / "o")
    data["trainer"]["batch_size"] = 0
    with pytest.raises(RecipeError, match=r"^recipe: trainer.batch_size: must be > 0$"):
        slhub.train(data)


# ------------------------------------------------------------------ structure


def _imports_of(path: Path, package: str, names: bool = True) -> set[str]:
    """Every ``package`` module a file imports, at any depth (functions included).

    With ``names``, ``from a import b`` also yields ``a.b`` (b may be a module).
    """
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == package:
                found.add(node.module)
                if names:
                    found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_slhub_has_no_import_circle():
    root = REPO / "slhub"
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {
        name: {m for m in _imports_of(path, "slhub") if m in modules and m != name}
        for name, path in modules.items()
    }
    graph = {  # the package itself is the public face: importing it is not a dependency
        name: deps - {"slhub"} for name, deps in graph.items() if name != "slhub"
    }
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycle = trail[trail.index(dep) :] + [dep] if dep in trail else [node, dep]
                pytest.fail(f"import circle: {' -> '.join(cycle)}")
            if dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert "slhub.trainer" not in graph["slhub.hookspecs"]
    assert not {m for m in graph["slhub.hookspecs"] if m.startswith("slhub.")}


def test_plugins_import_only_public_slhub_modules():
    public = {"slhub", "slhub.data", "slhub.sim", "slhub.export", "slhub.testing"}
    for path in (REPO / "plugins").glob("*/**/*.py"):
        for module in _imports_of(path, "slhub"):
            packages = tuple(f"{p}." for p in public - {"slhub"})
            top_level_name = module.count(".") == 1 and module.split(".")[1] in slhub.__all__
            assert module in public or module.startswith(packages) or top_level_name, (
                f"{path.relative_to(REPO)} imports {module}"
            )
