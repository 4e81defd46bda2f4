"""Errors that the CLI reports as one line with exit status 2.

Everything a user can get wrong (recipe, paths, checkpoints, plugins) raises a
subclass of :class:`SlhubError`; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SlhubError(Exception):
    """A user-facing error: its message is the whole story, no traceback needed."""


class RecipeError(SlhubError):
    """A recipe that cannot be read or does not validate."""


class PluginError(SlhubError):
    """A plugin that is missing, fails to import or breaks the hook contract."""


class CheckpointError(SlhubError):
    """A checkpoint that is missing, damaged, foreign or incompatible with the run."""


class ArtifactError(SlhubError):
    """An output directory that cannot be claimed or resumed into."""


class RankFailure(SlhubError):
    """A rank-local failure, raised identically on every rank after the agreement."""

    def __init__(self, message: str, *, origin_rank: int, phase: str) -> None:
        super().__init__(message)
        self.origin_rank = origin_rank
        self.phase = phase
