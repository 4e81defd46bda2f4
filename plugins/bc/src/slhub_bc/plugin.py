"""The ``bc`` slhub plugin: state or visual behavior cloning of the cart-pole LQR expert."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from slhub import LossResult, hookimpl
from slhub.data import SplitCache, cartpole_step, split_seed

from slhub_bc.expert import Demonstrations, demonstrations
from slhub_bc.model import StatePolicy, VisualPolicy
from slhub_bc.render import render

SECTION = "bc"
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class DemoConfig(BaseModel):
    """Expert demonstrations, made in memory at build time (see :mod:`slhub_bc.expert`)."""

    model_config = ConfigDict(extra="forbid")

    train_episodes: int = Field(default=64, gt=0)
    val_episodes: int = Field(default=16, gt=0)
    length: int = Field(default=150, gt=0)
    seed: int = Field(default=0, ge=0)
    noise: float = Field(default=2.0, ge=0)
    max_force: float = Field(default=10.0, gt=0)

    def make(self, split: str) -> Demonstrations:
        count = self.train_episodes if split == "train" else self.val_episodes
        seed = split_seed(self.seed, split)
        return demonstrations(count, self.length, seed, self.noise, self.max_force)


class BcSection(BaseModel):
    """The ``bc`` recipe section."""

    model_config = ConfigDict(extra="forbid")

    observation: Literal["state", "visual"] = "state"
    frame_gap: int = Field(default=3, gt=0)
    hidden: int = Field(default=64, gt=0)
    channels: int = Field(default=16, gt=0)
    data: DemoConfig = Field(default_factory=DemoConfig)
    val_stride: int = Field(default=5, gt=0)
    rollouts: int = Field(default=16, ge=0)
    rollout_steps: int = Field(default=150, gt=0)
    balance_angle: float = Field(default=0.5, gt=0)
    precision: Literal["float32", "float64"] = "float32"

    @model_validator(mode="after")
    def _gap_fits(self) -> BcSection:
        if self.observation == "visual" and self.frame_gap > self.data.length:
            raise ValueError("frame_gap must be <= data.length")
        return self

    @property
    def first_step(self) -> int:
        """The first step with a full observation (visual needs the frame ``frame_gap`` back)."""
        return self.frame_gap if self.observation == "visual" else 0


class BcPlugin:
    """Behavior cloning: MSE between the policy's force and the expert's, in N^2."""

    def __init__(self) -> None:
        self._splits: SplitCache[Demonstrations] = SplitCache()

    def _demos(self, cfg: BcSection, split: str) -> Demonstrations:
        return self._splits.get(cfg, split, cfg.data.make)

    @hookimpl
    def recipe_sections(self) -> dict[str, type[BaseModel]]:
        return {SECTION: BcSection}

    @hookimpl
    def build_model(self, trainer: Any) -> torch.nn.Module:
        cfg: BcSection = trainer.section(SECTION)
        demos = self._demos(cfg, "train")
        scale = float(demos.actions.std())
        if cfg.observation == "state":
            states = demos.states.reshape(-1, 4)
            model = StatePolicy(states.mean(0), states.std(0) + 1e-6, scale, cfg.hidden)
        else:
            model = VisualPolicy(scale, cfg.channels, cfg.hidden)
        return model.to(DTYPES[cfg.precision])

    @hookimpl
    def sample(self, trainer: Any, generator: torch.Generator) -> dict[str, torch.Tensor]:
        cfg: BcSection = trainer.section(SECTION)
        demos = self._demos(cfg, "train")
        size = (trainer.config.batch_size,)
        episode = torch.randint(0, demos.num_episodes, size, generator=generator).numpy()
        t = torch.randint(cfg.first_step, demos.length + 1, size, generator=generator).numpy()
        return _batch(cfg, demos, episode, t, trainer.device)

    @hookimpl
    def objective(self, trainer: Any, model: torch.nn.Module, batch: dict) -> LossResult:
        err = model(batch["obs"]) - batch["action"]
        return LossResult(loss=err.square().mean(), weight=err.numel())

    @hookimpl
    def validate(self, trainer: Any, model: torch.nn.Module, step: int) -> dict[str, float]:
        cfg: BcSection = trainer.section(SECTION)
        demos = self._demos(cfg, "val")
        t = np.arange(cfg.first_step, demos.length + 1, cfg.val_stride)
        episode = np.repeat(np.arange(demos.num_episodes), len(t))
        batch = _batch(cfg, demos, episode, np.tile(t, demos.num_episodes), trainer.device)
        metrics = {"mse": float((model(batch["obs"]) - batch["action"]).square().mean())}
        if cfg.rollouts:
            metrics["balanced"] = _balanced_fraction(cfg, demos, model, trainer.device)
        return metrics


def _observe(cfg: BcSection, now: np.ndarray, before: np.ndarray | None) -> np.ndarray:
    if cfg.observation == "state":
        return now
    return render(np.stack([before, now], axis=1))


def _batch(cfg, demos: Demonstrations, episode, t, device) -> dict[str, torch.Tensor]:
    before = demos.states[episode, t - cfg.frame_gap] if cfg.observation == "visual" else None
    obs = _observe(cfg, demos.states[episode, t], before)
    dtype = DTYPES[cfg.precision]
    return {
        "obs": torch.as_tensor(obs, dtype=dtype, device=device),
        "action": torch.as_tensor(demos.actions[episode, t], dtype=dtype, device=device),
    }


def _balanced_fraction(cfg: BcSection, demos: Demonstrations, model, device) -> float:
    """Closed loop: the share of rollouts from validation starts whose pole stays upright.

    The policy drives the simulator for ``rollout_steps`` from the first
    ``rollouts`` validation initial states (the visual policy sees the start state
    as its earlier frame until it has ``frame_gap`` steps of history); a rollout is
    balanced when ``|theta|`` stays below ``balance_angle`` throughout.
    """
    states = [np.asarray(demos.states[: cfg.rollouts, 0])]
    upright = np.ones(len(states[0]), dtype=bool)
    for step in range(cfg.rollout_steps):
        before = states[max(step - cfg.frame_gap, 0)]
        obs = _observe(cfg, states[-1], before)
        obs = torch.as_tensor(obs, dtype=DTYPES[cfg.precision], device=device)
        force = model(obs)[:, 0].double().cpu().numpy()
        force = np.clip(force, -cfg.data.max_force, cfg.data.max_force)
        states.append(cartpole_step(states[-1], force))
        upright &= np.abs(states[-1][:, 1]) < cfg.balance_angle
    return float(upright.mean())
