"""The rank-state gather: every rank's ``state_dict`` contributions to rank 0.

Rank 0 keeps a snapshot of its own state (a copy that later changes to the live
objects cannot reach: validation runs between the gather and the write); every
other rank pickles its state once, with plain CPU tensors as raw bytes, and
sends it over the process group.
"""

from __future__ import annotations

import copy
import copyreg
import io
import pickle
from collections.abc import Callable
from typing import Any

import torch

from slhub import distributed


def gather_rank_states(
    local_state: Callable[[], dict[str, Any]],
) -> tuple[list[dict[str, Any]] | None, BaseException | None]:
    """Every rank's ``state_dict`` contributions, gathered to rank 0 (a collective on every rank).

    Each other rank pickles its state itself, once, and sends the bytes: a state
    that cannot be made or pickled fails on its own rank, outside the collective.
    Rank 0 keeps a :func:`snapshot` of its own instead (cheaper than a pickle round
    trip; a state it cannot pickle fails in the checkpoint write, on rank 0, after
    the collective). A rank that fails still joins the
    gather, sending None, so no rank is left waiting. Returns ``(states, error)``:
    ``states`` is the list by rank on rank 0 when every rank succeeded (None
    otherwise, and on other ranks); ``error`` is this rank's own failure, to be
    held for the next agreement.
    """
    payload: bytes | None
    mine: dict[str, Any] = {}
    error: BaseException | None = None
    try:
        if distributed.rank() == 0:
            mine, payload = snapshot(local_state()), b""
        else:
            payload = pack_state(local_state())
    except Exception as exc:  # noqa: BLE001 - returned, held for the next agreement
        error, payload = exc, None
    gathered = distributed.gather_to_rank0(payload)
    if gathered is None or any(entry is None for entry in gathered):
        return None, error
    return [mine, *(pickle.loads(entry) for entry in gathered[1:])], error


#: Values a snapshot shares with the live state: nothing can change them in place.
_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device)


def snapshot(value: Any) -> Any:
    """A copy of a rank's state that later changes to the live objects cannot reach
    (validation runs between the gather and the write).

    Plain tensors are cloned and plain dicts, lists and tuples rebuilt (far cheaper
    than ``copy.deepcopy`` or a pickle round trip); anything else is deep-copied.
    """
    kind = type(value)
    if kind is torch.Tensor:  # a new leaf, as unpickling gives (deepcopy refuses non-leaves)
        return value.detach().clone().requires_grad_(value.requires_grad)
    if kind in _IMMUTABLE:
        return value
    if kind is dict:
        return {key: snapshot(item) for key, item in value.items()}
    if kind is list:
        return [snapshot(item) for item in value]
    if kind is tuple:
        return tuple(snapshot(item) for item in value)
    if isinstance(value, dict):  # OrderedDict, defaultdict...: same type, entries snapshotted
        copied = copy.copy(value)
        for key, item in value.items():
            copied[key] = snapshot(item)
        return copied
    if isinstance(value, tuple) and hasattr(value, "_make"):  # a namedtuple
        return value._make(snapshot(item) for item in value)
    return copy.deepcopy(value)


def pack_state(state: Any) -> bytes:
    """Pickle one rank's state, with plain CPU tensors as their raw bytes.

    Plain pickle stores each tensor by running ``torch.save`` on its storage (and
    ``torch.load`` to read it back), which dominates a boundary for a rank's small
    RNG and sampler tensors. Values, dtype
    and shape survive; storage sharing between tensors does not, which a checkpoint
    (written with ``torch.save`` afterwards) does not need either. Other tensors
    (requiring grad, not on the CPU, quantized, subclasses) pickle as usual.
    """
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor}
    pickler.dump(state)
    return buffer.getvalue()


def _reduce_tensor(tensor: torch.Tensor) -> tuple:
    if (
        tensor.device.type != "cpu"
        or tensor.layout != torch.strided
        or tensor.requires_grad
        or tensor.is_quantized
        or tensor.is_conj()
        or tensor.is_neg()
    ):
        return tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    if tensor.numel() == 0:  # an empty array from numpy may have stride 0: no byte view
        return _tensor_from_bytes, (b"", tensor.dtype, tuple(tensor.shape))
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return _tensor_from_bytes, (raw, tensor.dtype, tuple(tensor.shape))


def _tensor_from_bytes(raw: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)
