"""NeRD's (NVlabs/neural-robot-dynamics) trajectory-mode HDF5 files as an episode dataset.

NeRD's generators write time-major arrays ``data/<name>`` of shape ``(T, B, ...)``:
column ``b`` is one trajectory, valid for its first ``data/traj_lengths[b]`` steps
(all ``T`` when the file has no ``traj_lengths``); the steps after are zero filler.
So episode ``b`` is column ``b`` cut to its length, and every ``(T, B, ...)``
dataset in ``data/`` (``states``, ``next_states``, ``joint_acts``, ``gravity_dir``,
``root_body_q``, ``contact_*``) is a feature whose per-step shape is the trailing
dims. A read is the hyperslab ``data[name][start:stop, b]``, nothing more.

Transition-mode files (``mode='transition'``, arrays ``(N, D)`` of independent
one-step samples) are recognized but refused with one line: as episodes they would
be ``N`` episodes of length 1, which no window over steps can use, and a
per-episode index of millions of entries for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from slhub.data.episodes import Feature
from slhub.data.hdf5_file import probe_hdf5
from slhub.data.readers.robomimic import Hdf5Dataset, text_attr
from slhub.errors import DatasetError

TRAJECTORY = "trajectory"
TRANSITION = "transition"


@dataclass
class NerdTrajectoryDataset(Hdf5Dataset):
    """A NeRD trajectory-mode file: episode ``b`` is column ``b`` of ``data/<feature>``."""

    format: ClassVar[str] = "nerd"

    @classmethod
    def detect(cls, path: Path) -> bool:
        """HDF5 with a 3-D ``data/states`` and ``mode='trajectory'`` or ``data/traj_lengths``;
        also a transition-mode NeRD file, so that ``open`` can say why it is refused."""
        handle = probe_hdf5(Path(path))
        if handle is None:
            return False
        try:
            import h5py

            with handle:
                data = handle.get("data")
                states = data.get("states") if isinstance(data, h5py.Group) else None
                if not isinstance(states, h5py.Dataset):
                    return False
                mode = text_attr(data.attrs.get("mode"))
                if states.ndim == 3:
                    return mode == TRAJECTORY or "traj_lengths" in data
                return states.ndim == 2 and mode == TRANSITION
        except Exception:  # noqa: BLE001 - detect never raises
            return False

    label: ClassVar[str] = "NeRD"

    @classmethod
    def _layout(cls, path: Path, handle: Any) -> NerdTrajectoryDataset:
        import h5py

        data = handle.get("data")
        states = None if not isinstance(data, h5py.Group) else data.get("states")
        if not isinstance(states, h5py.Dataset):
            raise DatasetError(f"{path}: no data/states array, so not a NeRD file")
        mode = text_attr(data.attrs.get("mode"))
        if mode == TRANSITION or states.ndim == 2:
            raise DatasetError(
                f"{path}: a NeRD transition-mode file (one-step samples, no trajectories); "
                "only trajectory mode is read: generate the dataset with mode 'trajectory'"
            )
        if states.ndim != 3:
            raise DatasetError(
                f"{path}: data/states has shape {states.shape}; NeRD trajectories are (T, B, D)"
            )
        steps, columns = (int(n) for n in states.shape[:2])
        features = {
            name: Feature(tuple(int(n) for n in array.shape[2:]), str(array.dtype))
            for name, array in sorted(data.items())
            if isinstance(array, h5py.Dataset)
            and array.ndim >= 2
            and tuple(array.shape[:2]) == (steps, columns)
        }
        return cls(
            path=path,
            features=features,
            lengths=_lengths(path, data, steps, columns),
            fps=_rate(data.attrs),
        )

    def read(self, feature: str, episode: int, start: int, stop: int) -> np.ndarray:
        """``data/<feature>[start:stop, episode]``: one column's steps off the disk."""
        self._check_range(feature, episode, start, stop)
        return self._slice(
            f"data/{feature}",
            (slice(start, stop), episode),
            f"data/{feature}[{start}:{stop}, {episode}]",
        )


def _lengths(path: Path, data: Any, steps: int, columns: int) -> np.ndarray:
    """``traj_lengths`` (checked: one per column, each ``0..T``), or ``T`` for every column."""
    if "traj_lengths" not in data:
        return np.full(columns, steps, dtype=np.int64)
    stored = np.asarray(data["traj_lengths"][()])
    if stored.shape != (columns,) or not np.issubdtype(stored.dtype, np.integer):
        raise DatasetError(
            f"{path}: data/traj_lengths is {stored.dtype} {stored.shape}; "
            f"it needs one integer per trajectory ({columns})"
        )
    if stored.size and (stored.min() < 0 or stored.max() > steps):
        raise DatasetError(
            f"{path}: data/traj_lengths runs {stored.min()}..{stored.max()}, outside the "
            f"{steps} steps the arrays hold"
        )
    return stored.astype(np.int64)


def _rate(attrs: Any) -> float | None:
    """The control rate, when the file records one (``fps``, or ``dt`` in seconds);
    NeRD's generators write neither, so usually None."""
    for key, invert in (("fps", False), ("dt", True)):
        value = attrs.get(key)
        if value is None:
            continue
        try:
            number = float(np.asarray(value).reshape(-1)[0])
        except (TypeError, ValueError, IndexError):
            continue
        if number > 0:
            return 1.0 / number if invert else number
    return None
