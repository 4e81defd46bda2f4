"""``slhub.registry.direct_caller(pm, name)`` answers exactly as ``pm.hook.<name>`` does.

direct_caller replaces pluggy's call loop for the hooks the trainer calls every update
(it reads pluggy's private ``_callers._multicall`` and ``_inner_hookexec`` to know when it
may). For every hookspec in slhub/hookspecs.py, with several plugins registered in a known
order (some returning None, some values, one raising; ``tryfirst``; each taking a
different subset of the arguments), its results are pluggy's: the same values in the same
order, the same exception, the same implementations called. A wrapper implementation or
call monitoring keeps pluggy's own caller.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pluggy
import pytest

from slhub import hookspecs, registry
from slhub.hookspecs import hookimpl
from slhub.optim import OptimSection, ScheduleSection

SPECS = sorted(
    name
    for name, value in vars(hookspecs).items()
    if inspect.isfunction(value) and hasattr(value, f"{hookspecs.PROJECT}_spec")
)


class Raised(Exception):
    """What the raising implementation raises (one instance: the same object must arrive)."""


class Stand:
    """A stand-in argument: hooks here only pass it back, so no real trainer is needed."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


#: Which of a hook's arguments an implementation takes (pluggy passes only those).
TAKES: dict[str, Callable[[tuple[str, ...]], tuple[str, ...]]] = {
    "all": lambda names: names,
    "first": lambda names: names[:1],
    "last": lambda names: names[-1:],
    "none": lambda names: (),
}


def _impl(name: str, params: tuple[str, ...], body: Callable[[tuple], Any], **opts: Any):
    """A hook implementation named ``name`` whose signature is exactly ``params``."""
    args = ", ".join(params)
    namespace: dict[str, Any] = {"_body": body}
    exec(f"def {name}({args}):\n    return _body(({args}{',' if params else ''}))\n", namespace)
    return hookimpl(**opts)(namespace[name])


def _wrapper(name: str, params: tuple[str, ...], old_style: bool):
    """A pass-through wrapper implementation (``hookwrapper=True`` or ``wrapper=True``)."""
    args = ", ".join(params)
    body = "    yield\n" if old_style else "    return (yield)\n"
    namespace: dict[str, Any] = {}
    exec(f"def {name}({args}):\n{body}", namespace)
    opts = {"hookwrapper": True} if old_style else {"wrapper": True}
    return hookimpl(**opts)(namespace[name])


def _plugin(tag: str, behaviour: str, take: str, log: list, names, pm, **opts: Any):
    """A plugin implementing every hook: it logs its call, then returns
    ``(tag, hook, arguments)`` (``value``), None (``none``) or raises :data:`ERROR`."""
    plugin = SimpleNamespace()
    for name in names:
        params = TAKES[take](tuple(getattr(pm.hook, name).spec.argnames))

        def body(args: tuple, name: str = name) -> Any:
            log.append((tag, name, args))
            if behaviour == "raise":
                raise ERROR
            return (tag, name, args) if behaviour == "value" else None

        setattr(plugin, name, _impl(name, params, body, **opts))
    return plugin


ERROR = Raised("raised by plugin b")

#: Plugins in registration order: (tag, behaviour, arguments taken, hookimpl options).
#: pluggy calls the last registered first (``tryfirst`` before all others).
SCENARIOS: dict[str, list[tuple[str, str, str, dict[str, Any]]]] = {
    "none-first": [("a", "value", "all", {}), ("b", "value", "first", {}),
                   ("c", "none", "last", {})],
    "all-none": [("a", "none", "all", {}), ("b", "none", "none", {})],
    "one": [("a", "value", "all", {})],
    "one-none": [("a", "none", "first", {})],
    "no-plugin": [],
    "tryfirst": [("a", "value", "last", {"tryfirst": True}), ("b", "value", "all", {}),
                 ("c", "none", "none", {})],
    "trylast": [("a", "value", "all", {}), ("b", "value", "none", {"trylast": True}),
                ("c", "value", "first", {})],
    "raises": [("a", "value", "all", {}), ("b", "raise", "first", {}), ("c", "none", "all", {})],
}  # fmt: skip


def _bare() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def _manager(scenario: str, base: Callable[[], pluggy.PluginManager] = _bare, names=SPECS):
    pm, log = base(), []
    for tag, behaviour, take, opts in SCENARIOS[scenario]:
        pm.register(_plugin(tag, behaviour, take, log, names, pm, **opts), name=f"test-{tag}")
    return pm, log


def _kwargs(pm: pluggy.PluginManager, name: str) -> dict[str, Stand]:
    return {arg: Stand(arg) for arg in getattr(pm.hook, name).spec.argnames}


