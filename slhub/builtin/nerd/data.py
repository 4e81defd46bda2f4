"""NeRD's view of its data: the roles it reads, its windows, tokens and normalization.

NeRD reads any dataset :mod:`slhub.data` opens through the one ``data:`` section:
the ``state`` role (the components it predicts), ``action`` and optional ``extra``
inputs (contacts, gravity), each filled by dataset features the recipe names. The
cart-pole generator is one way to *make* such a dataset: without ``data.path``
its episodes are written once into slhub's store under ``data.cache_dir``.

The plugin, its evaluation and the tests all cut episodes into the same windows
of ``history`` tokens, so the windowing lives here once, and so does the choice of
the floating base (:func:`base_of`) and the frame targets are expressed in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from slhub import DatasetError
from slhub.builtin.nerd.base import (
    PLANAR,
    FloatingBase,
    PlanarBase,
    RobotBase,
    free_joint_base,
    planar_base,
)
from slhub.builtin.nerd.contacts import (
    ContactFrame,
    body_contact_statistics,
    geometry_columns,
    geometry_slots,
    slot_columns,
    unscaled_constants,
)
from slhub.builtin.nerd.frame import BaseFrame, frame_of
from slhub.builtin.nerd.model import NerdLayout
from slhub.builtin.nerd.planar_frame import PlanarFrame
from slhub.builtin.nerd.sections import (
    ANGLE_FEATURE,
    ModelSection,
    NerdDataSection,
    PlanarBaseSection,
)
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
#: Where ``slhub data collect`` records a robot's floating base in the store's
#: ``meta.json`` (under ``source``): a free joint as ``{"joint": ..., "qpos": ...,
#: "qvel": ...}`` (feature names), a planar base as ``{"kind": "planar", "joints": [x
#: slide, z slide, y hinge], "qpos": ..., "qvel": ...}``.
BASE_KEY = "floating_base"


def open_data(cfg: NerdDataSection, trainer: Any = None) -> TrainingData:
    """The dataset of ``cfg`` (made from the cart-pole generator when it names no path),
    split by episode and recorded in the run when ``trainer`` is given."""
    return TrainingData.open(cfg.resolved(), ROLES, trainer=trainer)


def layout_of(data: TrainingData, model_cfg: ModelSection, robot: str = "") -> NerdLayout:
    """The model's feature layout: the roles' component names, the angles, the floating
    base (:func:`base_of`) and the frame (``model.frame``; default body with a base)."""
    state = data.layouts["state"].names
    angles = model_cfg.angles
    if angles is None:
        angles = [ANGLE_FEATURE] if state == cartpole.STATE_NAMES else []
    extra = data.layouts["extra"].names if "extra" in data.layouts else ()
    base = base_of(data, model_cfg)
    frame = model_cfg.frame or ("body" if base is not None else "world")
    if frame == "body" and base is None:
        raise DatasetError(
            "model.frame: body needs a floating base: name its free joint (root) or "
            "{planar: [x slide, z slide, y hinge]} in model.base"
        )
    slots = geometry_slots(getattr(data.dataset, "source", None), extra)
    try:
        return NerdLayout.from_names(
            state,
            data.layouts["action"].names,
            extra,
            angles,
            model_cfg.angle_features,
            robot,
            base,
            frame,
            slots,
        )
    except ValueError as exc:
        raise DatasetError(f"model.angles: {exc}") from None


def state_contacts(data: TrainingData, layout: NerdLayout) -> Any:
    """What computes the model's extra inputs from a predicted state for the
    ``selfcontact_*`` validation figures (:class:`slhub.sim.contacts.StateContacts` of
    the env ``slhub data collect`` recorded), or None: the model has no extra inputs, or
    they cannot be computed (a note says why, once)."""
    if not layout.extra_names:
        return None
    source = getattr(data.dataset, "source", None)
    env = source.get("env") if isinstance(source, dict) else None
    if not isinstance(env, str):
        reason = "the dataset records no simulator env"
    else:
        from slhub.sim import StateContacts

        try:
            return StateContacts(env, layout.state_names, layout.action_names, layout.extra_names)
        except ValueError as exc:
            reason = str(exc)
    from slhub import get_logger

    get_logger().info(
        "validation computes no selfcontact_* figures (rollouts with their own contacts)",
        reason=reason,
    )
    return None


def base_of(data: TrainingData, model_cfg: ModelSection) -> RobotBase | None:
    """The robot's floating base among the state components: the free joint or planar
    joints ``model.base`` names, else the base ``slhub data collect`` recorded, else none.

    :raises DatasetError: ``model.base`` names joints whose components the state lacks;
        or the state holds quaternion components (``*_qw``) of a base no one named
        and ``model.frame`` is not ``world``.
    """
    state = data.layouts["state"].names
    if isinstance(model_cfg.base, PlanarBaseSection):
        planar = find_planar(model_cfg.base.planar, state)
        if planar is None:
            wanted = planar_base(model_cfg.base.planar).names
            raise DatasetError(
                f"model.base: the state lacks planar joints {model_cfg.base.planar}'s "
                f"components ({', '.join(wanted)}; the state has: {', '.join(state)})"
            )
        return planar
    if model_cfg.base is not None:
        base = find_free_joint(model_cfg.base, state)
        if base is None:
            wanted = free_joint_base(model_cfg.base).names
            raise DatasetError(
                f"model.base: the state lacks free joint {model_cfg.base!r}'s components "
                f"({', '.join(wanted)}; the state has: {', '.join(state)})"
            )
        return base
    recorded = getattr(data.dataset, "source", None)
    recorded = recorded.get(BASE_KEY) if isinstance(recorded, dict) else None
    if isinstance(recorded, dict) and recorded.get("kind") == PLANAR:
        joints = recorded.get("joints")
        if isinstance(joints, list) and len(joints) == 3:
            found = find_planar(
                [str(j) for j in joints], state, recorded.get("qpos", "qpos"),
                recorded.get("qvel", "qvel"),
            )  # fmt: skip
            if found is not None:
                return found
    elif isinstance(recorded, dict) and isinstance(recorded.get("joint"), str):
        base = find_free_joint(
            recorded["joint"], state, recorded.get("qpos", "qpos"), recorded.get("qvel", "qvel")
        )
        if base is not None:
            return base
    quaternions = [name for name in state if name.endswith("_qw")]
    if quaternions and model_cfg.frame != "world":
        raise DatasetError(
            f"model.base: the state holds quaternion components ({', '.join(quaternions)}) "
            "and the dataset records no floating base: name the free joint in model.base "
            "(e.g. root), or set model.frame: world"
        )
    return None


def find_free_joint(
    joint: str, state_names: tuple[str, ...], qpos: str = "qpos", qvel: str = "qvel"
) -> FloatingBase | None:
    """Free joint ``joint``'s components among ``state_names``, named as the state role
    names them (``qpos.root_x`` when qpos and qvel share component names, else
    ``root_x``), or None when any is missing."""
    prefixed = free_joint_base(joint, qpos, qvel)
    bare = FloatingBase(*(tuple(n.split(".", 1)[1] for n in part) for part in _parts(prefixed)))
    for base in (prefixed, bare):
        if all(name in state_names for name in base.names):
            return base
    return None


def find_planar(
    joints: list[str], state_names: tuple[str, ...], qpos: str = "qpos", qvel: str = "qvel"
) -> PlanarBase | None:
    """Planar ``joints``' components among ``state_names`` (``qpos.rootx``: a slide's or
    hinge's ``qpos`` and ``qvel`` components share the joint's name, so the feature
    prefix is always there), or None when any is missing."""
    base = planar_base(joints, qpos, qvel)
    return base if all(name in state_names for name in base.names) else None


def _parts(base: FloatingBase) -> tuple[tuple[str, ...], ...]:
    return base.position, base.orientation, base.linear_velocity, base.angular_velocity


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
    (float64) of windows read at :func:`offsets`; angle changes are wrapped. Tokens
    are in world coordinates (the model converts them); a body-frame layout's changes
    are in the base frame of the step each starts from (:meth:`BaseFrame.to_body`)."""
    states = window["state"]
    parts = [states[:, :history], window["action"][:, :history]]
    if layout.extra_names:
        parts.append(window["extra"][:, :history])
    if layout.body:
        delta = body_changes(np.asarray(states[:, : history + 1], dtype=np.float64), layout)
    else:
        delta = np.diff(states[:, : history + 1], axis=1)
    if layout.angles:
        columns = list(layout.angles)
        delta[..., columns] = wrap_angle(delta[..., columns])
    return np.concatenate(parts, axis=-1), delta


def body_frame(layout: NerdLayout) -> BaseFrame | PlanarFrame:
    assert layout.base is not None
    return frame_of(layout.base, layout.state_names)


def body_changes(states: np.ndarray, layout: NerdLayout) -> np.ndarray:
    """Each step's change to the next ``[..., T - 1, S]`` in the base frame of the step
    it starts from, of float64 world states ``[..., T, S]``."""
    frame = body_frame(layout)
    with torch.no_grad():
        values = torch.from_numpy(states)
        return frame.to_body(values[..., :-1, :], values[..., 1:, :]).numpy()


def normalization(data: TrainingData, layout: NerdLayout) -> tuple[torch.Tensor, ...]:
    """The inputs' (state, action, extra) and the state change's mean and std
    (:meth:`slhub.data.TrainingData.delta_normalization`), std floored at
    :data:`STD_FLOOR`; for a body-frame layout, of the state and its change in the
    base frame and of gravity's direction in it (:func:`body_statistics`)."""
    roles = ["state", "action"] + (["extra"] if layout.extra_names else [])
    out = data.delta_normalization(roles, layout.angles, STD_FLOOR)
    if layout.contact_slots:
        out = contact_normalization(data, layout, out)
    if not layout.body:
        return out
    state, change, gravity = body_statistics(data, layout)
    size = len(layout.state_names)
    mean, std = out[0].clone(), out[1].clone()
    mean[:size] = torch.from_numpy(state["mean"])
    std[:size] = torch.from_numpy(np.maximum(state["std"], STD_FLOOR))
    return (
        mean,
        std,
        *(torch.from_numpy(a) for a in _floored(change)),
        *(torch.from_numpy(a) for a in _floored(gravity)),
    )


