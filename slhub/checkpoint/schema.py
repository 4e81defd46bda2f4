"""The checkpoint schema: the v2/v1 layouts, their checks and the typed view of a checkpoint.

v2 (written by slhub): ``format``, ``step``, ``run``, ``model``, ``optimizer``,
``scheduler`` (``schedule`` and ``scaler`` state), ``ranks`` (one entry per global
rank), ``retention`` (the files ``trainer.keep_last`` keeps and the best validation
so far; absent in older files, read as empty), ``intent`` (what writing this file
does to its run directory, for a resume to finish after a kill: :class:`Intent`;
absent in older files, read as nothing to finish) and, only in a run whose recipe
has an ``ema`` section, ``ema`` (the averaged parameters and the number of updates
they hold: :class:`EmaState`).
v1 (single-device layout, before run identities): ``step``, ``model``,
``optimizer``, ``rng`` and no ``format``; read for export and for a resume into
a fresh destination only.

Only this package spells these keys: the loop, ``slhub inspect`` and every
exporter read a :class:`Checkpoint` instead.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from slhub.errors import CheckpointError
from slhub.recipe import MAX_DEPTH, recipe_digest, too_deep

FORMAT_V2 = "slhub.checkpoint/2"
#: What a v1 file (no ``format`` key) is called in messages and export provenance.
FORMAT_V1 = "slhub.checkpoint/1"
V1_KEYS = frozenset({"step", "model", "optimizer", "rng"})
V2_KEYS = frozenset({"format", "step", "run", "model", "optimizer", "scheduler", "ranks"})
#: v2 keys a file written before them may lack.
V2_OPTIONAL = frozenset({"retention", "intent", "ema"})


@dataclass(frozen=True)
class Retention:
    """What the retention policies have done so far: the ``step_N.pt`` files
    ``trainer.keep_last`` still keeps (oldest first), the one a stop wrote outside the
    schedule (``unscheduled``: removed once the next scheduled checkpoint is durable,
    so it takes no place among the kept) and the best validation so far.
    Checkpointed, so a resumed run keeps, deletes and picks what the uninterrupted
    run would."""

    kept: tuple[int, ...] = ()
    best_step: int | None = None
    best_value: float | None = None
    unscheduled: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kept": list(self.kept),
            "best_step": self.best_step,
            "best_value": self.best_value,
            "unscheduled": self.unscheduled,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Retention:
        if not data:
            return cls()
        return cls(
            tuple(int(s) for s in data["kept"]),
            data["best_step"],
            data["best_value"],
            data.get("unscheduled"),
        )


@dataclass(frozen=True)
class Intent:
    """What writing a checkpoint does to its run directory: the ``names`` it is written
    under (``last.pt`` first) and the ``step_N.pt`` files, by update, it ``removes`` once
    it is durable (``trainer.keep_last``). The file records it because ``last.pt`` is
    its first name: a kill after that rename leaves the rest undone, and the resume
    from ``last.pt`` finishes it (:func:`slhub.checkpoint.manager.finish_write`).

    Not training state: a boundary's names differ between a stopped run and the one
    never stopped, so :data:`slhub.testing.STATE_FIELDS` leaves it out."""

    names: tuple[str, ...] = ()
    removes: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "removes": list(self.removes)}

    @classmethod
    def from_dict(cls, data: Any) -> Intent:
        """The intent a file records; ValueError for names that are not plain file names
        in the run directory (a resume writes them) or updates that are not ints >= 0."""
        if data is None:
            return cls()
        names, removes = data["names"], data["removes"]
        if not isinstance(names, (list, tuple)) or not isinstance(removes, (list, tuple)):
            raise TypeError("intent")
        if not all(isinstance(n, str) and _plain_name(n) for n in names):
            raise ValueError("names")
        if not all(type(s) is int and s >= 0 for s in removes):
            raise ValueError("removes")
        return cls(tuple(names), tuple(removes))


def _plain_name(name: str) -> bool:
    """A file name directly in the run directory: no separator, not hidden (``..``)."""
    return bool(name) and not name.startswith(".") and not any(c in name for c in "/\\\0")


@dataclass(frozen=True)
class EmaState:
    """The moving average of a run with an ``ema`` recipe section: ``weights``, the
    averaged parameters by model state-dict name, and ``step``, the number of updates
    averaged (its warm-up counter), so a resume continues the same decay sequence."""

    step: int
    weights: dict[str, torch.Tensor]

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "weights": self.weights}

    @classmethod
    def from_dict(cls, data: Any) -> EmaState | None:
        if data is None:
            return None
        return cls(int(data["step"]), data["weights"])


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint, v1 or v2, as one typed object.

    ``ranks`` holds every rank's merged ``state_dict`` contributions by global rank
    (a v1 file: one entry holding its ``rng``); ``run`` is the run identity (None
    for v1, which has none).
    """

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    ranks: list[dict[str, Any]]
    run: dict[str, Any] | None = None
    schedule: dict[str, Any] | None = None
    scaler: dict[str, Any] | None = None
    retention: Retention = field(default_factory=Retention)
    #: The moving average (None: the run keeps none).
    ema: EmaState | None = None
    #: What writing this file does to its run directory (not training state).
    intent: Intent = field(default_factory=Intent)
    version: int = 2

    @property
    def format(self) -> str:
        return FORMAT_V2 if self.version == 2 else FORMAT_V1

    @property
    def world_size(self) -> int:
        return int(self.run["world_size"]) if self.run is not None else 1

    @property
    def run_id(self) -> str | None:
        return self.run.get("run_id") if self.run is not None else None

    @property
    def recipe(self) -> dict[str, Any]:
        recipe = (self.run or {}).get("recipe")
        return recipe if isinstance(recipe, dict) else {}

    @property
    def recipe_digest(self) -> str | None:
        """The digest run.json records (recomputed the same way for older identities)."""
        if self.run is None:
            return None
        recorded = self.run.get("recipe_digest")
        return recorded if isinstance(recorded, str) else recipe_digest(self.recipe)

    @property
    def plugins(self) -> list[dict[str, Any]]:
        """The plugin sources the run identity records, model plugin first."""
        return plugins_of(self.run)

    @property
    def evaluation_weights(self) -> dict[str, torch.Tensor]:
        """The weights validation, ``trainer.best`` and export judge: ``model`` with its
        averaged parameters in place of the trained ones where the run keeps an EMA
        (buffers and frozen parameters are the model's own), else ``model``."""
        if self.ema is None:
            return self.model
        return {**self.model, **self.ema.weights}

    def rank_state(self, rank: int) -> dict[str, Any]:
        """What the ``load_state_dict`` hook receives on ``rank``."""
        return self.ranks[rank] if self.version == 2 else self.ranks[0]

    def to_dict(self) -> dict[str, Any]:
        """The layout ``torch.save`` writes (v2; a v1 view keeps its v1 layout)."""
        if self.version == 1:
            return {
                "step": self.step,
                "model": self.model,
                "optimizer": self.optimizer,
                "rng": self.ranks[0]["rng"],
            }
        data = {
            "format": FORMAT_V2,
            "step": self.step,
            "run": self.run,
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": {"schedule": self.schedule, "scaler": self.scaler},
            "ranks": self.ranks,
            "retention": self.retention.to_dict(),
            "intent": self.intent.to_dict(),
        }
        if self.ema is not None:  # a run without EMA writes what it wrote before EMA existed
            data["ema"] = self.ema.to_dict()
        return data

    def to_v1(self) -> dict[str, Any]:
        """The single-device (v1) layout: rank 0's RNG, no identity."""
        return {
            "step": self.step,
            "model": self.model,
            "optimizer": self.optimizer,
            "rng": self.ranks[0]["rng"],
        }

    @classmethod
    def from_dict(cls, data: Any, path: str | Path) -> Checkpoint:
        """The view of a loaded file's contents; one :class:`CheckpointError` line for
        anything that is not a v1 or v2 checkpoint."""
        version = check_layout(data, path)
        if version == 1:
            return cls(
                step=int(data["step"]),
                model=data["model"],
                optimizer=data["optimizer"],
                ranks=[{"rng": data["rng"]}],
                version=1,
            )
        scheduler = data["scheduler"] or {}
        try:
            retention = Retention.from_dict(data.get("retention"))
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: damaged v2 checkpoint (retention)") from None
        try:
            intent = Intent.from_dict(data.get("intent"))
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: damaged v2 checkpoint (intent)") from None
        return cls(
            step=int(data["step"]),
            model=data["model"],
            optimizer=data["optimizer"],
            ranks=data["ranks"],
            run=data["run"],
            schedule=scheduler.get("schedule"),
            scaler=scheduler.get("scaler"),
            retention=retention,
            ema=EmaState.from_dict(data.get("ema")),
            intent=intent,
        )


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


