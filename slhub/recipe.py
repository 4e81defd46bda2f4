"""Recipes: YAML files validated by pydantic, with ``--set a.b=VALUE`` overrides.

A recipe has a top-level ``plugin`` (the model plugin), an optional ``plugins``
list (further plugins: loggers, callbacks, metrics), a ``trainer`` section and an
optional ``ema`` section validated here, and any number of sections owned by
plugins (declared through the ``recipe_sections`` hook). From Python,
``plugin``/``plugins`` entries may be plugin objects instead of names
(:func:`as_recipe`); the recipe then records their ``module:qualname`` and keeps
the objects aside. Every error becomes one :class:`RecipeError` line that names
the file and the field path, e.g.
``examples/sl_ddp/cpu.yaml: trainer.batch_size: must be > 0``.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import re
import stat
import types
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from slhub.errors import RecipeError, one_line, shown
from slhub.paths import home_of, reason, user_path

#: Trainer keys that may differ between a checkpoint's recipe and a resumed run's.
RESUMABLE_KEYS: frozenset[str] = frozenset(
    {"trainer.output_dir", "trainer.steps", "trainer.stop_signals"}
)


#: Bounds that keep a value inside what torch and numpy accept, so a typo fails here.
MAX_COUNT = 2**31 - 1
MAX_SEED = 2**63 - 1

#: A recipe file is read whole; anything larger is not a recipe (``/dev/zero``, a dump).
MAX_RECIPE_BYTES = 16 * 2**20
#: Levels of nesting a recipe may hold; deeper values would overflow the recursive code
#: that validates, copies and digests recipes (a real recipe nests a handful).
MAX_DEPTH = 100


class BestCheckpoint(BaseModel):
    """``trainer.best``: which validation metric picks ``best.pt``, and which way."""

    model_config = ConfigDict(extra="forbid", strict=True)

    metric: str = Field(pattern=r"^validation/.+")
    mode: Literal["min", "max"] = "min"


#: ``ema`` keys that only the power schedule reads.
EMA_POWER_KEYS: frozenset[str] = frozenset(
    {"inv_gamma", "min_decay", "max_decay", "update_after_step"}
)


class EmaSection(BaseModel):
    """``ema``: an exponential moving average of the trained parameters, which validation,
    ``trainer.best`` and export use instead of the trained ones (docs/recipes.md#ema).

    Either a constant ``decay`` or diffusion_policy's warm-up schedule (``power`` with
    ``inv_gamma``, ``min_decay``, ``max_decay``, ``update_after_step``; its defaults are
    diffusion_policy's), so a policy trained there averages the same way here.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    decay: float | None = Field(default=None, ge=0, lt=1)
    power: float | None = Field(default=None, gt=0)
    inv_gamma: float = Field(default=1.0, gt=0)
    min_decay: float = Field(default=0.0, ge=0, le=1)
    max_decay: float = Field(default=0.9999, ge=0, le=1)
    update_after_step: int = Field(default=0, ge=0, le=MAX_COUNT)

    @model_validator(mode="after")
    def _one_schedule(self) -> EmaSection:
        """One way to average, and no key that it would ignore."""
        if (self.decay is None) == (self.power is None):
            raise ValueError(
                "set either decay (a constant) or power (the warm-up schedule), not "
                + ("both" if self.decay is not None else "neither")
            )
        ignored = sorted(EMA_POWER_KEYS & self.model_fields_set)
        if self.decay is not None and ignored:
            raise ValueError(f"{', '.join(ignored)} apply to the power schedule only, not decay")
        if self.min_decay > self.max_decay:
            raise ValueError(f"min_decay {self.min_decay} exceeds max_decay {self.max_decay}")
        return self

    def decay_after(self, done: int) -> float:
        """The decay of the update after ``done`` averaged ones.

        The power schedule is diffusion_policy's ``EMAModel.get_decay(done)``: with
        ``s = done - update_after_step - 1``, 0 (a copy of the weights) while ``s <= 0``,
        then ``1 - (1 + s / inv_gamma) ** -power`` clamped to ``[min_decay, max_decay]``.
        """
        if self.decay is not None:
            return self.decay
        assert self.power is not None
        step = done - self.update_after_step - 1
        if step <= 0:
            return 0.0
        value = 1 - (1 + step / self.inv_gamma) ** -self.power
        return max(self.min_decay, min(value, self.max_decay))


class TrainerConfig(BaseModel):
    """The core's recipe section (docs/recipes.md documents every key).

    Strict: ``true`` is not an integer and ``1.5`` is not a count; numbers
    must be finite.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    steps: int = Field(gt=0, le=MAX_COUNT)
    batch_size: int = Field(gt=0, le=MAX_COUNT)
    lr: float = Field(gt=0)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    validate_every: int = Field(default=0, ge=0, le=MAX_COUNT)
    save_every: int = Field(default=0, ge=0, le=MAX_COUNT)
    output_dir: str = Field(min_length=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    timeout_s: float = Field(default=600.0, ge=1.0)  # below a second no group forms
    #: Clip the global norm of the reduced gradient to this before every optimizer step.
    grad_clip_norm: float | None = Field(default=None, gt=0)
    #: Micro-batches per rank and update (gradient accumulation).
    accumulate: int = Field(default=1, ge=1, le=MAX_COUNT)
    #: Autocast of the objective: fp32 (none), bf16-mixed, or fp16-mixed (CUDA, scaled).
    precision: Literal["fp32", "bf16-mixed", "fp16-mixed"] = "fp32"

    #: Intra-op threads of this process: ``auto`` is one on the CPU (small models on
    #: shared cores run fastest so; ``OMP_NUM_THREADS`` set in the environment wins) and
    #: torch's default on a GPU; a number sets it.
    threads: Literal["auto"] | Annotated[int, Field(ge=1, le=1024)] = "auto"
    #: Keep only the newest N ``step_N.pt`` boundary checkpoints (None: keep every one).
    keep_last: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    #: Keep ``best.pt``: the checkpoint of the validation with the best ``metric``.
    best: BestCheckpoint | None = None

    @field_validator("best")
    @classmethod
    def _validated(cls, best: BestCheckpoint | None, info: Any) -> BestCheckpoint | None:
        """A best checkpoint needs validations to pick it from."""
        if best is not None and not info.data.get("validate_every"):
            raise PydanticCustomError(
                "best_without_validation",
                "needs trainer.validate_every > 0 (best.pt is picked at validations)",
            )
        return best

    #: Signals that stop the run after the current update, with a checkpoint (preemption).
    @field_validator("output_dir", mode="before")
    @classmethod
    def _path_as_text(cls, value: Any) -> Any:
        """A ``pathlib.Path`` from Python is as good as the text a YAML file holds."""
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("output_dir")
    @classmethod
    def _nameable(cls, value: str) -> str:
        """No OS call takes a NUL byte; refused here, not as a ValueError mid-run. A
        leading ``~`` or ``~user`` is the home directory, as in a shell (a YAML file or
        a quoted ``--set`` gets no shell expansion), never a directory named ``~``."""
        if "\0" in value:
            raise PydanticCustomError("path_nul", "must not contain a NUL byte")
        expanded = os.path.expanduser(value)
        if expanded.startswith("~"):
            raise PydanticCustomError(
                "path_home", "{home}: no such user's home directory", {"home": home_of(value)}
            )
        return expanded

    stop_signals: list[Literal["SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP"]] = Field(
        default_factory=lambda: ["SIGTERM", "SIGUSR1"]
    )


#: Top-level keys the core validates itself; every other key is a plugin's section.
CORE_KEYS: frozenset[str] = frozenset({"plugin", "plugins", "trainer", "ema"})


class RecipeHead(BaseModel):
    """The keys the core owns; the rest are plugin sections."""

    model_config = ConfigDict(extra="allow")

    plugin: str = Field(min_length=1)
    plugins: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    trainer: TrainerConfig
    #: Absent or null: no moving average (nothing about the run changes).
    ema: EmaSection | None = None

    @field_validator("plugins")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"lists {', '.join(repeated)} more than once")
        return names


class Recipe:
    """A validated recipe: the raw mapping, the trainer section and plugin sections."""

    def __init__(
        self,
        path: str,
        data: dict[str, Any],
        head: RecipeHead,
        objects: dict[str, Any] | None = None,
        overrides: list[str] | None = None,
    ) -> None:
        #: Where the recipe came from: its file, or ``recipe`` for a mapping.
        self.path = path
        #: The ``--set`` overrides applied, so errors can name the one at fault.
        self.overrides = list(overrides or [])
        self.data = data
        self.plugin = head.plugin
        self.plugins = list(head.plugins)
        self.trainer = head.trainer
        self.ema = head.ema
        self.sections: dict[str, BaseModel] = {}
        #: Plugin objects given from Python, by the name the recipe records for them.
        self.objects: dict[str, Any] = dict(objects or {})

    def to_dict(self) -> dict[str, Any]:
        """The recipe as plain data, with the trainer section's defaults filled in."""
        data = copy.deepcopy(self.data)
        data["plugins"] = list(self.plugins)
        data["trainer"] = self.trainer.model_dump()
        data.pop("ema", None)  # null reads as absent: the recipe of a run without EMA
        if self.ema is not None:
            data["ema"] = self.ema.model_dump()
        for name, section in self.sections.items():
            data[name] = section.model_dump(mode="json")
        return data

    def digest(self) -> str:
        """sha256 of the recipe without the keys a resume may change."""
        return recipe_digest(self.to_dict())

    def validate_sections(self, models: dict[str, type[BaseModel]]) -> None:
        """Validate every plugin-owned section; reject sections no plugin owns."""
        for key in self.data:
            if key in CORE_KEYS:
                continue
            if key not in models:
                owned = ", ".join(sorted(models)) or "none"
                where = _origin(self.path, self.overrides, key)
                raise RecipeError(
                    f"{where}: {shown(key)}: unknown key (the run's plugins own: {owned})"
                )
        for name, model in models.items():
            raw = self.data.get(name, {})
            if raw is None:
                raw = {}
            try:
                self.sections[name] = model.model_validate(raw)
            except ValidationError as exc:
                raise RecipeError(
                    format_validation_error(self.path, exc, prefix=name, overrides=self.overrides)
                ) from None


def recipe_digest(data: dict[str, Any]) -> str:
    """Digest of a recipe mapping, ignoring ``RESUMABLE_KEYS``."""
    comparable = _comparable(data)
    trainer = comparable.get("trainer", {})
    for key in RESUMABLE_KEYS:
        trainer.pop(key.split(".", 1)[1], None)
    blob = json.dumps(comparable, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def recipe_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Field paths whose values differ between two recipes, ignoring ``RESUMABLE_KEYS``."""
    return [
        f"{path} ({_show(a)} -> {_show(b)})" for path, a, b in _changes(old, new, RESUMABLE_KEYS)
    ]


def differing_keys(
    old: dict[str, Any], new: dict[str, Any], ignore: frozenset[str] = RESUMABLE_KEYS
) -> list[str]:
    """Dotted field paths (``trainer.lr``) whose values differ between two recipes,
    sorted; ``ignore`` names paths not compared (a run's own output directory)."""
    return [path for path, _, _ in _changes(old, new, ignore)]


def _changes(
    old: dict[str, Any], new: dict[str, Any], ignore: frozenset[str]
) -> list[tuple[str, Any, Any]]:
    out: list[tuple[str, Any, Any]] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if path in ignore:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b), key=str):
                walk(a.get(key, _MISSING), b.get(key, _MISSING), f"{path}.{key}" if path else key)
        elif a != b:
            out.append((path, a, b))

    walk(_comparable(old), _comparable(new), "")
    return out


def _comparable(data: dict[str, Any]) -> dict[str, Any]:
    """A copy in which an absent ``plugins`` list equals an empty one and an absent key
    equals one set to None, in every section (a key a section gained since the
    identity was written, whose default is None, is no difference)."""
    comparable = copy.deepcopy(data)
    if not comparable.get("plugins"):
        comparable.pop("plugins", None)

    def drop_none(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: drop_none(v) for k, v in value.items() if v is not None}
        return value

    return {k: drop_none(v) if isinstance(v, dict) else v for k, v in comparable.items()}


_MISSING = object()


def _show(value: Any) -> str:
    return "absent" if value is _MISSING else repr(value)


_MESSAGES = {
    "greater_than": lambda ctx: f"must be > {ctx['gt']}",
    "greater_than_equal": lambda ctx: f"must be >= {ctx['ge']}",
    "less_than": lambda ctx: f"must be < {ctx['lt']}",
    "less_than_equal": lambda ctx: f"must be <= {ctx['le']}",
    "extra_forbidden": lambda ctx: "unknown key",
    "missing": lambda ctx: "required key is missing",
    "literal_error": lambda ctx: f"must be one of {ctx['expected']}",
    "string_too_short": lambda ctx: "must not be empty",
    "string_pattern_mismatch": lambda ctx: "must name a validation metric: validation/<name>",
    "int_type": lambda ctx: "must be an integer",
    "int_from_float": lambda ctx: "must be an integer",
    "float_type": lambda ctx: "must be a number",
    "finite_number": lambda ctx: "must be a finite number",
    "string_type": lambda ctx: "must be a string",
    "bool_type": lambda ctx: "must be true or false",
    "list_type": lambda ctx: "must be a list",
    "dict_type": lambda ctx: "must be a mapping",
    "model_type": lambda ctx: "must be a mapping",
}


def format_validation_error(
    source: str, exc: ValidationError, prefix: str = "", overrides: list[str] | None = None
) -> str:
    """One line naming every failing field path and where its value came from.

    A value set by ``--set`` is reported against that override, not the file.
    """
    parts: list[tuple[str, str]] = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in ((prefix,) if prefix else ()) + tuple(error["loc"]))
        render = _MESSAGES.get(error["type"])
        message = render(error.get("ctx", {})) if render else error["msg"]
        text = f"{shown(loc) if loc else '(top level)'}: {message}"
        parts.append((_origin(source, overrides or [], loc), text))
    line, last = "", None
    for origin, text in parts:
        line += f"; {text}" if origin == last else f"{'; ' if line else ''}{origin}: {text}"
        last = origin
    return line


