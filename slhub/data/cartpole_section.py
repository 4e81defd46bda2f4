"""The ``data:`` section of a model that can also train on the generated cart-pole.

NeRD and RWM read any dataset through :class:`slhub.data.DatasetSection`; without a
``path`` they make their own episodes with the numpy cart-pole
(:mod:`slhub.sim.cartpole`). The generator's keys (``cache_dir``, ``max_force``,
``generated_train``, ``generated_validation``), their checks and the step from them
to a dataset in slhub's store are the same for both, so they live here once; each
plugin subclasses :class:`CartpoleDataSection` to set its own defaults. The
``generated_`` prefix keeps them apart from a dataset's ``split`` (``split.train``,
``split.validation``: which episodes of a dataset train and validate).
``cache_dir`` is also where the statistics of any dataset go when the recipe sets it
(:meth:`slhub.data.DatasetSection.cache_root`): with a ``path`` and no ``cache_dir``
they go to the user's cache, never into the dataset.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from slhub.data.training import DatasetSection

#: The generator's keys, which a recipe with ``data.path`` does not use (``cache_dir``
#: serves a dataset path too: its statistics go there).
GENERATOR_KEYS = ("max_force", "generated_train", "generated_validation")
#: Split words that are not keys of this section (the generator's splits are
#: ``generated_*``, a dataset's are under ``split``): a recipe naming one is refused.
SPLIT_WORDS = ("train", "val", "validation")


class GeneratedSplit(BaseModel):
    """One generated split: ``num_trajectories`` episodes of ``length`` steps from ``seed``."""

    model_config = ConfigDict(extra="forbid")

    num_trajectories: int = Field(ge=1)
    length: int = Field(ge=1)
    seed: int = Field(ge=0)


class CartpoleDataSection(DatasetSection):
    """``data``: a dataset on disk (``path`` ...), or the cart-pole generator's episodes,
    made once into slhub's store under ``cache_dir`` (split names ``train`` and
    ``validation``), with their statistics beside them in ``cache_dir``."""

    model_config = ConfigDict(extra="forbid")

    cache_dir: str = Field(default=".cache/slhub_cartpole", min_length=1)
    max_force: float = Field(default=10.0, gt=0)
    generated_train: GeneratedSplit = GeneratedSplit(num_trajectories=1000, length=200, seed=0)
    generated_validation: GeneratedSplit = GeneratedSplit(num_trajectories=64, length=120, seed=1)

    @field_validator("cache_dir")
    @classmethod
    def _home(cls, value: str) -> str:
        """``~`` is the user's home, as in a shell, never a directory named ``~``."""
        return os.path.expanduser(value)

    @model_validator(mode="before")
    @classmethod
    def _generated_keys(cls, data: Any) -> Any:
        """``train``, ``val`` and ``validation`` name a dataset's split (``data.split``),
        never the generator's episodes: refused in one line naming the generator's keys."""
        if isinstance(data, dict):
            for key in SPLIT_WORDS:
                if key in data:
                    raise ValueError(
                        f"data.{key} is not a key: the cart-pole generator's episodes are "
                        "data.generated_train and data.generated_validation (a dataset's "
                        "split: data.split)"
                    )
        return data

    @model_validator(mode="after")
    def _one_source(self) -> CartpoleDataSection:
        """The generator's keys and a dataset's split never mix: each would be ignored."""
        if self.generated_train.seed == self.generated_validation.seed:
            raise ValueError(
                "generated_train.seed and generated_validation.seed must differ "
                "(independent validation data)"
            )
        if self.path is None and self.split != type(self.split)():
            raise ValueError(
                "split applies to a dataset path; the cart-pole generator's episodes are "
                "split by data.generated_train and data.generated_validation"
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
        """The generator's episodes in slhub's store
        (:func:`slhub.sim.cartpole.cartpole_store`)."""
        # imported here: slhub.sim's collector writes through this data layer
        from slhub.sim.cartpole import cartpole_store

        train, validation = self.generated_train, self.generated_validation
        splits = {
            "train": (train.num_trajectories, train.length, train.seed),
            "validation": (validation.num_trajectories, validation.length, validation.seed),
        }
        return cartpole_store(self.cache_dir, splits, self.max_force)

    def resolved(self) -> DatasetSection:
        """This section as :class:`TrainingData.open` takes it: the dataset path, or the
        generator's store with its own split when there is none (and its statistics
        cached in ``cache_dir`` beside the store, default or not)."""
        if self.path is not None:
            return self
        split = self.split.model_copy(update={"train": "train", "validation": "validation"})
        update = {"path": str(self.store()), "split": split, "cache_dir": self.cache_dir}
        return self.model_copy(update=update)
