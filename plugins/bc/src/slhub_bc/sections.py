"""The recipe sections the ``bc`` plugin owns, validated before anything is built.

- ``data``: slhub's one ``data:`` shape (:class:`slhub.data.DataSection`) with the
  roles ``observation`` (vector features, concatenated), ``image`` (one image
  feature per camera) and ``action``; without a ``path``, the LQR expert's cart-pole
  demonstrations (``demos``), written once into slhub's store under ``cache_dir``.
- ``bc``: the policy (state or visual), its observation history and action chunk,
  its sizes, validation and the cart-pole rollouts.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from slhub.data import DataSection


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


#: The demonstration generator's keys, which a recipe with ``data.path`` does not use.
GENERATOR_KEYS = ("cache_dir", "demos")


class BcDataSection(DataSection):
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
    rollouts: int = Field(
        default=0, ge=0, description="closed-loop cart-pole rollouts (demonstrations only)"
    )
    rollout_steps: int = Field(default=150, gt=0)
    balance_angle: float = Field(default=0.5, gt=0)
    precision: Literal["float32", "float64"] = "float32"

    def offsets(self) -> dict[str, range]:
        """Observation steps ``t - (history - 1) * frame_gap .. t`` and actions
        ``t .. t + chunk - 1`` around an anchor ``t``."""
        reach = (self.history - 1) * self.frame_gap
        return {"observation": range(-reach, 1, self.frame_gap), "action": range(self.chunk)}


#: Section name -> model, as returned by the ``recipe_sections`` hook.
SECTIONS: dict[str, type[BaseModel]] = {"bc": BcSection, "data": BcDataSection}
