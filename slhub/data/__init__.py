"""Public data utilities for slhub plugins: the episode-dataset layer and split/cache helpers.

Built-in and external plugins import data code from here (``slhub.data``, not
its submodules, which are internal), never from another plugin's internals, so
a plugin's modules can change without breaking the packages that share its
data. The numpy cart-pole the generated data comes from is :mod:`slhub.sim.cartpole`.

- :mod:`slhub.data.angles` — :func:`wrap_angle`, the one [-pi, pi) convention,
  for numpy arrays and torch tensors.
- :mod:`slhub.data.cache` — :func:`cached_arrays`: arrays generated once, written
  atomically and shared memory-mapped, keyed by their parameters.
- :mod:`slhub.data.split_cache` — :class:`SplitCache` (each split made once per recipe
  section) and :func:`split_seed` (validation uses ``seed + 1``).
- :mod:`slhub.data.layout_buffer` — :func:`json_buffer` and :func:`read_json_buffer`:
  a JSON record as a uint8 tensor, so a model's state dict carries its own layout.

Recorded robot data (the episode-dataset layer):

- :mod:`slhub.data.episodes` — the contract: :class:`EpisodeDataset` (episodes of
  named :class:`Feature` s), :func:`open_dataset` (readers by format from the
  entry-point group ``slhub.datasets``, or detected), :class:`ArrayEpisodes`.
- :mod:`slhub.data.windows` — :class:`Window` (per-feature step offsets; excluded
  or padded at episode edges with ``<feature>_is_pad``) and :func:`sample_anchors`.
- :mod:`slhub.data.store` — slhub's own store (:class:`StoreDataset`,
  :func:`write_store`); :mod:`slhub.data.statistics` — :func:`feature_statistics`;
  :mod:`slhub.data.dataset_fingerprint` — :func:`fingerprint` and :func:`split_episodes`.
- :mod:`slhub.data.readers` — LeRobot, robomimic, zarr, Minari and NeRD files.
- :mod:`slhub.data.training` — what a model plugin trains on: :class:`DatasetSection`
  (the one ``data:`` recipe shape), :class:`Role` (what a plugin reads under one name)
  and :class:`TrainingData` (the dataset split by episode, its roles' statistics,
  windows).
- :mod:`slhub.data.cartpole_section` — :class:`CartpoleDataSection`: that section
  with the cart-pole generator's keys (:class:`GeneratedSplit` each), for models
  that also train on generated episodes (NeRD, RWM).
"""

from slhub.data.angles import wrap_angle
from slhub.data.cache import cached_arrays
from slhub.data.cartpole_section import CartpoleDataSection, GeneratedSplit
from slhub.data.dataset_fingerprint import Split, fingerprint, split_episodes
from slhub.data.episodes import (
    READER_GROUP,
    ArrayEpisodes,
    EpisodeDataset,
    Feature,
    open_dataset,
    readers,
)
from slhub.data.layout_buffer import json_buffer, read_json_buffer
from slhub.data.split_cache import SplitCache, split_seed
from slhub.data.statistics import feature_statistics
from slhub.data.store import StoreDataset, write_store
from slhub.data.stream import WindowStream
from slhub.data.training import (
    DatasetSection,
    DecodeSection,
    Role,
    RoleLayout,
    SplitSection,
    TrainingData,
    WindowSection,
)
from slhub.data.windows import PAD_SUFFIX, Window, sample_anchors

__all__ = [
    "ArrayEpisodes",
    "CartpoleDataSection",
    "DatasetSection",
    "GeneratedSplit",
    "EpisodeDataset",
    "Role",
    "RoleLayout",
    "SplitSection",
    "TrainingData",
    "WindowSection",
    "WindowStream",
    "DecodeSection",
    "Feature",
    "PAD_SUFFIX",
    "READER_GROUP",
    "Split",
    "StoreDataset",
    "Window",
    "feature_statistics",
    "fingerprint",
    "json_buffer",
    "open_dataset",
    "read_json_buffer",
    "readers",
    "sample_anchors",
    "split_episodes",
    "write_store",
    "SplitCache",
    "cached_arrays",
    "split_seed",
    "wrap_angle",
]
