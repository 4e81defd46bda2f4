"""The recipe sections the ``rwm`` plugin owns, validated before anything is built.

- ``rwm``: the context (``history``) and forecast (``horizon``) lengths, the GRU's
  size, which state components are angles, the precision and the validation
  stride. Lengths are checked against the dataset in ``build_model``, which is the
  first place that knows its episodes.
- ``data``: slhub's one ``data:`` shape (:class:`slhub.data.DataSection`: path,
  format, split, window, features with the roles ``state``, ``action`` and
  ``extra``); without a ``path``, the cart-pole generator's cache directory and the
  sizes and seeds of its train and validation episodes (made once into slhub's
  store, memory-mapped afterwards), the same keys as NeRD's.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from slhub.data import DataSection as DatasetSection

#: The section holding the model's settings (the data has its own, ``data``).
SECTION = "rwm"
#: The cart-pole generator's keys, which a recipe with ``data.path`` does not use.
GENERATOR_KEYS = ("cache_dir", "max_force", "train", "val")


class RwmSection(BaseModel):
    """``rwm``: the world model, its windows and its validation."""

    model_config = ConfigDict(extra="forbid")

    history: int = Field(
        default=32, gt=0, description="context steps the GRU reads (RWM's default: 32)"
    )
    horizon: int = Field(
        default=8,
        gt=0,
        description="forecast steps, trained on the model's own predictions (RWM's: 8)",
    )
    hidden: int = Field(default=64, gt=0)
    layers: int = Field(default=1, gt=0)
    angles: list[str] | None = Field(
        default=None,
        description="state components that are angles (wrapped, fed as sin/cos); default: "
        "theta for the cart-pole store, none for a dataset",
    )
    val_stride: int = Field(
        default=5, gt=0, description="validation windows: every Nth anchor of each episode"
    )
    precision: Literal["float32", "float64"] = "float32"

    @property
    def span(self) -> int:
        """Steps of one window: the context and the forecast."""
        return self.history + self.horizon


class GeneratedSplit(BaseModel):
    """One generated cart-pole split: ``num_trajectories`` episodes of ``length`` steps
    from ``seed``."""

    model_config = ConfigDict(extra="forbid")

    num_trajectories: int = Field(ge=1)
    length: int = Field(ge=1)
    seed: int = Field(ge=0)


class DataSection(DatasetSection):
    """``data``: a dataset on disk (``path`` ...), or the cart-pole generator's episodes."""

    model_config = ConfigDict(extra="forbid")

    cache_dir: str = Field(default=".cache/slhub-rwm", min_length=1)
    max_force: float = Field(default=10.0, gt=0)
    train: GeneratedSplit = GeneratedSplit(num_trajectories=64, length=100, seed=0)
    val: GeneratedSplit = GeneratedSplit(num_trajectories=16, length=100, seed=1)

    @field_validator("cache_dir")
    @classmethod
    def _home(cls, value: str) -> str:
        """``~`` is the user's home, as in a shell, never a directory named ``~``."""
        return os.path.expanduser(value)

    @model_validator(mode="after")
    def _one_source(self) -> DataSection:
        """The generator's keys and a dataset's split never mix: each would be ignored."""
        if self.train.seed == self.val.seed:
            raise ValueError("train.seed and val.seed must differ (independent validation data)")
        if self.path is None and self.split != type(self.split)():
            raise ValueError(
                "split applies to a dataset path; the cart-pole generator's episodes are "
                "split by data.train and data.val"
            )
        if self.path is not None:
            fields = type(self).model_fields
            unused = [k for k in GENERATOR_KEYS if getattr(self, k) != fields[k].get_default()]
            if unused:
                raise ValueError(
                    f"{unused[0]} belongs to the cart-pole generator, which a dataset path "
                    "replaces; split a dataset with data.split"
                )
        return self


#: Section name -> model, as returned by the ``recipe_sections`` hook.
SECTIONS: dict[str, type[BaseModel]] = {SECTION: RwmSection, "data": DataSection}
