"""The checkpoint component: the one owner of the v2/v1 schema.

It builds a checkpoint (:func:`build`), validates one that was read
(:func:`check_layout`), gathers every rank's state to rank 0
(:func:`gather_rank_states`), writes atomically (:func:`save_checkpoint`),
loads safely (:func:`load_checkpoint`; :func:`checkpoint_from_bytes` for bytes
received from rank 0), checks resume compatibility and describes a checkpoint
for people (:func:`describe`). ``slhub inspect``, ``slhub export`` and the loop
use these and know no key names of their own.

v2 (written by slhub): ``format``, ``step``, ``run``, ``model``, ``optimizer``,
``scheduler``, ``ranks`` (one entry per global rank).
v1 (single-device layout, before run identities): ``step``, ``model``,
``optimizer``, ``rng`` and no ``format``; read for export and for a resume into
a fresh destination only.

Checkpoints are always read with ``torch.load(weights_only=True)``: a file that
needs pickle to load is refused, never executed, and nothing in a checkpoint
ever chooses code to import.
"""

from __future__ import annotations

import copy
import copyreg
import hashlib
import io
import json
import math
import pickle
import re
import stat
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from slhub import distributed
from slhub.artifacts import METRICS_FILE, read_metrics
from slhub.atomic import atomic_write
from slhub.errors import CheckpointError, SlhubError
from slhub.recipe import MAX_DEPTH, RESUMABLE_KEYS, recipe_differences, too_deep

FORMAT_V2 = "slhub.checkpoint/2"
V1_KEYS = frozenset({"step", "model", "optimizer", "rng"})
V2_KEYS = frozenset({"format", "step", "run", "model", "optimizer", "scheduler", "ranks"})


def build(
    *,
    step: int,
    run: dict[str, Any],
    model: dict[str, Any],
    optimizer: dict[str, Any],
    scheduler: dict[str, Any] | None,
    ranks: list[dict[str, Any]],
) -> dict[str, Any]:
    """A v2 checkpoint: the committed update ``step`` of run ``run``.

    :param model: the unwrapped model's ``state_dict()``.
    :param optimizer: the optimizer's ``state_dict()``.
    :param scheduler: schedule (and scaler) state, or None.
    :param ranks: every rank's merged ``save`` contributions, by global rank.
    :raises CheckpointError: a ``save`` contribution holds a value that
        ``torch.load(weights_only=True)`` refuses (a numpy array, a namedtuple): every
        checkpoint would be written and then be unloadable.
    """
    for rank, state in enumerate(ranks):
        where = unloadable(state, f"ranks[{rank}]")
        if where is not None:
            raise CheckpointError(
                f"rank {rank}'s save state holds {where}, which a checkpoint loaded with "
                "weights_only=True cannot hold; return tensors, numbers, strings, bytes, "
                "None, dtypes, devices and dicts, lists, tuples or sets of them"
            )
    return {
        "format": FORMAT_V2,
        "step": step,
        "run": run,
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "ranks": ranks,
    }


#: What ``torch.load(weights_only=True)`` loads (exact types: a subclass such as numpy's
#: float64 or a namedtuple needs its class to be unpickled, which it refuses).
_LOADABLE_LEAVES = (int, float, bool, complex, str, bytes, bytearray, type(None))
_LOADABLE_OTHER = (torch.dtype, torch.device)
_LOADABLE_CONTAINERS = (dict, OrderedDict, list, tuple, set, torch.Size)


def unloadable(value: Any, where: str = "state") -> str | None:
    """The first place in ``value`` a weights-only load refuses, described, or None."""
    pending = [(value, where)]
    while pending:
        item, path = pending.pop()
        kind = type(item)
        if kind in _LOADABLE_LEAVES or kind in (torch.Tensor, torch.nn.Parameter):
            continue
        if isinstance(item, _LOADABLE_OTHER):
            continue
        if kind in (dict, OrderedDict):
            for key, child in item.items():
                if type(key) not in _LOADABLE_LEAVES:
                    return f"a key of type {type(key).__name__} in {path}"
                pending.append((child, f"{path}.{key}"))
        elif kind in _LOADABLE_CONTAINERS:
            pending.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
        else:
            return f"{path}: a {kind.__module__}.{kind.__qualname__}"
    return None


