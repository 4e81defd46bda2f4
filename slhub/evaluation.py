"""A checkpoint's model judged after training: ``slhub.evaluate`` and ``slhub eval``.

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
- a learned simulator (a model reading recorded episodes, whose ``data`` section has a
  ``path``): fresh episodes are collected from the simulator first (fresh initial
  states from the simulator's resets, or drawn around them with ``--init random``
  (:mod:`slhub.sim.initial_states`), with ``--actions``, recording the contact inputs
  the run's dataset recorded), so it is judged against the real one on trajectories it
  never saw; a simulator (or a ``--set data.path=...``
  dataset) whose components differ from the ones the model was trained on (another
  robot) is refused in one line naming both;
- anything else (RigidFormer's generated scenes, a synthetic corpus): ``--env`` is refused.

Every bad option (``--episodes``/``--steps`` below 1, a negative ``--seed``, a
``--video`` that is not an ``.mp4`` file in an existing folder or comes without
``--env``, a ``--set`` of a section eval never reads) is refused in one line before the
checkpoint is read or anything is written.

As for export, the plugin is one the user installed or named (``--plugin``), never
code a file names.
"""

from __future__ import annotations

import contextlib
import numbers
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from slhub import checkpoint, registry
from slhub.errors import CheckpointError, DatasetError, RecipeError, SlhubError, one_line, shown
from slhub.export.writer import choose_exporter
from slhub.hookspecs import Trainer
from slhub.recipe import apply_overrides, format_validation_error
from slhub.sim.initial_states import INITS
from slhub.standalone import Standalone

#: ``--actions``: how fresh episodes' actions are drawn (:mod:`slhub.sim.actions`).
ACTIONS = ("uniform", "smooth", "zero")


@dataclass
class Prepared:
    """A checkpoint's model plugin, a trainer without a loop holding its recipe's sections
    (the :class:`slhub.Trainer` view its hooks receive), and its model with the weights
    the run validated, in eval mode: what ``slhub eval`` validates, and what a script
    plotting the model's predictions starts from."""

    checkpoint: checkpoint.Checkpoint
    plugin: Any
    trainer: Trainer
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
    init: str = "reset",
) -> Iterator[Prepared]:
    """The checkpoint's model, ready to validate on the data the options choose (fresh
    ``env`` episodes are collected into a temporary folder, removed on exit).

    :param steps: the collected episodes' length (default 200), or a policy's episode
        limit (default: the recipe's ``validation.env.max_steps``, else the env's).
    :param video: with ``env`` and a policy, the mp4 file of the first rollout (its folder
        must exist).
    :param init: where collected episodes start: ``reset`` (the env's) or ``random``
        (:mod:`slhub.sim.initial_states`); a policy's rollouts start at the env's reset.

    :raises CheckpointError: a v1 checkpoint (it records no recipe), or a damaged one.
    :raises DatasetError: the run's dataset changed since it was trained.
    :raises DatasetError: ``env``'s or ``data.path``'s components are not the model's.
    :raises RecipeError, PluginError, SimulatorError: a bad option, override, plugin or env.
    """
    _check_options(env, episodes, steps, seed, actions, video)
    if init not in INITS:
        raise RecipeError(f"--init must be one of {', '.join(INITS)}, got {shown(init)}")
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
        _check_overrides(overrides, declared, plugins.model.name)
        rolls_out = "env" in getattr(declared.get("validation"), "model_fields", {})
        reads_episodes = "path" in getattr(declared.get("data"), "model_fields", {})
        if video is not None and not rolls_out:
            raise RecipeError(
                f"--video: a policy's rollout (--env) writes it; plugin {plugins.model.name}'s "
                "model is not a policy and rolls nothing out"
            )
        if env is not None and not (rolls_out or reads_episodes):
            raise RecipeError(
                f"--env {shown(env)}: plugin {plugins.model.name} can neither roll a policy out "
                "(its validation section has no env) nor read collected episodes (its data "
                "section has no path), so it cannot be judged in a simulator; leave --env out"
            )
        if env is not None and rolls_out and init != "reset":
            raise RecipeError(
                f"--init {shown(init)}: plugin {plugins.model.name}'s model is a policy, whose "
                "rollouts start where the env resets; leave --init out"
            )
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
            collected = _collect(
                env, episodes, steps or 200, seed, actions, through_termination,
                _contact_kinds(ckpt), init,
            )  # fmt: skip
            data = dict(recipe.get("data") or {})
            data["path"] = str(collected / "episodes")
            # the statistics are the checkpoint's; episode 0 only fills the training role
            data["split"] = {"train": [0], "validation": list(range(1, episodes + 1))}
            recipe["data"] = data
            _same_layout(ckpt, recipe, overrides, f"--env {shown(env)}", env)
        elif reads_episodes and any(o.partition("=")[0].strip() == "data.path" for o in overrides):
            where = (recipe.get("data") or {}).get("path")
            _same_layout(ckpt, recipe, overrides, f"--set data.path={shown(where)}", None)
        sections = _validated(declared, recipe, path, overrides)
        try:
            backend = Standalone(model_plugin, sections, **recipe["trainer"])
        except ValidationError as exc:
            raise RecipeError(
                format_validation_error(str(path), exc, prefix="trainer", overrides=overrides)
            ) from None
        try:
            model = backend.build(model_plugin)
        except SlhubError as exc:
            if collected is None:
                raise
            # name the simulator, not the temporary folder the user never chose
            message = str(exc).replace(str(collected / "episodes"), f"{env}'s episodes")
            raise type(exc)(message) from None
        if collected is None and not any(o.startswith("data.") for o in overrides):
            _same_datasets(ckpt, backend.datasets, path)
        try:
            model.load_state_dict(ckpt.evaluation_weights)
        except RuntimeError as exc:
            raise CheckpointError(
                f"{path}: its weights do not fit the model its recipe builds ({one_line(exc)})"
            ) from None
        yield Prepared(ckpt, model_plugin, backend.view, model.eval())
    finally:
        if collected is not None:
            shutil.rmtree(collected, ignore_errors=True)


