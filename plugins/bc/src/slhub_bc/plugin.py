"""The ``bc`` slhub plugin: state or visual behavior cloning from any dataset slhub reads.

This module is the hook class and its loss, validation and cart-pole rollouts; the
recipe sections are :mod:`~slhub_bc.sections`, the roles and windows
:mod:`~slhub_bc.data`, the networks :mod:`~slhub_bc.model`, and the LQR expert whose
demonstrations make the default dataset :mod:`~slhub_bc.expert`.

Export: :mod:`~slhub_bc.export` (the policy with its normalization, loadable with
``slhub.export.load``).

Loss: mean squared error of the normalized action chunk over its real steps (padded
targets past an episode's end have no weight); ``LossResult.weight`` is the number
of real target elements. Image augmentation (``bc.crop``, ``bc.color_jitter``) is
drawn in ``sample`` from the trainer's generator (:mod:`~slhub_bc.augment`).
Validation: the same error over every ``val_stride``-th window of the validation
episodes, in a fixed order; on the expert's cart-pole demonstrations, the share of
closed-loop rollouts that stay balanced; with ``validation.env``, the policy rolled
out in a simulator (:mod:`~slhub_bc.rollouts`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel
from slhub import LossResult, RecipeError, Trainer, hookimpl
from slhub.data import PAD_SUFFIX, TrainingData, WindowStream
from slhub.sim import cartpole

from slhub_bc import augment
from slhub_bc.data import IMAGE, STATE, cameras, offsets_of, open_data, to_batch
from slhub_bc.model import Policy, StatePolicy, VisualPolicy
from slhub_bc.render import render
from slhub_bc.rollouts import EnvPlan, evaluate, plan
from slhub_bc.sections import SECTIONS, BcDataSection, BcSection

SECTION = "bc"
DTYPES = {"float32": torch.float32, "float64": torch.float64}
PAD = "action" + PAD_SUFFIX


class BcPlugin:
    """Behavior cloning: a policy from observation windows to action chunks."""

    def __init__(self) -> None:
        self._data: TrainingData | None = None
        self._stream: WindowStream | None = None
        self._env: EnvPlan | None = None
        #: Visual BC's camera roles, their frame shapes and cropped sizes (for augmentation).
        self._camera_roles: list[str] = []
        self._camera_shapes: list[tuple[int, int, int]] = []
        self._crops: list[tuple[int, int]] = []

    @hookimpl
    def recipe_sections(self) -> dict[str, type[BaseModel]]:
        return dict(SECTIONS)

    # -------------------------------------------------------------- construction

    @hookimpl
    def build_model(self, trainer: Trainer) -> torch.nn.Module:
        cfg: BcSection = trainer.section(SECTION)
        data_cfg: BcDataSection = trainer.section("data")
        if cfg.rollouts and data_cfg.path is not None:
            raise RecipeError(
                "bc.rollouts: closed-loop rollouts simulate the expert's cart-pole; a dataset "
                "path has no simulator here, set bc.rollouts: 0"
            )
        data = open_data(cfg, data_cfg, trainer)
        if cfg.rollouts:
            _check_rollouts(data)
        offsets = offsets_of(cfg, data)
        data.require_anchors(offsets, "train")
        if data.split.validation:
            data.require_anchors(offsets, "validation")
        stats = data.statistics
        observation = (
            (stats["observation"]["mean"], stats["observation"]["std"])
            if "observation" in data.layouts
            else (np.zeros(0), np.ones(0))
        )
        action = (stats["action"]["mean"], stats["action"]["std"])
        if cfg.observation == "state":
            model: Policy = StatePolicy(
                observation, action, history=cfg.history, chunk=cfg.chunk, hidden=cfg.hidden
            )
        else:
            roles = cameras(data)
            shapes = [
                (int(h), int(w), int(c)) for h, w, c in (data.layouts[r].shape for r in roles)
            ]
            model = VisualPolicy(
                observation,
                action,
                cameras=shapes,
                history=cfg.history,
                chunk=cfg.chunk,
                channels=cfg.channels,
                hidden=cfg.hidden,
                crop=cfg.crop,
            )
            self._camera_roles, self._camera_shapes, self._crops = roles, shapes, model.crops
        env = trainer.section("validation").env
        self._env = plan(env, cfg, data) if env is not None else None
        self._data = data
        # data.decode; checkpointed under "bc" and closed with the run
        self._stream = data.stream(offsets, trainer.config.batch_size, trainer=trainer, key=SECTION)
        return model.to(DTYPES[cfg.precision])

    # -------------------------------------------------------------- every update

    @hookimpl
    def sample(self, trainer: Trainer, generator: torch.Generator) -> dict[str, torch.Tensor]:
        if self._stream is None:
            raise RuntimeError("the bc plugin's build_model has not run")
        cfg: BcSection = trainer.section(SECTION)
        window = self._stream.next(generator)
        batch = to_batch(window, DTYPES[cfg.precision], trainer.device)
        if self._camera_roles:  # drawn after the windows, from the same generator only
            drawn = augment.draw(
                generator, len(batch["action"]), self._camera_roles, self._camera_shapes,
                self._crops, cfg.color_jitter,
            )  # fmt: skip
            batch.update({key: value.to(trainer.device) for key, value in drawn.items()})
        return batch

    @hookimpl
    def objective(self, trainer: Trainer, model: torch.nn.Module, batch: dict) -> LossResult:
        loss, weight = masked_error(model, batch)
        return LossResult(loss=loss / max(weight, 1), weight=weight)

    # -------------------------------------------------------------- validation

    @hookimpl
    def validate(self, trainer: Trainer, model: torch.nn.Module, step: int) -> dict[str, float]:
        data = self._data
        if data is None:
            return {}
        cfg: BcSection = trainer.section(SECTION)
        net = _unwrap(model)
        dtype = next(net.parameters()).dtype
        device = next(net.parameters()).device
        metrics: dict[str, float] = {}
        if data.split.validation:
            offsets = offsets_of(cfg, data)
            anchors = data.require_anchors(offsets, "validation")[:: cfg.val_stride]
            total, count = 0.0, 0
            with torch.no_grad():
                for start in range(0, len(anchors), cfg.val_batch):
                    window = data.read(offsets, anchors[start : start + cfg.val_batch])
                    error, weight = masked_error(net, to_batch(window, dtype, device))
                    total, count = total + float(error.double()), count + weight
            metrics["mse"] = total / max(count, 1)
        if cfg.rollouts and data.split.validation:
            starts = _validation_starts(data, cfg.rollouts)
            max_force = trainer.section("data").demos.max_force
            act = _policy_on(net, data, dtype, device)
            with torch.no_grad():
                metrics["balanced"] = balanced_fraction(cfg, starts, act, max_force)
        env = trainer.section("validation").env
        if self._env is not None and env is not None:
            metrics.update(evaluate(net, self._env, env, cfg, data.layouts["action"].dim))
        return metrics

    # -------------------------------------------------------------- export

    @hookimpl
    def export(self, checkpoint: Any, checkpoint_path: Path, out_dir: Path) -> Path | None:
        from slhub_bc.export import export_checkpoint

        return export_checkpoint(checkpoint, checkpoint_path, out_dir)


def masked_error(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[Any, int]:
    """The summed squared error of the normalized action chunk over its real steps, and
    how many target elements are real (padded steps count zero)."""
    prediction = model(batch)
    target = _unwrap(model).normalize_action(batch["action"])
    real = (~batch[PAD]).to(prediction.dtype)[..., None].expand_as(prediction)
    return ((prediction - target).square() * real).sum(), int(real.sum().item())


def _unwrap(model: torch.nn.Module) -> Policy:
    inner = getattr(model, "module", model)
    if not isinstance(inner, Policy):
        raise TypeError(f"the bc plugin expects a Policy, got {type(inner).__name__}")
    return inner


# ------------------------------------------------------------------ cart-pole rollouts


def _validation_starts(data: TrainingData, count: int) -> np.ndarray:
    """The initial states ``[n, 4]`` of the first ``count`` validation episodes."""
    episodes = data.split.validation[:count]
    return np.stack([np.asarray(data.dataset.read(STATE, e, 0, 1))[0] for e in episodes])


def _check_rollouts(data: TrainingData) -> None:
    """Rollouts simulate the state and render the frame, so the policy must read those."""
    layouts = data.layouts
    if "observation" in layouts and layouts["observation"].features != (STATE,):
        raise RecipeError("bc.rollouts: the observation role must be the demonstrations' state")
    if any(layouts[role].features != (IMAGE,) for role in cameras(data)):
        raise RecipeError("bc.rollouts: the camera must be the demonstrations' image")


def _policy_on(
    net: Policy, data: TrainingData, dtype: torch.dtype, device: torch.device
) -> Callable[[np.ndarray], np.ndarray]:
    """The policy as a function of cart-pole state histories ``[B, K, 4]``: it sees what
    it was trained on (the state and/or the rendered frames) and returns the first
    force of its chunk ``[B]``."""
    layouts = data.layouts
    views = cameras(data)

    def act(history: np.ndarray) -> np.ndarray:
        window: dict[str, np.ndarray] = {"action": np.zeros((len(history), 1, 1))}
        if "observation" in layouts:
            window["observation"] = history
        for role in views:
            window[role] = np.round(render(history) * 255).astype(np.uint8)[..., None]
        batch = to_batch(window, dtype, device)
        return net.act(batch)[:, 0, 0].double().cpu().numpy()

    return act


def balanced_fraction(
    cfg: BcSection,
    starts: np.ndarray,
    act: Callable[[np.ndarray], np.ndarray],
    max_force: float,
) -> float:
    """Closed loop: the share of rollouts from ``starts`` whose pole stays upright.

    ``act`` drives the simulator for ``rollout_steps`` from state histories at the
    policy's offsets (before the start, the start state repeats, as a padded window
    repeats an episode's first step); the first force of each chunk is applied. A
    rollout is balanced when ``|theta|`` stays below ``balance_angle`` throughout.
    """
    steps = np.asarray(cfg.offsets()["observation"])
    states = [np.asarray(starts, dtype=np.float64)]
    upright = np.ones(len(starts), dtype=bool)
    for now in range(cfg.rollout_steps):
        history = np.stack([states[max(now + int(o), 0)] for o in steps], axis=1)
        force = np.clip(act(history), -max_force, max_force)
        states.append(cartpole.cartpole_step(states[-1], force))
        upright &= np.abs(states[-1][:, 1]) < cfg.balance_angle
    return float(upright.mean())
