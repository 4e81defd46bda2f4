"""slhub: a plugin-registry microframework for supervised robot learning."""

from slhub.distributed import distributed_run
from slhub.hookspecs import LossResult, hookimpl
from slhub.recipe import load_recipe

__version__ = "0.1.0"

__all__ = ["LossResult", "__version__", "distributed_run", "hookimpl", "load_recipe"]
