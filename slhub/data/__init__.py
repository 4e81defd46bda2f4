"""Public data utilities for slhub plugins: the cart-pole simulator and split/cache helpers.

Built-in and external plugins import data code from here (``slhub.data``, not
its submodules, which are internal), never from another plugin's internals, so
a plugin's modules can change without breaking the packages that share its
data.

- :mod:`slhub.data.cartpole` — the numpy cart-pole (:func:`cartpole_step`,
  :func:`generate_trajectories`, :func:`ensure_dataset`, :func:`state_deltas`
  and its constants; ``CARTPOLE_FORMAT`` is the ``format`` its dataset's
  ``meta.json`` records).
- :mod:`slhub.data.angles` — :func:`wrap_angle`, the one [-pi, pi) convention,
  for numpy arrays and torch tensors.
- :mod:`slhub.data.cache` — :func:`cached_arrays`: arrays generated once, written
  atomically and shared memory-mapped, keyed by their parameters.
- :mod:`slhub.data.splits` — :class:`SplitCache` (each split made once per recipe
  section) and :func:`split_seed` (validation uses ``seed + 1``).

Its modules need numpy only; :func:`wrap_angle` also accepts torch tensors.
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
    ensure_dataset,
    generate_trajectories,
    state_deltas,
)
from slhub.data.cartpole import FORMAT as CARTPOLE_FORMAT
from slhub.data.splits import SplitCache, split_seed

__all__ = [
    "ACTION_NAMES",
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
    "ensure_dataset",
    "generate_trajectories",
    "split_seed",
    "state_deltas",
    "wrap_angle",
]
