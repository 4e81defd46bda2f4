"""The sweep file: a YAML mapping validated by pydantic (unknown keys refused), read
into a :class:`Sweep` whose every error is one :class:`SweepError` line naming the
file and the field path, as a recipe's are.

.. code-block:: yaml

    recipe: sl.train.yaml            # relative to the sweep file
    output_dir: outputs/sweeps/x     # trials, study.db, best.yaml (relative to the cwd)
    trials: 8                        # the budget: finished trials (complete, pruned, failed)
    objective: {metric: validation/rollout_mse_10, direction: minimize}
    set: {trainer.steps: 300}        # fixed overrides of every trial
    space:
      trainer.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
      model.width: {choices: [32, 64]}
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Literal

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

from slhub.errors import SlhubError, shown
from slhub.paths import user_path
from slhub.recipe import MAX_SEED, format_validation_error

#: A sweep file is small; anything larger is not one.
MAX_SWEEP_BYTES = 2**20
#: Study names: what a database and a file name both take.
_STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

Scalar = bool | int | float | str | None
#: YAML 1.1 reads ``1e-3`` as text; a sweep file means the number, as ``--set`` does.
_EXPONENT_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _refuse(message: str) -> PydanticCustomError:
    """A validator's refusal, shown as written (no "Value error," before it)."""
    return PydanticCustomError("sweep", "{message}", {"message": message})


def _number(value: Any) -> Any:
    return float(value) if isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value) else value


class SweepError(SlhubError):
    """A sweep file, study or search space that cannot be used (one line, exit 2)."""


class Param(BaseModel):
    """One dimension of the search space: a range (``type``, ``low``, ``high``, and
    ``log`` or ``step``) or a list of ``choices``."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    type: Literal["float", "int"] | None = None
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = Field(default=None, gt=0)
    choices: list[Scalar] | None = None

    @model_validator(mode="before")
    @classmethod
    def _numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: _number(v) if k in ("low", "high", "step") else v for k, v in data.items()}
        if isinstance(data.get("choices"), list):
            data["choices"] = [_number(c) for c in data["choices"]]
        return data

    @model_validator(mode="after")
    def _one_kind(self) -> Param:
        ranged = {"type", "low", "high", "log", "step"} & self.model_fields_set
        if self.choices is not None:
            if ranged:
                raise _refuse(f"choices take no {', '.join(sorted(ranged))}")
            if not self.choices:
                raise _refuse("choices must not be empty")
            if len({repr(c) for c in self.choices}) != len(self.choices):
                raise _refuse("choices must be distinct")
            if any(isinstance(c, float) and not math.isfinite(c) for c in self.choices):
                raise _refuse("choices must be finite numbers")
            return self
        if self.type is None or self.low is None or self.high is None:
            raise _refuse("give type (float or int), low and high, or choices")
        if self.type == "int":
            for name in ("low", "high", "step"):
                value = getattr(self, name)
                if value is not None and not isinstance(value, int):
                    raise _refuse(f"{name} of an int range must be an integer")
        if self.low > self.high:
            raise _refuse(f"low {self.low} exceeds high {self.high}")
        if self.log and self.low <= 0:
            raise _refuse("a log range needs low > 0")
        if self.log and self.step is not None:
            raise _refuse("give log or step, not both")
        return self

    def bounds(self) -> list[Scalar]:
        """The values that stand for the whole range when a recipe checks it."""
        return list(self.choices) if self.choices is not None else [self.low, self.high]

    def distribution(self) -> Any:
        """The Optuna distribution of this dimension."""
        import optuna

        if self.choices is not None:
            return optuna.distributions.CategoricalDistribution(self.choices)
        if self.type == "int":
            return optuna.distributions.IntDistribution(
                int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        return optuna.distributions.FloatDistribution(
            float(self.low), float(self.high), log=self.log, step=self.step
        )


class Objective(BaseModel):
    """What a trial scores: ``metric`` at the trial's last validation."""

    model_config = ConfigDict(extra="forbid", strict=True)

    metric: str = Field(pattern=r"^validation/.+")
    direction: Literal["minimize", "maximize"] = "minimize"


