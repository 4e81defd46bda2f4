"""The ``data:`` section of a model that can also train on the generated cart-pole.

NeRD and RWM read any dataset through :class:`slhub.data.DataSection`; without a
``path`` they make their own episodes with the numpy cart-pole. The generator's keys
(``cache_dir``, ``max_force``, ``train``, ``val``), their checks and the step from
them to a dataset in slhub's store are the same for both, so they live here once;
each plugin subclasses :class:`CartpoleDataSection` to set its own defaults.
``cache_dir`` is also where the statistics of any dataset go when the recipe sets it
(:meth:`slhub.data.DataSection.cache_root`): with a ``path`` and no ``cache_dir``
they go to the user's cache, never into the dataset.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from slhub.data.cartpole import cartpole_store
from slhub.data.source import DataSection

#: The generator's keys, which a recipe with ``data.path`` does not use (``cache_dir``
#: serves a dataset path too: its statistics go there).
GENERATOR_KEYS = ("max_force", "train", "val")


class GeneratedSplit(BaseModel):
    """One generated split: ``num_trajectories`` episodes of ``length`` steps from ``seed``."""

    model_config = ConfigDict(extra="forbid")

    num_trajectories: int = Field(ge=1)
    length: int = Field(ge=1)
    seed: int = Field(ge=0)


class CartpoleDataSection(DataSection):
    """``data``: a dataset on disk (``path`` ...), or the cart-pole generator's episodes,
    made once into slhub's store under ``cache_dir`` (split names ``train`` and
    ``validation``), with their statistics beside them in ``cache_dir``."""

    model_config = ConfigDict(extra="forbid")

    cache_dir: str = Field(default=".cache/slhub_cartpole", min_length=1)
    max_force: float = Field(default=10.0, gt=0)
    train: GeneratedSplit = GeneratedSplit(num_trajectories=1000, length=200, seed=0)
    val: GeneratedSplit = GeneratedSplit(num_trajectories=64, length=120, seed=1)

    @field_validator("cache_dir")
    @classmethod
    def _home(cls, value: str) -> str:
        """``~`` is the user's home, as in a shell, never a directory named ``~``."""
        return os.path.expanduser(value)

    @model_validator(mode="after")
    def _one_source(self) -> CartpoleDataSection:
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

    def store(self) -> Path:
        """The generator's episodes in slhub's store (:func:`slhub.data.cartpole_store`)."""
        splits = {
            "train": (self.train.num_trajectories, self.train.length, self.train.seed),
            "validation": (self.val.num_trajectories, self.val.length, self.val.seed),
        }
        return cartpole_store(self.cache_dir, splits, self.max_force)

    def resolved(self) -> DataSection:
        """This section as :class:`TrainingData.open` takes it: the dataset path, or the
        generator's store with its own split when there is none (and its statistics
        cached in ``cache_dir`` beside the store, default or not)."""
        if self.path is not None:
            return self
        split = self.split.model_copy(update={"train": "train", "validation": "validation"})
        update = {"path": str(self.store()), "split": split, "cache_dir": self.cache_dir}
        return self.model_copy(update=update)