def check_state_loadable(ranks: list[dict[str, Any]]) -> None:
    """Refuse rank state a weights-only load would refuse (a numpy array, a namedtuple):
    every checkpoint would be written and then be unloadable.

    :raises CheckpointError: naming the first such value and its rank.
    """
    for rank, state in enumerate(ranks):
        where = unloadable(state, f"ranks[{rank}]")
        if where is not None:
            raise CheckpointError(
                f"rank {rank}'s save state holds {where}, which a checkpoint loaded with "
                "weights_only=True cannot hold; return tensors, numbers, strings, bytes, "
                "None, dtypes, devices and dicts, lists, tuples or sets of them"
            )


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
        if missing:  # the loop registers them, so every checkpoint holds them
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
    return _ema_problem(data.get("ema"))


def _ema_problem(ema: Any) -> str | None:
    """What is wrong with a v2 checkpoint's ``ema`` entry (None: absent, no EMA)."""
    if ema is None:
        return None
    if not isinstance(ema, dict) or set(ema) != {"step", "weights"}:
        return "ema is not {step, weights}"
    step, weights = ema["step"], ema["weights"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"ema.step is {step!r}, expected an int >= 0"
    if not isinstance(weights, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()
    ):
        return "ema.weights is not a state dict of named tensors"
    return None


#: What every rank's entry of a v2 checkpoint holds (the loop's registered ``rng`` and
#: ``sampler``, :mod:`slhub.rank_state`):
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


def check_fits(checkpoint: Checkpoint, model: torch.nn.Module, optimizer: Any) -> None:
    """Refuse, in one line, a checkpoint whose tensors torch would silently cast into the
    model and optimizer (a float64 weight into a float32 model) or that the optimizer
    would only trip over at the first update (a moment of another shape): an exact
    resume needs the same shapes and dtypes. Shape and key mismatches of the model
    itself are reported by ``load_state_dict``."""
    own = model.state_dict()
    for key, value in checkpoint.model.items():
        if key in own and value.dtype != own[key].dtype:
            raise CheckpointError(
                f"checkpoint's model tensor {key} is {_dtype(value)}, this recipe's model "
                f"has {_dtype(own[key])}: an exact resume needs the same dtype"
            )
    saved = checkpoint.optimizer
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
