"""Built-ins and external plugins import only slhub's public face.

DESIGN.md's rule: code under ``slhub/builtin`` and ``plugins/*/src`` imports
``slhub`` (names in its ``__all__``), ``slhub.data``, ``slhub.sim``,
``slhub.export`` and ``slhub.testing``, plus modules of its own package; never
an internal module such as ``slhub.rng`` or ``slhub.sim.cartpole``, so slhub's
internals can change without breaking a plugin. Checked on the source with
``ast``, without importing it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import slhub

REPO = Path(__file__).resolve().parents[1]
#: The modules a plugin may import (their own submodules are internal).
PUBLIC_MODULES = frozenset({"slhub", "slhub.data", "slhub.sim", "slhub.export", "slhub.testing"})


def _own_package(path: Path) -> str:
    """The package whose modules ``path`` may import freely: a built-in package
    (``slhub.builtin.nerd``), the module itself for a one-module built-in, or a
    plugin distribution's top-level package (``slhub_rwm``)."""
    parts = path.relative_to(REPO).with_suffix("").parts
    if parts[0] == "plugins":  # plugins/NAME/src/PACKAGE/...
        return parts[3]
    dotted = ".".join(p for p in parts if p != "__init__")
    return ".".join(dotted.split(".")[:3])  # slhub.builtin.NAME


def _is_own(module: str, own: str) -> bool:
    return module == own or module.startswith(own + ".")


def _absolute(node: ast.ImportFrom, path: Path) -> str:
    """The module an ``import from`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] == "plugins":
        parts = parts[3:]
    package = parts[:-1]  # a module's package, and an __init__'s own
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def private_imports(source: str, path: Path) -> list[str]:
    """``LINE: what`` for every import of a private slhub module or name in ``source``."""
    own = _own_package(path)
    public_names = set(slhub.__all__) | {m.split(".")[1] for m in PUBLIC_MODULES if "." in m}
    found: list[str] = []

    def check_module(module: str, line: int) -> None:
        top = module.split(".")[0]
        if _is_own(module, own):
            return
        if top == "slhub" and module not in PUBLIC_MODULES:
            found.append(f"{line}: {module} is not public")
        elif top.startswith("slhub_") and top != own:
            found.append(f"{line}: {module} is another plugin's internals")

    tree = ast.parse(source, filename=str(path))
    aliases: set[str] = set()  # names bound to the slhub package itself
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check_module(alias.name, node.lineno)
                if alias.asname is None and alias.name.split(".")[0] == "slhub":
                    aliases.add("slhub")  # import slhub.data binds slhub too
                elif alias.name == "slhub":
                    aliases.add(alias.asname)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, path)
            check_module(module, node.lineno)
            if module == "slhub":
                for alias in node.names:
                    if alias.name not in public_names:
                        found.append(f"{node.lineno}: slhub.{alias.name} is not public")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr not in public_names
        ):
            found.append(f"{node.lineno}: slhub.{node.attr} is not public")
    return found


def _sources() -> list[Path]:
    files = sorted((REPO / "slhub" / "builtin").rglob("*.py"))
    files += sorted(REPO.glob("plugins/*/src/**/*.py"))
    return files


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_only_public_slhub(path: Path):
    found = private_imports(path.read_text(encoding="utf-8"), path)
    assert not found, f"{path.relative_to(REPO)} imports slhub internals: " + "; ".join(found)


def test_the_check_covers_builtins_and_every_plugin_package():
    sources = {p.relative_to(REPO).parts[:2] for p in _sources()}
    assert ("slhub", "builtin") in sources
    plugins = {p.name for p in (REPO / "plugins").iterdir() if (p / "src").is_dir()}
    assert plugins and {("plugins", name) for name in plugins} <= sources


BUILTIN = REPO / "slhub" / "builtin" / "ddp_weighting.py"
NERD = REPO / "slhub" / "builtin" / "nerd" / "data.py"
RWM = REPO / "plugins" / "rwm" / "src" / "slhub_rwm" / "plugin.py"


@pytest.mark.parametrize(
    ("path", "source"),
    [
        (BUILTIN, "from slhub import rng as rng_state\n"),
        (BUILTIN, "from slhub.rng import capture\n"),
        (BUILTIN, "import slhub.optim\n"),
        (BUILTIN, "import slhub\nslhub.log.get_logger()\n"),
        (BUILTIN, "from slhub.builtin.nerd.model import NerdModel\n"),
        (NERD, "from slhub.sim.cartpole import FORMAT\n"),
        (NERD, "from ... import errors\n"),
        (RWM, "from slhub.errors import RecipeError\n"),
        (RWM, "from slhub_bc.render import render\n"),
        (RWM, "from slhub.builtin.nerd.data import open_splits\n"),
    ],
)
def test_a_private_import_is_found(path: Path, source: str):
    assert private_imports(source, path)


@pytest.mark.parametrize(
    ("path", "source"),
    [
        (BUILTIN, "from slhub import hookimpl, random_state, RecipeError\n"),
        (BUILTIN, "import slhub\nslhub.SlhubError\n"),
        (BUILTIN, "from slhub import data, export\nimport slhub.testing\n"),
        (NERD, "from slhub.builtin.nerd.model import NerdModel\nfrom . import loss\n"),
        (NERD, "from slhub.sim import cartpole\n"),
        (RWM, "from slhub_rwm.model import WorldModel\nfrom .data import Windows\n"),
        (RWM, "import torch\nfrom torch import nn\n"),
    ],
)
def test_a_public_import_passes(path: Path, source: str):
    assert private_imports(source, path) == []
