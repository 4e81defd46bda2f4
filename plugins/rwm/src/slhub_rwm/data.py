"""RWM's view of its data: the roles it reads, its windows and its normalization.

RWM reads any dataset :mod:`slhub.data` opens through the one ``data:`` section:
the ``state`` role (the components it predicts), ``action`` and optional ``extra``
inputs, each filled by dataset features the recipe names. The cart-pole generator
is one way to *make* such a dataset: without ``data.path`` its episodes are written
once into slhub's store under ``data.cache_dir``.

A window is anchored at the last context step: ``history`` states up to it and
``horizon`` after it, with the inputs between them. :class:`slhub.data.TrainingData`
keeps it inside one episode (only anchors whose whole window fits are drawn), so a
window never crosses an episode reset.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from slhub import DatasetError
from slhub.data import Role, TrainingData
from slhub.sim import cartpole

from slhub_rwm.model import RwmLayout
from slhub_rwm.sections import RwmDataSection, RwmSection

#: What RWM reads, by role; the defaults are the cart-pole store's feature names.
ROLES = {
    "state": Role(default=("state",)),
    "action": Role(default=("action",)),
    "extra": Role(required=False),
}
#: The cart-pole's state component that is an angle.
CARTPOLE_ANGLE = "theta"
#: The smallest standard deviation used to normalize (a constant feature stays finite).
STD_FLOOR = 1e-6


def open_data(cfg: RwmDataSection, trainer: Any = None) -> TrainingData:
    """The dataset of ``cfg`` (made from the cart-pole generator when it names no path),
    split by episode and recorded in the run when ``trainer`` is given."""
    return TrainingData.open(cfg.resolved(), ROLES, trainer=trainer)


def layout_of(data: TrainingData, cfg: RwmSection) -> RwmLayout:
    """The model's layout: the roles' component names, the angles and the GRU's size."""
    state = data.layouts["state"].names
    angles = cfg.angles
    if angles is None:
        angles = [CARTPOLE_ANGLE] if state == cartpole.STATE_NAMES else []
    extra = data.layouts["extra"].names if "extra" in data.layouts else ()
    try:
        return RwmLayout.from_names(
            angles,
            state_names=state,
            action_names=data.layouts["action"].names,
            extra_names=extra,
            hidden=cfg.hidden,
            layers=cfg.layers,
            history=cfg.history,
            horizon=cfg.horizon,
            robot=str(data.dataset.path.name),
        )
    except ValueError as exc:
        raise DatasetError(f"rwm.angles: {exc}") from None


def window_offsets(layout: RwmLayout, history: int, horizon: int) -> dict[str, range]:
    """Role offsets of a window anchored at its last context step: ``history + horizon``
    states and the ``history + horizon - 1`` inputs between them."""
    out = {"state": range(1 - history, 1 + horizon), "action": range(1 - history, horizon)}
    if layout.extra_names:
        out["extra"] = out["action"]
    return out


def batch_of(
    window: dict[str, np.ndarray], layout: RwmLayout, device: torch.device, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """``states [B, H + F, S]`` and ``inputs [B, H + F - 1, U]`` (actions, then extra
    inputs) of windows read at :func:`window_offsets`."""
    parts = [window["action"]] + ([window["extra"]] if layout.extra_names else [])
    inputs = np.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]
    return {
        "states": torch.from_numpy(window["state"]).to(device=device, dtype=dtype),
        "inputs": torch.from_numpy(inputs).to(device=device, dtype=dtype),
    }


def validation_anchors(data: TrainingData, layout: RwmLayout, stride: int) -> np.ndarray:
    """Every ``stride``-th anchor of each validation episode (from its first).

    :raises DatasetError: no validation episode holds ``history + horizon`` steps (at
        admission, naming the lengths).
    """
    history, horizon = layout.history, layout.horizon
    anchors = data.anchors(window_offsets(layout, history, horizon), "validation")
    if len(anchors) == 0:
        episodes = data.split.validation
        if not episodes:
            raise DatasetError(f"{data.dataset.path}: the validation split holds no episodes")
        longest = max(int(data.dataset.lengths[e]) for e in episodes)
        raise DatasetError(
            f"{data.dataset.path}: rwm.history {history} + rwm.horizon {horizon} need "
            f"validation episodes of {history + horizon} steps; the longest has {longest}"
        )
    return anchors[(anchors[:, 1] - (history - 1)) % stride == 0]


def normalization(data: TrainingData, layout: RwmLayout) -> tuple[torch.Tensor, ...]:
    """The inputs' (state, action, extra) and the state change's mean and std
    (:meth:`slhub.data.TrainingData.delta_normalization`), std floored at
    :data:`STD_FLOOR`."""
    roles = ["state", "action"] + (["extra"] if layout.extra_names else [])
    return data.delta_normalization(roles, layout.angles, STD_FLOOR)
