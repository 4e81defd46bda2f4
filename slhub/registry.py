"""The plugin manager: hookspecs, built-in plugins, entry points and recipe-named plugins.

The core reaches plugins only through here. A recipe's ``plugin`` (the model
plugin) and each entry of ``plugins`` (loggers, callbacks, metrics) is either
an entry-point name of group ``slhub`` (an installed distribution, as a third
party ships it), ``package.module:object`` for code on the path, or, from
Python, the plugin object itself. Every way a plugin can fail to load becomes
one :class:`PluginError` line naming the plugin and its distribution.

Registration order fixes the calling order (pluggy calls the last registered
first): built-ins, then the extra plugins in reverse recipe order, then the
model plugin. So the model plugin is called first, then the extras in recipe
order, then the built-in ``trylast`` defaults.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import operator
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from importlib.metadata import Distribution, EntryPoint, distributions, entry_points
from pathlib import Path
from typing import Any

import pluggy

from slhub import hookspecs
from slhub._version import __version__
from slhub.errors import PluginError, one_line, shown

GROUP = "slhub"

#: Built-in policy plugins, always registered (``trylast`` defaults a model package may override).
BUILTINS: tuple[str, ...] = (
    "slhub.builtin.ddp_weighting",
    "slhub.builtin.optimization",
    "slhub.builtin.rank0_validation",
    "slhub.builtin.progress",
)

MODEL, EXTRA = "model", "extra"


@dataclass(frozen=True)
class PluginSource:
    """Where a plugin came from: recorded in run.json and compared on resume."""

    name: str
    object: str
    dist: str | None
    version: str | None
    role: str = MODEL
    #: sha256 of the module file of a ``module:object`` plugin, so edits to code that
    #: has no version are noticed on resume (None for entry points: their version says it).
    digest: str | None = None

    def describe(self) -> str:
        dist = f"dist {self.dist} {self.version}" if self.dist else "no distribution"
        return f'slhub plugin "{shown(self.name)}" ({dist})'

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Plugins:
    """A run's plugin manager and the sources of its plugins (model plugin first)."""

    manager: pluggy.PluginManager
    sources: tuple[PluginSource, ...]

    @property
    def hook(self) -> Any:
        return self.manager.hook

    @property
    def model(self) -> PluginSource:
        return self.sources[0]

    def to_list(self) -> list[dict[str, Any]]:
        """What run.json records and a resume compares."""
        return [source.to_dict() for source in self.sources]

    def code_identity(self) -> dict[str, Any]:
        """What run.json records of the code that runs: slhub, torch and every plugin."""
        import torch  # the registry itself needs no torch; a run has it loaded already

        return {"slhub": __version__, "torch": str(torch.__version__), "plugins": self.to_list()}


def direct_caller(pm: pluggy.PluginManager, name: str) -> Any:
    """A callable equivalent to ``pm.hook.<name>(**kwargs)`` for the plugins registered now,
    without pluggy's per-call machinery (the loop calls a few hooks every update).

    Pluggy calls the implementations last-registered first, each with the arguments it
    names, collects the non-None results (the first one for a *firstresult* hook) and
    lets an exception propagate; so does this. A hook with a wrapper implementation, or
    a manager whose calls are traced or monitored, keeps pluggy's own caller. Build it
    again after the plugins change.
    """
    caller = getattr(pm.hook, name)
    impls = caller.get_hookimpls()
    # pluggy has no public way to ask whether tracing or monitoring replaced its caller, so
    # this reads its internals (pyproject pins pluggy <2); either missing keeps pm.hook.
    plain = getattr(getattr(pluggy, "_callers", None), "_multicall", None)
    traced = plain is None or getattr(pm, "_inner_hookexec", None) is not plain
    if traced or any(impl.hookwrapper or impl.wrapper for impl in impls):
        return caller
    firstresult = bool(caller.spec is not None and caller.spec.opts.get("firstresult"))
    order = tuple((impl.function, _arguments(impl.argnames)) for impl in reversed(impls))
    if firstresult and len(order) == 1:
        function, arguments = order[0]
        return lambda **kwargs: function(*arguments(kwargs))
    if firstresult:

        def first(**kwargs: Any) -> Any:
            for function, arguments in order:
                result = function(*arguments(kwargs))
                if result is not None:
                    return result
            return None

        return first

    def collect(**kwargs: Any) -> list[Any]:
        results = []
        for function, arguments in order:
            result = function(*arguments(kwargs))
            if result is not None:
                results.append(result)
        return results

    return collect