def _origin(source: str, overrides: list[str], loc: str) -> str:
    """``--set TEXT`` for the last override that set ``loc`` (or a section above it),
    its text cut to a readable length (:func:`slhub.errors.shown`)."""
    for text in reversed(overrides):
        key = text.partition("=")[0].strip()
        if loc == key or loc.startswith(key + ".") or key.startswith(loc + "."):
            return f"--set {shown(text)}"
    return source


_EXPONENT_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b=VALUE`` into a key path and a YAML scalar value."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or any(not p for p in key.strip().split(".")):
        raise RecipeError(f"--set {shown(text, quote=True)}: expected KEY.PATH=VALUE")
    try:
        # the recipe's own loader: merge keys, no repeated keys, aliases bounded
        parsed = yaml.load(value, Loader=_RecipeLoader) if value.strip() else ""  # noqa: S506
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or one_line(exc)
        raise RecipeError(
            f"--set {shown(text, quote=True)}: value is not valid YAML ({shown(problem)})"
        ) from None
    except RecursionError:  # the YAML parser recurses once per level
        raise RecipeError(f"--set {shown(text)}: value is {_TOO_DEEP}") from None
    except _AliasBomb as exc:
        raise RecipeError(f"--set {shown(text)}: {exc}") from None
    if isinstance(parsed, str) and _EXPONENT_FLOAT.fullmatch(parsed):
        parsed = float(parsed)  # YAML 1.1 reads 1e-3 as a string; here it means a number
    return key.strip().split("."), parsed


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides in order (a later one wins) to a copy of ``data``.

    Only the mappings along each overridden path are copied, so plugin objects
    elsewhere in ``data`` stay the caller's objects.
    """
    data = dict(data)
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for depth, part in enumerate(path[:-1]):
            child = node.get(part)
            if isinstance(child, (list, tuple)) or (child is None and path[depth + 1].isdigit()):
                raise RecipeError(_cannot_index(text, path[: depth + 1], path[depth + 1], value))
            if child is None:
                child = {}
            if not isinstance(child, dict):
                raise RecipeError(f"--set {shown(text, quote=True)}: {part} is not a section")
            node[part] = child = dict(child)
            node = child
        node[path[-1]] = value
    return data


def _cannot_index(text: str, path: list[str], index: str, value: Any) -> str:
    """The refusal of ``--set a.list.0=VALUE``, showing how to give the whole list."""
    key = ".".join(path)
    example = json.dumps([value] if index.isdigit() else [{index: value}], default=str)
    return (
        f"--set {shown(text)}: --set cannot index into a list ({key}); give the whole "
        f"list as YAML, e.g. --set '{key}={shown(example)}'"
    )


#: Nodes that YAML aliases (``*name``) may add to a recipe or a ``--set`` value when
#: expanded: each alias stands for a copy of its anchor's whole value, so a few hundred
#: bytes of nested aliases expand to billions of nodes (an "alias bomb") once the recipe
#: is copied, validated or digested. Real recipes alias a handful of small mappings.
MAX_ALIAS_NODES = 100_000

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _AliasBomb(Exception):
    """A YAML document whose aliases expand past :data:`MAX_ALIAS_NODES`."""


class _RecipeLoader(yaml.SafeLoader):
    """yaml's SafeLoader (merge keys ``<<: *defaults`` included), refusing a mapping that
    repeats a key (yaml keeps the last silently) and a document whose aliases expand to
    more than :data:`MAX_ALIAS_NODES` nodes, before anything is constructed."""

    def construct_document(self, node: yaml.Node) -> Any:
        added = _expanded_nodes(node) - _distinct_nodes(node)
        if added > MAX_ALIAS_NODES:
            raise _AliasBomb(
                f"YAML aliases expand to {added} nodes more than written, over the limit of "
                f"{MAX_ALIAS_NODES} (an alias bomb); write the values out or alias less"
            )
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:  # ``<<``: merged keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return []


def _distinct_nodes(root: yaml.Node) -> int:
    """Nodes of a composed document, each counted once however many aliases name it."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend(_children(node))
    return len(seen)


