"""Test-only model plugins for the oracle test (``slhub_plugin_replicas:Name``, tests/ on the path).

Each is a model plugin (built-in NeRD or an installed external package) plus a
``save`` hook that puts this rank's parameters into its checkpoint entry
(``ranks[r]["replica_parameters"]``), so a test can compare the replicas of a
real multi-worker run. The model packages are imported on first use, so this
module imports even where they are not installed.
"""

from __future__ import annotations

import importlib
from typing import Any

from slhub import hookimpl

#: Name here -> the model plugin class it extends.
BASES = {
    "Nerd": "slhub.builtin.nerd.plugin:NerdPlugin",
    "Rwm": "slhub_rwm.plugin:RwmPlugin",
    "RigidFormer": "slhub_rigidformer.plugin:RigidFormerPlugin",
    "Bc": "slhub_bc.plugin:BcPlugin",
}


class ReplicaParameters:
    """Contributes this rank's parameters to every checkpoint."""

    @hookimpl
    def state_dict(self, trainer: Any) -> dict[str, Any]:
        params = {n: p.detach().cpu().clone() for n, p in trainer.model.named_parameters()}
        return {"replica_parameters": params}


def __getattr__(name: str) -> type:
    if name not in BASES:
        raise AttributeError(name)
    module, _, attr = BASES[name].partition(":")
    base = getattr(importlib.import_module(module), attr)
    cls = type(name, (ReplicaParameters, base), {"__module__": __name__})
    globals()[name] = cls
    return cls