def _arguments(names: Iterable[str]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """``kwargs -> (kwargs[name] for name in names)`` as one C call (``itemgetter``)."""
    names = tuple(names)
    if len(names) >= 2:
        return operator.itemgetter(*names)
    if len(names) == 1:
        (name,) = names
        return lambda kwargs: (kwargs[name],)
    return lambda kwargs: ()


def new_manager() -> pluggy.PluginManager:
    """A plugin manager holding the hookspecs and the built-in plugins."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for module_name in BUILTINS:
        _register(pm, builtin_plugin(module_name), module_name)
    return pm


def builtin_plugin(module_name: str) -> Any:
    """A built-in plugin: its module, or a fresh ``module.Plugin()`` for one that keeps
    per-run state (so two runs in one process share nothing)."""
    module = importlib.import_module(module_name)
    factory = getattr(module, "Plugin", None)
    return factory() if factory is not None else module


#: Hooks that were renamed, old name -> new name: an implementation under the old name is
#: refused at registration (pluggy would call it "unknown", which does not say what to do).
RENAMED_HOOKS = {"save": "state_dict", "restore": "load_state_dict"}


def _renamed(plugin: Any) -> list[str]:
    """``old -> new`` for each hook ``plugin`` implements under a name it no longer has."""
    return [
        f"{old} -> {new}"
        for old, new in RENAMED_HOOKS.items()
        if getattr(getattr(plugin, old, None), f"{hookspecs.PROJECT}_impl", None) is not None
    ]


def _register(pm: pluggy.PluginManager, plugin: Any, name: str, source: PluginSource | None = None):
    label = source.describe() if source else f'slhub plugin "{name}"'
    renamed = _renamed(plugin)
    if renamed:
        raise PluginError(
            f"{label} implements hooks under their old names; rename them ({', '.join(renamed)}): "
            "the state hooks are state_dict and load_state_dict"
        )
    if pm.get_plugin(name) is not None or pm.is_registered(plugin):
        raise PluginError(f"{label} is named twice in the recipe")
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"{label} breaks the hook contract: {one_line(exc)}") from None
    except ValueError as exc:
        raise PluginError(f"{label} cannot be registered: {one_line(exc)}") from None
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        pm.unregister(name=name)
        raise PluginError(f"{label} implements an unknown hook: {one_line(exc)}") from None


def not_a_plugin(pm: pluggy.PluginManager, source: PluginSource) -> str | None:
    """Why the object registered for ``source`` is no plugin at all, or None when it
    implements a hook: pluggy registers an object without any hookimpl silently, and a
    recipe naming one would fail later, as an unknown section or a model of None."""
    plugin = pm.get_plugin(source.name)
    if plugin is None or pm.get_hookcallers(plugin):
        return None
    return f"{source.describe()} is not a plugin: {_no_hooks(plugin, source)}"


def _no_hooks(plugin: Any, source: PluginSource) -> str:
    """What would make ``plugin`` one: marking its hook-named methods, or which hooks."""
    what = "the module" if inspect.ismodule(plugin) else f"its {type(plugin).__qualname__} object"
    unmarked = implemented_hooks(plugin)
    if unmarked:
        return (
            f"{what} defines {', '.join(unmarked)} but marks none with @slhub.hookimpl, "
            "so it implements no slhub hook"
        )
    if source.role == MODEL:
        wanted = "a model plugin implements build_model, sample and objective"
    else:
        wanted = "e.g. on_log, on_commit, validate or recipe_sections"
    return f"{what} implements no slhub hook ({wanted}, each marked @slhub.hookimpl)"


def _instantiate(obj: Any, label: str) -> Any:
    """Classes are instantiated with no arguments; modules and instances are used as they are."""
    if inspect.isclass(obj):
        try:
            return obj()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the plugin's, exits too
            raise PluginError(f"{label} failed to initialize: {one_line(exc)}") from None
    return obj


def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, ep)
    return found


def installed_names() -> frozenset[str]:
    """Names of the installed entry-point plugins (importing none of them)."""
    return frozenset(_entry_points())


def _file_path_hint(spec: str) -> str | None:
    """The refusal of a plugin named by its file (``my_plugin.py``, ``path/to/x.py:Cls``),
    pointing to the ``module:object`` form; None for a module or entry-point name."""
    module, _, attr = spec.partition(":")
    if not (module.endswith(".py") or "/" in module or os.sep in module or "\\" in module):
        return None
    path = Path(module.replace("\\", "/"))
    stem = path.stem if path.suffix == ".py" else path.name
    obj = attr or "".join(part.title() for part in stem.split("_")) or "Plugin"
    folder = path.parent
    example = f"{stem}:{obj}"
    if str(folder) not in ("", "."):
        example += f" with {folder} on PYTHONPATH"
        if not path.is_absolute() and ".." not in path.parts:
            dotted = ".".join((*folder.parts, stem))
            example += f", or {dotted}:{obj} run from the folder that holds {folder.parts[0]}"
        return f"{module} is a file path; name the plugin as module:object, e.g. {example}"
    return (
        f"{module} is a file path; name the plugin as module:object, e.g. {example}, with "
        "its folder on PYTHONPATH or as the working directory"
    )


def _source_of_entry_point(ep: EntryPoint, role: str = MODEL) -> PluginSource:
    dist = ep.dist.metadata["Name"] if ep.dist is not None else None
    ver = ep.dist.version if ep.dist is not None else None
    return PluginSource(name=ep.name, object=ep.value, dist=dist, version=ver, role=role)


def _source_of_path(spec: str, role: str = MODEL) -> PluginSource:
    found = distribution_providing(spec.split(":", 1)[0].split(".", 1)[0])
    dist = found.metadata["Name"] if found is not None else None
    ver = found.version if found is not None else None
    return PluginSource(name=spec, object=spec, dist=dist, version=ver, role=role)


def distribution_providing(top: str) -> Distribution | None:
    """The installed distribution that provides the top-level module ``top``: the first
    that ``importlib.metadata.packages_distributions()`` lists for it, found without
    parsing every distribution's metadata and file list (about 0.5 s of every start)."""
    for dist in distributions():
        declared = (dist.read_text("top_level.txt") or "").split()
        if declared:
            if top in declared:
                return dist
            continue
        record = dist.read_text("RECORD")
        if record is not None:
            if top in record and any(_top_level(line) == top for line in record.splitlines()):
                return dist
        elif any(_top_level(str(path)) == top for path in dist.files or ()):
            return dist
    return None


def _top_level(entry: str) -> str | None:
    """The importable top-level name a RECORD entry (``path,hash,size``) installs."""
    path = entry.split(",", 1)[0].strip('"')
    head, sep, _ = path.partition("/")
    name = head if sep else (inspect.getmodulename(path) or path)
    return name if "." not in name else None


def _file_digest(module: Any) -> str | None:
    """sha256 of a module's source file (None when it has none, e.g. a notebook's __main__)."""
    path = getattr(module, "__file__", None)
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def resolve(spec: str, role: str = MODEL, objects: dict[str, Any] | None = None):
    """Import the plugin ``spec`` names (or take the object given for it) and describe its source.

    ``spec`` is always a name the user chose (a recipe entry, a command-line
    argument or a Python call): nothing read from a file reaches here.
    """
    if objects and spec in objects:
        obj = objects[spec]
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        if inspect.ismodule(obj):
            module = obj
        return obj, replace(_source_of_path(spec, role), digest=_file_digest(module))
    file_path = _file_path_hint(spec)
    if file_path is not None:
        raise PluginError(file_path)
    if ":" in spec:
        source = _source_of_path(spec, role)
        module_name, _, attr = spec.partition(":")
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` does, for the console script too
        try:
            module = importlib.import_module(module_name)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - any import-time failure,
            # sys.exit() in the module included (it would end the command silently)
            top = module_name.split(".", 1)[0]
            where = ""
            if isinstance(exc, ModuleNotFoundError) and exc.name == top:
                where = (
                    f" (run slhub from the folder that holds {shown(top)}, or put that folder on "
                    "PYTHONPATH)"
                )
            raise PluginError(
                f"{source.describe()} failed to import: {one_line(exc)}{where}"
            ) from None
        obj: Any = module
        for part in filter(None, attr.split(".")):
            if not hasattr(obj, part):
                raise PluginError(
                    f"{source.describe()}: module {module_name} has no {shown(part, quote=True)}"
                )
            obj = getattr(obj, part)
        return obj, replace(source, digest=_file_digest(module))
    eps = _entry_points()
    if spec not in eps:
        known = ", ".join(sorted(eps)) or "none installed"
        raise PluginError(f'slhub plugin "{shown(spec)}" is not installed (installed: {known})')
    ep = eps[spec]
    source = _source_of_entry_point(ep, role)
    try:
        return ep.load(), source
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any import-time failure,
        # sys.exit() in the module included (it would end the command silently)
        raise PluginError(f"{source.describe()} failed to import: {one_line(exc)}") from None


def build_manager(
    model: str, extras: Iterable[str] = (), objects: dict[str, Any] | None = None
) -> Plugins:
    """Built-ins, the extra plugins and the model plugin of a run, in calling order.

    An extra plugin may not implement a model hook (``hookspecs.MODEL_HOOKS``):
    those are decided by the model plugin alone.
    """
    pm = new_manager()
    loaded = []
    for spec in [model, *extras]:
        role = MODEL if not loaded else EXTRA
        obj, source = resolve(spec, role, objects)
        loaded.append((_instantiate(obj, source.describe()), source))
    for plugin, source in loaded[1:]:
        claimed = [h for h in hookspecs.MODEL_HOOKS if h in implemented_hooks(plugin)]
        if claimed:
            raise PluginError(
                f"{source.describe()} is listed in plugins: but implements "
                f"{', '.join(claimed)}, which only the model plugin (plugin:) may implement"
            )
    for plugin, source in [*reversed(loaded[1:]), loaded[0]]:
        _register(pm, plugin, source.name, source)
    for _, source in loaded:
        reason = not_a_plugin(pm, source)
        if reason is not None:
            raise PluginError(reason)
    model_plugin, model_source = loaded[0]
    if "build_model" not in {caller.name for caller in pm.get_hookcallers(model_plugin) or ()}:
        raise PluginError(
            f"{model_source.describe()} is the recipe's model plugin (plugin:) but implements "
            "no build_model; a model plugin implements build_model, sample and objective"
        )
    return Plugins(pm, tuple(source for _, source in loaded))


def export_manager(chosen: str | None) -> tuple[pluggy.PluginManager, list[PluginSource]]:
    """Built-ins and the plugin(s) ``slhub export`` may ask to export.

    ``chosen`` is a plugin name the user or an installed entry point vouches
    for; None asks every installed entry-point plugin (for a v1 checkpoint,
    which records no plugin). A plugin that fails to load is skipped in the
    latter case: exporting one model must not depend on every other installed
    package importing cleanly.
    """
    pm = new_manager()
    if chosen is not None:
        obj, source = resolve(chosen)
        _register(pm, _instantiate(obj, source.describe()), source.name, source)
        return pm, [source]
    sources = []
    for name, ep in sorted(_entry_points().items()):
        try:
            source = _source_of_entry_point(ep)
            _register(pm, _instantiate(ep.load(), source.describe()), name, source)
        except (Exception, SystemExit):  # noqa: BLE001, S112 - broken: listed as such by `slhub plugins`
            continue
        sources.append(source)
    return pm, sources


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
            version=__version__,
            kind="built-in",
            hooks=implemented_hooks(builtin_plugin(m)),
        )
        for m in BUILTINS
    ]
    for name, ep in sorted(_entry_points().items()):
        source = _source_of_entry_point(ep)
        try:
            hooks = implemented_hooks(ep.load())
            kind = MODEL if set(hooks) & set(hookspecs.MODEL_HOOKS) else EXTRA
            rows.append(PluginListing(name, source.dist, source.version, kind, hooks))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - shown in the listing instead
            rows.append(PluginListing(name, source.dist, source.version, "?", (), one_line(exc)))
    return rows
