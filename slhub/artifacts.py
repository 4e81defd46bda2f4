"""The run directory: its one writer's lock, run.json identity and append-only metrics.

Only rank 0 calls anything here that touches the filesystem.

- **One writer.** A run holds an exclusive ``flock`` on ``.slhub.lock`` for its
  whole life; the OS releases it when the process dies, so a crashed run never
  blocks its own requeue, and a live one is never joined by a second writer.
- **run.json** is created exclusively; the identity in it never changes. Its one
  mutable entry, ``best`` (which update ``best.pt`` holds), is replaced atomically
  whenever ``best.pt`` is (:func:`record_best`).
- **metrics.jsonl** is append-only. A resume in place appends a marker
  ``{"step": k, "event": "resume", ...}``; :func:`read_metrics` returns the
  effective history, dropping records a marker superseded (updates after k that
  a crash between checkpoints left behind). A torn last line (a kill mid-write)
  is fenced with a newline before anything is appended, so it stays one
  unreadable line, which readers skip only there.
- Nothing written is deleted (but the old ``step_N.pt`` that ``trainer.keep_last``
  lets go, :mod:`slhub.checkpoint.manager`): ``--overwrite`` and a fresh start under
  ``--resume auto`` move old artifacts into a dated ``superseded-*`` folder.
  Temporaries of a killed writer (``.NAME.tmp-PID``) are not artifacts and are
  removed by the next lock holder.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
import uuid
from pathlib import Path
from typing import Any, TextIO

from slhub.atomic import atomic_write
from slhub.errors import ArtifactError
from slhub.paths import path_errors, user_path
from slhub.strictjson import NON_FINITE, dumps

RUN_FORMAT = "slhub.run/1"
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
LOCK_FILE = ".slhub.lock"
RESUME_EVENT = "resume"


def is_temporary(name: str) -> bool:
    """A checkpoint being written (or left by a killed writer): ``.NAME.tmp-PID``."""
    return name.startswith(".") and ".tmp-" in name


def is_artifact(name: str) -> bool:
    """Files a run writes; a directory holding any of them is not fresh."""
    return not is_temporary(name) and (name in (RUN_FILE, METRICS_FILE) or name.endswith(".pt"))


def artifacts_in(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if is_artifact(p.name))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_identity(
    *,
    recipe: dict[str, Any],
    recipe_digest: str,
    world_size: int,
    source: dict[str, Any],
    resumed_from: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A fresh run identity: what run.json and every checkpoint's ``run`` hold."""
    return {
        "format": RUN_FORMAT,
        "run_id": uuid.uuid4().hex,
        "created": _now().isoformat(timespec="seconds"),
        "world_size": world_size,
        "recipe_digest": recipe_digest,
        "recipe": recipe,
        "source": source,
        "resumed_from": resumed_from,
    }


# ------------------------------------------------------------------ the lock


class RunLock:
    """An exclusive lock on a run directory, held until :meth:`release` or process exit."""

    def __init__(self, folder: Path, handle: TextIO) -> None:
        self.folder = folder
        self._handle: TextIO | None = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the descriptor releases the flock
            self._handle = None


def lock(folder: Path) -> RunLock:
    """Create ``folder`` if needed and lock it for this process, or raise naming the holder.

    Even ``exists()`` raises for a name the OS refuses (too long, a symlink loop, a NUL
    byte): every such failure is the one-line ArtifactError, not a traceback.
    """
    with path_errors(
        folder,
        ArtifactError,
        "cannot use trainer.output_dir",
        "choose a directory this user can create and write",
    ):
        if folder.exists() and not folder.is_dir():
            raise ArtifactError(f"{folder}: trainer.output_dir exists and is not a directory")
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 - held
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = _holder(handle.read())
        handle.close()
        raise ArtifactError(
            f"{folder}: another slhub run writes into this directory ({holder}); wait for it "
            "to end or stop it, or choose another trainer.output_dir"
        ) from None
    except OSError as exc:
        handle.close()
        raise ArtifactError(f"{folder}: cannot lock the run directory ({exc.strerror})") from None
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now().isoformat()}
    try:  # a full disk or a failing device: the one line, naming the file, not a traceback
        with path_errors(
            folder / LOCK_FILE,
            ArtifactError,
            "cannot write the run directory's lock file",
            "free space there or choose another trainer.output_dir",
        ):
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(info) + "\n")
            handle.flush()
            _remove_temporaries(folder)
    except ArtifactError:
        _close_quietly(handle)
        raise
    return RunLock(folder, handle)


