"""The registry of stateful objects: what a rank saves under its own keys besides the hooks.

Anything with ``state_dict()`` and ``load_state_dict(state)`` is registered once under
a key (``Trainer.register_state``; the loop registers ``rng``, ``sampler`` and
``buffers`` itself). At every boundary its state is gathered under that key in the
rank's entry of the checkpoint (``ranks[r][key]``), beside the ``state_dict`` hooks'
contributions, and on resume it gets that entry back (when it registers after the
checkpoint was loaded, from ``admit``, at once). A ``state_dict()`` that returns
None contributes no key (nothing to save now: a stream that decodes nothing ahead).
An object with ``close()`` is closed when the run ends, however it ends.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from slhub import log
from slhub.errors import PluginError, SlhubError, one_line

LOG = log.get_logger()


@runtime_checkable
class Stateful(Protocol):
    """What can be registered: its state for the checkpoint, and that state restored."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class StateRegistry:
    """One rank's registered objects, by key, in registration order."""

    def __init__(self) -> None:
        self._objects: dict[str, Any] = {}
        self._closed = False
        #: The rank's entry of the checkpoint loaded, with its update and rank: an object
        #: registered later (an extra plugin's, from ``admit``) is restored from it at once.
        self._loaded: tuple[dict[str, Any], int, int] | None = None

    def register(self, key: str, obj: Any) -> None:
        """Keep ``obj`` under ``key``.

        :raises PluginError: ``key`` is not a string or is registered already, or ``obj``
            lacks ``state_dict``/``load_state_dict``.
        """
        if not isinstance(key, str) or not key:
            raise PluginError(f"register_state: the key must be a non-empty string, got {key!r}")
        if key in self._objects:
            raise PluginError(f"checkpoint state {key!r} is registered twice (register_state)")
        if not (callable(getattr(obj, "state_dict", None))
                and callable(getattr(obj, "load_state_dict", None))):  # fmt: skip
            raise PluginError(
                f"register_state({key!r}): {type(obj).__name__} has no state_dict() and "
                "load_state_dict(state)"
            )
        self._objects[key] = obj
        if self._loaded is not None:
            state, step, rank = self._loaded
            if key in state:
                self._restore(key, obj, state[key], step, rank)

    def __contains__(self, key: object) -> bool:
        return key in self._objects

    def merged(self, hooks: dict[str, Any]) -> dict[str, Any]:
        """The rank's entry: the ``state_dict`` hooks' contributions ``hooks``, then every
        registered object's state under its key.

        :raises PluginError: a hook contributes a registered key.
        """
        local = dict(hooks)
        for key, obj in self._objects.items():
            if key in local:
                raise PluginError(
                    f"checkpoint key {key!r} is both registered (register_state) and "
                    "returned by a state_dict hook"
                )
            try:
                state = obj.state_dict()
            except SlhubError:
                raise
            except Exception as exc:  # the gather logs its traceback
                raise PluginError(
                    f"checkpoint state {key!r} failed in state_dict: {one_line(exc)}"
                ) from exc
            if state is not None:
                local[key] = state
        return local

    def load(self, state: dict[str, Any], step: int, rank: int) -> None:
        """Give every registered object its entry of a rank's ``state`` (an object whose
        key the checkpoint lacks keeps its fresh state); objects registered afterwards
        get theirs when they register."""
        self._loaded = (state, step, rank)
        for key, obj in self._objects.items():
            if key in state:
                self._restore(key, obj, state[key], step, rank)

    @staticmethod
    def _restore(key: str, obj: Any, state: Any, step: int, rank: int) -> None:
        try:
            obj.load_state_dict(state)
        except SlhubError:
            raise
        except Exception as exc:  # noqa: BLE001 - its traceback, then one line
            log.failure(f"load_state_dict of {key!r} failed", exc)
            raise PluginError(
                f"checkpoint state {key!r} failed to load from the checkpoint of update "
                f"{step} on rank {rank} (load_state_dict: {one_line(exc)}); its traceback "
                "is in that rank's log"
            ) from None

    def close(self) -> None:
        """Close every registered object that has ``close()``, once; a failure is logged
        (the run's outcome is decided already)."""
        if self._closed:
            return
        self._closed = True
        for key, obj in reversed(self._objects.items()):
            close = getattr(obj, "close", None)
            if not callable(close):
                continue
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - logged; the others still close
                log.failure(f"closing {key!r} failed", exc)
