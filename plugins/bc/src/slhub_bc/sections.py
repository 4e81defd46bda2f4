"""The recipe sections the ``bc`` plugin owns, validated before anything is built.

- ``data``: slhub's one ``data:`` shape (:class:`slhub.data.DatasetSection`) with the
  roles ``observation`` (vector features, concatenated), ``image`` (one image
  feature per camera) and ``action``; without a ``path``, the LQR expert's cart-pole
  demonstrations (``demos``), written once into slhub's store under ``cache_dir``.
- ``bc``: the policy (state or visual), its observation history and action chunk,
  its sizes, image augmentation, validation and the cart-pole rollouts.
- ``validation``: ``env``, the policy rolled out in a simulator at every validation
  (:mod:`slhub_bc.rollouts`).
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from slhub.data import DatasetSection


class DemoSection(BaseModel):
    """``data.demos``: the LQR expert's cart-pole demonstrations (:mod:`slhub_bc.expert`),
    used when ``data.path`` names no dataset. Validation episodes use ``seed + 1``."""

    model_config = ConfigDict(extra="forbid")

    train_episodes: int = Field(default=64, gt=0)
    val_episodes: int = Field(default=16, gt=0)
    length: int = Field(default=150, gt=0, description="steps per episode, less the first")
    seed: int = Field(default=0, ge=0)
    noise: float = Field(default=2.0, ge=0, description="N of noise on the applied force")
    max_force: float = Field(default=10.0, gt=0)


#: The demonstration generator's keys, which a recipe with ``data.path`` does not use
#: (``cache_dir`` serves a dataset path too: its statistics go there).
GENERATOR_KEYS = ("demos",)


class BcDataSection(DatasetSection):
    """``data``: a dataset on disk (``path`` ...), or the expert's cart-pole demonstrations."""

    model_config = ConfigDict(extra="forbid")

    cache_dir: str = Field(default=".cache/bc_cartpole", min_length=1)
    demos: DemoSection = DemoSection()

    @field_validator("cache_dir")
    @classmethod
    def _home_dir(cls, value: str) -> str:
        """``~`` is the user's home, as in a shell, never a directory named ``~``."""
        return os.path.expanduser(value)

    @model_validator(mode="after")
    def _one_source(self) -> BcDataSection:
        if self.path is None and self.split != type(self.split)():
            raise ValueError(
                "split applies to a dataset path; the expert's demonstrations are split by "
                "data.demos.train_episodes and val_episodes"
            )
        if self.path is not None:
            fields = type(self).model_fields
            unused = [k for k in GENERATOR_KEYS if getattr(self, k) != fields[k].get_default()]
            if unused:
                raise ValueError(
                    f"{unused[0]} belongs to the expert's demonstrations, which a dataset path "
                    "replaces"
                )
        return self


class ColorJitterSection(BaseModel):
    """``bc.color_jitter``: per training window, brightness and contrast factors drawn
    uniformly in ``[1 - b, 1 + b]`` and ``[1 - c, 1 + c]`` (torchvision's ColorJitter)."""

    model_config = ConfigDict(extra="forbid")

    brightness: float = Field(default=0.0, ge=0, lt=1)
    contrast: float = Field(default=0.0, ge=0, lt=1)


class BcSection(BaseModel):
    """``bc``: the policy, its windows and its validation."""

    model_config = ConfigDict(extra="forbid")

    observation: Literal["state", "visual"] = Field(
        default="state",
        description="state: an MLP on the observation role; visual: a CNN per camera "
        "(image role), plus the observation role when the recipe names one",
    )
    history: int = Field(default=1, ge=1, le=64, description="observation steps fed")
    frame_gap: int = Field(default=1, ge=1, description="steps between observed steps")
    chunk: int = Field(default=1, ge=1, le=256, description="action steps predicted, from t")
    hidden: int = Field(default=64, gt=0)
    channels: int = Field(default=16, gt=0)
    val_stride: int = Field(default=5, gt=0, description="every n-th validation anchor")
    val_batch: int = Field(default=256, gt=0, description="validation windows read at once")
    n_action_steps: int = Field(
        default=1,
        ge=1,
        description="actions of each predicted chunk executed in a rollout before the "
        "policy is asked again (receding horizon); at most chunk",
    )
    crop: int | float | None = Field(
        default=None,
        description="visual: frames cropped to this side in pixels (56), or this share of "
        "each side (0.875): a random crop per training window, the centre crop otherwise",
    )
    color_jitter: ColorJitterSection | None = None
    rollouts: int = Field(
        default=0, ge=0, description="closed-loop cart-pole rollouts (demonstrations only)"
    )
    rollout_steps: int = Field(default=150, gt=0)
    balance_angle: float = Field(default=0.5, gt=0)
    precision: Literal["float32", "float64"] = "float32"

    @field_validator("crop", mode="before")
    @classmethod
    def _crop_kind(cls, value: object) -> object:
        if isinstance(value, bool):
            raise ValueError("a side in pixels (an integer >= 1) or a share in (0, 1]")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BcSection:
        if isinstance(self.crop, int) and self.crop < 1:
            raise ValueError("crop: a side in pixels must be >= 1")
        if isinstance(self.crop, float) and not 0 < self.crop <= 1:
            raise ValueError("crop: a share of each side must be in (0, 1]")
        if self.observation == "state" and (self.crop is not None or self.color_jitter):
            raise ValueError("crop and color_jitter augment frames: bc.observation: visual")
        if self.n_action_steps > self.chunk:
            raise ValueError(
                f"n_action_steps {self.n_action_steps} exceeds the chunk of {self.chunk} actions"
            )
        return self

    def offsets(self) -> dict[str, range]:
        """Observation steps ``t - (history - 1) * frame_gap .. t`` and actions
        ``t .. t + chunk - 1`` around an anchor ``t``."""
        reach = (self.history - 1) * self.frame_gap
        return {"observation": range(-reach, 1, self.frame_gap), "action": range(self.chunk)}


class EnvSection(BaseModel):
    """``validation.env``: the policy rolled out in a simulator on rank 0 at every
    validation, from fixed reset seeds (:func:`slhub.sim.rollout_policy`)."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(
        default=None,
        pattern=r"^[^:]+:.+$",
        description="PREFIX:ENV (gymnasium:InvertedPendulum-v5); default: the env the "
        "dataset was collected from (its meta.json source)",
    )
    episodes: int = Field(default=10, ge=1)
    seed: int = Field(default=0, ge=0, description="episode e resets as collect's episode e")
    max_steps: int | None = Field(default=None, ge=1, description="default: the env's limit")
    time_budget_s: float | None = Field(
        default=None, gt=0, description="no new episode starts after this many seconds"
    )
    camera: str | None = Field(default=None, description="default: the dataset's collect camera")
    size: int | None = Field(default=None, ge=1, description="default: the dataset's frame side")
    features: dict[str, str] = Field(
        default_factory=dict,
        description="dataset feature -> what the rollout records (observation, qpos, qvel, "
        "image), for datasets whose names differ",
    )
    video: str | None = Field(
        default=None, min_length=1, description="write the first episode here (mp4)"
    )
    video_size: int = Field(default=256, ge=16)


class BcValidationSection(BaseModel):
    """``validation``: what BC's validation does beyond the held-out error."""

    model_config = ConfigDict(extra="forbid")

    env: EnvSection | None = None


#: Section name -> model, as returned by the ``recipe_sections`` hook.
SECTIONS: dict[str, type[BaseModel]] = {
    "bc": BcSection,
    "data": BcDataSection,
    "validation": BcValidationSection,
}
