"""Public data utilities for slhub plugins: the cart-pole simulator and split/cache helpers.

Built-in and external plugins import data code from here (``slhub.data``, not
its submodules, which are internal), never from another plugin's internals, so
a plugin's modules can change without breaking the packages that share its
data.

- :mod:`slhub.data.cartpole` — the numpy cart-pole (:func:`cartpole_step`,
  :func:`generate_trajectories`, :func:`cartpole_store` (episodes in slhub's
  store), :func:`ensure_dataset`, :func:`state_deltas`
  and its constants; ``CARTPOLE_FORMAT`` is the ``format`` its dataset's
  ``meta.json`` records).
- :mod:`slhub.data.angles` — :func:`wrap_angle`, the one [-pi, pi) convention,
  for numpy arrays and torch tensors.
- :mod:`slhub.data.cache` — :func:`cached_arrays`: arrays generated once, written
  atomically and shared memory-mapped, keyed by their parameters.
- :mod:`slhub.data.splits` — :class:`SplitCache` (each split made once per recipe
  section) and :func:`split_seed` (validation uses ``seed + 1``).

Recorded robot data (the episode-dataset layer):

- :mod:`slhub.data.episodes` — the contract: :class:`EpisodeDataset` (episodes of
  named :class:`Feature` s), :func:`open_dataset` (readers by format from the
  entry-point group ``slhub.datasets``, or detected), :class:`ArrayEpisodes`.
- :mod:`slhub.data.windows` — :class:`Window` (per-feature step offsets; excluded
  or padded at episode edges with ``<feature>_is_pad``) and :func:`sample_anchors`.
- :mod:`slhub.data.store` — slhub's own store (:class:`StoreDataset`,
  :func:`write_store`); :mod:`slhub.data.statistics` — :func:`feature_statistics`;
  :mod:`slhub.data.identity` — :func:`fingerprint` and :func:`split_episodes`.
- :mod:`slhub.data.readers` — LeRobot, robomimic, zarr, Minari and NeRD files.
- :mod:`slhub.data.cartpole_section` — :class:`CartpoleDataSection`: that section
  with the cart-pole generator's keys, for models that also train on it (NeRD, RWM).
- :mod:`slhub.data.source` — what a model plugin trains on: :class:`DataSection` (the
  one ``data:`` recipe shape), :class:`Role` (what a plugin reads under one name) and
  :class:`TrainingData` (the dataset split by episode, its roles' statistics, windows).
"""

from slhub.data.angles import wrap_angle
from slhub.data.cache import cached_arrays
from slhub.data.cartpole import (
    ACTION_NAMES,
    CART_MASS,
    DT,
    GRAVITY,
    HALF_LENGTH,
    POLE_MASS,
    STATE_NAMES,
    THETA,
    CartpoleData,
    cartpole_step,
    cartpole_store,
    ensure_dataset,
    generate_trajectories,
    state_deltas,
)
from slhub.data.cartpole import FORMAT as CARTPOLE_FORMAT
from slhub.data.cartpole_section import CartpoleDataSection, GeneratedSplit
from slhub.data.episodes import (
    READER_GROUP,
    ArrayEpisodes,
    EpisodeDataset,
    Feature,
    open_dataset,
    readers,
)
from slhub.data.identity import Split, fingerprint, split_episodes
from slhub.data.source import (
    DataSection,
    DecodeSection,
    Role,
    RoleLayout,
    SplitSection,
    TrainingData,
    WindowSection,
)
from slhub.data.splits import SplitCache, split_seed
from slhub.data.statistics import feature_statistics
from slhub.data.store import StoreDataset, write_store
from slhub.data.stream import WindowStream
from slhub.data.windows import PAD_SUFFIX, Window, sample_anchors

__all__ = [
    "ACTION_NAMES",
    "ArrayEpisodes",
    "CartpoleDataSection",
    "DataSection",
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
    "open_dataset",
    "readers",
    "sample_anchors",
    "split_episodes",
    "write_store",
    "CARTPOLE_FORMAT",
    "CART_MASS",
    "DT",
    "GRAVITY",
    "HALF_LENGTH",
    "POLE_MASS",
    "STATE_NAMES",
    "THETA",
    "CartpoleData",
    "SplitCache",
    "cached_arrays",
    "cartpole_step",
    "cartpole_store",
    "ensure_dataset",
    "generate_trajectories",
    "split_seed",
    "state_deltas",
    "wrap_angle",
]
