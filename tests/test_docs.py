"""Documentation is tested: the hook reference is generated from the contract and
current, and every public name of slhub's public modules is documented."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from helpers import REPO

DOCS = REPO / "docs"
#: Public modules whose ``__all__`` the docs must cover.
PUBLIC = ("slhub", "slhub.export", "slhub.sim", "slhub.testing")


def _script() -> ModuleType:
    name = "hook_reference"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_hook_reference_in_docs_is_current():
    script = _script()
    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    assert script.splice(text, script.render()) == text, (
        "docs/hooks.md is stale: run python scripts/hook_reference.py"
    )


def test_hook_reference_check_reports_a_stale_page(tmp_path: Path, capsys):
    script = _script()
    page = tmp_path / "hooks.md"
    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    page.write_text(text.replace("## `sample`", "## `sample` (edited by hand)"), encoding="utf-8")
    assert script.main(["--check", "--doc", str(page)]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert script.main(["--doc", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == text
    assert script.main(["--check", "--doc", str(page)]) == 0


def test_hook_reference_documents_every_hook_and_protocol_member():
    from slhub import hookspecs

    reference = _script().render()
    for name in _script().hookspecs_of(hookspecs):
        assert re.search(rf"^## `{name.__name__}`", reference, re.M), name.__name__
    members = [n for n in vars(hookspecs.Trainer) if not n.startswith("_")]
    members += list(hookspecs.Trainer.__annotations__)
    for member in members:
        assert f"`{member}" in reference, f"Trainer.{member} is not in the reference"


def _public_names() -> list[str]:
    return [f"{m}.{n}" for m in PUBLIC for n in importlib.import_module(m).__all__]


@pytest.mark.parametrize("qualified", _public_names())
def test_every_public_name_is_documented(qualified: str):
    """datasette's docs-as-test: each public name appears, qualified, on a docs page."""
    pattern = re.compile(rf"(?<![\w.]){re.escape(qualified)}(?!\w)")
    pages = sorted(DOCS.glob("*.md"))
    assert any(pattern.search(p.read_text(encoding="utf-8")) for p in pages), (
        f"{qualified} is public (in __all__) but no page of docs/ mentions it"
    )


def test_ci_runs_the_readme_test_command_and_then_the_slow_tests():
    """README's test command is what CI runs, and CI also runs what it leaves out."""
    readme = (REPO / "README.md").read_text()
    (command,) = re.findall(r"OMP_NUM_THREADS=1 (python -m pytest[^\n`]*)\n", readme)
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert command.strip() in ci
    assert ci.index(command.strip()) < ci.index("python -m pytest -q -m slow")
