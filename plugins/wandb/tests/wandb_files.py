"""Read a W&B run back from its offline files, as ``wandb sync`` would upload it.

A ``.wandb`` file is a LevelDB-style log of ``wandb_internal_pb2.Record`` messages:
a 7-byte file header (``:W&B``, magic 0xBEE1, version), then records in 32 KiB
blocks, each record (or fragment of one) behind a 7-byte header (crc32, length,
type: full, first, middle, last); a block's tail shorter than a header is padding.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
#: History keys W&B adds to every row itself.
W_AND_B_KEYS = {"_step", "_runtime", "_timestamp"}


def records(path: Path) -> Iterator[Any]:
    """Every record of one ``.wandb`` file, in order."""
    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a W&B run file"
    pos, pieces = HEADER, b""
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 or pos + HEADER + length > len(data):
            break  # the end, or a record still being written
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        pieces = chunk if kind in (FULL, FIRST) else pieces + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            yield record


def run_files(folder: Path, run_id: str, timeout_s: float = 20.0) -> list[Path]:
    """The offline run files of W&B run ``run_id`` under ``folder/wandb``, oldest first.

    ``run.finish()`` returns before W&B's service has written the whole file: wait
    (at most ``timeout_s``) until each ends with its ``exit`` record.
    """
    paths = sorted((folder / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    deadline = time.monotonic() + timeout_s
    for path in paths:
        while not any(r.WhichOneof("record_type") == "exit" for r in records(path)):
            assert time.monotonic() < deadline, f"{path} has no exit record"
            time.sleep(0.05)
    return paths


def item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def history(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """The history rows of one run file: ``(step, {key: value})``, W&B's own keys left out."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            row = {item_key(i): json.loads(i.value_json) for i in record.history.item}
            kept = {key: value for key, value in row.items() if key not in W_AND_B_KEYS}
            rows.append((record.history.step.num, kept))
    return rows


def of_type(path: Path, kind: str) -> list[Any]:
    """Every ``kind`` record (``run``, ``summary``, ``config``, ``exit``...) of a run file."""
    return [getattr(r, kind) for r in records(path) if r.WhichOneof("record_type") == kind]


def summary(path: Path) -> dict[str, Any]:
    """The run summary the file leaves, key by key (the last update of a key wins)."""
    out: dict[str, Any] = {}
    for update in of_type(path, "summary"):
        for item in update.update:
            out[item_key(item)] = json.loads(item.value_json)
    return out


def config(path: Path) -> dict[str, Any]:
    """The run config the file leaves (the run record's, then every config update)."""
    out: dict[str, Any] = {}
    for source in [r.config for r in of_type(path, "run")] + of_type(path, "config"):
        for item in source.update:
            out[item_key(item)] = json.loads(item.value_json)
    return out
