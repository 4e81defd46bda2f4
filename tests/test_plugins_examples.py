"""Each model package's README shows its example recipes exactly as they are in examples/."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import REPO

#: README -> the example recipes its ```yaml blocks show, in order.
READMES = {
    "plugins/rwm/README.md": ["examples/rwm/cartpole.yaml"],
    "plugins/rigidformer/README.md": ["examples/rigidformer/boxes.yaml"],
    "plugins/bc/README.md": ["examples/bc/state.yaml", "examples/bc/visual.yaml"],
}


@pytest.mark.parametrize("readme", list(READMES))
def test_readme_recipes_match_the_examples(readme: str) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / readme).read_text(), re.S)
    assert len(blocks) == len(READMES[readme])
    for block, example in zip(blocks, READMES[readme], strict=True):
        assert yaml.safe_load(block) == yaml.safe_load((REPO / example).read_text()), example
