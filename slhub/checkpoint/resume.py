"""The resume plan: every question a resume asks, answered once and agreed by every rank.

:func:`plan_resume` is called once per rank during admission and does all of it:
rank 0 decides the file (``--resume auto``: the run directory's ``last.pt`` when
it exists) and reads it; a rank with no file at that path (a node without a
shared filesystem) receives rank 0's bytes over the process group, a rank with
one must hold the same bytes; the checkpoint is then checked against this run
(world size, plugins, code, recipe, moving average) and against
``trainer.steps`` (:func:`nothing_to_train`). What comes out is an immutable
:class:`ResumePlan` that the bootstrap, the run directory
(:mod:`slhub.checkpoint.directory`) and the manager's ``load`` only read; the one
check that needs the built model, the datasets its plugins recorded, is
:meth:`ResumePlan.check_datasets`.

Every refusal of a resume is raised here, so this module is the whole list of
reasons a checkpoint cannot continue a run.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import slhub.checkpoint.files as files
from slhub import distributed, log
from slhub.checkpoint.schema import Checkpoint, plugins_of
from slhub.errors import ArtifactError, CheckpointError, DatasetError
from slhub.paths import path_errors
from slhub.recipe import RESUMABLE_KEYS, recipe_differences

LOG = log.get_logger()

#: ``--resume auto``: the run directory's last checkpoint when there is one, else fresh.
AUTO = "auto"


@dataclass(frozen=True)
class StartRequest:
    """How the user asked the run to start (``--resume``, ``--overwrite``,
    ``--allow-source-change``), before anything is read."""

    resume: str | Path | None = None
    overwrite: bool = False
    allow_source_change: bool = False
    allow_dataset_change: bool = False

    @property
    def auto(self) -> bool:
        return self.resume is not None and str(self.resume) == AUTO


@dataclass(frozen=True)
class ResumePlan:
    """How this run starts, the same on every rank.

    ``checkpoint`` is None for a fresh start. ``source_changes`` are the code
    differences the user accepted with ``allow_source_change``; ``sha256`` is the
    digest of the checkpoint file's bytes (what run.json's ``resumed_from`` records).
    ``complete``: ``--resume auto`` found the run already at ``trainer.steps``, so
    there is nothing to do (the run exits 0).
    """

    request: StartRequest
    path: Path | None = None
    checkpoint: Checkpoint | None = None
    sha256: str | None = None
    source_changes: tuple[str, ...] = ()
    complete: bool = False

    @property
    def auto_fresh(self) -> bool:
        """``--resume auto`` found nothing to resume: a leftover run without checkpoints
        (failed before its first save) is moved aside instead of blocking the start."""
        return self.request.auto and self.checkpoint is None

    def check_datasets(self, datasets: dict[str, dict[str, Any]]) -> list[str]:
        """The datasets the plugins recorded while building (``record_dataset``) against
        the checkpoint's. Returns the differences accepted with ``allow_dataset_change``
        (none for a fresh start).

        :raises DatasetError: a difference the user did not accept, naming it.
        """
        if self.checkpoint is None:
            return []
        changes = dataset_differences(self.checkpoint, datasets)
        if changes and not self.request.allow_dataset_change:
            raise DatasetError(
                f"the dataset differs from the checkpoint's: {'; '.join(changes)}; exact "
                "recovery needs the same data (pass --allow-dataset-change to resume anyway)"
            )
        return changes


def plan_resume(
    request: StartRequest,
    *,
    output_dir: str | Path | None,
    recipe: dict[str, Any] | None,
    source: dict[str, Any] | None,
    failed: bool,
) -> tuple[ResumePlan | None, BaseException | None]:
    """This rank's resume plan, or its error, held for the admission agreement.

    A collective on every rank, also on a rank that already ``failed`` (it takes part
    and reads nothing; ``output_dir``, ``recipe`` and ``source`` may then be None).
    ``recipe`` is the recipe as plain data (:meth:`slhub.recipe.Recipe.to_dict`): its
    ``trainer.steps`` and ``ema`` are what the checkpoint must leave something to
    train for and continue.
    """
    path: Path | None = None
    error: BaseException | None = None
    if not failed and distributed.rank() == 0:
        try:
            path = _requested_path(request, output_dir)
        except Exception as exc:  # noqa: BLE001 - held for the agreement
            error = exc
    ckpt, path, sha256, exchange_error = _exchange(path, failed or error is not None)
    error = error or exchange_error
    if error is not None or failed:
        return None, error
    changes: list[str] = []
    complete = False
    if ckpt is not None:
        assert path is not None and recipe is not None and source is not None
        try:
            changes = check_compatible(
                ckpt,
                path,
                recipe=recipe,
                source=source,
                world_size=distributed.world_size(),
                allow_source_change=request.allow_source_change,
            )
            _check_ema(ckpt, path, averaging=recipe.get("ema") is not None)
            complete = nothing_to_train(request, ckpt, path, recipe["trainer"]["steps"])
        except Exception as exc:  # noqa: BLE001 - held for the agreement
            return None, exc
    return ResumePlan(request, path, ckpt, sha256, tuple(changes), complete), None


def nothing_to_train(request: StartRequest, ckpt: Checkpoint, path: Path, steps: int) -> bool:
    """Whether the checkpoint leaves no update to train: True for ``--resume auto`` (a
    requeue of a finished run, which exits 0).

    :raises CheckpointError: an explicit checkpoint at or after ``trainer.steps``.
    """
    if ckpt.step < steps:
        return False
    if request.auto:
        return True
    raise CheckpointError(
        f"{path}: checkpoint is at update {ckpt.step} and trainer.steps is {steps}: "
        "nothing to train; raise trainer.steps to continue"
    )


def _requested_path(request: StartRequest, output_dir: str | Path | None) -> Path | None:
    """Rank 0: the checkpoint file to resume from (None: a fresh run)."""
    if request.resume is None:
        return None
    if not request.auto:
        return Path(request.resume)
    assert output_dir is not None
    last = files.last_path(output_dir)
    with path_errors(last, ArtifactError, "cannot look for the checkpoint to resume"):
        found = last.is_file()  # raises for a name the OS refuses (too long)
    return last if found else None


def _exchange(
    path: Path | None, failed: bool
) -> tuple[Checkpoint | None, Path | None, str | None, BaseException | None]:
    """Rank 0's checkpoint on every rank: ``(checkpoint, path, sha256, error)``."""
    if distributed.world_size() == 1:
        if failed or path is None:
            return None, None, None, None
        try:
            data = files.read_bytes(path)
            return files.from_bytes(data, path), path, hashlib.sha256(data).hexdigest(), None
        except Exception as exc:  # noqa: BLE001 - held for the agreement
            return None, None, None, exc
    is_main = distributed.rank() == 0
    data: bytes | None = None
    error: BaseException | None = None
    offer: dict[str, str] | None = None
    if is_main and not failed and path is not None:
        try:
            data = files.read_bytes(path)
            offer = {
                "path": str(path),
                "sha256": hashlib.sha256(data).hexdigest(),
                "host": socket.gethostname(),
            }
        except Exception as exc:  # noqa: BLE001 - held for the agreement
            error = exc
    offer = distributed.broadcast_from_rank0(offer)
    if offer is None:
        return None, None, None, error
    path = Path(offer["path"])
    missing = False
    if not is_main and not failed:
        if path.is_file():
            try:
                data = files.read_bytes(path)
                _check_same_file(path, data, offer)
            except Exception as exc:  # noqa: BLE001 - held for the agreement
                data, error = None, exc
        else:
            missing = True
    wanted = distributed.gather_to_rank0(missing)
    if distributed.broadcast_from_rank0(any(wanted) if is_main else None):
        if is_main:
            assert wanted is not None and data is not None
            ranks = ",".join(str(r) for r, flag in enumerate(wanted) if flag)
            LOG.info("checkpoint sent", path=str(path), bytes=len(data), to_ranks=ranks)
        received = distributed.broadcast_from_rank0(data if is_main else None)
        if missing:
            data = received
    if data is None:
        return None, None, None, error
    try:
        return files.from_bytes(data, path), path, offer["sha256"], None
    except Exception as exc:  # noqa: BLE001 - held for the agreement
        return None, None, None, exc


