"""Errors that the CLI reports as one line with exit status 2, and :func:`one_line`.

Everything a user can get wrong (recipe, paths, checkpoints, plugins, exports)
raises a subclass of :class:`SlhubError`; anything else is a bug and keeps its
traceback. :func:`one_line` is the one way an exception becomes part of such a
line, and :func:`write_final_line` the one way that line reaches stderr.
"""

from __future__ import annotations

import sys
from typing import Any

#: What :func:`one_line` puts where it cut a message.
CUT = " ..."


class SlhubError(Exception):
    """A user-facing error: its message is the whole story, no traceback needed."""


class RecipeError(SlhubError):
    """A recipe that cannot be read or does not validate."""


class PluginError(SlhubError):
    """A plugin that is missing, fails to import or breaks the hook contract."""


class CheckpointError(SlhubError):
    """A checkpoint that is missing, damaged, foreign or incompatible with the run."""


class DatasetError(SlhubError):
    """A dataset that is missing, of an unknown format, damaged, or unfit for the recipe."""


class SimulatorError(SlhubError):
    """A simulator or environment that is unknown, missing its library, or misused."""


class ArtifactError(SlhubError):
    """An output directory that cannot be claimed or resumed into."""


class ExportError(SlhubError, ValueError):
    """An export directory that is not a readable export of an installed kind.

    Also a ``ValueError``, which is what ``slhub.export.load`` raised before it had
    its own class, so ``except ValueError`` keeps working.
    """


class RankFailure(SlhubError):
    """A rank-local failure, raised identically on every rank after the agreement."""

    def __init__(self, message: str, *, origin_rank: int, phase: str) -> None:
        super().__init__(message)
        self.origin_rank = origin_rank
        self.phase = phase


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``exc`` as one line of at most ``limit`` characters, for a user's message.

    Whitespace (newlines included) is collapsed to single spaces. A
    :class:`SlhubError` gives its text alone (its message is written for the
    user); any other exception gives ``ClassName: text``, and its class name
    alone when it has no text. A longer line is cut at the last word boundary
    that leaves room for ``" ..."``, never inside a word, unless one word alone
    is longer than the limit.
    """
    name = type(exc).__name__
    text = " ".join(str(exc).split())
    if not text:
        return name
    if not isinstance(exc, SlhubError):
        text = f"{name}: {text}"
    if len(text) <= limit:
        return text
    room = max(limit - len(CUT), 1)
    space = text.rfind(" ", 0, room + 1)
    return (text[:space] if space > 0 else text[:room]) + CUT


def write_final_line(line: str) -> None:
    """Write a command's last line to stderr in ONE write, flushed: torchrun workers
    share that stream, and a line written apart from its newline can be glued to
    another worker's line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


#: How many characters of a user's value a message echoes (:func:`shown`).
SHOWN = 80


def shown(value: Any, limit: int = SHOWN, *, quote: bool = False) -> str:
    """``value`` as a message echoes it (a ``str`` as it is, anything else as ``str()``;
    ``quote``: as ``repr()``): at most ``limit`` characters of it, a longer one cut to its
    first characters and ``… (N characters)``, and any character that is not printable
    (a newline) escaped, so a value of any size or content keeps its line one short line.
    """
    text = value if isinstance(value, str) else str(value)
    head = text[:limit]
    if not head.isprintable():
        head = "".join(c if c.isprintable() else repr(c)[1:-1] for c in head)
    if quote:
        head = repr(head)
    return head if len(text) <= limit else f"{head}… ({len(text)} characters)"


def raised_by(exc: BaseException, hook: Any) -> str:
    """``plugin NAME``: the plugin whose implementation of ``hook`` (a pluggy hook caller)
    raised ``exc``, the innermost one on its traceback; ``a plugin`` when none can be told.
    """
    impls = {
        getattr(impl.function, "__code__", None): impl.plugin_name
        for impl in getattr(hook, "get_hookimpls", list)()
    }
    name = None
    frame = exc.__traceback__
    while frame is not None:
        name = impls.get(frame.tb_frame.f_code, name)
        frame = frame.tb_next
    return f"plugin {name}" if name is not None else "a plugin"
