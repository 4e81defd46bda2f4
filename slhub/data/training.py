"""A model plugin's training data: the one ``data:`` recipe section and what it opens.

Every model plugin (NeRD, RWM, state and visual BC) reads recorded episodes the
same way, so the recipe shape and the code that turns it into batches live here
once:

.. code-block:: yaml

    data:
      path: datasets/hopper          # any format slhub.data reads
      format: auto
      split: {validation_ratio: 0.1, seed: 0}   # or train/validation: [episodes] or a split name
      window: {pad: false, sample: step}        # episode edges and how anchors are drawn
      features: {state: [qpos, qvel], action: [action]}   # role -> dataset features
      cache_dir: ~/.cache/slhub          # statistics and derived arrays (never in the dataset)

A *role* is what a plugin needs under one name (NeRD's ``state`` and ``action``,
BC's ``observation``, ``image`` and ``action``); the recipe says which dataset
features fill it, concatenated on their last axis (vectors and scalars), or one
image feature. The plugin says which offsets each role takes around an anchor
(its history and forecast lengths). :class:`TrainingData` opens the dataset,
splits it by episode, records its identity in the run (resume refuses a changed
dataset), computes the training split's statistics once (cached by fingerprint in
``data.cache_dir`` or the user's cache, never inside the dataset: a run never writes
into a dataset) and reads windows of roles: float64 vectors ``[B, K, D]`` or uint8 images
``[B, K, H, W, C]``, with ``<role>_is_pad`` masks when padding.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from slhub.data.cache import cached_arrays
from slhub.data.dataset_fingerprint import Split, fingerprint, split_episodes
from slhub.data.episodes import AUTO, EpisodeDataset, Feature, open_dataset, refuse_short_episodes
from slhub.data.statistics import feature_statistics
from slhub.data.stream import WindowStream
from slhub.data.windows import PAD_SUFFIX, Window, sample_anchors
from slhub.errors import ArtifactError, DatasetError, RecipeError
from slhub.paths import real_path, user_cache_dir, within

#: Statistics kept per role (float64 arrays over the role's components).
STATISTICS = ("mean", "std", "min", "max")


class SplitSection(BaseModel):
    """``data.split``: which episodes train and which validate (never by step)."""

    model_config = ConfigDict(extra="forbid")

    train: list[int] | str | None = Field(
        default=None, description="episode indices, or the name of a split the file defines"
    )
    validation: list[int] | str | None = None
    validation_ratio: float = Field(default=0.1, ge=0.0, lt=1.0)
    seed: int = Field(default=0, ge=0)


class WindowSection(BaseModel):
    """``data.window``: what happens at episode edges, and how anchors are drawn."""

    model_config = ConfigDict(extra="forbid")

    pad: bool = Field(
        default=False,
        description="false: only anchors whose whole window fits the episode; true: every "
        "step, edges padded with the edge value and reported in <role>_is_pad",
    )
    sample: Literal["step", "episode"] = Field(
        default="step", description="uniform over valid anchors, or over episodes first"
    )


class DecodeSection(BaseModel):
    """``data.decode``: windows decoded ahead of the loop (results never depend on
    ``workers``; ``ahead`` is part of the draw order, so of the run's identity)."""

    model_config = ConfigDict(extra="forbid")

    workers: int = Field(default=0, ge=0, le=64, description="decode threads; 0: inline")
    ahead: int = Field(
        default=0, ge=0, le=64, description="batches drawn and decoded ahead of the update"
    )


class DatasetSection(BaseModel):
    """``data``: a recorded dataset, its split, its windows and which features fill each role."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(default=None, min_length=1)
    format: str = AUTO
    split: SplitSection = SplitSection()
    window: WindowSection = WindowSection()
    decode: DecodeSection = DecodeSection()
    features: dict[str, list[str]] = Field(default_factory=dict)
    cache_dir: str | None = Field(
        default=None,
        min_length=1,
        description="where statistics and other arrays derived from the dataset are "
        "cached (keyed by its fingerprint), never inside the dataset; default: "
        "$XDG_CACHE_HOME/slhub (~/.cache/slhub)",
    )

    @field_validator("path", "cache_dir")
    @classmethod
    def _expand_home(cls, value: str | None) -> str | None:
        """``~`` is the user's home, as in a shell, never a directory named ``~``."""
        return None if value is None else os.path.expanduser(value)

    def cache_root(self) -> Path:
        """The folder slhub caches what it derives from this dataset in: ``cache_dir``
        when the recipe sets it (a plugin's default for a generator of its own, which
        puts it in the fields set, counts too), else the user's cache
        (:func:`user_cache_dir`). Never the dataset: a run does not write into it."""
        if self.cache_dir is not None and "cache_dir" in self.model_fields_set:
            return Path(self.cache_dir)
        return user_cache_dir()

    @field_validator("features", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        """``state: qpos`` means ``state: [qpos]``."""
        if isinstance(value, Mapping):
            return {k: [v] if isinstance(v, str) else v for k, v in value.items()}
        return value


@dataclass(frozen=True)
class Role:
    """What a plugin reads under one name: the dataset features it takes when the
    recipe names none, whether it may be left empty, and whether it is an image."""

    default: tuple[str, ...] = ()
    required: bool = True
    image: bool = False


@dataclass(frozen=True)
class RoleLayout:
    """The dataset features that fill one role, and the names of its components."""

    role: str
    features: tuple[str, ...]
    names: tuple[str, ...]
    image: bool = False
    shape: tuple[int, ...] = ()

    @property
    def dim(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        """The position of component ``name`` (one line naming the components if absent)."""
        if name not in self.names:
            raise RecipeError(
                f"{self.role} has no component {name!r} (it has: {', '.join(self.names)})"
            )
        return self.names.index(name)


@dataclass
class TrainingData:
    """An opened dataset split by episode, with its role layouts and training statistics."""

    dataset: EpisodeDataset
    split: Split
    layouts: dict[str, RoleLayout]
    statistics: dict[str, dict[str, np.ndarray]]
    window: WindowSection = field(default_factory=WindowSection)
    identity: dict[str, Any] = field(default_factory=dict)
    decode: DecodeSection = field(default_factory=DecodeSection)
    #: Where :meth:`cached` keeps its arrays (``data.cache_dir``; None: the user's cache).
    cache_dir: Path | None = None
    _anchors: dict[tuple[Any, ...], np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def open(
        cls,
        section: DatasetSection,
        roles: Mapping[str, Role],
        *,
        trainer: Any = None,
        record_as: str = "data",
    ) -> TrainingData:
        """Open ``section``'s dataset for ``roles``; with ``trainer``, record its identity.

        :raises RecipeError: no path, a role the plugin does not read, a required role
            left empty.
        :raises DatasetError: a missing or unreadable dataset, a feature it lacks (listing
            what it has), a wrong shape or dtype, a non-finite value, an empty split or
            episode.
        :raises RecipeError: ``data.cache_dir`` inside the dataset (or the dataset itself).
        """
        if section.path is None:
            raise RecipeError("data.path: name the dataset to train on")
        unknown = sorted(set(section.features) - set(roles))
        if unknown:
            raise RecipeError(
                f"data.features: unknown role {unknown[0]!r} (this model reads: {', '.join(roles)})"
            )
        cache_dir = section.cache_root()
        if Path(section.path).exists() and within(cache_dir, section.path):
            raise RecipeError(
                f"data.cache_dir {real_path(cache_dir)} is inside the dataset "
                f"{real_path(section.path)}: a run never writes into a dataset; choose a "
                "cache directory outside it"
            )
        dataset = open_dataset(section.path, section.format)
        try:
            if dataset.num_episodes == 0:
                raise DatasetError(f"{dataset.path}: the dataset holds no episodes")
            refuse_short_episodes(dataset)  # an empty episode, as `slhub data check` says
        except DatasetError:
            dataset.close()
            raise
        layouts = {}
        for name, role in roles.items():
            chosen = tuple(section.features.get(name, role.default))
            if not chosen:
                if role.required:
                    raise RecipeError(f"data.features.{name}: name the dataset features to use")
                continue
            layouts[name] = _layout(dataset, name, chosen, role)
        split_cfg = section.split
        split = split_episodes(
            dataset,
            validation_ratio=split_cfg.validation_ratio,
            seed=split_cfg.seed,
            train=split_cfg.train,
            validation=split_cfg.validation,
        )
        identity = fingerprint(dataset)
        statistics = _cached_statistics(dataset, identity, split, layouts, cache_dir)
        if trainer is not None:
            trainer.record_dataset(record_as, dataset, split)
        return cls(
            dataset,
            split,
            layouts,
            statistics,
            section.window,
            identity,
            section.decode,
            cache_dir,
        )

    def cached(
        self,
        name: str,
        params: Mapping[str, Any],
        names: Sequence[str],
        make: Callable[[], Mapping[str, np.ndarray]],
    ) -> dict[str, np.ndarray]:
        """Arrays a plugin derives from this data (NeRD's state-change statistics), made
        once by ``make()`` and cached with the statistics, keyed by the dataset's
        fingerprint, the split and ``params``: every rank and later run reads the same
        arrays, bit for bit, without reading the dataset again."""
        meta = {
            "name": name,
            "fingerprint": self.identity,
            "train": list(self.split.train),
            "validation": list(self.split.validation),
            "params": dict(params),
        }
        key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:32]
        arrays = cached_arrays(_statistics_dir(self.cache_dir) / key, meta, names, make)
        return {k: np.array(v) for k, v in arrays.items()}

    def change_statistics(self, role: str, angles: Sequence[int] = ()) -> dict[str, np.ndarray]:
        """Mean and std (float64) of the step-to-step change of ``role`` over the training
        episodes (``angles``: component indices whose change is wrapped to [-pi, pi)):
        what a model predicting state changes (NeRD, RWM) normalizes its targets with.
        One streaming pass, cached like :meth:`cached`.

        :raises DatasetError: no training episode has two steps.
        """
        layout, columns = self.layouts[role], [int(a) for a in angles]

        def changes() -> dict[str, np.ndarray]:
            from slhub.data.angles import wrap_angle

            count, total, squares = 0, 0.0, 0.0
            for episode in self.split.train:
                length = int(self.dataset.lengths[episode])
                if length < 2:
                    continue
                parts = [
                    np.asarray(self.dataset.read(name, episode, 0, length), dtype=np.float64)
                    for name in layout.features
                ]
                values = np.concatenate([p.reshape(length, -1) for p in parts], axis=-1)
                delta = np.diff(values, axis=0)
                if columns:
                    delta[:, columns] = wrap_angle(delta[:, columns])
                count, total = count + len(delta), total + delta.sum(0)
                squares = squares + np.square(delta).sum(0)
            if count == 0:
                raise DatasetError(f"{self.dataset.path}: no training episode has two steps")
            mean = total / count
            variance = np.maximum(squares / count - np.square(mean), 0.0)
            return {"mean": mean, "std": np.sqrt(variance)}

        params = {"role": role, "features": list(layout.features), "angles": columns}
        return self.cached("changes", params, ["mean", "std"], changes)

    def delta_normalization(
        self, inputs: Sequence[str], angles: Sequence[int] = (), floor: float = 1e-6
    ) -> tuple[torch.Tensor, ...]:
        """What a model fed ``inputs`` (roles, in token order) and predicting changes of
        ``state`` normalizes with (NeRD, RWM): the inputs' mean and std and the state
        change's mean and std (:meth:`change_statistics`), float64, std floored at
        ``floor`` so a constant component stays finite."""
        mean = np.concatenate([self.statistics[r]["mean"] for r in inputs])
        std = np.concatenate([self.statistics[r]["std"] for r in inputs])
        change = self.change_statistics("state", angles)
        return tuple(
            torch.from_numpy(np.asarray(a, dtype=np.float64))
            for a in (
                mean,
                np.maximum(std, floor),
                change["mean"],
                np.maximum(change["std"], floor),
            )
        )

    # ------------------------------------------------------------ anchors

    def episodes(self, which: Literal["train", "validation"]) -> tuple[int, ...]:
        return self.split.train if which == "train" else self.split.validation

    def anchors(
        self, offsets: Mapping[str, Sequence[int]], which: Literal["train", "validation"]
    ) -> np.ndarray:
        """Every valid anchor ``(episode, step)`` of a split for a window of role offsets."""
        window = self._window(offsets)
        key = (which, window.pad, tuple(sorted(window.offsets.items())))
        if key not in self._anchors:
            episodes = np.asarray(self.episodes(which), dtype=np.int64)
            local = window.anchors(np.asarray(self.dataset.lengths)[episodes])
            local[:, 0] = episodes[local[:, 0]] if len(local) else local[:, 0]
            self._anchors[key] = local
        return self._anchors[key]

    def require_anchors(
        self, offsets: Mapping[str, Sequence[int]], which: Literal["train", "validation"]
    ) -> np.ndarray:
        """:meth:`anchors`, refusing in one line a split whose episodes are all shorter
        than the window (at admission, not at the first update)."""
        found = self.anchors(offsets, which)
        if len(found) == 0:
            episodes = self.episodes(which)
            if not episodes:
                raise DatasetError(f"{self.dataset.path}: the {which} split holds no episodes")
            low, high = self._window(offsets).reach
            longest = int(max(int(self.dataset.lengths[e]) for e in episodes))
            raise DatasetError(
                f"{self.dataset.path}: every {which} episode is shorter than the window "
                f"(offsets {low}..{high} need {high - low + 1} steps; the longest has {longest})"
            )
        return found

    def sample(
        self,
        offsets: Mapping[str, Sequence[int]],
        count: int,
        generator: torch.Generator,
    ) -> dict[str, np.ndarray]:
        """``count`` training windows drawn with ``generator`` (with replacement)."""
        anchors = self.require_anchors(offsets, "train")
        picked = sample_anchors(anchors, count, generator, by=self.window.sample)
        return self.read(offsets, picked)

    def read(self, offsets: Mapping[str, Sequence[int]], anchors: np.ndarray) -> dict[str, Any]:
        """The windows at ``anchors``: per role float64 ``[B, K, D]`` (or the image dtype,
        ``[B, K, H, W, C]``) and, with padding, ``<role>_is_pad`` ``[B, K]``."""
        out: dict[str, Any] = {}
        for role, steps in offsets.items():
            layout = self.layouts[role]
            window = Window({name: tuple(steps) for name in layout.features}, pad=self.window.pad)
            read = window.batch(self.dataset, anchors)
            if layout.image:
                out[role] = read[layout.features[0]]
            else:
                parts = [_as_vectors(read[name]) for name in layout.features]
                out[role] = np.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]
            if self.window.pad:
                out[role + PAD_SUFFIX] = read[layout.features[0] + PAD_SUFFIX]
        out["anchors"] = np.asarray(anchors, dtype=np.int64)
        return out

    def stream(
        self,
        offsets: Mapping[str, Sequence[int]],
        batch_size: int,
        *,
        trainer: Any = None,
        key: str | None = None,
    ) -> WindowStream:
        """Training batches of ``offsets`` decoded ahead as ``data.decode`` says.

        With ``trainer`` and ``key`` the stream is registered with the trainer
        (``trainer.register_state(key, stream)``): every checkpoint holds the windows it
        drew ahead under ``key``, a resume restores them, and when the run ends the
        stream is closed, and this data with it.
        """
        if (trainer is None) != (key is None):
            raise TypeError("TrainingData.stream: pass trainer and key together, or neither")
        stream = WindowStream(
            self,
            offsets,
            batch_size,
            ahead=self.decode.ahead,
            workers=self.decode.workers,
            owns_data=trainer is not None,
        )
        if trainer is not None:
            try:
                trainer.register_state(key, stream)
            except BaseException:
                stream.close()
                raise
        return stream

    def reopened(self) -> TrainingData:
        """This data with its own reader of the same files (a decode thread's private
        handles); an in-memory dataset is shared as it is (its reads touch no files)."""
        if not Path(self.dataset.path).exists():
            return self
        reader = open_dataset(self.dataset.path, self.dataset.format)
        return replace(self, dataset=reader, _anchors={})

    def _window(self, offsets: Mapping[str, Sequence[int]]) -> Window:
        features: dict[str, tuple[int, ...]] = {}
        for role, steps in offsets.items():
            for name in self.layouts[role].features:
                features[name] = tuple(sorted(set(features.get(name, ())) | set(steps)))
        return Window(features, pad=self.window.pad)

    def close(self) -> None:
        self.dataset.close()


def _layout(dataset: EpisodeDataset, role: str, chosen: tuple[str, ...], spec: Role) -> RoleLayout:
    for_what = f"data.features.{role}"
    features = [dataset.check_feature(name, for_what=for_what) for name in chosen]
    if spec.image:
        if len(chosen) != 1 or not features[0].is_image:
            shapes = ", ".join(f"{n} {list(f.shape)} {f.dtype}" for n, f in zip(chosen, features))
            raise DatasetError(
                f"{dataset.path}: {for_what} takes one image feature (H x W x C uint8), "
                f"got {shapes}"
            )
        return RoleLayout(role, chosen, chosen, image=True, shape=tuple(features[0].shape))
    for name, feature in zip(chosen, features):
        if feature.is_image or len(feature.shape) > 1:
            raise DatasetError(
                f"{dataset.path}: {for_what}: feature {name} has shape {list(feature.shape)}; "
                "this role takes vectors or scalars"
            )
        if not np.issubdtype(np.dtype(feature.dtype), np.number) and feature.dtype != "bool":
            raise DatasetError(
                f"{dataset.path}: {for_what}: feature {name} has dtype {feature.dtype}, "
                "not a number"
            )
    return RoleLayout(role, chosen, component_names(dict(zip(chosen, features))))


def component_names(features: Mapping[str, Feature]) -> tuple[str, ...]:
    """The names of the components that ``features`` (in order) fill a role with: the
    format's names, else ``feature[i]``; a scalar is its feature's name; components that
    two features name alike (qpos and qvel both name their joints) become
    ``feature.name``. A feature of more than one axis is one ``feature [shape]`` entry."""
    per_feature: list[list[str]] = []
    for name, feature in features.items():
        if not feature.shape:
            per_feature.append([name])
        elif len(feature.shape) > 1:
            per_feature.append([f"{name} {list(feature.shape)}"])
        elif feature.names and len(feature.names) == feature.shape[0]:
            per_feature.append(list(feature.names))
        else:
            per_feature.append([f"{name}[{i}]" for i in range(feature.shape[0])])
    names = [n for part in per_feature for n in part]
    if len(set(names)) != len(names):
        names = [
            n if n.startswith(f"{feature}[") or n == feature else f"{feature}.{n}"
            for feature, part in zip(features, per_feature)
            for n in part
        ]
    return tuple(names)


def _as_vectors(values: np.ndarray) -> np.ndarray:
    """``[B, K]`` scalars or ``[B, K, d]`` vectors as float64 ``[B, K, d]``."""
    values = values.astype(np.float64)
    return values[..., None] if values.ndim == 2 else values


def _cached_statistics(
    dataset: EpisodeDataset,
    identity: Mapping[str, Any],
    split: Split,
    layouts: Mapping[str, RoleLayout],
    cache_dir: Path | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """Per-role mean/std/min/max over the training episodes, computed once (float64,
    one streaming pass) and cached in ``cache_dir`` (never in the dataset) by the
    dataset's fingerprint, the episodes and the features, so every rank and every later
    run reads the same arrays bit for bit (each file written atomically, the parameters
    last). The validation episodes are checked for non-finite values in the same pass."""
    features = sorted({name for layout in layouts.values() for name in layout.features})
    meta = {
        "fingerprint": dict(identity),
        "train": list(split.train),
        "validation": list(split.validation),
        "features": features,
    }
    key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:32]
    # feature names (``obs/qpos``) never become file names: files are numbered
    file_of = {(f, s): f"f{i:03d}_{s}" for i, f in enumerate(features) for s in STATISTICS}

    def compute() -> dict[str, np.ndarray]:
        if split.validation:
            feature_statistics(dataset, features, split.validation)
        stats = feature_statistics(dataset, features, split.train)
        return {file: np.asarray(stats[f][s], dtype=np.float64) for (f, s), file in file_of.items()}

    folder = _statistics_dir(cache_dir) / key
    arrays = cached_arrays(folder, meta, list(file_of.values()), compute)
    out: dict[str, dict[str, np.ndarray]] = {}
    for role, layout in layouts.items():
        per_stat = {}
        for stat in STATISTICS:
            parts = [np.array(arrays[file_of[f, stat]]).reshape(-1) for f in layout.features]
            per_stat[stat] = np.concatenate(parts) if not layout.image else parts[0]
        out[role] = per_stat
    return out


def _statistics_dir(cache_dir: Path | None) -> Path:
    """``<cache_dir>/statistics``: ``data.cache_dir``'s, or the user's cache
    (``$XDG_CACHE_HOME/slhub``), never a folder inside the dataset."""
    return (user_cache_dir() if cache_dir is None else Path(cache_dir)) / "statistics"


def check_output_dir(output_dir: str | os.PathLike[str], sections: Mapping[str, Any]) -> None:
    """Refuse, in one line, an output directory through which a run would write into a
    dataset it reads: the ``path`` of every recipe section of the one ``data`` shape
    (:class:`DatasetSection`). Refused: the dataset itself, a folder inside it, and a folder
    that contains a dataset directory (a file dataset may sit in the output directory).
    Paths are compared with every symlink resolved. Called at admission, before the run
    directory is created or anything is written.

    :raises ArtifactError: naming ``trainer.output_dir`` and the dataset, both resolved.
    """
    out = real_path(output_dir)
    for name, section in sections.items():
        if not isinstance(section, DatasetSection) or section.path is None:
            continue
        data = real_path(section.path)
        if out == data:
            how = "is the dataset"
        elif data in out.parents:
            how = "is inside the dataset"
        elif out in data.parents and not data.is_file():
            how = "contains the dataset"
        else:
            continue
        raise ArtifactError(
            f"trainer.output_dir {out} {how} {name}.path {data}: a run never writes into a "
            "dataset; choose an output directory outside it"
        )
