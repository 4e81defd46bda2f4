"""Train and validation splits, made once per recipe and reused by every hook.

A model plugin needs its splits in ``build_model``, ``sample`` and
``validate``; generating them in each hook would be slow, and keeping them past
a recipe change would train on stale data. :class:`SplitCache` holds each
split until the plugin is asked for a split of another recipe section, and
:func:`split_seed` is the convention that keeps validation data independent of
training data when a recipe gives one seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

SplitT = TypeVar("SplitT")

SPLITS: tuple[str, ...] = ("train", "val")


def split_seed(seed: int, split: str) -> int:
    """The seed of ``split`` from a recipe's one ``seed``: ``seed`` (train), ``seed + 1`` (val)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    return seed + SPLITS.index(split)


class SplitCache(Generic[SplitT]):
    """Splits made on first request and kept while the recipe section stays the same object.

    >>> cache: SplitCache[Scenes] = SplitCache()
    >>> scenes = cache.get(section, "train", section.make)  # made once, then reused

    A different section object (another recipe, e.g. in a test or a notebook)
    drops every kept split first.
    """

    def __init__(self) -> None:
        self._splits: dict[str, SplitT] = {}
        self._section: object = None

    def get(self, section: object, split: str, make: Callable[[str], SplitT]) -> SplitT:
        """The split ``split`` of ``section``, calling ``make(split)`` the first time."""
        if section is not self._section:
            self._splits, self._section = {}, section
        if split not in self._splits:
            self._splits[split] = make(split)
        return self._splits[split]
