"""The plugin manager: hookspecs, built-in plugins, entry points and recipe-named plugins.

The core reaches plugins only through here. A recipe's ``plugin`` is either an
entry-point name of group ``slhub`` (an installed distribution, as a third
party ships it) or ``package.module:object`` for code on the path. Every way a
plugin can fail to load becomes one :class:`PluginError` line naming the plugin
and its distribution.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import asdict, dataclass
from importlib.metadata import EntryPoint, entry_points, packages_distributions, version
from typing import Any

import pluggy

from slhub import hookspecs
from slhub.errors import PluginError

GROUP = "slhub"

#: Built-in policy plugins, always registered (``trylast`` defaults a model package may override).
BUILTINS: tuple[str, ...] = (
    "slhub.builtin.ddp_weighting",
    "slhub.builtin.rank0_validation",
    "slhub.builtin.recovery",
)


@dataclass(frozen=True)
class PluginSource:
    """Where a plugin came from: recorded in run.json and compared on resume."""

    name: str
    object: str
    dist: str | None
    version: str | None

    def describe(self) -> str:
        dist = f"dist {self.dist} {self.version}" if self.dist else "no distribution"
        return f'slhub plugin "{self.name}" ({dist})'

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def new_manager() -> pluggy.PluginManager:
    """A plugin manager holding the hookspecs and the built-in plugins."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for module_name in BUILTINS:
        _register(pm, importlib.import_module(module_name), module_name)
    return pm


def _register(pm: pluggy.PluginManager, plugin: Any, name: str, source: PluginSource | None = None):
    label = source.describe() if source else f'slhub plugin "{name}"'
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"{label} breaks the hook contract: {_one_line(exc)}") from None
    except ValueError as exc:
        raise PluginError(f"{label} cannot be registered: {_one_line(exc)}") from None
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        pm.unregister(name=name)
        raise PluginError(f"{label} implements an unknown hook: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def _instantiate(obj: Any, label: str) -> Any:
    """Classes are instantiated with no arguments; modules and instances are used as they are."""
    if inspect.isclass(obj):
        try:
            return obj()
        except Exception as exc:  # noqa: BLE001 - any constructor failure is the plugin's
            raise PluginError(f"{label} failed to initialize: {_one_line(exc)}") from None
    return obj


def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, ep)
    return found


def _source_of_entry_point(ep: EntryPoint) -> PluginSource:
    dist = ep.dist.metadata["Name"] if ep.dist is not None else None
    ver = ep.dist.version if ep.dist is not None else None
    return PluginSource(name=ep.name, object=ep.value, dist=dist, version=ver)


def _source_of_path(spec: str) -> PluginSource:
    top = spec.split(":", 1)[0].split(".", 1)[0]
    dists = packages_distributions().get(top, [])
    dist = dists[0] if dists else None
    ver = version(dist) if dist else None
    return PluginSource(name=spec, object=spec, dist=dist, version=ver)


def resolve(spec: str) -> tuple[Any, PluginSource]:
    """Import the plugin a recipe names and describe its source."""
    if ":" in spec:
        source = _source_of_path(spec)
        module_name, _, attr = spec.partition(":")
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` does, for the console script too
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - report any import-time failure
            raise PluginError(f"{source.describe()} failed to import: {_one_line(exc)}") from None
        obj: Any = module
        for part in filter(None, attr.split(".")):
            if not hasattr(obj, part):
                raise PluginError(f"{source.describe()}: module {module_name} has no {part!r}")
            obj = getattr(obj, part)
        return obj, source
    eps = _entry_points()
    if spec not in eps:
        known = ", ".join(sorted(eps)) or "none installed"
        raise PluginError(f'slhub plugin "{spec}" is not installed (installed: {known})')
    ep = eps[spec]
    source = _source_of_entry_point(ep)
    try:
        return ep.load(), source
    except Exception as exc:  # noqa: BLE001 - report any import-time failure
        raise PluginError(f"{source.describe()} failed to import: {_one_line(exc)}") from None


def build_manager(spec: str) -> tuple[pluggy.PluginManager, PluginSource]:
    """Built-ins plus the model plugin a recipe names."""
    pm = new_manager()
    obj, source = resolve(spec)
    _register(pm, _instantiate(obj, source.describe()), source.name, source)
    return pm, source


def export_manager(also: str | None = None) -> pluggy.PluginManager:
    """Built-ins, every installed entry-point plugin and ``also`` (for ``slhub export``).

    ``also`` is the ``package.module:object`` plugin a v2 checkpoint's run names,
    so code that is not installed can export its own checkpoints. A plugin that
    fails to load is skipped here: exporting one model must not depend on every
    other installed package importing cleanly.
    """
    pm = new_manager()
    if also and ":" in also:
        try:
            obj, source = resolve(also)
            _register(pm, _instantiate(obj, source.describe()), source.name, source)
        except PluginError:
            pass
    for name, ep in sorted(_entry_points().items()):
        try:
            source = _source_of_entry_point(ep)
            _register(pm, _instantiate(ep.load(), source.describe()), name, source)
        except Exception:  # noqa: BLE001, S112 - listed as broken by `slhub plugins`
            continue
    return pm


@dataclass(frozen=True)
class PluginListing:
    """One row of ``slhub plugins``."""

    name: str
    dist: str | None
    version: str | None
    kind: str
    hooks: tuple[str, ...]
    error: str | None = None


def implemented_hooks(plugin: Any) -> tuple[str, ...]:
    """Names of the hookspecs a plugin object implements."""
    names = {n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), "slhub_spec")}
    return tuple(n for n in sorted(names) if callable(getattr(plugin, n, None)))


def list_plugins() -> list[PluginListing]:
    """Built-ins and installed entry-point plugins, each with the hooks it implements."""
    rows = [
        PluginListing(
            name=m.rsplit(".", 1)[1],
            dist="slhub",
            version=_own_version(),
            kind="built-in",
            hooks=implemented_hooks(importlib.import_module(m)),
        )
        for m in BUILTINS
    ]
    for name, ep in sorted(_entry_points().items()):
        source = _source_of_entry_point(ep)
        try:
            obj = ep.load()
            rows.append(
                PluginListing(name, source.dist, source.version, "model", implemented_hooks(obj))
            )
        except Exception as exc:  # noqa: BLE001 - shown in the listing instead
            rows.append(
                PluginListing(name, source.dist, source.version, "model", (), _one_line(exc))
            )
    return rows


def _own_version() -> str:
    from slhub import __version__

    return __version__