def _close_quietly(handle: TextIO) -> None:
    """Close a handle whose write failed (closing flushes again, and fails again)."""
    try:
        handle.close()
    except OSError:
        pass


def _holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on host {info['host']}, since {info['since']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"


def _remove_temporaries(folder: Path) -> None:
    """Temporaries of a killed writer: never artifacts, safe to remove under the lock."""
    for path in folder.iterdir():
        if is_temporary(path.name) and path.is_file():
            path.unlink(missing_ok=True)


def move_aside(folder: Path) -> Path | None:
    """Move every artifact of ``folder`` into a new ``superseded-<UTC time>`` folder in it.

    Nothing is deleted; returns the new folder, or None when there was nothing to move.
    """
    found = artifacts_in(folder)
    if not found:
        return None
    target = folder / f"superseded-{_now().strftime('%Y%m%dT%H%M%S.%fZ')}"
    try:
        target.mkdir()
        for name in found:
            os.replace(folder / name, target / name)
    except OSError as exc:
        raise ArtifactError(f"{folder}: cannot move old artifacts aside ({exc.strerror})") from None
    return target


# ------------------------------------------------------------------ identity


def claim(folder: Path, identity: dict[str, Any]) -> None:
    """Claim an artifact-free directory by creating run.json exclusively."""
    found = artifacts_in(folder)
    if found:
        raise ArtifactError(
            f"{folder}: output directory already holds run artifacts ({', '.join(found[:4])}); "
            "choose a fresh trainer.output_dir, --resume a checkpoint of that run, or pass "
            "--overwrite to move them aside"
        )
    try:
        handle = open(folder / RUN_FILE, "x", encoding="utf-8")  # noqa: SIM115 - closed below
    except FileExistsError:
        raise ArtifactError(f"{folder}: another run claimed this directory first") from None
    except OSError as exc:
        raise ArtifactError(
            f"{folder}: cannot write {RUN_FILE} into trainer.output_dir "
            f"({exc.strerror or exc}); choose a writable directory"
        ) from None
    try:
        with handle:
            handle.write(dumps(identity, indent=2, sort_keys=True, default=str))
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:  # a full disk: the run.json begun here is no claim, remove it
        (folder / RUN_FILE).unlink(missing_ok=True)
        raise ArtifactError(
            f"{folder}: cannot write {RUN_FILE} into trainer.output_dir "
            f"({exc.strerror or exc}); choose a writable directory"
        ) from None


def record_best(folder: Path, best: dict[str, Any]) -> None:
    """Record in run.json which update ``best.pt`` holds (an atomic replace of the file,
    its identity unchanged)."""
    identity = read_identity(folder)
    if identity is None:
        raise ArtifactError(f"{folder}: no {RUN_FILE} to record the best checkpoint in")
    text = dumps({**identity, "best": best}, indent=2, sort_keys=True, default=str) + "\n"
    atomic_write(text, folder / RUN_FILE)


def read_identity(folder: Path) -> dict[str, Any] | None:
    path = folder / RUN_FILE
    if not path.exists():
        return None
    try:
        identity = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: unreadable run identity ({exc})") from None
    if not isinstance(identity, dict):
        raise ArtifactError(
            f"{path}: not a run identity (holds a JSON {type(identity).__name__}, not an object)"
        )
    return identity


def check_resume_destination(folder: Path, checkpoint_run: dict[str, Any] | None) -> bool:
    """Decide whether a resume writes into a fresh directory (False) or in place (True).

    In place is allowed when run.json belongs to the checkpoint's run; metrics
    the run wrote after its checkpoint are superseded by the resume marker.
    """
    found = artifacts_in(folder)
    if not found:
        return False
    identity = read_identity(folder)
    if identity is None:
        raise ArtifactError(
            f"{folder}: holds run artifacts ({', '.join(found[:4])}) but no run.json; "
            "resume into a fresh trainer.output_dir"
        )
    if checkpoint_run is None:
        raise ArtifactError(
            f"{folder}: a v1 checkpoint has no run identity and resumes only into a fresh "
            "trainer.output_dir"
        )
    if identity.get("run_id") != checkpoint_run.get("run_id"):
        raise ArtifactError(
            f"{folder}: run.json belongs to run {identity.get('run_id')}, the checkpoint to run "
            f"{checkpoint_run.get('run_id')}; resume into a fresh trainer.output_dir"
        )
    return True


# ------------------------------------------------------------------ metrics


#: metrics.jsonl is strict JSON, which has no NaN or infinity: a non-finite float is
#: written as one of the strings of :data:`NON_FINITE` (:mod:`slhub.strictjson`, as
#: every JSON slhub writes), and :func:`read_metrics` reads it back as the float.
#: Record keys whose string values are text, never a non-finite number.
_TEXT_KEYS = frozenset({"event", "checkpoint"})


def _numbers_back(record: dict[str, Any]) -> dict[str, Any]:
    """A record's metric values written as :data:`NON_FINITE` names, as floats again."""
    for key, value in record.items():
        if isinstance(value, str) and value in NON_FINITE and key not in _TEXT_KEYS:
            record[key] = NON_FINITE[value]
    return record


def read_metrics(path: str | os.PathLike[str], *, markers: bool = False) -> list[dict[str, Any]]:
    """The effective history of a metrics.jsonl, in order.

    A resume marker at update k drops every earlier record with a step after k
    (those updates were redone). An unreadable line is tolerated only where a
    kill can leave one: last, or fenced right before a resume marker. With
    ``markers`` the resume markers themselves are kept. Metric values written
    as ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (:data:`NON_FINITE`) are
    returned as floats; so are the bare ``NaN``/``Infinity`` of older files.
    """
    path = user_path(path, "metrics file", ArtifactError)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    out: list[dict[str, Any]] = []
    torn: int | None = None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
            _numbers_back(record)
        except ValueError:
            if torn is not None:
                raise ArtifactError(f"{path}: line {torn + 1} is not JSON") from None
            torn = i
            continue
        if torn is not None:
            if record.get("event") != RESUME_EVENT:
                raise ArtifactError(f"{path}: line {torn + 1} is not JSON")
            torn = None
        if record.get("event") == RESUME_EVENT:
            step = int(record["step"])
            out = [r for r in out if int(r.get("step", 0)) <= step]
            if not markers:
                continue
        out.append(record)
    if torn is not None and torn != _last_nonblank(lines):
        raise ArtifactError(f"{path}: line {torn + 1} is not JSON")
    return out


def _last_nonblank(lines: list[str]) -> int:
    return max((i for i, line in enumerate(lines) if line.strip()), default=-1)


class MetricsLog:
    """Append-only metrics.jsonl: one JSON object per line, each with ``step``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._handle = open(path, "a+b")  # noqa: SIM115 - closed in close()
            self._fence()
        except OSError as exc:
            raise ArtifactError(
                f"{path}: cannot open metrics for appending ({exc.strerror})"
            ) from None

    def _fence(self) -> None:
        """End a torn last line (a kill mid-write) so the next record starts a line."""
        size = self._handle.seek(0, os.SEEK_END)
        if size == 0:
            return
        self._handle.seek(size - 1)
        if self._handle.read(1) != b"\n":
            self._handle.seek(0, os.SEEK_END)
            self._handle.write(b"\n")
            self._handle.flush()

    def append(self, record: dict[str, Any]) -> None:
        """Append one record as a line of strict JSON (non-finite floats as their
        :data:`NON_FINITE` names; ``record`` itself is left as it is)."""
        line = dumps(record, sort_keys=True)  # walks the record only when a value is not finite
        try:
            self._handle.write((line + "\n").encode())
            self._handle.flush()
        except OSError as exc:
            raise ArtifactError(f"{self.path}: cannot append metrics ({exc.strerror})") from None

    def mark_resume(
        self, step: int, checkpoint: str, source_changes: list[str] | None = None
    ) -> None:
        """Record that the run continues from update ``step``: later records supersede."""
        record: dict[str, Any] = {"step": step, "event": RESUME_EVENT, "checkpoint": checkpoint}
        if source_changes:
            record["source_changes"] = source_changes
        self.append(record)

    def sync(self) -> None:
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        """Close; a failure to flush was already reported by the append that caused it."""
        try:
            self._handle.close()
        except OSError:
            pass
