"""structlog configuration: a readable console for people, JSON lines for pipelines.

Every event carries ``run_id``, ``rank``, ``world_size`` and (during training)
``step`` through structlog's context variables. Rank 0 logs at INFO; other
ranks log warnings and errors only, so a torchrun console is not N copies.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

FORMATS = ("console", "json")


def configure(fmt: str = "console", rank: int = 0, world_size: int = 1) -> None:
    """Configure structlog for this process (idempotent)."""
    level = logging.INFO if rank == 0 else logging.WARNING
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(rank=rank, world_size=world_size)


def bind(**values: Any) -> None:
    """Add context (``run_id``, ``step``) to every later event of this process."""
    structlog.contextvars.bind_contextvars(**values)


def get_logger() -> Any:
    return structlog.get_logger("slhub")
