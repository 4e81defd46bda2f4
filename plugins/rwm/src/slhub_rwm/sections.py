"""The recipe sections the ``rwm`` plugin owns, validated before anything is built.

- ``rwm``: the context (``history``) and forecast (``horizon``) lengths, the GRU's
  size, which state components are angles, the precision and the validation
  stride. Lengths are checked against the dataset in ``build_model``, which is the
  first place that knows its episodes.
- ``data``: slhub's one ``data:`` shape (:class:`slhub.data.DatasetSection`: path,
  format, split, window, features with the roles ``state``, ``action`` and
  ``extra``); without a ``path``, the cart-pole generator's cache directory and the
  sizes and seeds of its train and validation episodes (made once into slhub's
  store, memory-mapped afterwards), the same keys as NeRD's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from slhub.data import CartpoleDataSection, GeneratedSplit

#: The section holding the model's settings (the data has its own, ``data``).
SECTION = "rwm"


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


class RwmDataSection(CartpoleDataSection):
    """``data``: a dataset on disk (``path`` ...), or the cart-pole generator's episodes
    (:class:`slhub.data.CartpoleDataSection`; RWM's defaults)."""

    model_config = ConfigDict(extra="forbid")

    cache_dir: str = Field(default=".cache/slhub-rwm", min_length=1)
    generated_train: GeneratedSplit = GeneratedSplit(num_trajectories=64, length=100, seed=0)
    generated_validation: GeneratedSplit = GeneratedSplit(num_trajectories=16, length=100, seed=1)


#: Section name -> model, as returned by the ``recipe_sections`` hook.
SECTIONS: dict[str, type[BaseModel]] = {SECTION: RwmSection, "data": RwmDataSection}