def _expanded_nodes(root: yaml.Node) -> int:
    """Nodes of a composed document with every alias expanded: each node counts as often
    as it is reached. Memoised per node and walked without recursion, so a bomb costs
    time linear in its written size; a node reached again while being counted (a
    recursive anchor) counts once here and is refused as nested too deeply later."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            size[id(node)] = 1 + sum(size.get(id(child), 1) for child in _children(node))
            continue
        if id(node) in size:
            continue
        size[id(node)] = 1  # in progress: a cycle back to it counts once
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in size)
    return size[id(root)]


def read_recipe_file(path: str | Path) -> dict[str, Any]:
    """Read a recipe's YAML mapping, with one-line errors for every failure."""
    path = user_path(path, "recipe file", RecipeError)
    text = _read_recipe_text(path)
    try:
        data = yaml.load(text, Loader=_RecipeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or one_line(exc)
        raise RecipeError(f"{path}: YAML syntax error at {where}{problem}") from None
    except RecursionError:  # the YAML parser recurses once per level
        raise RecipeError(f"{path}: YAML {_TOO_DEEP}") from None
    except _AliasBomb as exc:
        raise RecipeError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping, got {type(data).__name__}")
    return data


def _read_recipe_text(path: Path) -> str:
    """The text of a recipe file, which must be a regular file of at most MAX_RECIPE_BYTES.

    Opened without blocking and checked on the open descriptor before any read: a
    FIFO would block the open or read forever and ``/dev/zero`` would fill memory.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such recipe file") from None
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe ({reason(exc)})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise RecipeError(f"{path}: is a directory, not a recipe file")
        if not stat.S_ISREG(info.st_mode):
            raise RecipeError(
                f"{path}: not a regular file (a FIFO, socket or device); a recipe is a YAML file"
            )
        if info.st_size > MAX_RECIPE_BYTES:
            raise RecipeError(f"{path}: {_too_big(info.st_size)}")
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_RECIPE_BYTES + 1)  # the size can change after the fstat
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe ({reason(exc)})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_RECIPE_BYTES:
        raise RecipeError(f"{path}: {_too_big(len(data), more=True)}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(
            f"{path}: cannot read recipe (not UTF-8 text: byte {exc.start} is "
            f"0x{data[exc.start]:02x})"
        ) from None


def _too_big(size: int, more: bool = False) -> str:
    return (
        f"{'more than ' if more else ''}{size} bytes; a recipe is at most "
        f"{MAX_RECIPE_BYTES // 2**20} MiB"
    )


_TOO_DEEP = f"nested too deeply (more than {MAX_DEPTH} levels)"


def too_deep(data: Any, limit: int = MAX_DEPTH) -> str | None:
    """The key path of a value nested more than ``limit`` levels, or None.

    Walked without recursion, so neither depth nor a cycle (from Python) can
    overflow the stack; the path stops at the first list or at a few keys.
    """
    stack: list[tuple[Any, str, int, bool]] = [(data, "", 0, True)]
    deepest: dict[int, int] = {}  # YAML aliases share values: walk each once per depth
    while stack:
        node, loc, depth, naming = stack.pop()
        if depth > limit:
            return loc or "(top level)"
        if not isinstance(node, (dict, list, tuple)) or deepest.get(id(node), -1) >= depth:
            continue
        deepest[id(node)] = depth
        if isinstance(node, dict):
            keep = naming and depth < 6
            for key, value in node.items():
                child = (f"{loc}.{key}" if loc else str(key)) if keep else loc
                stack.append((value, child, depth + 1, keep))
        elif isinstance(node, (list, tuple)):
            stack.extend((value, loc, depth + 1, False) for value in node)
    return None


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read, override and validate the core part of a recipe.

    Plugin-owned sections are validated later by :meth:`Recipe.validate_sections`,
    once the registry knows which plugin owns which section.
    """
    data = apply_overrides(read_recipe_file(path), overrides or [])
    return recipe_from_dict(data, source=str(path), overrides=overrides)


def recipe_from_dict(
    data: dict[str, Any], source: str, overrides: list[str] | None = None
) -> Recipe:
    """Validate the core part of a recipe mapping (e.g. one stored in a checkpoint).

    ``plugin``/``plugins`` entries that are objects rather than names are
    replaced by :func:`object_name` and kept in :attr:`Recipe.objects`.
    """
    deep = too_deep(data)
    if deep is not None:
        origin = _origin(source, overrides or [], deep)
        raise RecipeError(f"{origin}: {deep}: {_TOO_DEEP}")
    data = dict(data)
    objects: dict[str, Any] = {}

    def name_of(entry: Any) -> Any:
        if entry is None or isinstance(entry, (str, int, float, bool, dict, list)):
            return entry
        name = object_name(entry)
        objects[name] = entry
        return name

    if "plugin" in data:
        data["plugin"] = name_of(data["plugin"])
    if isinstance(data.get("plugins"), (list, tuple)):
        data["plugins"] = [name_of(entry) for entry in data["plugins"]]
    try:
        head = RecipeHead.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(source, exc, overrides=overrides)) from None
    return Recipe(source, data, head, objects, overrides)