def _outcome(call: Callable[..., Any], kwargs: dict[str, Any], log: list) -> tuple:
    """What a call returned or raised, and which implementations it called, in order."""
    del log[:]
    try:
        result: Any = ("returned", call(**kwargs))
    except Raised as exc:
        result = ("raised", exc)
    return result, list(log)


def _firstresult(pm: pluggy.PluginManager, name: str) -> bool:
    return bool(getattr(pm.hook, name).spec.opts.get("firstresult"))


def test_the_contract_has_hookspecs_of_both_kinds():
    pm = _bare()
    assert len(SPECS) >= 10 and "sample" in SPECS and "on_commit" in SPECS
    assert {n for n in SPECS if _firstresult(pm, n)} >= {"build_model", "sample", "objective"}
    assert {n for n in SPECS if not _firstresult(pm, n)} >= {"on_commit", "state_dict"}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("name", SPECS)
def test_direct_caller_answers_as_pluggy(name: str, scenario: str):
    pm, log = _manager(scenario)
    kwargs = _kwargs(pm, name)
    direct = registry.direct_caller(pm, name)
    assert direct is not getattr(pm.hook, name), "the plain case takes direct_caller's own path"
    expected = _outcome(getattr(pm.hook, name), kwargs, log)
    assert _outcome(direct, kwargs, log) == expected
    if scenario == "raises":
        assert expected[0] == ("raised", ERROR)  # the same object, not an equal one
    if scenario == "none-first":  # c (None) is called first, then b, then a
        called = [tag for tag, _, _ in expected[1]]
        b = ("b", name, tuple(kwargs.values())[:1])
        a = ("a", name, tuple(kwargs.values()))
        if _firstresult(pm, name):
            assert called == ["c", "b"] and expected[0] == ("returned", b)
        else:
            assert called == ["c", "b", "a"] and expected[0] == ("returned", [b, a])


@pytest.mark.parametrize("old_style", [True, False], ids=["hookwrapper", "wrapper"])
@pytest.mark.parametrize("name", SPECS)
def test_a_wrapper_keeps_pluggys_caller(name: str, old_style: bool):
    pm, log = _manager("none-first")
    params = tuple(getattr(pm.hook, name).spec.argnames)
    pm.register(SimpleNamespace(**{name: _wrapper(name, params, old_style)}), name="wrapper")
    caller = getattr(pm.hook, name)
    direct = registry.direct_caller(pm, name)
    assert direct is caller
    kwargs = _kwargs(pm, name)
    assert _outcome(direct, kwargs, log) == _outcome(caller, kwargs, log)


def test_monitored_calls_keep_pluggys_caller():
    pm, log = _manager("none-first")
    seen: list[str] = []
    undo = pm.add_hookcall_monitoring(lambda name, *_: seen.append(name), lambda *_: None)
    for name in SPECS:
        assert registry.direct_caller(pm, name) is getattr(pm.hook, name)
    registry.direct_caller(pm, "sample")(**_kwargs(pm, "sample"))
    assert seen == ["sample"]
    undo()
    assert registry.direct_caller(pm, "sample") is not pm.hook.sample


def _builtins_unreached_or_trainer_free(name: str) -> bool:
    """Hooks whose built-in implementations are never called here (a test plugin answers a
    firstresult hook first: built-ins are ``trylast``) or need no trainer."""
    return _firstresult(_bare(), name) or name == "recipe_sections"


WITH_BUILTINS = [n for n in SPECS if _builtins_unreached_or_trainer_free(n)]


def test_the_builtins_implement_some_of_those_hooks():
    pm = registry.new_manager()
    implemented = {
        n for n in WITH_BUILTINS if any(i.plugin_name in registry.BUILTINS
                                        for i in getattr(pm.hook, n).get_hookimpls())
    }  # fmt: skip
    assert implemented >= {"recipe_sections", "configure_optimizers", "scale_loss"}


@pytest.mark.parametrize("scenario", ["none-first", "tryfirst", "trylast", "raises"])
@pytest.mark.parametrize("name", WITH_BUILTINS)
def test_direct_caller_answers_as_pluggy_with_the_builtins(name: str, scenario: str):
    pm, log = _manager(scenario, base=registry.new_manager)
    kwargs = _kwargs(pm, name)
    direct = registry.direct_caller(pm, name)
    assert direct is not getattr(pm.hook, name)
    expected = _outcome(getattr(pm.hook, name), kwargs, log)
    assert _outcome(direct, kwargs, log) == expected
    if name == "recipe_sections" and scenario in ("none-first", "tryfirst"):
        # the built-in (trylast) answers last; a later trylast plugin would follow it
        assert expected[0][1][-1] == {"optim": OptimSection, "schedule": ScheduleSection}
