"""Arrays made once, written atomically and shared memory-mapped, keyed by their parameters.

Every worker of a run asks for the same dataset at the same time. Generation is
deterministic in its parameters, so whoever gets there first writes it: each
file is written atomically (:func:`slhub.atomic.atomic_write`: a temporary
name, fsync, rename), and ``meta.json`` (the parameters) is written last. A
folder whose ``meta.json`` equals the request is therefore complete; any other
folder is made again, so a recipe change never reads stale data. Readers open
the ``.npy`` files memory-mapped, so the workers of one node share one copy
through the page cache.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slhub.atomic import atomic_write

META_FILE = "meta.json"


def cached_arrays(
    folder: str | Path,
    meta: Mapping[str, Any],
    names: Sequence[str],
    make: Callable[[], Mapping[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """The arrays ``names`` of ``folder``, made by ``make()`` unless ``folder`` holds ``meta``'s.

    :param folder: one dataset (one split); created when missing.
    :param meta: JSON-serializable parameters that determine the arrays; stored as
        ``meta.json`` and compared on every call.
    :param names: the arrays, stored as ``<name>.npy`` in this order.
    :param make: generates the arrays (a mapping with exactly ``names``); called only
        when the folder is missing, incomplete or made from other parameters.
    :returns: ``{name: read-only memory-mapped array}``.
    """
    folder = Path(folder)
    meta_path = folder / META_FILE
    if _read_json(meta_path) != json.loads(json.dumps(meta)):
        folder.mkdir(parents=True, exist_ok=True)
        arrays = make()
        if set(arrays) != set(names):
            raise ValueError(f"make() returned {sorted(arrays)}, expected {sorted(names)}")
        for name in names:
            buffer = io.BytesIO()
            np.save(buffer, arrays[name])
            atomic_write(buffer.getvalue(), folder / f"{name}.npy")
        atomic_write(json.dumps(meta, indent=2), meta_path)
    return {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in names}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