def step_of(checkpoint: dict[str, Any]) -> int:
    """The committed update a (validated) checkpoint holds."""
    return int(checkpoint["step"])


def run_of(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The run identity of a v2 checkpoint; None for v1, which has none."""
    return checkpoint["run"] if version_of(checkpoint) == 2 else None


def plugins_of(run: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The plugin sources a run identity records, model plugin first.

    Identities written before runs composed several plugins record one
    ``source.plugin``; it reads as a one-element list.
    """
    source = (run or {}).get("source") or {}
    if not isinstance(source, dict):
        return []
    if isinstance(source.get("plugins"), list):
        return source["plugins"]
    single = source.get("plugin")
    return [{**single, "role": "model"}] if isinstance(single, dict) else []


def gather_rank_states(
    local_state: Callable[[], dict[str, Any]],
) -> tuple[list[dict[str, Any]] | None, BaseException | None]:
    """Every rank's ``save`` state, gathered to rank 0 (a collective on every rank).

    Each other rank pickles its state itself, once, and sends the bytes: a state
    that cannot be made or pickled fails on its own rank, outside the collective.
    Rank 0 keeps a :func:`snapshot` of its own instead (a pickle round trip of it
    cost ~0.3-0.6 ms per boundary; a state it cannot pickle fails in the checkpoint
    write, on rank 0, after the collective). A rank that fails still joins the
    gather, sending None, so no rank is left waiting. Returns ``(states, error)``:
    ``states`` is the list by rank on rank 0 when every rank succeeded (None
    otherwise, and on other ranks); ``error`` is this rank's own failure, to be
    held for the next agreement.
    """
    payload: bytes | None
    own: dict[str, Any] | None = None
    error: BaseException | None = None
    try:
        if distributed.rank() == 0:
            own, payload = snapshot(local_state()), b""
        else:
            payload = pack_state(local_state())
    except Exception as exc:  # noqa: BLE001 - returned, held for the next agreement
        error, payload = exc, None
    gathered = distributed.gather_to_rank0(payload)
    if gathered is None or any(entry is None for entry in gathered):
        return None, error
    assert own is not None
    return [own, *(pickle.loads(entry) for entry in gathered[1:])], error


#: Values a snapshot shares with the live state: nothing can change them in place.
_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device)


def snapshot(value: Any) -> Any:
    """A copy of a rank's state that later changes to the live objects cannot reach
    (validation runs between the gather and the write).

    Plain tensors are cloned and plain dicts, lists and tuples rebuilt; anything
    else is deep-copied. Cloning a small tensor costs ~2 us where ``copy.deepcopy``
    of it costs ~35 us and a pickle round trip of the whole state ~0.1-0.3 ms.
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
    ``torch.load`` to read it back): about 0.3 ms per small tensor, so a rank's RNG
    and sampler states cost most of a millisecond at every boundary. Values, dtype
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
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return _tensor_from_bytes, (raw, tensor.dtype, tuple(tensor.shape))


def _tensor_from_bytes(raw: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


def serialize(checkpoint: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint, serialized once for however many files receive it."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


def save_checkpoint(checkpoint: dict[str, Any], *paths: Path) -> None:
    """Serialize once and write atomically under every path (:func:`slhub.atomic.atomic_write`)."""
    atomic_write(serialize(checkpoint), *paths)


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a v1 or v2 checkpoint safely, or raise a one-line :class:`CheckpointError`."""
    return checkpoint_from_bytes(read_checkpoint_bytes(path), path)