def object_name(obj: Any) -> str:
    """``module:qualname`` of a plugin object (a module, a class or an instance)."""
    if isinstance(obj, types.ModuleType):
        return f"{obj.__name__}:"
    cls = obj if inspect.isclass(obj) else type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def as_recipe(
    recipe: str | Path | dict[str, Any] | Recipe,
    overrides: list[str] | None = None,
    *,
    plugin: Any = None,
    plugins: list[Any] | None = None,
) -> Recipe:
    """A recipe from a YAML path, a mapping or a :class:`Recipe`, with overrides applied.

    ``plugin`` replaces the recipe's model plugin and ``plugins`` its list of
    further plugins; either may hold names or plugin objects.
    """
    if isinstance(recipe, Recipe):
        if not overrides and plugin is None and plugins is None:
            return recipe
        source, data = recipe.path, _with_objects(recipe)
    elif isinstance(recipe, dict):
        source, data = "recipe", dict(recipe)
    else:
        source, data = str(recipe), read_recipe_file(recipe)
    if plugin is not None:
        data["plugin"] = plugin
    if plugins is not None:
        data["plugins"] = list(plugins)
    overrides = list(overrides or [])
    if overrides:
        data = apply_overrides(data, overrides)
    return recipe_from_dict(data, source=source, overrides=overrides)


def _with_objects(recipe: Recipe) -> dict[str, Any]:
    """The recipe's mapping with plugin names given as objects put back as objects."""
    data = copy.copy(recipe.data)
    data["plugin"] = recipe.objects.get(recipe.plugin, recipe.plugin)
    data["plugins"] = [recipe.objects.get(n, n) for n in recipe.plugins]
    return data
