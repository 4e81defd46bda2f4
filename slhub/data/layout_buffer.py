"""A JSON record as a uint8 tensor: how a model's state dict carries its own layout.

A model that names its inputs and outputs (NeRD's ``nerd_layout``, RWM's
``rwm_layout``) keeps that record as a buffer, so a checkpoint or an export holds
it beside the weights and a loader rebuilds the model from the file alone. The
bytes are UTF-8 JSON with sorted keys: the same record always gives the same
buffer, and a stored buffer reads back on any later slhub.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from slhub.errors import one_line


def json_buffer(record: Mapping[str, Any]) -> torch.Tensor:
    """``record`` as a 1-D uint8 tensor of its UTF-8 JSON (keys sorted)."""
    encoded = json.dumps(record, sort_keys=True).encode("utf-8")
    return torch.tensor(list(encoded), dtype=torch.uint8)


def read_json_buffer(tensor: Any, name: str) -> dict[str, Any]:
    """The JSON object a :func:`json_buffer` tensor holds.

    :raises ValueError: one line naming the buffer ``name``: not a 1-D uint8 tensor,
        not UTF-8 JSON, or not a JSON object.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() != 1:
        raise ValueError(f"{name} must be a 1-D uint8 tensor")
    try:
        data = json.loads(bytes(tensor.tolist()).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{name} is damaged ({one_line(exc)})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{name} is damaged (not a JSON object)")
    return data
