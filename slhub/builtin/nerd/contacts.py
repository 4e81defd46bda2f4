"""NeRD's contact geometry inputs: which extra components are contact slots, and the
slots in a step's base frame.

``slhub data collect --contacts geometry`` records, per contact slot, the point on the
robot, the normal, the depth and an active mask (:mod:`slhub.sim.contacts`) in world
coordinates, and names the slots in ``meta.json`` (``source.contact_geometry``). A
body-frame model sees each token's slots in that token's base frame, as upstream NeRD
does: the point relative to the base's position rotated into the base frame, the normal
rotated; depth and mask unchanged, and an inactive slot stays all zero. A world-frame
model sees them as recorded. Plain torch (no in-place writes), so the ONNX graph holds
the same math.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from slhub.builtin.nerd.frame import rotate_inverse
from slhub.sim import CONTACT_COMPONENTS as COMPONENTS

#: Where collect records the slots in the store's ``meta.json`` (under ``source``).
GEOMETRY_KEY = "contact_geometry"


def geometry_slots(source: Any, extra_names: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """The contact slots among ``extra_names``, each its eight component names (as the
    extra role names them: ``contact_geometry.foot_geom_px`` or ``foot_geom_px``), from
    the dataset's ``source`` record; none when it records no geometry or the extra
    inputs leave the feature out."""
    record = source.get(GEOMETRY_KEY) if isinstance(source, dict) else None
    if not isinstance(record, dict) or list(record.get("components", [])) != list(COMPONENTS):
        return ()
    feature = str(record.get("feature", GEOMETRY_KEY))
    names = set(extra_names)
    out = []
    for slot in record.get("slots", []):
        for prefix in (f"{feature}.", ""):
            wanted = tuple(f"{prefix}{slot}_{c}" for c in COMPONENTS)
            if all(n in names for n in wanted):
                out.append(wanted)
                break
    return tuple(out)


class ContactFrame(nn.Module):
    """The contact slots' columns of a token and their conversion into a base frame.

    Holds index buffers only (not saved: the layout names the slots).
    """

    def __init__(self, slots: Sequence[Sequence[int]], width: int) -> None:
        super().__init__()
        slots = [list(s) for s in slots]
        points = [i for s in slots for i in s[0:3]]
        normals = [i for s in slots for i in s[3:6]]
        taken = set(points) | set(normals)
        rest = [i for i in range(width) if i not in taken]
        order = rest + points + normals
        self.count = len(slots)
        self.register_buffer("rest_columns", torch.tensor(rest, dtype=torch.int64), False)
        self.register_buffer("point_columns", torch.tensor(points, dtype=torch.int64), False)
        self.register_buffer("normal_columns", torch.tensor(normals, dtype=torch.int64), False)
        self.register_buffer("active_columns", torch.tensor([s[7] for s in slots]), False)
        inverse = sorted(range(width), key=order.__getitem__)
        self.register_buffer("inverse", torch.tensor(inverse, dtype=torch.int64), False)

    def to_body(
        self, tokens: torch.Tensor, position: torch.Tensor, orientation: torch.Tensor
    ) -> torch.Tensor:
        """``tokens`` ``[..., width]`` with each slot's point and normal in the base
        frame of ``position`` ``[..., 3]`` and unit quaternion ``orientation``
        ``[..., 4]`` (body to world); inactive slots zero."""
        shape = tokens.shape[:-1] + (self.count, 3)
        points = tokens.index_select(-1, self.point_columns).reshape(shape)
        normals = tokens.index_select(-1, self.normal_columns).reshape(shape)
        active = tokens.index_select(-1, self.active_columns).unsqueeze(-1) > 0.5
        q = orientation.unsqueeze(-2)
        local = rotate_inverse(q, points - position.unsqueeze(-2))
        turned = rotate_inverse(q, normals)
        zero = torch.zeros_like(local)
        local = torch.where(active, local, zero).flatten(-2)
        turned = torch.where(active, turned, zero).flatten(-2)
        rest = tokens.index_select(-1, self.rest_columns)
        return torch.cat([rest, local, turned], dim=-1).index_select(-1, self.inverse)


def slot_columns(slots: Sequence[Sequence[str]], input_names: Sequence[str]) -> list[list[int]]:
    """Each slot's eight component names as token columns."""
    where = {name: i for i, name in enumerate(input_names)}
    return [[where[n] for n in slot] for slot in slots]


def geometry_columns(slots: Sequence[Sequence[str]], extra_names: Sequence[str]) -> list[int]:
    """The extra columns (indices into ``extra_names``) that hold slot components."""
    where = {name: i for i, name in enumerate(extra_names)}
    return sorted(where[n] for slot in slots for n in slot)


def unscaled_constants(std: torch.Tensor, columns: Sequence[int], floor: float) -> torch.Tensor:
    """``std`` with the ``columns`` whose spread is at or below ``floor`` set to 1: a slot
    never active in training stays unscaled, so a rollout that makes it active feeds
    the network values of the recorded size, not ``1 / floor`` times them."""
    out = std.clone()
    if columns:
        index = torch.tensor(list(columns), dtype=torch.int64)
        picked = out.index_select(0, index)
        out[index] = torch.where(picked <= floor, torch.ones_like(picked), picked)
    return out


def body_contact_statistics(
    data: Any, layout: Any, frame: Any, contact_frame: ContactFrame
) -> dict[str, np.ndarray]:
    """Mean and std (float64) of every extra component as a body-frame model sees it (the
    slots in each step's base frame), over the training episodes (one pass, cached)."""
    state_features = data.layouts["state"].features
    extra_features = data.layouts["extra"].features
    width = len(layout.input_names)
    state_dim, action_dim = len(layout.state_names), len(layout.action_names)

    def read(features: Sequence[str], episode: int, length: int) -> np.ndarray:
        parts = [
            np.asarray(data.dataset.read(name, episode, 0, length), dtype=np.float64)
            for name in features
        ]
        return np.concatenate([p.reshape(length, -1) for p in parts], axis=-1)

    def compute() -> dict[str, np.ndarray]:
        total, squares, count = 0.0, 0.0, 0
        for episode in data.split.train:
            length = int(data.dataset.lengths[episode])
            states, extra = (
                read(state_features, episode, length),
                read(extra_features, episode, length),
            )
            tokens = np.zeros((length, width), dtype=np.float64)
            tokens[:, :state_dim] = states
            tokens[:, state_dim + action_dim :] = extra
            with torch.no_grad():
                values = torch.from_numpy(tokens)
                position, orientation = frame.pose(values)
                body = contact_frame.to_body(values, position, orientation).numpy()
            body = body[:, state_dim + action_dim :]
            total = total + body.sum(0)
            squares = squares + np.square(body).sum(0)
            count += length
        mean = total / max(count, 1)
        return {
            "mean": mean,
            "std": np.sqrt(np.maximum(squares / max(count, 1) - mean**2, 0.0)),
        }

    params = {
        "state": list(state_features),
        "extra": list(extra_features),
        "base": layout.base.to_dict(),
        "slots": [list(s) for s in layout.contact_slots],
    }
    return data.cached("nerd_contact_frame", params, ["mean", "std"], compute)
