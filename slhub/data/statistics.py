"""Per-feature statistics over a set of episodes, in float64, in one streaming pass.

Mean and standard deviation are merged block by block (Chan et al.'s pairwise
update), so no feature is ever copied whole into memory; min and max are exact.
Quantiles (``q01 q10 q50 q90 q99``, LeRobot's set) are exact over at most
``QUANTILE_SAMPLES`` steps per feature: every k-th step of the episodes in order,
with k chosen so the sample fits (k = 1, exact, on small datasets). Images are
summarized per channel, as LeRobot does. The result is a plain mapping of float64
arrays, safe to store in a checkpoint and an export.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from slhub.data.episodes import EpisodeDataset
from slhub.errors import DatasetError

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
QUANTILE_SAMPLES = 100_000
#: Steps read at a time from one episode.
BLOCK = 4096


def feature_statistics(
    dataset: EpisodeDataset,
    features: Iterable[str] | None = None,
    episodes: Sequence[int] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """``{feature: {"mean", "std", "min", "max", "count", "q01", ...}}`` over ``episodes``
    (default: all) of ``features`` (default: every non-image feature and every image
    feature per channel).

    :raises DatasetError: no steps to summarize, or a non-finite value (naming the
        feature, episode and step).
    """
    names = list(dataset.features if features is None else features)
    chosen = list(range(dataset.num_episodes) if episodes is None else episodes)
    total = int(sum(int(dataset.lengths[e]) for e in chosen))
    if total == 0:
        raise DatasetError(f"{dataset.path}: no steps to compute statistics over")
    stride = max(1, -(-total // QUANTILE_SAMPLES))
    return {name: _one(dataset, name, chosen, stride) for name in names}


def _one(
    dataset: EpisodeDataset, name: str, episodes: list[int], stride: int
) -> dict[str, np.ndarray]:
    spec = dataset.check_feature(name, for_what="statistics")
    count, mean, m2 = 0, None, None
    low = high = None
    samples: list[np.ndarray] = []
    seen = 0  # steps before this block, for the quantile stride
    for episode in episodes:
        length = int(dataset.lengths[episode])
        for start in range(0, length, BLOCK):
            stop = min(length, start + BLOCK)
            block = _as_rows(dataset.read(name, episode, start, stop), spec.is_image)
            bad = ~np.isfinite(block)
            if bad.any():
                row = int(np.argwhere(bad)[0][0])
                raise DatasetError(
                    f"{dataset.path}: feature {name} is not finite at episode {episode}, "
                    f"step {_step_of(row, start, block, stop - start)}"
                )
            n = block.shape[0]
            block_mean = block.mean(axis=0)
            block_m2 = ((block - block_mean) ** 2).sum(axis=0)
            if mean is None:
                count, mean, m2 = n, block_mean, block_m2
                low, high = block.min(axis=0), block.max(axis=0)
            else:
                delta = block_mean - mean
                merged = count + n
                mean = mean + delta * (n / merged)
                m2 = m2 + block_m2 + delta**2 * (count * n / merged)
                count = merged
                low, high = np.minimum(low, block.min(axis=0)), np.maximum(high, block.max(axis=0))
            if not spec.is_image:
                picks = np.arange((-seen) % stride, stop - start, stride)
                samples.append(block[picks])
            seen += stop - start
    assert mean is not None and m2 is not None
    out = {
        "mean": mean,
        "std": np.sqrt(m2 / count),
        "min": low,
        "max": high,
        "count": np.asarray([count], dtype=np.int64),
    }
    if samples:
        stacked = np.concatenate(samples)
        for key, q in QUANTILES.items():
            out[key] = np.quantile(stacked, q, axis=0)
    return out


def _as_rows(block: np.ndarray, image: bool) -> np.ndarray:
    """float64 rows: one per step, or for images one per pixel (statistics per channel)."""
    values = block.astype(np.float64)
    if image:
        return values.reshape(-1, values.shape[-1])
    return values.reshape(values.shape[0], *values.shape[1:])


def _step_of(row: int, start: int, block: np.ndarray, steps: int) -> int:
    per_step = max(1, block.shape[0] // max(1, steps))
    return start + row // per_step
