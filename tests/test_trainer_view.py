"""Hooks receive the :class:`slhub.Trainer` view and nothing else of the engine.

A hook reading the loop's plugin manager, checkpoint component or recipe fails
in a run (one line) and in a unit test alike; every hook implementation of slhub
and its plugins says so in its annotation; and no production module leans on the
test helpers of :mod:`slhub.testing`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import slhub
from helpers import REPO, SL_DDP
from slhub.errors import RankFailure
from slhub.standalone import standalone_trainer
from slhub.testing import StandInTrainer, stand_in
from slhub.view import MEMBERS, TrainerView, protocol_members

#: Production code: slhub's modules and the plugin packages' sources.
PRODUCTION = [
    *sorted((REPO / "slhub").rglob("*.py")),
    *sorted((REPO / "plugins").glob("*/src/**/*.py")),
]

SHORT = ("trainer.steps=2", "trainer.validate_every=2", "trainer.save_every=2")


def test_the_view_holds_exactly_the_protocols_members():
    public = {name for name in dir(TrainerView) if not name.startswith("_")}
    assert public == MEMBERS == protocol_members(slhub.Trainer)
    assert "register_state" in MEMBERS and "checkpoints" not in MEMBERS


def test_the_view_is_a_trainer_and_refuses_everything_else():
    trainer = StandInTrainer(batch_size=4, step=2)
    assert isinstance(trainer, slhub.Trainer) and type(trainer) is TrainerView
    assert (trainer.batch_size, trainer.step, trainer.is_main) == (4, 2, True)
    for name in ("checkpoints", "hook", "plugins", "recipe", "calls", "saved", "build"):
        with pytest.raises(AttributeError, match="hooks receive the slhub.Trainer view, whose "
                           "members are batch_size, config,"):  # fmt: skip
            getattr(trainer, name)
    with pytest.raises(AttributeError, match="cannot set trainer.step"):
        trainer.step = 3
    with pytest.raises(AttributeError, match="cannot set trainer._backend"):
        trainer._backend = None
    stand_in(trainer).step = 3  # a test changes what is behind the view
    assert trainer.step == 3  # read live


def test_the_production_factory_builds_the_same_view(tmp_path: Path):
    trainer = standalone_trainer(output_dir=str(tmp_path), rank=1, world_size=2)
    assert type(trainer) is TrainerView and not trainer.is_main
    assert trainer.save("x") is None and stand_in(trainer).saved == ["x"]

    class Stateful:
        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    thing = Stateful()
    trainer.register_state("thing", thing)
    assert stand_in(trainer).registered == {"thing": thing}
    with pytest.raises(slhub.PluginError, match="registered twice"):
        trainer.register_state("thing", thing)
    with pytest.raises(slhub.PluginError, match="has no state_dict"):
        trainer.register_state("other", object())


@pytest.mark.parametrize(
    ("hook", "attribute"),
    [("build_model", "recipe"), ("admit", "hook"), ("on_commit", "checkpoints"),
     ("validate", "plugins")],
)  # fmt: skip
def test_a_hook_reaching_into_the_engine_fails_the_run(
    tmp_path: Path, monkeypatch, hook: str, attribute: str
):
    monkeypatch.setenv("SLHUB_REACH_HOOK", hook)
    monkeypatch.setenv("SLHUB_REACH_ATTR", attribute)
    with pytest.raises((AttributeError, RankFailure), match="hooks receive the slhub.Trainer"):
        slhub.train(
            SL_DDP,
            [*SHORT, "plugin=slhub_testplugins:ReachesIntoEngine",
             f"trainer.output_dir={tmp_path / 'o'}"],
        )  # fmt: skip


def test_a_hook_reaching_into_the_engine_is_one_line(tmp_path: Path, monkeypatch, capsys):
    """The plugin's traceback is logged, and the run ends with the usual one line."""
    from slhub import cli

    monkeypatch.setenv("SLHUB_REACH_HOOK", "on_commit")
    monkeypatch.setenv("SLHUB_REACH_ATTR", "checkpoints")
    code = cli.main(
        ["train", "--config", str(SL_DDP), *[f"--set={s}" for s in SHORT],
         "--set=plugin=slhub_testplugins:ReachesIntoEngine",
         f"--set=trainer.output_dir={tmp_path / 'o'}"]
    )  # fmt: skip
    errors = [line for line in capsys.readouterr().err.splitlines() if "slhub: error:" in line]
    assert code == 2 and len(errors) == 1, errors
    assert errors[0].startswith(
        "slhub: error: rank 0 failed during commit: AttributeError: trainer has no attribute "
        "'checkpoints': hooks receive the slhub.Trainer view, whose members are batch_size,"
    ), errors


def _hookimpls(tree: ast.AST):
    """Every function decorated with ``hookimpl`` / ``slhub.hookimpl`` (called or not)."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name == "hookimpl":
                yield node
                break


def _is_trainer(annotation: ast.expr | None) -> bool:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value in ("Trainer", "slhub.Trainer")
    if isinstance(annotation, ast.Name):
        return annotation.id == "Trainer"
    return (
        isinstance(annotation, ast.Attribute)
        and annotation.attr == "Trainer"
        and isinstance(annotation.value, ast.Name)
        and annotation.value.id == "slhub"
    )


def test_every_hook_implementation_annotates_trainer_as_the_protocol():
    wrong, seen = [], 0
    for path in PRODUCTION:
        for function in _hookimpls(ast.parse(path.read_text(encoding="utf-8"))):
            args = function.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if arg.arg == "trainer":
                    seen += 1
                    if not _is_trainer(arg.annotation):
                        shown = ast.unparse(arg.annotation) if arg.annotation else "nothing"
                        where = path.relative_to(REPO)
                        wrong.append(f"{where}:{function.lineno} {function.name}: {shown}")
    assert seen > 20, seen
    assert not wrong, "trainer must be annotated slhub.Trainer:\n" + "\n".join(wrong)


def test_no_production_module_imports_slhub_testing():
    found = []
    for path in PRODUCTION:
        if path == REPO / "slhub" / "testing.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                modules = [node.module or ""]
                if node.module == "slhub":
                    modules += [f"slhub.{alias.name}" for alias in node.names]
            else:
                continue
            if any(m == "slhub.testing" or m.startswith("slhub.testing.") for m in modules):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, f"production code imports slhub.testing: {found}"
