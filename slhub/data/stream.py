"""Training windows decoded ahead of the loop, with anchors still drawn by the trainer.

Decoding video or images can cost more than an update, so a :class:`WindowStream`
keeps ``ahead`` batches of anchors drawn and their windows decoding on ``workers``
threads while the loop trains on the current one. Exactness does not depend on the
worker count: the anchors of batch ``n + ahead`` are drawn with the trainer's
generator when batch ``n`` is taken, whatever ``workers`` is (0 decodes in the
caller's thread, when the batch is taken), and a window is a pure function of its
anchors. The drawn-but-unused anchors are the stream's state
(:meth:`WindowStream.state_dict`), saved beside the generator's state: a stream made
with ``TrainingData.stream(..., trainer=trainer, key=KEY)`` is registered with the
trainer (``register_state``), so every checkpoint holds them under ``KEY`` and a
resumed run decodes exactly the batches the uninterrupted run would have.

Each worker thread opens its own reader of the dataset (file handles and video
decoders are not shared between threads). :meth:`WindowStream.close` stops the
threads and closes their readers (and the source, for a stream that owns it); the
trainer closes a registered stream when the run ends, however it ends.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import torch

from slhub.data.windows import sample_anchors


class WindowSource(Protocol):
    """What a stream reads from (:class:`slhub.data.TrainingData`)."""

    window: Any

    def require_anchors(self, offsets: Mapping[str, Sequence[int]], which: str) -> np.ndarray: ...

    def read(self, offsets: Mapping[str, Sequence[int]], anchors: np.ndarray) -> dict[str, Any]: ...

    def reopened(self) -> WindowSource: ...

    def close(self) -> None: ...


class WindowStream:
    """Batches of training windows: drawn in order with the trainer's generator,
    decoded ``ahead`` batches in advance on ``workers`` threads. ``owns_data``: closing
    the stream also closes ``data``."""

    def __init__(
        self,
        data: WindowSource,
        offsets: Mapping[str, Sequence[int]],
        batch_size: int,
        *,
        ahead: int = 1,
        workers: int = 0,
        owns_data: bool = False,
    ) -> None:
        self.data = data
        self.owns_data = owns_data
        self.offsets = {role: tuple(int(o) for o in steps) for role, steps in offsets.items()}
        self.batch_size = int(batch_size)
        self.ahead = int(ahead)
        self.workers = int(workers)
        self._anchors = data.require_anchors(self.offsets, "train")
        self._pending: deque[np.ndarray] = deque()
        self._decoding: deque[Future[dict[str, Any]] | None] = deque()
        self._local = threading.local()
        self._readers: list[WindowSource] = []  # the worker threads' own readers
        self._lock = threading.Lock()
        self._closed = False
        self._pool = (
            ThreadPoolExecutor(self.workers, thread_name_prefix="slhub-decode")
            if self.workers
            else None
        )

    def next(self, generator: torch.Generator) -> dict[str, Any]:
        """The next batch of windows (see :meth:`TrainingData.read`); draws the anchors
        of the batch ``ahead`` later with ``generator``."""
        while len(self._pending) < self.ahead + 1:
            self._push(self._draw(generator))
        anchors = self._pending.popleft()
        future = self._decoding.popleft()
        return future.result() if future is not None else self.data.read(self.offsets, anchors)

    def _draw(self, generator: torch.Generator) -> np.ndarray:
        by = self.data.window.sample
        return sample_anchors(self._anchors, self.batch_size, generator, by=by)

    def _push(self, anchors: np.ndarray) -> None:
        self._pending.append(anchors)
        self._decoding.append(self._pool.submit(self._read, anchors) if self._pool else None)

    def _read(self, anchors: np.ndarray) -> dict[str, Any]:
        reader = getattr(self._local, "data", None)
        if reader is None:
            reader = self.data.reopened()
            self._local.data = reader
            if reader is not self.data:
                with self._lock:
                    self._readers.append(reader)
        return reader.read(self.offsets, anchors)

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """The anchors drawn but not yet trained on (``[n, batch, 2]`` int64); None for a
        stream that draws nothing ahead (``ahead: 0``: it has no state to save)."""
        if not self.ahead:
            return None
        pending = np.stack(list(self._pending)) if self._pending else np.zeros((0, 0, 2))
        return {"pending": torch.from_numpy(np.asarray(pending, dtype=np.int64))}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after the anchors a checkpoint's stream had drawn."""
        pending = state["pending"]
        self._pending.clear()
        for future in self._decoding:
            if future is not None:
                future.cancel()
        self._decoding.clear()
        for anchors in np.asarray(pending.numpy() if hasattr(pending, "numpy") else pending):
            self._push(np.asarray(anchors, dtype=np.int64))

    def close(self) -> None:
        """Stop the decode threads (waiting for them), close their readers and, when the
        stream owns it, the source. Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            readers, self._readers = self._readers, []
        for reader in readers:
            reader.close()
        if self.owns_data:
            self.data.close()
