"""Settings every test directory shares (tests/ and each plugin's tests/).

A failing comparison prints tensors as pytest's assertion rewriting shows them: cut to
a few elements at each edge, so a failure reads as a short diff, not pages of values.
"""

from __future__ import annotations

import pytest
import torch

torch.set_printoptions(threshold=24, edgeitems=2, linewidth=100)


@pytest.fixture(scope="session", autouse=True)
def _user_cache(tmp_path_factory):
    """slhub's user cache (``$XDG_CACHE_HOME/slhub``: statistics, dataset digests) is one
    folder of this session's, for every test and the processes they start: never the
    real user's ~/.cache. A test that looks at it reads ``XDG_CACHE_HOME``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield
