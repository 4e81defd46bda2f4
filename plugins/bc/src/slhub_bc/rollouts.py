"""``validation.env``: the policy judged in its environment (:func:`slhub.sim.rollout_policy`).

The policy sees what it was trained on, in the dataset's feature layout. Each dataset
feature its roles read is one a rollout records before every action, the features
``slhub data collect`` writes: ``observation`` (the env's), ``qpos``, ``qvel`` and
``image`` (rendered with the camera and side the dataset's collect recorded in its
``meta.json`` ``source.render``, or ``validation.env.camera``/``size``). A dataset that
names them otherwise maps its names with ``validation.env.features``
(``{observation.state: observation}``). The observation role is those features
concatenated in the recipe's order, as the data layer concatenates them; frames keep
their history at the policy's offsets, the first step repeated before an episode has
one. Every ``bc.n_action_steps`` steps the policy predicts a chunk and the first
``n_action_steps`` of it are applied (receding horizon).

Everything is checked when the model is built, on every rank (the simulator is
opened once and closed again); rank 0 opens it anew at each validation and closes it
afterwards, so nothing outlives a validation. Reset seeds are fixed by
``validation.env.seed`` and the policy draws nothing, so a validation's results are
the same every time (unless the time budget stops it earlier) and no training stream
is touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from slhub import RecipeError
from slhub.data import TrainingData
from slhub.sim import (
    ROLLOUT_FEATURES,
    Camera,
    Rollouts,
    open_simulator,
    reset_seeds,
    rollout_policy,
    write_video,
)

from slhub_bc.data import cameras, to_batch
from slhub_bc.model import Policy
from slhub_bc.sections import BcSection, EnvSection

#: What ``meta.json``'s ``source.format`` says of a dataset ``slhub data collect`` wrote.
COLLECT_FORMAT = "slhub.collect/1"
#: The camera of a video when neither the recipe nor the dataset names one.
DEFAULT_CAMERA = "follow"


@dataclass(frozen=True)
class EnvPlan:
    """What a rollout records and how the policy's roles read it."""

    env: str
    #: Role -> the rollout features it reads, in order (``observation`` concatenates).
    roles: dict[str, tuple[str, ...]]
    render: Camera | None
    video: Camera
    history: tuple[int, ...]

    @property
    def features(self) -> tuple[str, ...]:
        seen = [name for names in self.roles.values() for name in names]
        return tuple(dict.fromkeys(seen))


def plan(cfg: EnvSection, bc: BcSection, data: TrainingData) -> EnvPlan:
    """Resolve ``validation.env`` against the dataset and check it against the simulator.

    :raises RecipeError: no env to name, a feature no rollout records, a camera to
        guess, or a feature or action of another size than the simulator's.
    :raises SimulatorError: the env cannot be opened.
    """
    source = getattr(data.dataset, "source", None) or {}
    collected = source if source.get("format") == COLLECT_FORMAT else {}
    env = cfg.id or collected.get("env")
    if not env:
        raise RecipeError(
            "validation.env.id: name the simulator (gymnasium:InvertedPendulum-v5); the "
            "dataset records no env it was collected from"
        )
    layouts = data.layouts
    roles: dict[str, tuple[str, ...]] = {}
    for role in ("observation", *cameras(data)):
        if role in layouts:
            roles[role] = tuple(_simulated(cfg, name, role) for name in layouts[role].features)
    for role in cameras(data):
        if roles[role] != ("image",):
            raise RecipeError(
                f"validation.env: camera {role} reads {layouts[role].features[0]}, which a "
                "rollout records as no image; map it with validation.env.features: {NAME: image}"
            )
    if "image" in roles.get("observation", ()):
        raise RecipeError("validation.env: the observation role takes vectors, not the image")
    rendered = collected.get("render") if isinstance(collected.get("render"), dict) else {}
    camera = cfg.camera or rendered.get("camera")
    render = None
    if cameras(data):
        if camera is None:
            raise RecipeError(
                "validation.env.camera: the dataset records no camera its frames were rendered "
                "with; name it (follow, fixed, or one of the model's)"
            )
        side = cfg.size or rendered.get("size") or layouts[cameras(data)[0]].shape[0]
        render = Camera(str(camera), int(side))
    steps = tuple(int(o) for o in bc.offsets()["observation"])
    out = EnvPlan(
        env=env,
        roles=roles,
        render=render,
        video=Camera(str(camera or DEFAULT_CAMERA), cfg.video_size),
        history=steps,
    )
    _check_against(out, cfg, data)
    return out


def _simulated(cfg: EnvSection, name: str, role: str) -> str:
    simulated = cfg.features.get(name, name)
    if simulated not in ROLLOUT_FEATURES:
        raise RecipeError(
            f"validation.env: data.features.{role} reads {name}, which a rollout does not "
            f"record ({', '.join(ROLLOUT_FEATURES)}); map it with validation.env.features: "
            f"{{{name}: observation}}"
        )
    return simulated


def _check_against(plan_: EnvPlan, cfg: EnvSection, data: TrainingData) -> None:
    """The simulator's features and actions have the dataset's sizes (opened and closed)."""
    simulator = open_simulator(plan_.env, max_steps=cfg.max_steps)
    try:
        observation = simulator.reset(reset_seeds(cfg.seed, 1)[0])
        sizes = {
            "observation": int(np.asarray(observation).size),
            "qpos": len(simulator.qpos_names),
            "qvel": len(simulator.qvel_names),
        }
        layouts, dataset = data.layouts, data.dataset
        for role, names in plan_.roles.items():
            for name, simulated in zip(layouts[role].features, names, strict=True):
                shape = tuple(dataset.features[name].shape)
                if simulated == "image":
                    assert plan_.render is not None
                    want = (plan_.render.size, plan_.render.size, 3)
                    if shape != want:
                        raise RecipeError(
                            f"validation.env: {name} holds {list(shape)} frames; the rollout "
                            f"renders {list(want)} (set validation.env.size)"
                        )
                elif int(np.prod(shape)) != sizes[simulated]:
                    raise RecipeError(
                        f"validation.env: {name} has {int(np.prod(shape))} components; "
                        f"{plan_.env}'s {simulated} has {sizes[simulated]}"
                    )
        actions = layouts["action"].dim
        if actions != len(simulator.action_names):
            raise RecipeError(
                f"validation.env: the action role has {actions} components; {plan_.env} takes "
                f"{len(simulator.action_names)} ({', '.join(simulator.action_names)})"
            )
        if plan_.render is not None:
            simulator.render(plan_.render.name, plan_.render.size)  # a bad camera: refused now
    finally:
        simulator.close()


def policy_act(
    net: Policy, plan_: EnvPlan, bc: BcSection, action_dim: int
) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """The policy as :func:`slhub.sim.rollout_policy`'s ``act``: a window of rollout
    features -> the first ``n_action_steps`` actions of its chunk, in the dataset's units."""
    dtype = next(net.parameters()).dtype
    device = next(net.parameters()).device

    def act(window: dict[str, np.ndarray]) -> np.ndarray:
        batch: dict[str, np.ndarray] = {"action": np.zeros((1, 1, action_dim))}
        for role, names in plan_.roles.items():
            if role == "observation":
                parts = [window[n].reshape(len(plan_.history), -1) for n in names]
                batch[role] = np.concatenate(parts, axis=-1).astype(np.float64)[None]
            else:
                batch[role] = window[names[0]][None]
        with torch.no_grad():
            chunk = net.act(to_batch(batch, dtype, device))
        return chunk[0, : bc.n_action_steps].double().cpu().numpy()

    return act


def evaluate(
    net: Policy, plan_: EnvPlan, cfg: EnvSection, bc: BcSection, action_dim: int
) -> dict[str, float]:
    """Roll the policy out as ``validation.env`` says; the metrics (``env_return``,
    ``env_length``, ``env_episodes``, ``env_success`` where the env reports success),
    and the first episode's video when ``video`` names a file."""
    simulator = open_simulator(plan_.env, max_steps=cfg.max_steps)
    try:
        rollouts: Rollouts = rollout_policy(
            simulator,
            policy_act(net, plan_, bc, action_dim),
            episodes=cfg.episodes,
            seed=cfg.seed,
            max_steps=cfg.max_steps,
            features=plan_.features,
            history=plan_.history,
            render=plan_.render,
            video=plan_.video if cfg.video else None,
            time_budget_s=cfg.time_budget_s,
        )
    finally:
        simulator.close()
    if cfg.video and rollouts.frames is not None:
        write_video(Path(cfg.video), rollouts.frames, 1.0 / rollouts.dt)
    return rollouts.metrics()
