"""Settings every test directory shares (tests/ and each plugin's tests/).

A failing comparison prints tensors as pytest's assertion rewriting shows them: cut to
a few elements at each edge, so a failure reads as a short diff, not pages of values.
"""

from __future__ import annotations

import torch

torch.set_printoptions(threshold=24, edgeitems=2, linewidth=100)
