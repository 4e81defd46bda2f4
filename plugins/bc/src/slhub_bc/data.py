"""BC's view of its data: the roles it reads, its windows and its batches.

BC reads any dataset :mod:`slhub.data` opens through the one ``data:`` section:
``observation`` (vector features, concatenated), ``image`` (a list of camera
features; each camera is read as its own role ``image[i]``, since a role holds one
image feature) and ``action``. Observations and frames are read at the history's
offsets, actions as a chunk from the anchor on; with ``data.window.pad`` the chunk's
steps past the episode's end are reported in ``action_is_pad`` and left out of the
loss. Without ``data.path`` the LQR expert's demonstrations are written once into
slhub's store (:func:`slhub_bc.expert.demonstration_store`) and read the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from slhub import RecipeError
from slhub.data import PAD_SUFFIX, Role, TrainingData

from slhub_bc.sections import BcDataSection, BcSection

#: The cart-pole demonstrations' feature names, the roles' defaults.
STATE, ACTION, IMAGE = "state", "action", "image"


def camera_role(index: int) -> str:
    """The role camera ``index`` of ``data.features.image`` is read as."""
    return f"image[{index}]"


def roles_of(cfg: BcSection, section: BcDataSection) -> tuple[dict[str, Role], BcDataSection]:
    """The roles BC reads for ``cfg.observation`` and ``section`` with its cameras spread
    over one role each (``image: [a, b]`` -> ``image[0]: [a]``, ``image[1]: [b]``)."""
    if cfg.observation == "state":
        return {"observation": Role(default=(STATE,)), "action": Role(default=(ACTION,))}, section
    features = dict(section.features)
    cameras = features.pop(IMAGE, [IMAGE])
    if not cameras:
        raise RecipeError("data.features.image: name the camera features visual BC reads")
    roles = {"observation": Role(required=False), "action": Role(default=(ACTION,))}
    for index, camera in enumerate(cameras):
        roles[camera_role(index)] = Role(image=True)
        features[camera_role(index)] = [camera]
    return roles, section.model_copy(update={"features": features})


def open_data(cfg: BcSection, section: BcDataSection, trainer: Any = None) -> TrainingData:
    """The dataset of ``section`` (the expert's demonstrations when it names no path),
    split by episode and recorded in the run when ``trainer`` is given."""
    from slhub_bc.expert import demonstration_store

    if section.path is None:
        path = demonstration_store(
            section.cache_dir, **section.demos.model_dump(), images=cfg.observation == "visual"
        )
        split = section.split.model_copy(update={"train": "train", "validation": "validation"})
        # the demonstrations' statistics are cached beside them, in cache_dir
        update = {"path": str(path), "split": split, "cache_dir": section.cache_dir}
        section = section.model_copy(update=update)
    roles, section = roles_of(cfg, section)
    return TrainingData.open(section, roles, trainer=trainer)


def cameras(data: TrainingData) -> list[str]:
    """The camera roles of ``data``, in the recipe's order."""
    found = []
    while camera_role(len(found)) in data.layouts:
        found.append(camera_role(len(found)))
    return found


def offsets_of(cfg: BcSection, data: TrainingData) -> dict[str, range]:
    """Role offsets of one window: the history for observations and every camera, the
    chunk for actions."""
    base = cfg.offsets()
    out = {"action": base["action"]}
    if "observation" in data.layouts:
        out["observation"] = base["observation"]
    for role in cameras(data):
        out[role] = base["observation"]
    return out


def to_batch(
    window: dict[str, np.ndarray], dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    """Windows as tensors: vectors in ``dtype``, frames as uint8, and ``action_is_pad``
    (all false when the window is not padded)."""
    out: dict[str, torch.Tensor] = {}
    for role, values in window.items():
        if role == "anchors" or role.endswith(PAD_SUFFIX):
            continue
        tensor = torch.from_numpy(np.ascontiguousarray(values))
        out[role] = tensor.to(device) if tensor.dtype == torch.uint8 else tensor.to(device, dtype)
    pad = window.get("action" + PAD_SUFFIX)
    if pad is None:
        pad = np.zeros(window["action"].shape[:2], dtype=bool)
    out["action" + PAD_SUFFIX] = torch.from_numpy(np.asarray(pad, dtype=bool)).to(device)
    return out
