"""Names say what they hold: one class per name, public faces without internals.

Checked on the source with ``ast`` where a name is a class, and on the imported
modules where it is a public face; the recipe check runs the CLI.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

import slhub.data
import slhub.export
import slhub.sim
from helpers import REPO, one_line_error, run_cli, write_recipe

NERD_CARTPOLE = REPO / "examples" / "nerd" / "cartpole" / "sl.train.yaml"
#: Upper-case names slhub.data may export: identifiers of formats and groups, not physics.
DATA_CONSTANTS = {"PAD_SUFFIX", "READER_GROUP"}
#: The cart-pole's constants, which live in slhub.sim.cartpole.
PHYSICS = {"CART_MASS", "POLE_MASS", "HALF_LENGTH", "GRAVITY", "DT", "THETA"}


def _class_names() -> Counter[str]:
    files = sorted((REPO / "slhub").rglob("*.py")) + sorted(REPO.glob("plugins/*/src/**/*.py"))
    names: Counter[str] = Counter()
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names.update(node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef))
    return names


def test_every_data_section_class_has_its_own_name():
    names = _class_names()
    assert "DataSection" not in names
    sections = {n: c for n, c in names.items() if n.endswith(("DataSection", "DatasetSection"))}
    assert {"DatasetSection", "CartpoleDataSection", "NerdDataSection"} <= set(sections)
    assert {"RwmDataSection", "BcDataSection"} <= set(sections)
    assert all(count == 1 for count in sections.values()), sections


def test_slhub_data_exports_no_physics_constants():
    upper = {name for name in slhub.data.__all__ if name.isupper()}
    assert upper <= DATA_CONSTANTS, upper - DATA_CONSTANTS
    assert not PHYSICS & set(dir(slhub.data))
    assert {"DT", "STATE_NAMES", "cartpole_step"} <= set(dir(slhub.sim.cartpole))


def test_slhub_export_does_not_re_export_atomic_write():
    assert not hasattr(slhub.export, "atomic_write")
    assert "atomic_write" not in slhub.export.__all__
    assert "atomic_write" in slhub.__all__


@pytest.mark.parametrize("key", ["train", "val"])
def test_a_generator_split_under_a_split_word_is_refused_naming_the_new_keys(
    tmp_path: Path, key: str
):
    recipe = write_recipe(
        tmp_path / "nerd.yaml",
        base=NERD_CARTPOLE,
        trainer__output_dir=str(tmp_path / "run"),
        **{f"data__{key}": {"num_trajectories": 2, "length": 12, "seed": 1}},
    )
    line = one_line_error(run_cli("train", "--config", str(recipe)))
    assert f"data.{key}" in line
    assert "data.generated_train" in line and "data.generated_validation" in line
    assert not (tmp_path / "run").exists()