class Sampler(BaseModel):
    """Optuna's sampler; seeded afresh from ``seed`` and the trial number before each
    trial, so trial N's values depend on the stored trials alone, not on the process."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Literal["tpe", "random"] = "tpe"
    #: TPE: trials drawn at random before the model of good values takes over.
    n_startup_trials: int = Field(default=10, ge=0, le=2**31 - 1)


class Pruner(BaseModel):
    """Optuna's pruner: which trials stop early, from the values their validations
    reported (``none``: every trial runs its whole recipe)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    name: Literal["none", "median", "percentile"] = "none"
    #: Trials that finish before pruning starts.
    n_startup_trials: int = Field(default=5, ge=0, le=2**31 - 1)
    #: Updates of a trial before it may be pruned.
    n_warmup_steps: int = Field(default=0, ge=0, le=2**31 - 1)
    #: percentile: keep a trial in the best ``percentile`` percent at each validation.
    percentile: float = Field(default=25.0, gt=0, lt=100)

    @model_validator(mode="after")
    def _no_idle_keys(self) -> Pruner:
        if self.name == "none" and self.model_fields_set - {"name"}:
            raise _refuse("the pruner none takes no settings")
        if self.name == "median" and "percentile" in self.model_fields_set:
            raise _refuse("percentile applies to the percentile pruner only")
        return self

    def build(self) -> Any:
        import optuna

        if self.name == "none":
            return optuna.pruners.NopPruner()
        if self.name == "median":
            return optuna.pruners.MedianPruner(
                n_startup_trials=self.n_startup_trials, n_warmup_steps=self.n_warmup_steps
            )
        return optuna.pruners.PercentilePruner(
            self.percentile,
            n_startup_trials=self.n_startup_trials,
            n_warmup_steps=self.n_warmup_steps,
        )


class SweepFile(BaseModel):
    """The sweep file's keys (docs/trackers.md documents each)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    recipe: str = Field(min_length=1)
    output_dir: str = Field(min_length=1)
    objective: Objective
    space: dict[str, Param] = Field(min_length=1)
    trials: int = Field(gt=0, le=100_000)
    set: dict[str, Any] = Field(default_factory=dict)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    sampler: Sampler = Field(default_factory=Sampler)
    pruner: Pruner = Field(default_factory=Pruner)
    #: Default ``sqlite:///<output_dir>/study.db``; a database URL for a shared server.
    storage: str | None = Field(default=None, min_length=1)
    #: Default: the sweep file's name without ``.yaml``.
    study: str | None = None
    #: 1: each trial is ``python -m slhub train``; N: ``slhub launch`` with N workers.
    workers: int = Field(default=1, ge=1, le=1024)

    @field_validator("study")
    @classmethod
    def _study_name(cls, name: str | None) -> str | None:
        if name is not None and not _STUDY_NAME.fullmatch(name):
            raise _refuse("letters, digits, _ . - (at most 128, not starting with . _ -)")
        return name

    @model_validator(mode="after")
    def _owned_keys(self) -> SweepFile:
        for where, keys in (("space", self.space), ("set", self.set)):
            for key in keys:
                if key == "trainer.output_dir":
                    raise _refuse(f"{where}: trainer.output_dir is the sweep's (each trial's dir)")
                if not key or any(not part for part in key.split(".")):
                    raise _refuse(f"{where}: {shown(key, quote=True)} is not a dotted recipe key")
        both = sorted(set(self.space) & set(self.set))
        if both:
            raise _refuse(f"{', '.join(both)} in both space and set")
        return self


class Sweep:
    """A validated sweep file with its paths resolved."""

    def __init__(self, path: Path, spec: SweepFile) -> None:
        self.path = path
        self.spec = spec
        #: The recipe, relative to the sweep file's folder.
        self.recipe = path.parent / os.path.expanduser(spec.recipe)
        self.output_dir = Path(os.path.expanduser(spec.output_dir))
        self.study = spec.study or _default_study(path)
        self.default_storage = spec.storage is None
        self.storage = spec.storage or f"sqlite:///{self.output_dir / 'study.db'}"

    def overrides(self, params: dict[str, Any] | None = None) -> list[str]:
        """``--set`` words of the sweep's fixed ``set`` and then ``params``, each value
        written as JSON (YAML reads it back as the same value, floats bit for bit)."""
        import json

        merged = {**self.spec.set, **(params or {})}
        return [f"{key}={json.dumps(value)}" for key, value in merged.items()]


def _default_study(path: Path) -> str:
    stem = path.name.removesuffix(".yaml").removesuffix(".yml")
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", stem).lstrip("._-") or "sweep"
    return name[:128]


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep file; one :class:`SweepError` line for any fault."""
    path = user_path(path, "sweep file", SweepError)
    try:
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "no such file"
            raise SweepError(f"{path}: {what}; give a sweep YAML file")
        if path.stat().st_size > MAX_SWEEP_BYTES:
            raise SweepError(f"{path}: larger than {MAX_SWEEP_BYTES} bytes: not a sweep file")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SweepError(f"{path}: cannot read the sweep file ({exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not YAML"
        raise SweepError(f"{path}: YAML syntax error{where}: {problem}") from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: a sweep file is a YAML mapping, got {type(data).__name__}")
    try:
        spec = SweepFile.model_validate(data)
    except ValidationError as exc:
        raise SweepError(format_validation_error(str(path), exc)) from None
    return Sweep(path, spec)
