"""Process group, device choice, and the collectives of the step protocol.

One worker per device: NCCL on ``cuda:LOCAL_RANK`` when CUDA is chosen, Gloo on
CPU. Without torchrun's environment everything runs in one process with no
process group; there, and in a group of one, the collectives below are local
arithmetic.
"""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from slhub.errors import RankFailure, SlhubError, one_line

#: Phases a rank-local failure can happen in; the code is the index + 1.
PHASES: tuple[str, ...] = (
    "admission",
    "sampling",
    "objective",
    "non-finite loss",
    "validation",
    "checkpoint I/O",
    "commit",
)


def launched_by_torchrun() -> bool:
    """True when torchrun's environment variables are present."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


def resolve_device(choice: str = "auto") -> torch.device:
    """The device for this worker: ``cuda:LOCAL_RANK`` or CPU."""
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SlhubError("trainer.device is 'cuda' but no CUDA device is visible")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank >= torch.cuda.device_count():
        raise SlhubError(
            f"LOCAL_RANK {local_rank} has no device: only {torch.cuda.device_count()} "
            "visible in CUDA_VISIBLE_DEVICES"
        )
    return torch.device("cuda", local_rank)


def env_rank() -> int:
    """This worker's global rank from torchrun's environment (0 when absent)."""
    return int(os.environ.get("RANK", "0"))


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def alone() -> bool:
    """True without a process group or in a group of one (``--nproc-per-node=1``): the
    collectives below are then local arithmetic, with no device transfer or sync."""
    return not dist.is_initialized() or dist.get_world_size() == 1


#: Devices of the ``distributed_run`` scopes this process is inside, innermost last.
_SCOPES: list[torch.device] = []


def current_device() -> torch.device | None:
    """The device of the innermost enclosing :func:`distributed_run`, or None outside one.

    ``slhub.train`` called inside a caller's scope trains on that device and
    process group instead of opening its own from the recipe.
    """
    return _SCOPES[-1] if _SCOPES else None


@contextmanager
def distributed_run(
    device: str | torch.device = "auto", timeout_s: float = 600.0
) -> Iterator[torch.device]:
    """Initialize the process group under torchrun and yield this worker's device.

    All ranks must enter this scope. It destroys only a group it created: a
    process group that exists on entry stays the caller's to destroy.
    ``device`` is ``"auto"``, ``"cpu"``, ``"cuda"`` or a ``torch.device``.
    """
    resolved = device if isinstance(device, torch.device) else resolve_device(device)
    created = False
    if launched_by_torchrun() and not dist.is_initialized():
        if resolved.type == "cuda":
            torch.cuda.set_device(resolved)
        try:
            dist.init_process_group(
                backend="nccl" if resolved.type == "cuda" else "gloo",
                timeout=timedelta(seconds=timeout_s),
                device_id=resolved if resolved.type == "cuda" else None,
            )
        except (RuntimeError, ValueError) as exc:  # DistError and its network/store kinds
            raise SlhubError(
                f"cannot form the process group (rank {env_rank()} of {env_world_size()}, "
                f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}): "
                f"{one_line(exc)}"
            ) from None
        created = True
    _SCOPES.append(resolved)
    try:
        yield resolved
    finally:
        _SCOPES.pop()
        if created and dist.is_initialized():
            # A DistributedDataParallel wrapper still alive (held by a reference cycle)
            # when the group goes away aborts the process at exit under Gloo.
            gc.collect()
            dist.destroy_process_group()


class WorkerLost(SlhubError):
    """The agreement's collective failed: another worker died or the network broke.

    The cause is elsewhere (the dead worker, its launcher's status), so this rank says
    so in one line, without a traceback, and exits 1 (a failure, not bad input).
    """

    exit_code = 1


def _all_reduce(buf: torch.Tensor) -> None:
    """``dist.all_reduce`` of an agreement: a fixed-size sum that only a broken process
    group can fail (Gloo: "Connection reset by peer" when a worker died)."""
    try:
        dist.all_reduce(buf)
    except RuntimeError as exc:  # DistError and Gloo's plain RuntimeError
        raise WorkerLost(
            f"rank {rank()} lost the other workers in an update's agreement "
            f"({one_line(exc, 160)}): a worker died or the network failed; rerun with "
            "--resume auto to continue from the last checkpoint"
        ) from None


class Agreement(NamedTuple):
    """What every rank learns from one update's agreement collective (a tuple: it is
    made every update, and a frozen dataclass costs several times more to build)."""

    total_weight: float
    weighted_loss_sum: float
    failures: tuple[tuple[int, str], ...]
    #: Some rank was asked to stop (a preemption signal): every rank stops after this update.
    stop: bool = False

    @property
    def failed(self) -> bool:
        return bool(self.failures)


def agree(
    weight: float,
    weighted_loss: float,
    failure_phase: str | None,
    device: torch.device,
    stop: bool = False,
) -> Agreement:
    """The one all-reduce per update: ``[sum w_r, sum w_r * L_r]``, with failure as NaN
    and a stop request as +inf.

    A failing rank contributes NaN as its weight. Healthy weights are finite and
    >= 0, so the sum is NaN exactly when some rank failed; only then do all ranks
    (every one of them sees the NaN) run a second all-reduce of per-rank phase
    codes that names who failed and where. A rank asked to stop contributes +inf
    as its weighted loss (a healthy one is finite), so the sum is +inf exactly
    when some rank was asked to stop; only then is the true weighted loss
    reduced once more. A healthy update costs one two-element all-reduce: on
    Gloo, three or more elements cost two to three times as much
    (benchmarks/gloo_allreduce_sizes.py).
    """
    failed = failure_phase is not None
    if alone():  # one rank: the same sums, without a tensor or a collective
        if failed:
            return Agreement(math.nan, math.nan, ((0, failure_phase),))
        return Agreement(float(weight), float(weighted_loss), (), stop=stop)
    buf = torch.tensor(
        [math.nan if failed else weight, 0.0 if failed else (math.inf if stop else weighted_loss)],
        dtype=torch.float64,
    ).to(device)
    _all_reduce(buf)
    total_weight, weighted_loss_sum = buf.tolist()
    if not math.isnan(total_weight):
        if weighted_loss_sum != math.inf:
            return Agreement(total_weight, weighted_loss_sum, ())
        true_loss = torch.tensor([0.0 if failed else weighted_loss], dtype=torch.float64)
        true_loss = true_loss.to(device)
        _all_reduce(true_loss)
        return Agreement(total_weight, true_loss.item(), (), stop=True)
    codes = torch.zeros(world_size(), dtype=torch.float64)
    if failed:
        codes[rank()] = PHASES.index(failure_phase) + 1
    codes = codes.to(device)
    _all_reduce(codes)
    failures = tuple(
        (r, PHASES[int(code) - 1]) for r, code in enumerate(codes.tolist()) if int(code) > 0
    )
    return Agreement(math.nan, math.nan, failures)


def raise_agreed_failure(agreement: Agreement, local_error: BaseException | None) -> None:
    """Raise the same :class:`RankFailure` on every rank, naming origin rank and phase.

    A rank that failed itself names its own failure first (with its cause), so a
    bad input every rank refuses is reported with that cause on every rank.
    """
    failures = list(agreement.failures)
    own = [f for f in failures if f[0] == rank()]
    if own and local_error is not None:
        failures = own + [f for f in failures if f[0] != rank()]
    origin, phase = failures[0]
    others = "".join(f"; rank {r} also failed ({p})" for r, p in failures[1:])
    if origin == rank() and local_error is not None:
        cause = f": {one_line(local_error)}"
    else:
        cause = " (details in that rank's log)"
    raise RankFailure(
        f"rank {origin} failed during {phase}{cause}{others}", origin_rank=origin, phase=phase
    )


def gather_to_rank0(obj: Any) -> list[Any] | None:
    """Every rank's object on rank 0 (a list by rank); None elsewhere.

    Only rank 0 holds world-size copies; other ranks hold their own only.
    """
    if alone():
        return [obj]
    out: list[Any] | None = [None] * world_size() if rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def broadcast_from_rank0(obj: Any) -> Any:
    """Rank 0's object on every rank."""
    if alone():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
