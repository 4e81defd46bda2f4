"""Paths a user names: one-line errors instead of OSError and ValueError tracebacks.

The OS refuses some names outright: an empty one (pathlib silently reads it as
``.``), one holding a NUL byte, a component over the file system's name limit,
a symlink loop. pathlib raises those as ValueError or OSError from calls as
innocent as ``exists()``. Every command that takes a path goes through here, so
each refusal is one :class:`~slhub.errors.SlhubError` line, ``PATH: reason``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slhub.errors import SlhubError, one_line


def user_path(
    path: str | os.PathLike[str], what: str, error: type[SlhubError] = SlhubError
) -> Path:
    """``path`` as a Path, refusing names no OS call accepts, before anything acts on them.

    ``Path("")`` means the current directory and a NUL byte makes pathlib raise
    ValueError, or answer False from ``exists()``; either would surface far from
    the argument at fault. ``what`` names the argument (``--out``, ``recipe file``).
    A leading ``~`` or ``~user`` is expanded as a shell would (a quoted argument, a
    YAML value or a path from Python gets no shell expansion), never taken literally
    as a directory named ``~``; an unknown user is refused.
    """
    text = os.fspath(path)
    if not text:
        raise error(f"{what}: empty path")
    if "\0" in text:
        raise error(f"{what} {text!r}: a path cannot hold a NUL byte")
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        raise error(f"{what} {text}: {home_of(text)}: no such user's home directory")
    return Path(expanded)


def home_of(text: str) -> str:
    """The ``~`` or ``~user`` a path starts with (``os.path.expanduser`` expands it)."""
    return text.split(os.sep, 1)[0]


def reason(exc: BaseException) -> str:
    """The OS's short reason (``File name too long``), without the path it repeats."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return one_line(exc)


@contextmanager
def path_errors(
    path: str | os.PathLike[str],
    error: type[SlhubError],
    doing: str,
    hint: str = "",
) -> Iterator[None]:
    """Turn an OSError or ValueError of the block's path operations into one line:
    ``PATH: DOING (REASON)[; HINT]`` raised as ``error`` (SlhubErrors pass through)."""
    try:
        yield
    except (OSError, ValueError) as exc:
        suffix = f"; {hint}" if hint else ""
        raise error(f"{path}: {doing} ({reason(exc)}){suffix}") from None


def real_path(path: str | os.PathLike[str]) -> Path:
    """``path`` absolute, ``~`` expanded and every symlink resolved (as far as it exists):
    the one form two paths are compared in."""
    expanded = os.path.expanduser(os.fspath(path))
    try:
        return Path(expanded).resolve()
    except (OSError, RuntimeError):  # a symlink loop: compare what can be told
        return Path(os.path.abspath(expanded))


def within(inner: str | os.PathLike[str], outer: str | os.PathLike[str]) -> bool:
    """Whether ``inner`` is ``outer`` or lies inside it, compared as real paths."""
    inner_path, outer_path = real_path(inner), real_path(outer)
    return inner_path == outer_path or outer_path in inner_path.parents


def user_cache_dir() -> Path:
    """slhub's folder in the user's cache: ``$XDG_CACHE_HOME/slhub``, by default
    ``~/.cache/slhub`` (statistics, dataset digests; never inside a dataset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slhub"


def unwritable_reason(folder: str | os.PathLike[str]) -> str | None:
    """Why ``folder`` could not be made or written into, or None when it can: it, or
    the nearest folder of it that exists, must be a directory this process may write
    into. Nothing is created (a logger checks its directory in ``admit``, before any
    artifact)."""
    existing = Path(folder)
    try:
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            return f"{existing} is not a directory"
        if not os.access(existing, os.W_OK | os.X_OK):
            return f"{existing} is not writable (read-only, or another user's)"
    except (OSError, ValueError) as exc:
        return str(exc)
    return None