def read_checkpoint_bytes(path: str | Path) -> bytes:
    """The bytes of a checkpoint file, or a one-line :class:`CheckpointError` when there is
    no such file, it is not a regular file (a FIFO would block the read forever) or it
    cannot be read."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointError(f"{path}: no such checkpoint file") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint ({exc.strerror or exc})") from None
    except ValueError:  # a NUL byte in the path
        raise CheckpointError(f"{str(path)!r}: not a valid path (it holds a NUL byte)") from None
    if stat.S_ISDIR(mode):
        raise CheckpointError(
            f"{path}: is a directory, not a checkpoint file; name one, e.g. {path / 'last.pt'}"
        )
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path}: not a regular file (a pipe, socket or device)")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint ({exc.strerror or exc})") from None


def checkpoint_from_bytes(data: bytes, path: str | Path) -> dict[str, Any]:
    """Load the bytes of a v1 or v2 checkpoint (read from ``path``, or received from rank 0
    for that path) safely, or raise a one-line :class:`CheckpointError`."""
    buffer = io.BytesIO(data)
    if not zipfile.is_zipfile(buffer):  # torch.save writes a zip archive; anything else is not ours
        raise CheckpointError(
            f"{path}: damaged or not a checkpoint (not a complete torch.save archive)"
        )
    damaged = _damaged_record(buffer)
    if damaged is not None:
        raise CheckpointError(
            f"{path}: damaged checkpoint ({damaged} fails its CRC-32 check: the bytes changed "
            "after they were written)"
        )
    buffer.seek(0)
    try:
        loaded = torch.load(buffer, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch.load fails in many ways on foreign bytes
        raise CheckpointError(f"{path}: damaged or not a checkpoint ({_reason(exc)})") from None
    check_layout(loaded, path)
    return loaded


def _damaged_record(buffer: io.BytesIO) -> str | None:
    """The first archive record whose CRC-32 does not match its bytes, if any.

    torch.load does not check the CRCs that torch.save records, so a flipped bit in a
    tensor's bytes would load as a silently different weight; zipfile checks them
    (2 GB/s here: half of torch.load's own time).
    """
    try:
        with zipfile.ZipFile(buffer) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as exc:
        return f"its archive ({_reason(exc)})"
    finally:
        buffer.seek(0)


def _reason(exc: BaseException) -> str:
    """The informative part of a torch.load failure, on one line, never cut mid-sentence."""
    text = " ".join(str(exc).split())
    marker = "WeightsUnpickler error:"
    if marker in text:
        detail = text.split(marker, 1)[1].strip()
        found = re.search(r"Unsupported global: GLOBAL (\S+)", detail)
        what = f"it names {found.group(1)}" if found else detail.split(". ", 1)[0].rstrip(".")
        return f"needs pickle to load: {what}; slhub loads checkpoints with weights_only=True"
    if len(text) > 200:
        text = text[:200].rsplit(" ", 1)[0] + " ..."
    return text or exc.__class__.__name__


def check_layout(data: Any, path: str | Path) -> int:
    """The checkpoint's version (1 or 2); raise one line for anything else.

    Beyond the keys, the types every reader relies on are checked here, so a
    damaged but safe-to-load file fails with a line, not deep in a reader.
    """
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a slhub checkpoint (holds a {type(data).__name__})")
    fmt = data.get("format")
    if fmt is None:
        if not V1_KEYS <= set(data):
            keys = ", ".join(sorted(map(str, data))) or "none"
            raise CheckpointError(f"{path}: not a slhub checkpoint (keys: {keys})")
        version = 1
    elif fmt != FORMAT_V2:
        raise CheckpointError(f"{path}: foreign checkpoint format {fmt!r} (expected {FORMAT_V2})")
    else:
        missing = V2_KEYS - set(data)
        if missing:
            raise CheckpointError(
                f"{path}: damaged v2 checkpoint (missing {', '.join(sorted(missing))})"
            )
        version = 2
    problem = _type_problem(data, version)
    if problem:
        raise CheckpointError(f"{path}: damaged v{version} checkpoint ({problem})")
    return version


def _type_problem(data: dict[str, Any], version: int) -> str | None:
    step = data["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"step is {step!r}, expected an int >= 0"
    model = data["model"]
    if not isinstance(model, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()
    ):
        return "model is not a state dict of named tensors"
    if not isinstance(data["optimizer"], dict):
        return "optimizer is not a state dict"
    problem = _optimizer_problem(data["optimizer"])
    if problem:
        return problem
    if version == 1:
        return None if isinstance(data["rng"], dict) else "rng is not a dict"
    run, ranks = data["run"], data["ranks"]
    if not isinstance(run, dict) or not isinstance(run.get("world_size"), int):
        return "run is not a run identity"
    if not isinstance(ranks, list) or not all(isinstance(r, dict) for r in ranks):
        return "ranks is not a list of per-rank states"
    if len(ranks) != run["world_size"]:
        return f"ranks has {len(ranks)} entries for world size {run['world_size']}"
    for rank, entry in enumerate(ranks):
        missing = [key for key in RANK_KEYS if key not in entry]
        if missing:  # the built-in recovery plugin writes them at every checkpoint
            return f"ranks[{rank}] has no {' and no '.join(missing)} state"
    for key in ("recipe", "source"):
        if not isinstance(run.get(key, {}), dict):
            return f"run.{key} is a {type(run[key]).__name__}, expected a mapping"
    if not all(isinstance(source, dict) for source in plugins_of(run)):
        return "run.source.plugins is not a list of plugin sources"
    if data["scheduler"] is not None and not isinstance(data["scheduler"], dict):
        return "scheduler is neither None nor a state dict"
    if too_deep(run, MAX_DEPTH + 1) is not None:  # + 1: the recipe sits inside the identity
        return f"run identity is nested more than {MAX_DEPTH} levels deep"
    return None


#: What every rank's entry of a v2 checkpoint holds (the recovery plugin's ``save``):
#: without them a resume would continue with fresh random streams, silently inexact.
RANK_KEYS = ("rng", "sampler")
#: Hyperparameters of torch's optimizers that are numbers in every parameter group.
_NUMERIC_GROUP_KEYS = ("lr", "weight_decay", "eps", "momentum", "dampening")
#: Optimizer state that torch's optimizers keep shaped like its parameter (and of its dtype).
PARAM_SHAPED_STATE = frozenset(
    {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "exp_inf", "square_avg",
     "grad_avg", "sum", "acc_delta", "ax", "prev"}
)  # fmt: skip


def _is_number(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and value.is_floating_point()
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _optimizer_problem(optimizer: dict[str, Any]) -> str | None:
    """What in an optimizer state dict ``torch.optim`` would choke on with an unclear
    message (or accept and train wrongly with): checked before it is loaded."""
    groups, state = optimizer.get("param_groups", []), optimizer.get("state", {})
    if not isinstance(groups, list) or not isinstance(state, dict):
        return "optimizer state dict has no list of param_groups and dict of state"
    for index, group in enumerate(groups):
        if not isinstance(group, dict) or not isinstance(group.get("params"), list):
            return f"optimizer param group {index} has no list of params"
        for key in _NUMERIC_GROUP_KEYS:
            if key in group and not _is_number(group[key]):
                return f"optimizer param group {index}: {key} is {group[key]!r}, expected a number"
        if "lr" in group and not math.isfinite(float(group["lr"])):
            return f"optimizer param group {index}: lr is {float(group['lr'])}"
    for index, entries in state.items():
        if not isinstance(entries, dict):
            return f"optimizer state of parameter {index} is not a dict"
        for key, value in entries.items():
            if not (isinstance(value, torch.Tensor) or _is_number(value) or value is None):
                return (
                    f"optimizer state {key!r} of parameter {index} is a "
                    f"{type(value).__name__}, expected a tensor or a number"
                )
    return None


def check_fits(checkpoint: dict[str, Any], model: torch.nn.Module, optimizer: Any) -> None:
    """Refuse, in one line, a checkpoint whose tensors torch would silently cast into the
    model and optimizer (a float64 weight into a float32 model) or that the optimizer
    would only trip over at the first update (a moment of another shape): an exact
    resume needs the same shapes and dtypes. Shape and key mismatches of the model
    itself are reported by ``load_state_dict``."""
    own = model.state_dict()
    for key, value in checkpoint["model"].items():
        if key in own and value.dtype != own[key].dtype:
            raise CheckpointError(
                f"checkpoint's model tensor {key} is {_dtype(value)}, this recipe's model "
                f"has {_dtype(own[key])}: an exact resume needs the same dtype"
            )
    saved = checkpoint["optimizer"]
    names = {id(p): name for name, p in model.named_parameters()}
    params = {
        saved_id: param
        for saved_group, group in zip(saved.get("param_groups", []), optimizer.param_groups)
        for saved_id, param in zip(saved_group["params"], group["params"])
    }
    for saved_id, entries in saved.get("state", {}).items():
        param = params.get(saved_id)
        if param is None:
            continue
        for key in PARAM_SHAPED_STATE.intersection(entries):
            value = entries[key]
            if isinstance(value, torch.Tensor) and (
                value.shape != param.shape or value.dtype != param.dtype
            ):
                raise CheckpointError(
                    f"checkpoint's optimizer state {key} of parameter "
                    f"{names.get(id(param), saved_id)} is {_dtype(value)} "
                    f"{list(value.shape)}, the parameter is {_dtype(param)} {list(param.shape)}"
                )


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def version_of(checkpoint: dict[str, Any]) -> int:
    return 2 if checkpoint.get("format") == FORMAT_V2 else 1


def to_v1(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The single-device (v1) form of a v2 checkpoint: rank 0's RNG, no identity."""
    if version_of(checkpoint) == 1:
        return dict(checkpoint)
    return {
        "step": checkpoint["step"],
        "model": checkpoint["model"],
        "optimizer": checkpoint["optimizer"],
        "rng": checkpoint["ranks"][0]["rng"],
    }


def rank_state(checkpoint: dict[str, Any], rank: int) -> dict[str, Any]:
    """What the ``restore`` hook receives on ``rank``."""
    if version_of(checkpoint) == 1:
        return {"rng": checkpoint["rng"]}
    return checkpoint["ranks"][rank]


def check_resume_compatible(
    checkpoint: dict[str, Any],
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
    if version_of(checkpoint) == 1:
        if world_size != 1:
            raise CheckpointError(
                f"{path}: a v1 checkpoint holds one process's state; it was written with world "
                f"size 1 and cannot resume with world size {world_size}"
            )
        return []
    run = checkpoint["run"]
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
    return ", ".join(_describe(s) for s in sources) or "none"


def _describe(source: dict[str, Any] | None) -> str:
    if not source:
        return "none"
    dist = (
        f"{source.get('dist')} {source.get('version')}" if source.get("dist") else "no distribution"
    )
    if not source.get("dist") and source.get("version"):
        dist += f", version {source.get('version')}"
    role = "" if source.get("role", "model") == "model" else f" [{source.get('role')}]"
    return f"{source.get('name')} ({source.get('object')}, {dist}){role}"


# ---------------------------------------------------------------------- inspect


def describe(path: str | Path) -> str:
    """``slhub inspect``: a short multi-line description of a v1 or v2 checkpoint."""
    ckpt = load_checkpoint(path)
    model = ckpt["model"]
    n_values = sum(t.numel() for t in model.values())
    dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in model.values()})
    opt_state = ckpt["optimizer"].get("state", {})
    lines = [
        f"checkpoint: {path}",
        f"format:     {ckpt.get('format', 'v1 (single-device layout, no format key)')}",
        f"step:       {step_of(ckpt)}",
        f"model:      {len(model)} tensors, {n_values} values ({', '.join(dtypes)})",
        f"optimizer:  state for {len(opt_state) if isinstance(opt_state, dict) else 0} parameters",
    ]
    run = run_of(ckpt)
    if run is None:
        return "\n".join(
            lines
            + ["run:        none (v1 resumes only into a fresh output directory)", "world size: 1"]
        )
    ranks = ckpt["ranks"]
    keys = sorted({str(k) for entry in ranks for k in entry})
    plugins = plugins_of(run)
    lines += [
        f"run:        {run.get('run_id')} (created {run.get('created')})",
        f"world size: {run.get('world_size')}",
        f"plugin:     {_describe(plugins[0] if plugins else None)}",
    ]
    lines += [f"plugins:    {_describe(extra)}" for extra in plugins[1:]]
    recipe = run.get("recipe") if isinstance(run.get("recipe"), dict) else {}
    lines += [
        f"recipe:     sha256 {recipe_digest(recipe)[:16]} ({len(recipe)} sections)",
        f"ranks:      {len(ranks)} entries holding {', '.join(keys) or 'nothing'}",
        f"optim:      {_section(recipe, 'optim')}{_lr(ckpt['optimizer'])}",
        f"schedule:   {_section(recipe, 'schedule')}{_schedule_state(ckpt['scheduler'])}",
    ]
    return "\n".join(lines + _last_metrics(Path(path).parent / METRICS_FILE, step_of(ckpt)))


