"""``slhub eval --checkpoint CKPT [--env PREFIX:ENV ...] [--set KEY=VALUE]``.

Judges a trained model after training the way its run judged it: the checkpoint's
model plugin is built from the recipe the checkpoint records, the weights the run
validated are loaded (the EMA where the run keeps one) and the plugin's
``validate`` runs once, on this process, leaving no artifact. By default it
evaluates the run's own held-out episodes (refusing a dataset that changed since);
``--set data.path=...`` points it at other recorded episodes. ``--env`` depends on
what the model is:

- a policy, whose plugin's ``validation`` section has an ``env`` field (BC's
  ``validation.env``): ``--env``, ``--episodes``, ``--seed`` (and ``--steps``, the
  episode limit) fill that field and the plugin rolls the policy out in the simulator
  (:func:`slhub.sim.rollout_policy`); ``--video FILE.mp4`` writes the first episode;
  the recipe's ``time_budget_s`` is dropped, so all N episodes run;
- anything else (a learned simulator): fresh episodes are collected from the
  simulator first (fresh initial states from the simulator's resets, with
  ``--actions``), so it is judged against the real one on trajectories it never saw.

As for export, the plugin is one the user installed or named (``--plugin``), never
code a file names.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slhub import checkpoint, registry
from slhub.errors import CheckpointError, DatasetError, RecipeError, one_line
from slhub.export.command import choose_exporter
from slhub.recipe import apply_overrides


@dataclass
class Prepared:
    """A checkpoint's model plugin, a stand-in trainer holding its recipe's sections, and
    its model with the weights the run validated, in eval mode: what ``slhub eval``
    validates, and what a script plotting the model's predictions starts from."""

    checkpoint: checkpoint.Checkpoint
    plugin: Any
    trainer: Any
    model: torch.nn.Module

    def validate(self) -> dict[str, float]:
        """The plugin's ``validate``, as the loop calls it at the checkpoint's update."""
        with torch.no_grad():
            metrics = self.plugin.validate(
                trainer=self.trainer, model=self.model, step=self.checkpoint.step
            )
        return {name: float(value) for name, value in (metrics or {}).items()}


def run_eval(checkpoint_path: str | Path, **options: Any) -> dict[str, float]:
    """The validation metrics of ``checkpoint_path``'s model (see the module docstring);
    ``options`` are :func:`prepared`'s."""
    with prepared(checkpoint_path, **options) as ready:
        return ready.validate()


@contextlib.contextmanager
def prepared(
    checkpoint_path: str | Path,
    *,
    overrides: Sequence[str] = (),
    plugin: str | None = None,
    env: str | None = None,
    episodes: int = 16,
    steps: int | None = None,
    seed: int = 0,
    actions: str = "smooth",
    through_termination: bool = True,
    video: str | Path | None = None,
) -> Iterator[Prepared]:
    """The checkpoint's model, ready to validate on the data the options choose (fresh
    ``env`` episodes are collected into a temporary folder, removed on exit).

    :param steps: the collected episodes' length (default 200), or a policy's episode
        limit (default: the recipe's ``validation.env.max_steps``, else the env's).
    :param video: with ``env`` and a policy, the mp4 file of the first rollout.

    :raises CheckpointError: a v1 checkpoint (it records no recipe), or a damaged one.
    :raises DatasetError: the run's dataset changed since it was trained.
    :raises RecipeError, PluginError, SimulatorError: a bad override, plugin or env.
    """
    from slhub.testing import StandInTrainer

    path = Path(checkpoint_path)
    ckpt = checkpoint.load(path)
    if ckpt.version != 2 or not ckpt.recipe:
        raise CheckpointError(f"{path} is a v1 checkpoint: it records no recipe to evaluate by")
    chosen = choose_exporter(ckpt, path, plugin) or ckpt.recipe["plugin"]
    recipe = apply_overrides(dict(ckpt.recipe), list(overrides))
    collected: Path | None = None
    try:
        plugins = registry.build_manager(chosen)
        model_plugin = plugins.manager.get_plugin(plugins.model.name)
        declared = (
            model_plugin.recipe_sections() if hasattr(model_plugin, "recipe_sections") else {}
        ) or {}
        rolls_out = "env" in getattr(declared.get("validation"), "model_fields", {})
        if video is not None and (env is None or not rolls_out):
            raise RecipeError("--video: a policy's rollout (--env) writes it; this model has none")
        if env is not None and rolls_out:
            validation = dict(recipe.get("validation") or {})
            settings = dict(validation.get("env") or {})
            settings.update(id=env, episodes=episodes, seed=seed, time_budget_s=None)
            if steps is not None:
                settings["max_steps"] = steps
            settings["video"] = None if video is None else str(video)  # nothing else written
            validation["env"] = settings
            recipe["validation"] = validation
        elif env is not None:
            collected = _collect(env, episodes, steps or 200, seed, actions, through_termination)
            data = dict(recipe.get("data") or {})
            data["path"] = str(collected / "episodes")
            # the statistics are the checkpoint's; episode 0 only fills the training role
            data["split"] = {"train": [0], "validation": list(range(1, episodes + 1))}
            recipe["data"] = data
        sections = {name: recipe[name] for name in declared if name in recipe}
        trainer = StandInTrainer(model_plugin, sections, **recipe["trainer"])
        model = trainer.build(model_plugin)
        if collected is None and not any(o.startswith("data.") for o in overrides):
            _same_datasets(ckpt, trainer, path)
        try:
            model.load_state_dict(ckpt.evaluation_weights)
        except RuntimeError as exc:
            raise CheckpointError(
                f"{path}: its weights do not fit the model its recipe builds ({one_line(exc)})"
            ) from None
        yield Prepared(ckpt, model_plugin, trainer, model.eval())
    finally:
        if collected is not None:
            shutil.rmtree(collected, ignore_errors=True)


def _collect(
    env: str, episodes: int, steps: int, seed: int, actions: str, through_termination: bool
) -> Path:
    from slhub.sim import collect

    if episodes < 1:
        raise RecipeError("--episodes must be >= 1")
    folder = Path(tempfile.mkdtemp(prefix="slhub-eval-"))
    try:
        collect(
            folder / "episodes", env, episodes=episodes + 1, steps=steps, actions=actions,
            seed=seed, through_termination=through_termination,
        )  # fmt: skip
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def _same_datasets(ckpt: checkpoint.Checkpoint, trainer: Any, path: Path) -> None:
    from slhub.data.identity import differences

    recorded = (ckpt.run or {}).get("datasets") or {}
    current = getattr(trainer, "datasets", {}) or {}
    for name, entry in recorded.items():
        now = current.get(name)
        if now is None:
            continue
        changed = differences(entry["fingerprint"], now["fingerprint"])
        if changed:
            raise DatasetError(
                f"{path}: dataset {name} ({entry.get('path')}) changed since the run: "
                f"{'; '.join(changed)}; evaluate other episodes with --set data.path=..."
            )


def format_metrics(metrics: dict[str, float]) -> str:
    """One ``name value`` line per metric, in the order the plugin reported them."""
    width = max((len(name) for name in metrics), default=0)
    return "\n".join(f"{name:<{width}}  {value:.6g}" for name, value in metrics.items())