def _check_options(
    env: str | None,
    episodes: Any,
    steps: Any,
    seed: Any,
    actions: str,
    video: str | Path | None,
) -> None:
    """Refuse a bad option in one line before the checkpoint is read."""
    counts = (("--episodes", episodes, 1), ("--steps", steps, 1), ("--seed", seed, 0))
    for name, value, low in counts:
        if value is None and name == "--steps":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise RecipeError(f"{name} must be a whole number, got {shown(value, quote=True)}")
        if value < low:
            raise RecipeError(f"{name} must be >= {low}, got {value}")
    if actions not in ACTIONS:
        raise RecipeError(f"--actions must be one of {', '.join(ACTIONS)}, got {shown(actions)}")
    if video is None:
        return
    if env is None:
        raise RecipeError(
            f"--video {shown(video)}: needs --env (it records a policy's first rollout in "
            "that simulator)"
        )
    file = Path(video)
    if file.is_dir():
        raise RecipeError(
            f"--video {shown(video)}: is a directory; name the mp4 file to write, e.g. "
            f"{shown(file / 'rollout.mp4')}"
        )
    if file.suffix.lower() != ".mp4":
        raise RecipeError(f"--video {shown(video)}: name an .mp4 file (the video is H.264 mp4)")
    folder = file.parent
    if not folder.is_dir():
        what = "is not a directory" if folder.exists() else "does not exist"
        raise RecipeError(
            f"--video {shown(video)}: its folder {shown(folder)} {what} (eval creates no folder)"
        )


def _check_overrides(overrides: Sequence[str], declared: dict[str, Any], name: str) -> None:
    """Refuse a ``--set`` of a key eval never reads (a typo would be silently ignored)."""
    for text in overrides:
        key = text.partition("=")[0].strip().split(".")[0]
        if key != "trainer" and key not in declared:
            owned = ", ".join(declared) or "none"
            raise RecipeError(
                f"--set {shown(text)}: eval reads no {shown(key)} section (it reads trainer "
                f"and the sections of plugin {name}: {owned})"
            )


def _validated(
    declared: dict[str, Any], recipe: dict[str, Any], path: Path, overrides: Sequence[str]
) -> dict[str, Any]:
    """The recipe's sections the model plugin declares, validated (one line if not)."""
    sections = {}
    for name, model in declared.items():
        if name not in recipe:
            continue
        try:
            sections[name] = model.model_validate(recipe[name] or {})
        except ValidationError as exc:
            raise RecipeError(
                format_validation_error(str(path), exc, prefix=name, overrides=list(overrides))
            ) from None
    return sections


