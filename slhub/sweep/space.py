"""The search space checked against its recipe before any trial: each key must be one
the recipe has, and each bound (each choice) must make a recipe that validates,
through the same ``--set`` path and validation that ``slhub train`` uses."""

from __future__ import annotations

from typing import Any

from slhub.errors import SlhubError, shown
from slhub.recipe import Recipe, load_recipe
from slhub.sweep.spec import Sweep, SweepError


def checked_recipe(sweep: Sweep) -> Recipe:
    """The recipe with the sweep's fixed ``set`` applied, validated whole; then every
    key of the space checked (:func:`check_space`). Raises one :class:`SweepError` line."""
    recipe = _validated(sweep, sweep.overrides(), "set")
    if not recipe.trainer.validate_every and "trainer.validate_every" not in sweep.spec.space:
        raise SweepError(
            f"{sweep.path}: objective: {sweep.spec.objective.metric} is read at validations, "
            f"and {sweep.recipe} never validates (trainer.validate_every is 0); set "
            "trainer.validate_every in the recipe or the sweep's set"
        )
    check_space(sweep, recipe)
    return recipe


def check_space(sweep: Sweep, recipe: Recipe) -> None:
    """Every key of the space exists in ``recipe`` (the sweep's, validated), and its
    bounds validate: the lows together, the highs together, and each choice in turn."""
    space = sweep.spec.space
    values = {key: param.bounds() for key, param in space.items()}
    known = recipe.to_dict()
    for key in space:
        if not _has(known, key) and not _takes(sweep, key, values[key][0]):
            raise SweepError(f"{sweep.path}: space: {shown(key)}: {_no_such_key(known, key)}")
    for i in range(max(len(v) for v in values.values())):
        params = {key: v[min(i, len(v) - 1)] for key, v in values.items()}
        recipe = _validated(sweep, sweep.overrides(params), "space")
        data = recipe.to_dict()
        for key in space:
            if not _has(data, key):
                raise SweepError(f"{sweep.path}: space: {shown(key)}: {_no_such_key(data, key)}")


def _validated(sweep: Sweep, overrides: list[str], where: str) -> Recipe:
    """The recipe with ``overrides`` applied and every section validated."""
    from slhub.run import validate_sections

    try:
        recipe = load_recipe(sweep.recipe, overrides)
        validate_sections(recipe)
    except SlhubError as exc:
        raise SweepError(f"{sweep.path}: {where}: {exc}") from None
    return recipe


def _takes(sweep: Sweep, key: str, value: Any) -> bool:
    """Whether the recipe keeps ``key`` set to ``value``: a key of a section the recipe
    leaves out (``ema``), which its defaults do not show."""
    try:
        recipe = _validated(sweep, sweep.overrides({key: value}), "space")
    except SweepError:
        return False
    return _has(recipe.to_dict(), key)


def _has(data: Any, key: str) -> bool:
    node = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _no_such_key(data: dict[str, Any], key: str) -> str:
    """Why ``key`` is not in the recipe, naming the keys of the deepest section it names."""
    node: Any = data
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            where = ".".join(parts[:depth]) or "the recipe"
            known = ", ".join(map(str, node)) if isinstance(node, dict) else "none"
            return f"no such recipe key ({where} has: {shown(known, 200)})"
        node = node[part]
    return "no such recipe key"
