"""``slhub sweep``: hyperparameter sweeps over a recipe's keys with Optuna (the
``sweep`` extra). A sweep file names a recipe, the search space, the objective (a
validation metric to minimize or maximize), the trial budget, the sampler and the
pruner (:mod:`slhub.sweep.spec`); the space is checked against the recipe before
anything is written (:mod:`slhub.sweep.space`). Each trial is an ordinary run in its
own directory (:mod:`slhub.sweep.trial`); the study lives in an Optuna storage, and
a killed sweep rerun with the same command continues it (:mod:`slhub.sweep.study`).
``--summary`` prints the trials and writes the best recipe (:mod:`slhub.sweep.summary`).
docs/trackers.md is the user's guide.
"""

from __future__ import annotations

from slhub.sweep.spec import Sweep, SweepError, load_sweep

__all__ = ["Sweep", "SweepError", "load_sweep", "run_sweep"]


def run_sweep(path: str) -> int:
    """Run the sweep file at ``path`` until its budget is met; the exit status."""
    import hashlib
    import json

    from slhub.sweep.space import checked_recipe
    from slhub.sweep.study import SweepRun, import_optuna

    import_optuna()  # the extra's one line before any other work
    sweep = load_sweep(path)
    data = checked_recipe(sweep).to_dict()
    data["trainer"].pop("output_dir", None)  # each trial's own
    digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
    return SweepRun(sweep, digest).run()