def _same_layout(
    ckpt: checkpoint.Checkpoint,
    recipe: dict[str, Any],
    overrides: Sequence[str],
    what: str,
    env: str | None,
) -> None:
    """Refuse, in one line naming both, a dataset whose roles (state, action, ...) have
    other components than the ones the model was trained on (another robot)."""
    from slhub.data import open_dataset
    from slhub.data.episodes import Feature

    recorded = ((ckpt.run or {}).get("datasets") or {}).get("data")
    data = recipe.get("data") or {}
    if not recorded or not data.get("path"):
        return
    before = {
        name: Feature.from_dict(spec)
        for name, spec in (recorded.get("fingerprint") or {}).get("features", {}).items()
    }
    try:
        dataset = open_dataset(data["path"], data.get("format") or "auto")
    except SlhubError:
        return  # the plugin says what is wrong with it, as in training
    try:
        now = dict(dataset.features)
        source = getattr(dataset, "source", None)
    finally:
        dataset.close()
    trained_roles = dict(((ckpt.recipe or {}).get("data") or {}).get("features") or {})
    roles = dict(data.get("features") or {})
    if not trained_roles:  # the plugin's default roles: compare the features themselves
        trained_roles = roles = {name: [name] for name in before}
    remapped = any(o.strip().startswith("data.features") for o in overrides)
    trained_on = _source_of(recorded.get("path"))
    given = env or shown(data["path"])
    if env is None and isinstance(source, dict) and source.get("env"):
        given += f" (from {shown(source['env'])})"
    for role, chosen in trained_roles.items():
        old = _components(before, chosen)
        if old is None:
            continue
        missing = [name for name in roles.get(role, chosen) if name not in now]
        if missing:
            raise DatasetError(
                f"{what}: this model was trained on {trained_on}'s {len(old)}-component {role} "
                f"({_listed(old)}); {given} records no {missing[0]} (it has: "
                f"{_listed(sorted(now))})"
            )
        new = _components(now, roles.get(role, chosen)) or ()
        if len(new) != len(old) or (new != old and not remapped):
            other = "" if len(new) != len(old) else " other components"
            raise DatasetError(
                f"{what}: this model was trained on {trained_on}'s {len(old)}-component {role} "
                f"({_listed(old)}); {given} gives {len(new)}{other} ({_listed(new)})"
            )


def _components(features: dict[str, Any], chosen: Sequence[str]) -> tuple[str, ...] | None:
    """The component names of the features ``chosen`` fill a role with, named as training
    names them (``qpos.hinge``); None when one is absent."""
    from slhub.data.training import component_names

    if any(name not in features for name in chosen):
        return None
    return component_names({name: features[name] for name in chosen})


def _listed(names: Sequence[str], keep: int = 6) -> str:
    """``names`` joined, a longer list cut to its first ones, ``...`` and its last."""
    names = [shown(n, 40) for n in names]
    if len(names) > keep:
        names = [*names[: keep - 2], "...", names[-1]]
    return ", ".join(names) or "none"


def _source_of(path: Any) -> str:
    """The env a recorded dataset was collected from (its ``meta.json`` source), else its
    path."""
    from slhub.data import open_dataset

    try:
        dataset = open_dataset(path)
    except (SlhubError, TypeError, OSError):
        return shown(path)
    try:
        source = getattr(dataset, "source", None) or {}
    finally:
        dataset.close()
    env = source.get("env") if isinstance(source, dict) else None
    return shown(env) if env else shown(path)


def _contact_kinds(ckpt: checkpoint.Checkpoint) -> str:
    """The contact inputs (``collect``'s ``contacts``) the run's dataset recorded: the
    kinds whose feature its fingerprint lists, else ``force``."""
    from slhub.sim.contacts import KINDS

    recorded = ((ckpt.run or {}).get("datasets") or {}).get("data") or {}
    features = (recorded.get("fingerprint") or {}).get("features") or {}
    kinds = [kind for kind, feature in KINDS.items() if feature in features]
    return ",".join(kinds) or "force"


def _collect(
    env: str,
    episodes: int,
    steps: int,
    seed: int,
    actions: str,
    through_termination: bool,
    contacts: str = "force",
    init: str = "reset",
) -> Path:
    from slhub.sim import collect

    if episodes < 1:
        raise RecipeError("--episodes must be >= 1")
    folder = Path(tempfile.mkdtemp(prefix="slhub-eval-"))
    try:
        collect(
            folder / "episodes", env, episodes=episodes + 1, steps=steps, actions=actions,
            seed=seed, through_termination=through_termination, contacts=contacts, init=init,
        )  # fmt: skip
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def _same_datasets(
    ckpt: checkpoint.Checkpoint, current: dict[str, dict[str, Any]], path: Path
) -> None:
    """Refuse a dataset (recorded by ``build_model`` in ``current``) that changed since
    the run recorded it."""
    from slhub.data.dataset_fingerprint import differences

    recorded = (ckpt.run or {}).get("datasets") or {}
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