def recipe_digest(recipe: dict[str, Any]) -> str:
    """sha256 of a recorded recipe in canonical JSON: equal digests, equal recipes."""
    canonical = json.dumps(recipe, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _last_metrics(path: Path, step: int) -> list[str]:
    """The last training and validation lines at or before ``step`` of the run
    directory's metrics history (the checkpoint's own numbers, not later ones)."""
    try:
        records = [r for r in read_metrics(path) if isinstance(r.get("step"), int)]
    except (OSError, SlhubError) as exc:
        return [f"metrics:    unreadable ({exc})"]
    records = [r for r in records if r["step"] <= step]
    if not records:
        return [f"metrics:    none at or before update {step} in {path}"]
    out = []
    for prefix in ("train/", "validation/"):
        line = next((r for r in reversed(records) if any(k.startswith(prefix) for k in r)), None)
        if line is not None:
            values = " ".join(
                f"{k.removeprefix(prefix)}={_metric_value(v)}"
                for k, v in line.items()
                if k.startswith(prefix) and v is not None
            )
            out.append(f"{prefix[:-1] + ':':<11} update {line['step']}: {values}")
    return out


def _metric_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _section(recipe: dict[str, Any], name: str) -> str:
    """``name key=value ...`` of a recorded optim or schedule section: the keys its
    optimizer or schedule reads, None values left out."""
    section = recipe.get(name)
    if not isinstance(section, dict):
        return "not recorded"
    from slhub.optim import applicable

    shown = applicable(name, section)
    rest = " ".join(f"{k}={v}" for k, v in shown.items() if k != "name" and v is not None)
    return f"{section.get('name', '?')} {rest}".strip()


def _lr(optimizer: dict[str, Any]) -> str:
    groups = optimizer.get("param_groups")
    if isinstance(groups, list) and groups and isinstance(groups[0], dict):
        lr = groups[0].get("lr")
        if isinstance(lr, torch.Tensor) and lr.numel() == 1:
            lr = lr.item()
        if isinstance(lr, (int, float)) and not isinstance(lr, bool):
            return f"; lr for the next update {lr:.4g}"
    return ""


def _schedule_state(scheduler: Any) -> str:
    schedule = scheduler.get("schedule") if isinstance(scheduler, dict) else None
    if isinstance(schedule, dict) and "last_epoch" in schedule:
        return f"; stepped {schedule['last_epoch']} times"
    return "; no schedule state (a constant rate)"
