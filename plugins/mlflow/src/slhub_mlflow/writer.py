"""A background thread that logs to MLflow, so an update never waits for the server.

``on_log`` only queues a line; the thread opens the MLflow run, catches it up with
the run's history, then sends what is queued in batches (one ``log_batch`` for all
lines that arrived while the previous request was under way). The first failure
(a lost server, a refused request) is warned about once, in one line naming the
server and the command that fills the run afterwards; from then on nothing is sent
and metrics.jsonl, complete as always, is the record.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import slhub

from slhub_mlflow import tracker
from slhub_mlflow.history import Row
from slhub_mlflow.section import MlflowSection

#: The most queued lines one request carries (MLflow splits a batch to its own limits).
BATCH_LINES = 500
#: The longest ``on_fit_end`` waits for the queue to drain and the run to be ended.
FINISH_WAIT_S = 300.0


def sync_command(run_dir: Path) -> str:
    return f"python -m slhub_mlflow.sync {run_dir}"


class Writer:
    """Logs one slhub run's lines into its MLflow run from a daemon thread."""

    def __init__(
        self, uri: str, section: MlflowSection, run_dir: Path, run_name: str, first_step: int
    ) -> None:
        self.uri = uri
        self.run_dir = run_dir
        self.failure: BaseException | None = None
        self.link: tracker.Link | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # the thread logs with this process's context (run id, rank), as the loop does
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run,
            args=(self._work, section, run_name, first_step),
            name="slhub-mlflow",
            daemon=True,
        )
        self._thread.start()

    def log(self, step: int, row: Row) -> None:
        """Queue one metrics line (nothing once logging stopped)."""
        if self.failure is None and row:
            self._queue.put((step, row, tracker.now_ms()))

    def close(self, status: str, step: int, checkpoints: bool) -> None:
        """Send what is queued, end the MLflow run with ``status`` at update ``step`` (and
        upload the checkpoints), and wait for it, at most :data:`FINISH_WAIT_S`."""

        def end(link: tracker.Link) -> None:
            link.log_identity(self.run_dir)  # run.json's ``best`` may have changed
            if checkpoints:
                link.log_checkpoints(self.run_dir)
            link.end(status, step)

        self._queue.put(end)
        self._queue.put(None)
        self._thread.join(FINISH_WAIT_S)
        if self._thread.is_alive():
            slhub.get_logger().warning(
                "mlflow still busy; not waiting",
                server=self.uri,
                waited_s=FINISH_WAIT_S,
                sync=sync_command(self.run_dir),
            )

    def _work(self, section: MlflowSection, run_name: str, first_step: int) -> None:
        try:
            # the history before this process's first line (and that line, if written)
            link, rows = tracker.attach(
                self.uri, section, self.run_dir, run_name, until=first_step + 1
            )
            self.link = link
            link.send(rows)
            self._serve(link)
        except Exception as exc:  # noqa: BLE001 - training goes on; metrics.jsonl is complete
            self.failure = exc
            slhub.get_logger().warning(
                "mlflow logging stopped",
                server=self.uri,
                error=tracker.reason(exc),
                sync=sync_command(self.run_dir),
            )

    def _serve(self, link: tracker.Link) -> None:
        """Send queued lines in batches and run queued calls in order, until None."""
        while True:
            items = [self._queue.get()]
            while len(items) < BATCH_LINES:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            lines: list[tuple[int, Row, int]] = []
            for item in items:
                if isinstance(item, tuple):
                    lines.append(item)
                    continue
                link.send(lines)
                lines = []
                if item is None:
                    return
                call: Callable[[tracker.Link], None] = item
                call(link)
            link.send(lines)
