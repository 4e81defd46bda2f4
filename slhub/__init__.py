"""slhub: a plugin-registry microframework for supervised robot learning.

The public face for plugin authors and users: the hook marker and contract
types, the error a plugin raises for a one-line user error, the process-group
scope, the Python entry to training and the reader of a run's metrics history.
Everything else is internal.

``train`` is imported on first use, so ``import slhub`` (and loading an export
with ``slhub.export.load``) does not load the training engine.
"""

from typing import Any

from slhub._version import __version__
from slhub.artifacts import read_metrics
from slhub.distributed import distributed_run
from slhub.errors import SlhubError
from slhub.hookspecs import LossResult, Trainer, hookimpl
from slhub.recipe import load_recipe

__all__ = [
    "LossResult",
    "SlhubError",
    "Trainer",
    "__version__",
    "distributed_run",
    "hookimpl",
    "load_recipe",
    "read_metrics",
    "train",
]


def __getattr__(name: str) -> Any:
    if name == "train":
        from slhub.run import train

        return train
    raise AttributeError(f"module 'slhub' has no attribute {name!r}")
