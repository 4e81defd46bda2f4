"""NeRD's view of its data: the roles it reads, its windows, tokens and normalization.

NeRD reads any dataset :mod:`slhub.data` opens through the one ``data:`` section:
the ``state`` role (the components it predicts), ``action`` and optional ``extra``
inputs (contacts, gravity), each filled by dataset features the recipe names. The
cart-pole generator is one way to *make* such a dataset: without ``data.path``
its episodes are written once into slhub's store under ``data.cache_dir``.

The plugin, its evaluation and the tests all cut episodes into the same windows
of ``history`` tokens, so the windowing lives here once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from slhub import DatasetError
from slhub.builtin.nerd.model import NerdLayout
from slhub.builtin.nerd.sections import ANGLE_FEATURE, ModelSection, NerdDataSection
from slhub.data import Role, TrainingData, wrap_angle
from slhub.sim import cartpole

#: What NeRD reads, by role; the defaults are the cart-pole store's feature names.
ROLES = {
    "state": Role(default=("state",)),
    "action": Role(default=("action",)),
    "extra": Role(required=False),
}
#: The arrays :func:`normalization` returns (cached by :meth:`TrainingData.cached`).
STATISTICS = ("token_mean", "token_std", "delta_mean", "delta_std")
#: The smallest standard deviation used to normalize (a constant feature stays finite).
STD_FLOOR = 1e-6


def open_data(cfg: NerdDataSection, trainer: Any = None) -> TrainingData:
    """The dataset of ``cfg`` (made from the cart-pole generator when it names no path),
    split by episode and recorded in the run when ``trainer`` is given."""
    return TrainingData.open(cfg.resolved(), ROLES, trainer=trainer)


def layout_of(data: TrainingData, model_cfg: ModelSection, robot: str = "") -> NerdLayout:
    """The model's feature layout: the roles' component names and the angles."""
    state = data.layouts["state"].names
    angles = model_cfg.angles
    if angles is None:
        angles = [ANGLE_FEATURE] if state == cartpole.STATE_NAMES else []
    extra = data.layouts["extra"].names if "extra" in data.layouts else ()
    try:
        return NerdLayout.from_names(
            state,
            data.layouts["action"].names,
            extra,
            angles,
            model_cfg.angle_features,
            robot,
        )
    except ValueError as exc:
        raise DatasetError(f"model.angles: {exc}") from None


def offsets(history: int, reach: int = 1) -> dict[str, range]:
    """Role offsets of a window whose last ``history`` tokens end at the anchor and whose
    states run ``reach`` steps past it (1: the next state every token is supervised on)."""
    return {"state": range(1 - history, 1 + reach), "action": range(1 - history, reach)}


def window_offsets(layout: NerdLayout, history: int, reach: int = 1) -> dict[str, range]:
    """:func:`offsets` with the ``extra`` role when the layout has extra inputs."""
    out = offsets(history, reach)
    if layout.extra_names:
        out["extra"] = out["action"]
    return out


def tokens_of(
    window: dict[str, np.ndarray], layout: NerdLayout, history: int
) -> tuple[np.ndarray, np.ndarray]:
    """Tokens ``[B, history, features]`` and raw state changes ``[B, history, S]``
    (float64) of windows read at :func:`offsets`; angle changes are wrapped."""
    states = window["state"]
    parts = [states[:, :history], window["action"][:, :history]]
    if layout.extra_names:
        parts.append(window["extra"][:, :history])
    delta = np.diff(states[:, : history + 1], axis=1)
    if layout.angles:
        columns = list(layout.angles)
        delta[..., columns] = wrap_angle(delta[..., columns])
    return np.concatenate(parts, axis=-1), delta


def normalization(data: TrainingData, layout: NerdLayout) -> tuple[torch.Tensor, ...]:
    """The inputs' (state, action, extra) and the state change's mean and std
    (:meth:`slhub.data.TrainingData.delta_normalization`), std floored at
    :data:`STD_FLOOR`."""
    roles = ["state", "action"] + (["extra"] if layout.extra_names else [])
    return data.delta_normalization(roles, layout.angles, STD_FLOOR)
