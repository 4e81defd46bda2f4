"""Dataset fingerprints and episode splits: what a run records about the data it trained on.

A dataset's :func:`fingerprint` is its format, its layout (every feature's shape,
dtype and names), its episode lengths and a sha256 of its files' bytes. The digest
is computed once and cached (keyed by the files' paths, sizes and modification
times), so a resume checks it without reading the data again. Splits are always
by episode, never by step: a validation episode is never a training one.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slhub.atomic import atomic_write
from slhub.data.episodes import EpisodeDataset
from slhub.errors import DatasetError


def fingerprint(dataset: EpisodeDataset) -> dict[str, Any]:
    """The fingerprint of ``dataset`` as plain data (run.json and the checkpoint record it)."""
    lengths = np.asarray(dataset.lengths, dtype=np.int64)
    return {
        "format": dataset.format,
        "features": {name: spec.to_dict() for name, spec in sorted(dataset.features.items())},
        "episodes": int(len(lengths)),
        "steps": int(lengths.sum()),
        "lengths_sha256": hashlib.sha256(lengths.tobytes()).hexdigest(),
        "content_sha256": content_digest(dataset),
    }


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What changed between two fingerprints, in words (empty: the same dataset)."""
    out = []
    for key in ("format", "episodes", "steps", "lengths_sha256", "features", "content_sha256"):
        if recorded.get(key) != current.get(key):
            what = {"lengths_sha256": "episode lengths", "content_sha256": "content"}.get(key, key)
            old, new = recorded.get(key), current.get(key)
            if key in ("format", "episodes", "steps"):
                out.append(f"{what} {old} -> {new}")
            else:
                out.append(f"{what} changed")
    return out


def content_digest(dataset: EpisodeDataset) -> str:
    """sha256 over the bytes of the dataset's files (a file, or a directory tree in path
    order), cached by the files' names, sizes and modification times."""
    root = Path(dataset.path)
    if not root.exists():  # an in-memory dataset: digest the arrays themselves
        digest = hashlib.sha256()
        for episode in range(dataset.num_episodes):
            for name in sorted(dataset.features):
                length = int(dataset.lengths[episode])
                digest.update(np.ascontiguousarray(dataset.read(name, episode, 0, length)))
        return digest.hexdigest()
    if root.is_file():  # its name is not content: a renamed copy is the same dataset
        files, names = [root], [""]
    else:  # hidden files (caches, temporaries) are not the dataset's
        files = sorted(p for p in root.rglob("*") if p.is_file())
        files = [p for p in files if not any(s.startswith(".") for s in p.relative_to(root).parts)]
        names = [p.relative_to(root).as_posix() for p in files]
    listing = [(name, *_stat(p)) for name, p in zip(names, files)]
    key = hashlib.sha256(json.dumps([str(root.resolve()), listing]).encode()).hexdigest()
    cached = _cache_dir() / f"{key}.json"
    try:
        return json.loads(cached.read_text())["content_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = hashlib.sha256()
    for path, (name, _, _) in zip(files, listing):
        digest.update(name.encode() + b"\0")
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    value = digest.hexdigest()
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(json.dumps({"content_sha256": value, "path": str(root)}), cached)
    except OSError:
        pass  # a read-only cache only costs the digest again next time
    return value


def _stat(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_size, info.st_mtime_ns


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slhub" / "dataset-digests"


@dataclass(frozen=True)
class Split:
    """Training and validation episodes (disjoint, sorted)."""

    train: tuple[int, ...]
    validation: tuple[int, ...]

    def to_dict(self) -> dict[str, list[int]]:
        return {"train": list(self.train), "validation": list(self.validation)}


def split_episodes(
    dataset: EpisodeDataset,
    *,
    validation_ratio: float = 0.0,
    seed: int = 0,
    train: Sequence[int] | str | None = None,
    validation: Sequence[int] | str | None = None,
) -> Split:
    """Split by episode: from the file's own named splits (``train``/``validation`` given
    as split names, e.g. robomimic's ``"train"``/``"valid"``), from explicit episode
    lists, or by ``validation_ratio`` with ``seed`` (a numpy permutation).

    :raises DatasetError: an unknown split name or episode index, overlapping lists, or
        an empty training split.
    """
    count = dataset.num_episodes
    chosen_train = _episodes(dataset, train, "train")
    chosen_validation = _episodes(dataset, validation, "validation")
    if chosen_train is None and chosen_validation is None:
        order = np.random.default_rng(seed).permutation(count)
        held = int(round(validation_ratio * count))
        if validation_ratio > 0 and held == 0:
            held = 1
        chosen_validation, chosen_train = sorted(order[:held]), sorted(order[held:])
    elif chosen_train is None:
        chosen_train = [e for e in range(count) if e not in set(chosen_validation)]
    elif chosen_validation is None:
        chosen_validation = [e for e in range(count) if e not in set(chosen_train)]
    overlap = sorted(set(chosen_train) & set(chosen_validation))
    if overlap:
        raise DatasetError(
            f"{dataset.path}: episodes {overlap[:10]} are in both the training and the "
            "validation split"
        )
    if not chosen_train:
        raise DatasetError(f"{dataset.path}: the training split holds no episodes")
    return Split(tuple(int(e) for e in chosen_train), tuple(int(e) for e in chosen_validation))


def _episodes(
    dataset: EpisodeDataset, given: Sequence[int] | str | None, which: str
) -> list[int] | None:
    if given is None:
        return None
    if isinstance(given, str):
        if given not in dataset.splits:
            have = ", ".join(sorted(dataset.splits)) or "none"
            raise DatasetError(
                f"{dataset.path}: no split named {given!r} for {which} (the file names: {have})"
            )
        return sorted(dataset.splits[given])
    bad = [e for e in given if not 0 <= int(e) < dataset.num_episodes]
    if bad:
        raise DatasetError(
            f"{dataset.path}: {which} episodes {bad[:10]} do not exist "
            f"(the dataset has {dataset.num_episodes})"
        )
    return sorted(int(e) for e in given)
