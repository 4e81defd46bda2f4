"""Windows that respect episodes: per-feature step offsets around an anchor step.

A :class:`Window` names, for each feature, the steps it takes relative to an
anchor (NeRD: state ``-9..0`` and next state ``1``; RWM: history ``-31..0`` and
forecast ``1..8``; BC: observation ``-1..0`` and action chunk ``0..15``). A window
never reads another episode. Steps outside the anchor's episode are either
excluded (``pad=False``: only anchors whose whole window fits, NeRD's rule) or
padded with the episode's edge value and reported in ``<feature>_is_pad``
(``pad=True``: every step is an anchor; LeRobot's ``delta_timestamps`` and
robomimic's ``pad_same`` rule).

Anchors are drawn with a ``torch.Generator`` (the trainer's per-rank sampler
stream), and a window's arrays are a pure function of its anchor, so a resumed
run draws and reads exactly what the uninterrupted run did, whoever decodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from slhub.data.episodes import EpisodeDataset
from slhub.errors import DatasetError

PAD_SUFFIX = "_is_pad"


@dataclass(frozen=True)
class Window:
    """Per-feature step offsets around an anchor, and what happens at episode edges."""

    offsets: Mapping[str, tuple[int, ...]]
    pad: bool = False

    def __post_init__(self) -> None:
        frozen = {name: tuple(int(o) for o in steps) for name, steps in self.offsets.items()}
        if not frozen or any(not steps for steps in frozen.values()):
            raise DatasetError("a window needs at least one feature with at least one offset")
        object.__setattr__(self, "offsets", frozen)

    @property
    def reach(self) -> tuple[int, int]:
        """The lowest and highest offset of any feature."""
        every = [o for steps in self.offsets.values() for o in steps]
        return min(every), max(every)

    def anchors(self, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
        """Every valid anchor as rows ``(episode, step)`` (int64), episode by episode."""
        low, high = self.reach
        rows = []
        for episode, length in enumerate(np.asarray(lengths, dtype=np.int64)):
            if self.pad:
                first, last = 0, int(length) - 1
            else:
                first, last = max(0, -low), int(length) - 1 - max(0, high)
            if last >= first:
                steps = np.arange(first, last + 1, dtype=np.int64)
                rows.append(np.stack([np.full_like(steps, episode), steps], axis=1))
        return np.concatenate(rows) if rows else np.zeros((0, 2), dtype=np.int64)

    def at(self, dataset: EpisodeDataset, episode: int, step: int) -> dict[str, np.ndarray]:
        """The window anchored at ``step`` of ``episode``: per feature an array of shape
        ``(len(offsets), *shape)``; with ``pad``, also ``<feature>_is_pad`` (bool)."""
        length = int(dataset.lengths[episode])
        if not 0 <= step < length:
            raise DatasetError(f"step {step} is not in episode {episode} (length {length})")
        out: dict[str, np.ndarray] = {}
        for name, offsets in self.offsets.items():
            wanted = step + np.asarray(offsets, dtype=np.int64)
            outside = (wanted < 0) | (wanted >= length)
            if outside.any() and not self.pad:
                raise DatasetError(
                    f"window of {name} at step {step} of episode {episode} leaves the episode "
                    f"(length {length}); use a padded window or a valid anchor"
                )
            out[name] = dataset.read_steps(name, episode, np.clip(wanted, 0, length - 1))
            if self.pad:
                out[name + PAD_SUFFIX] = outside
        return out

    def batch(self, dataset: EpisodeDataset, anchors: np.ndarray) -> dict[str, np.ndarray]:
        """The windows at ``anchors`` (rows ``(episode, step)``), stacked along axis 0: each
        feature is read in one :meth:`~slhub.data.EpisodeDataset.read_rows` call. Equal,
        element for element, to stacking :meth:`at` of every anchor."""
        anchors = np.asarray(anchors, dtype=np.int64).reshape(-1, 2)
        if len(anchors) == 0:
            raise DatasetError("no anchors to read windows at")
        episodes, steps = anchors[:, 0], anchors[:, 1]
        lengths = np.asarray(dataset.lengths, dtype=np.int64)[episodes]
        if ((steps < 0) | (steps >= lengths)).any():
            bad = int(np.argmax((steps < 0) | (steps >= lengths)))
            raise DatasetError(
                f"step {int(steps[bad])} is not in episode {int(episodes[bad])} "
                f"(length {int(lengths[bad])})"
            )
        out: dict[str, np.ndarray] = {}
        for name, offsets in self.offsets.items():
            wanted = steps[:, None] + np.asarray(offsets, dtype=np.int64)[None, :]
            last = lengths[:, None] - 1
            outside = (wanted < 0) | (wanted > last)
            if outside.any() and not self.pad:
                row = int(np.argmax(outside.any(axis=1)))
                raise DatasetError(
                    f"window of {name} at step {int(steps[row])} of episode "
                    f"{int(episodes[row])} leaves the episode (length {int(lengths[row])}); use "
                    "a padded window or a valid anchor"
                )
            clamped = np.minimum(np.maximum(wanted, 0), last)
            rows = np.repeat(episodes, len(offsets))
            values = dataset.read_rows(name, rows, clamped.reshape(-1))
            out[name] = values.reshape(len(anchors), len(offsets), *values.shape[1:])
            if self.pad:
                out[name + PAD_SUFFIX] = outside
        return out


def sample_anchors(
    anchors: np.ndarray,
    count: int,
    generator: torch.Generator,
    by: Literal["step", "episode"] = "step",
) -> np.ndarray:
    """``count`` anchors drawn with replacement with ``generator``: uniform over every
    valid anchor (``by="step"``), or an episode uniformly, then an anchor in it."""
    if len(anchors) == 0:
        raise DatasetError("no valid anchors: every episode is shorter than the window")
    if by == "step":
        picks = torch.randint(len(anchors), (count,), generator=generator).numpy()
        return anchors[picks]
    episodes, starts, counts = np.unique(anchors[:, 0], return_index=True, return_counts=True)
    chosen = torch.randint(len(episodes), (count,), generator=generator).numpy()
    within = torch.rand(count, generator=generator, dtype=torch.float64).numpy()
    offset = np.minimum((within * counts[chosen]).astype(np.int64), counts[chosen] - 1)
    return anchors[starts[chosen] + offset]