def contact_normalization(
    data: TrainingData, layout: NerdLayout, stats: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, ...]:
    """``stats`` with the contact slots' input statistics as the model sees the slots (a
    body-frame model: in each step's base frame), a component constant in training left
    unscaled (:func:`~slhub.builtin.nerd.contacts.unscaled_constants`)."""
    mean, std = stats[0].clone(), stats[1].clone()
    offset = len(layout.state_names) + len(layout.action_names)
    if layout.body:
        contact_frame = ContactFrame(
            slot_columns(layout.contact_slots, layout.input_names), len(layout.input_names)
        )
        found = body_contact_statistics(data, layout, body_frame(layout), contact_frame)
        mean[offset:] = torch.from_numpy(found["mean"]).to(mean.dtype)
        std[offset:] = torch.from_numpy(np.maximum(found["std"], STD_FLOOR)).to(std.dtype)
    columns = [offset + i for i in geometry_columns(layout.contact_slots, layout.extra_names)]
    return (mean, unscaled_constants(std, columns, STD_FLOOR), *stats[2:])


def _floored(stats: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return stats["mean"], np.maximum(stats["std"], STD_FLOOR)


def body_statistics(data: TrainingData, layout: NerdLayout) -> tuple[dict[str, np.ndarray], ...]:
    """Mean and std (float64) over the training episodes of the state as a body-frame
    model sees it, of its change in the base frame and of gravity's direction in that
    frame (one pass, cached)."""
    assert layout.base is not None
    frame = body_frame(layout)
    features = data.layouts["state"].features
    columns = list(layout.angles)

    def compute() -> dict[str, np.ndarray]:
        sums = {"state": 0.0, "change": 0.0, "gravity": 0.0}
        squares = {"state": 0.0, "change": 0.0, "gravity": 0.0}
        counts = {"state": 0, "change": 0, "gravity": 0}
        for episode in data.split.train:
            length = int(data.dataset.lengths[episode])
            parts = [
                np.asarray(data.dataset.read(name, episode, 0, length), dtype=np.float64)
                for name in features
            ]
            states = np.concatenate([p.reshape(length, -1) for p in parts], axis=-1)
            with torch.no_grad():
                values = torch.from_numpy(states)
                body, gravity = (t.numpy() for t in frame.inputs(values))
                change = frame.to_body(values[:-1], values[1:]).numpy()
            if columns:
                change[:, columns] = wrap_angle(change[:, columns])
            for key, value in (("state", body), ("change", change), ("gravity", gravity)):
                sums[key] = sums[key] + value.sum(0)
                squares[key] = squares[key] + np.square(value).sum(0)
                counts[key] += len(value)
        if counts["change"] == 0:
            raise DatasetError(f"{data.dataset.path}: no training episode has two steps")
        out = {}
        for key in sums:
            mean = sums[key] / counts[key]
            out[f"{key}_mean"] = mean
            out[f"{key}_std"] = np.sqrt(np.maximum(squares[key] / counts[key] - mean**2, 0.0))
        return out

    params = {"features": list(features), "angles": columns, "base": layout.base.to_dict()}
    parts = ("state", "change", "gravity")
    names = [f"{part}_{stat}" for part in parts for stat in ("mean", "std")]
    found = data.cached("nerd_body_frame", params, names, compute)
    return tuple({"mean": found[f"{p}_mean"], "std": found[f"{p}_std"]} for p in parts)
