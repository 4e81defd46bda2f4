"""slhub: a plugin-registry microframework for supervised robot learning.

The public face for plugin authors and users: the hook marker and contract
types, the errors (and :func:`one_line`, which turns any exception into a
user's one-line message), the process-group scope, the Python entry to
training and its counterpart ``evaluate`` (``slhub eval``), the reader of a run's
metrics history, the atomic file writer every exporter writes with, the recipe's optimizer and
schedule builders, the random-state helpers and slhub's logger. Built-in and
external plugins import only these names and the public modules
``slhub.data``, ``slhub.sim``, ``slhub.export`` and ``slhub.testing``;
everything else is internal.

``train``, the optimizer builders, the random-state helpers and the logging
names are imported on first use, so ``import slhub`` (and loading an export
with ``slhub.export.load``) does not load the training engine or structlog.
"""

from importlib import import_module
from typing import Any

from slhub._version import __version__
from slhub.artifacts import read_metrics
from slhub.atomic import atomic_write
from slhub.errors import (
    ArtifactError,
    CheckpointError,
    DatasetError,
    ExportError,
    PluginError,
    RankFailure,
    RecipeError,
    SlhubError,
    one_line,
)
from slhub.hookspecs import LossResult, Trainer, hookimpl
from slhub.paths import unwritable_reason
from slhub.recipe import load_recipe

#: Public names imported on first use: name -> (module, name there).
_LAZY = {
    "train": ("slhub.run", "train"),
    "evaluate": ("slhub.evaluation", "run_eval"),
    "distributed_run": ("slhub.distributed", "distributed_run"),
    "OptimSection": ("slhub.optim", "OptimSection"),
    "ScheduleSection": ("slhub.optim", "ScheduleSection"),
    "build_optimizer": ("slhub.optim", "build_optimizer"),
    "build_schedule": ("slhub.optim", "build_schedule"),
    "random_state": ("slhub.rng", "random_state"),
    "set_random_state": ("slhub.rng", "set_random_state"),
    "preserved_random_state": ("slhub.rng", "preserved_random_state"),
    "get_logger": ("slhub.log", "get_logger"),
    "log_format": ("slhub.log", "current_format"),
    "set_log_write_wrapper": ("slhub.log", "set_write_wrapper"),
}

__all__ = [
    "ArtifactError",
    "DatasetError",
    "CheckpointError",
    "ExportError",
    "LossResult",
    "OptimSection",
    "PluginError",
    "RankFailure",
    "RecipeError",
    "ScheduleSection",
    "SlhubError",
    "Trainer",
    "__version__",
    "atomic_write",
    "build_optimizer",
    "build_schedule",
    "distributed_run",
    "evaluate",
    "get_logger",
    "hookimpl",
    "load_recipe",
    "log_format",
    "one_line",
    "preserved_random_state",
    "random_state",
    "read_metrics",
    "set_log_write_wrapper",
    "set_random_state",
    "train",
    "unwritable_reason",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(import_module(module), attribute)
    raise AttributeError(f"module 'slhub' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