def _check_same_file(path: Path, data: bytes, offer: dict[str, str]) -> None:
    """A rank that sees a file at rank 0's checkpoint path must hold rank 0's bytes."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != offer["sha256"]:
        raise CheckpointError(
            f"{path}: rank {distributed.rank()} on host {socket.gethostname()} sees a different "
            f"file than rank 0 on host {offer['host']} (sha256 {digest} here, {offer['sha256']} "
            "on rank 0); remove it from this node (it then receives rank 0's checkpoint) or "
            "make it rank 0's file"
        )


def check_compatible(
    checkpoint: Checkpoint,
    path: str | Path,
    *,
    recipe: dict[str, Any],
    source: dict[str, Any],
    world_size: int,
    allow_source_change: bool = False,
) -> list[str]:
    """Refuse a resume whose world size, recipe or code differs, naming the difference.

    ``source`` is this run's ``{"slhub", "torch", "plugins"}``. A different
    slhub or torch version, or a plugin whose recorded version or module digest
    differs, is refused unless ``allow_source_change``; the accepted
    differences are returned for the run to record. A different set of
    plugins is always refused.
    """
    if checkpoint.version == 1:
        if world_size != 1:
            raise CheckpointError(
                f"{path}: a v1 checkpoint holds one process's state; it was written with world "
                f"size 1 and cannot resume with world size {world_size}"
            )
        return []
    run = checkpoint.run
    assert run is not None
    saved_world = run.get("world_size")
    if saved_world != world_size:
        raise CheckpointError(
            f"{path}: checkpoint was written with world size {saved_world}, this run has world "
            f"size {world_size}; exact recovery needs the same world size"
        )
    saved, plugins = plugins_of(run), source["plugins"]
    if [(p.get("name"), p.get("role", "model")) for p in saved] != [
        (p.get("name"), p.get("role", "model")) for p in plugins
    ]:
        raise CheckpointError(
            f"{path}: plugins differ: checkpoint has {_describe_all(saved)}, "
            f"this run has {_describe_all(plugins)}"
        )
    changes = source_differences(run.get("source") or {}, source)
    if changes and not allow_source_change:
        raise CheckpointError(
            f"{path}: code differs from the checkpoint's: {'; '.join(changes)}; exact recovery "
            "needs the same code (pass --allow-source-change to resume anyway)"
        )
    differences = recipe_differences(run.get("recipe", {}), recipe)
    if differences:
        shown = "; ".join(differences[:5]) + ("; ..." if len(differences) > 5 else "")
        raise CheckpointError(
            f"{path}: recipe differs from the checkpoint's (only "
            f"{', '.join(sorted(RESUMABLE_KEYS))} may change): {shown}"
        )
    return changes


def _check_ema(ckpt: Checkpoint, path: Path, averaging: bool) -> None:
    """A run with an ``ema`` section continues a checkpoint's average, never starts one
    midway (its warm-up would restart), and a run without one does not drop it. The
    recipe comparison refuses both for a v2 checkpoint already; this covers a v1 file."""
    if averaging and ckpt.ema is None:
        raise CheckpointError(
            f"{path}: checkpoint of update {ckpt.step} holds no EMA weights and this recipe "
            "has an ema section: an exact resume continues an average from its start "
            "(remove ema, or train afresh)"
        )
    if not averaging and ckpt.ema is not None:
        raise CheckpointError(
            f"{path}: checkpoint holds EMA weights and this recipe has no ema section: an "
            "exact resume keeps averaging (add the checkpoint's ema section)"
        )


def dataset_differences(ckpt: Checkpoint, current: dict[str, dict[str, Any]]) -> list[str]:
    """What differs between the datasets a checkpoint's run recorded and this run's, in
    words. A checkpoint written before runs recorded datasets is not compared."""
    from slhub.data.dataset_fingerprint import differences

    recorded = (ckpt.run or {}).get("datasets")
    if recorded is None:
        return []
    out = []
    for name in sorted(set(recorded) | set(current)):
        old, new = recorded.get(name), current.get(name)
        if old is None or new is None:
            out.append(f"dataset {name} {'added' if old is None else 'no longer recorded'}")
            continue
        out += [f"dataset {name}: {d}" for d in differences(old["fingerprint"], new["fingerprint"])]
        if old.get("split") != new.get("split"):
            out.append(f"dataset {name}: split changed")
    return out


def source_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What changed in the code between a run identity's source and this run's."""
    out = [
        f"{name} {saved.get(name)} -> {current.get(name)}"
        for name in ("slhub", "torch")
        if saved.get(name) != current.get(name)
    ]
    for old, new in zip(plugins_of({"source": saved}), current.get("plugins", []), strict=False):
        for key in ("object", "dist", "version", "digest"):
            if old.get(key) != new.get(key):
                what = "module digest" if key == "digest" else key
                out.append(f"plugin {new.get('name')} {what} {_short(old.get(key))} -> "
                           f"{_short(new.get(key))}")  # fmt: skip
    return out


def _short(value: Any) -> str:
    text = str(value)
    return text[:12] if len(text) == 64 else text


def _describe_all(sources: list[dict[str, Any]]) -> str:
    return ", ".join(describe_source(s) for s in sources) or "none"


def describe_source(source: dict[str, Any] | None) -> str:
    if not source:
        return "none"
    dist = (
        f"{source.get('dist')} {source.get('version')}" if source.get("dist") else "no distribution"
    )
    if not source.get("dist") and source.get("version"):
        dist += f", version {source.get('version')}"
    role = "" if source.get("role", "model") == "model" else f" [{source.get('role')}]"
    return f"{source.get('name')} ({source.get('object')}, {dist}){role}"
