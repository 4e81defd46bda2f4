"""The recipe sections the ``nerd`` plugin owns, validated before anything is built.

Every key has a default (docs/nerd.md lists them), so a recipe names only what
it changes; cross-section checks that need more than one section (window
lengths against horizons) are made in ``build_model``.

- ``model``: history window, sizes, causal attention, normalization, which
  state components are angles (and whether they are also fed as sin/cos), the
  floating base and the frame it learns in, and the precision the model is
  built, trained and exported in.
- ``data``: slhub's one ``data:`` shape (:class:`slhub.data.DatasetSection`: path,
  format, split, window, features with the roles ``state``, ``action`` and
  ``extra``); without a ``path``, the cart-pole generator's cache directory and
  the sizes and seeds of its train and validation episodes (made once into
  slhub's store, memory-mapped afterwards).
- ``loss``: the loss mask: which state components and which window positions
  are supervised.
- ``validation``: rollout horizons and how many validation episodes to use.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from slhub.builtin.nerd.model import LAYOUT_FEATURE_SET, NerdArch, NerdLayout
from slhub.data import CartpoleDataSection

#: The cart-pole's state component that is an angle (fed as sin/cos, wrapped).
ANGLE_FEATURE = "theta"


class PlanarBaseSection(BaseModel):
    """``model.base: {planar: [rootx, rootz, rooty]}``: a planar base's three joints, a
    slide along x, a slide along z and a hinge about +y, in that order."""

    model_config = ConfigDict(extra="forbid")

    planar: list[str]


#: How ``model.base`` is written, for the one line that refuses another form.
BASE_FORMS = "a free joint (root) or {planar: [x slide, z slide, y hinge]}"


def _base(value: Any) -> Any:
    """``model.base`` checked before the union parses it, so a bad one is one message."""
    if value is None or isinstance(value, PlanarBaseSection):
        return value
    if isinstance(value, str) and value:
        return value
    if isinstance(value, dict) and set(value) == {"planar"}:
        joints = value["planar"]
        if (
            isinstance(joints, list | tuple)
            and len(joints) == 3
            and all(isinstance(j, str) and j for j in joints)
            and len(set(joints)) == 3
        ):
            return PlanarBaseSection(planar=list(joints))
    raise ValueError(f"{value!r}: name {BASE_FORMS} (three different joints)")


class ModelSection(BaseModel):
    """``model``: the network and its precision."""

    model_config = ConfigDict(extra="forbid")

    history: int = Field(default=10, ge=1, le=1024)
    width: int = Field(default=64, ge=1)
    layers: int = Field(default=2, ge=1)
    heads: int = Field(default=4, ge=1)
    mlp_hidden: int | None = Field(default=None, ge=1, description="default: 4 * width")
    causal: bool = True
    normalize: bool = True
    angles: list[str] | None = Field(
        default=None,
        description="state components that are angles (wrapped to [-pi, pi)); default: "
        "theta for the cart-pole, none for a dataset",
    )
    angle_features: bool = True
    base: Annotated[str | PlanarBaseSection | None, BeforeValidator(_base)] = Field(
        default=None,
        description="the robot's floating base: a free joint's name (root), or {planar: "
        "[x slide, z slide, y hinge]}; default: the one slhub data collect recorded in the "
        "dataset, else none",
    )
    frame: Literal["body", "world"] | None = Field(
        default=None,
        description="body: each step in its base's frame; world: as recorded; default: "
        "body where a base exists, else world",
    )
    precision: Literal["float32", "float64", "bfloat16"] = "float32"

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelSection:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be divisible by heads {self.heads}")
        return self

    def arch(self, layout: NerdLayout) -> NerdArch:
        return NerdArch(
            feature_set=LAYOUT_FEATURE_SET,
            state_dim=len(layout.state_names),
            action_dim=len(layout.action_names),
            extra_dim=len(layout.extra_names),
            history=self.history,
            width=self.width,
            layers=self.layers,
            heads=self.heads,
            mlp_hidden=self.mlp_hidden or 4 * self.width,
            causal=int(self.causal),
            normalize=int(self.normalize),
            angle_index=-1,
        )


class NerdDataSection(CartpoleDataSection):
    """``data``: a dataset on disk (``path`` ...), or the cart-pole generator's episodes
    (:class:`slhub.data.CartpoleDataSection`; NeRD's defaults)."""

    model_config = ConfigDict(extra="forbid")

    cache_dir: str = Field(default=".cache/nerd_cartpole", min_length=1)


class LossSection(BaseModel):
    """``loss``: the mask of the normalized state-change MSE."""

    model_config = ConfigDict(extra="forbid")

    features: list[str] | None = Field(
        default=None, min_length=1, description="supervised state components; default: all"
    )
    skip_first: int = Field(default=0, ge=0)


class ValidationSection(BaseModel):
    """``validation``: autoregressive rollout horizons and how many validation episodes
    (long enough for the longest horizon) to roll out."""

    model_config = ConfigDict(extra="forbid")

    horizons: list[int] = Field(default_factory=lambda: [10, 100], min_length=1)
    num_trajectories: int | None = Field(default=None, ge=1, description="default: all")
    groups: dict[str, list[str]] = Field(
        default_factory=dict,
        description="measure -> state components (joint_position: [qpos.hinge]): each "
        "measure's errors are also reported alone, rollout and baselines alike",
    )

    @model_validator(mode="after")
    def _positive(self) -> ValidationSection:
        if any(h < 1 for h in self.horizons):
            raise ValueError("horizons must be >= 1")
        for name, components in self.groups.items():
            if not name.isidentifier() or not components:
                raise ValueError(
                    f"groups.{name}: a measure is a name (letters, digits, _) with at least "
                    "one state component"
                )
        return self


#: Section name -> model, as returned by the ``recipe_sections`` hook.
SECTIONS: dict[str, type[BaseModel]] = {
    "model": ModelSection,
    "data": NerdDataSection,
    "loss": LossSection,
    "validation": ValidationSection,
}
