"""Test helpers for plugin authors (and slhub's own tests).

- :class:`StandInTrainer` implements the :class:`slhub.Trainer` protocol without
  a loop, so a plugin's hooks can be unit-tested directly, with its recipe
  sections validated by the plugin's own models.
- :func:`hooks_of` calls a plugin's hooks as the loop does (keyword arguments,
  any subset of the documented parameters per implementation).
- :func:`sampler_generator` is the generator a rank samples with, to rebuild a
  real run's batches in an oracle.
- :func:`check_resume_exact` runs a recipe uninterrupted, and again preempted
  at update k (by the extra plugin :class:`StopAt`) and resumed, in fresh
  processes (one, or N Gloo workers under torchrun), and compares the two
  final checkpoints bit for bit: model, optimizer, schedule, the moving average
  (``ema``) and every rank's state. Its :class:`ResumeCheck` also validates the
  final weights again (:meth:`ResumeCheck.revalidate`), to compare with what the
  run logged.
- :func:`check_resume_and_revalidate` is both, with the checks a model
  package's example recipe needs: the checkpoint is its model and reproduces
  the validation the run logged.
- :func:`assert_tree_equal` is the exact comparison it uses (``torch.equal``
  for tensors).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy
import torch
from pydantic import BaseModel
from torch import nn

from slhub import checkpoint, hookspecs, rng
from slhub.checkpoint import Checkpoint
from slhub.errors import PluginError
from slhub.hookspecs import hookimpl
from slhub.optim import OptimSection, ScheduleSection, build_optimizer, build_schedule
from slhub.preemption import EXIT_PREEMPTED, Preempted
from slhub.recipe import TrainerConfig, as_recipe
from slhub.trainer import TrainerBase

__all__ = [
    "ResumeCheck",
    "StandInTrainer",
    "StopAt",
    "assert_tree_equal",
    "check_resume_and_revalidate",
    "check_resume_exact",
    "hooks_of",
    "sampler_generator",
]


def hooks_of(*plugins: Any) -> Any:
    """The hook relay of a plugin manager holding the slhub contract and ``plugins``.

    ``hooks_of(plugin).sample(trainer=t, generator=g, step=1)`` calls the
    plugin's ``sample`` exactly as the loop does, whatever subset of the
    parameters it accepts. Built-in plugins are not registered.
    """
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    for plugin in plugins:
        manager.register(plugin)
    return manager.hook


def sampler_generator(seed: int, rank: int = 0) -> torch.Generator:
    """The sampler generator rank ``rank`` of a run seeded ``seed`` starts with."""
    return torch.Generator().manual_seed(rng.derived_seed(seed, rank, "sampler"))


class StandInTrainer(TrainerBase):
    """What hooks receive as ``trainer``, without a training loop.

    :param plugin: when given, raw section mappings in ``sections`` are
        validated with the models its ``recipe_sections`` hook declares, and
        sections it declares but ``sections`` omits get their defaults.
    :param sections: section name -> validated pydantic model or raw mapping.
    :param device: the device; default ``trainer.device`` when given (``auto``:
        CUDA when visible, else CPU), else CPU.
    :param trainer: ``trainer:`` keys (``batch_size``, ``seed``, ``lr``,
        ``output_dir``...); ``steps=1``, ``batch_size=8``, ``lr=1e-3`` and
        ``output_dir`` are filled in when absent.

    ``save()`` records the names it was asked for in :attr:`saved` and writes
    nothing; ``register_state`` keeps the objects in :attr:`states` by name, and
    :meth:`close` closes those that have ``close()``.
    """

    def __init__(
        self,
        plugin: Any = None,
        sections: Mapping[str, Any] | None = None,
        *,
        device: str | torch.device | None = None,
        rank: int = 0,
        world_size: int = 1,
        step: int = 0,
        **trainer: Any,
    ) -> None:
        keys = {"steps": 1, "batch_size": 8, "lr": 1e-3, "output_dir": "outputs/stand-in"}
        self.config = TrainerConfig.model_validate({**keys, **trainer})
        choice = device if device is not None else trainer.get("device", "cpu")
        if isinstance(choice, str) and choice == "auto":
            choice = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(choice)
        self.rank = rank
        self.world_size = world_size
        self.step = step
        self.output_dir = Path(self.config.output_dir)
        self.run_id: str | None = "stand-in"
        self.generator = sampler_generator(self.config.seed, rank)
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.saved: list[str | None] = []
        self.datasets: dict[str, dict[str, Any]] = {}
        self.states: dict[str, Any] = {}
        self._sections = _validated(plugin, dict(sections or {}))

    def save(self, name: str | None = None) -> Path | None:
        self.saved.append(name)
        return None

    def register_state(self, name: str, obj: Any) -> None:
        """Keep ``obj`` under ``name`` in :attr:`states`; a name registered twice is a
        PluginError, as in the loop."""
        if name in self.states:
            raise PluginError(f"checkpoint state {name!r} is registered twice (register_state)")
        self.states[name] = obj

    def close(self) -> None:
        """Close the registered objects that have ``close()`` (a stream's decode threads)."""
        for obj in reversed(self.states.values()):
            if callable(getattr(obj, "close", None)):
                obj.close()

    def build(
        self, plugin: Any, optim: Mapping[str, Any] | None = None, schedule: Any = None
    ) -> nn.Module:
        """Call ``plugin.build_model`` seeded as the loop seeds it; keep the model and give
        it the optimizer and schedule the built-in default makes from the recipe sections
        ``optim`` and ``schedule`` (given as mappings; default Adam, constant)."""
        rng.seed_everything(self.config.seed)
        model = plugin.build_model(trainer=self)
        self.model = model.to(self.device)
        self.optimizer = build_optimizer(
            self.model.parameters(), self.config.lr, OptimSection.model_validate(optim or {})
        )
        self.scheduler = build_schedule(
            self.optimizer, ScheduleSection.model_validate(schedule or {}), self.config.steps
        )
        return self.model


def _validated(plugin: Any, sections: dict[str, Any]) -> dict[str, Any]:
    if plugin is None or not hasattr(plugin, "recipe_sections"):
        return sections
    models: dict[str, type[BaseModel]] = plugin.recipe_sections() or {}
    unknown = sorted(set(sections) - set(models))
    if unknown:
        raise PluginError(f"the plugin owns no section {', '.join(unknown)}")
    out = {}
    for name, model in models.items():
        value = sections.get(name, {})
        out[name] = value if isinstance(value, BaseModel) else model.model_validate(value or {})
    return out


# ---------------------------------------------------------------- exact resume


def assert_tree_equal(a: Any, b: Any, where: str = "") -> None:
    """Exact equality of nested checkpoint data (``torch.equal`` and dtype for tensors)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"tensor vs {type(b).__name__} at {where}"
        assert a.dtype == b.dtype, f"dtypes differ at {where}: {a.dtype} != {b.dtype}"
        assert torch.equal(a, b), f"tensors differ at {where}"
    elif isinstance(a, dict):
        assert isinstance(b, dict), f"dict vs {type(b).__name__} at {where}"
        assert set(a) == set(b), f"keys differ at {where}: {set(a) ^ set(b)}"
        for key in a:
            assert_tree_equal(a[key], b[key], f"{where}.{key}")
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):  # Retention, EmaState
        assert type(a) is type(b), f"{type(a).__name__} vs {type(b).__name__} at {where}"
        for item in dataclasses.fields(a):
            assert_tree_equal(getattr(a, item.name), getattr(b, item.name), f"{where}.{item.name}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)), f"sequence vs {type(b).__name__} at {where}"
        assert len(a) == len(b), f"lengths differ at {where}: {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_tree_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"values differ at {where}: {a!r} != {b!r}"


#: The fields of a :class:`~slhub.checkpoint.Checkpoint` that hold the training state
#: (``run`` is identity, not state).
STATE_FIELDS = ("step", "model", "optimizer", "schedule", "scaler", "ranks", "retention", "ema")


def assert_same_state(expected: Checkpoint, actual: Checkpoint) -> None:
    """Exact equality of two checkpoints' training state (every field of
    :data:`STATE_FIELDS`), naming the first differing path."""
    for name in STATE_FIELDS:
        assert_tree_equal(getattr(expected, name), getattr(actual, name), name)


@dataclass(frozen=True)
class ResumeCheck:
    """The run directories of :func:`check_resume_exact`."""

    uninterrupted: Path
    stopped: Path
    resumed: Path

    def final(self, which: str) -> Checkpoint:
        """The last checkpoint of run ``which`` (``uninterrupted``, ``stopped``, ``resumed``)."""
        return checkpoint.load(checkpoint.files.last_path(getattr(self, which)))

    def metrics_after(self, which: str, step: int) -> list[dict[str, Any]]:
        """Run ``which``'s metrics.jsonl records of updates after ``step``."""
        lines = (getattr(self, which) / "metrics.jsonl").read_text().splitlines()
        return [record for record in map(json.loads, lines) if record["step"] > step]

    def revalidate(
        self, plugin: Any, trainer: StandInTrainer, step: int
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Validate the resumed run's final weights again, outside any loop.

        ``plugin``'s model is built on ``trainer`` (a stand-in holding the run's
        recorded sections), the final checkpoint's weights are loaded (its EMA
        weights where the run averages: what the loop validated) and
        ``validate`` is called as the loop calls it at ``step``. Returns what it
        computes and the validation record the run logged at ``step``: whether the
        checkpoint is the plugin's model and reproduces what the run reported.
        """
        model = trainer.build(plugin)
        model.load_state_dict(self.final("resumed").evaluation_weights)
        with torch.no_grad():
            (metrics,) = hooks_of(plugin).validate(trainer=trainer, model=model.eval(), step=step)
        logged = next(
            (
                record
                for record in self.metrics_after("resumed", step - 1)
                if record["step"] == step and any(key.startswith("validation/") for key in record)
            ),
            None,
        )
        if logged is None:
            raise AssertionError(f"the resumed run logged no validation at update {step}")
        return metrics, logged


#: ``launcher(argv, workers, env, cwd, timeout) -> (exit statuses by rank, stderr)``.
Launcher = Callable[[list[str], int, Mapping[str, str], Path, float], tuple[list[int], str]]


def _command(workers: int) -> list[str]:
    if workers == 1:
        return [sys.executable, "-m", "slhub"]
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
        f"--nproc-per-node={workers}", "-m", "slhub",
    ]  # fmt: skip


#: The environment variable :class:`StopAt` reads: the update to stop the run at.
STOP_AT_ENV = "SLHUB_TESTING_STOP_AT"


class StopAt:
    """An extra plugin (``slhub.testing:StopAt``) that preempts a run at update k.

    After update ``k - 1`` commits, rank 0 sends its own process SIGUSR1 (one of
    the default ``trainer.stop_signals``), so the run stops exactly as a
    preempted job does: every rank finishes update k, ``step_k.pt`` is written
    and the run exits with status 75. ``k`` comes from the environment variable
    ``SLHUB_TESTING_STOP_AT`` (unset: the plugin does nothing), so the stopped
    and the resumed run have the same recipe and plugin set. ``k`` must be >= 2.
    """

    @hookimpl
    def on_commit(self, trainer: Any, step: int) -> None:
        target = int(os.environ.get(STOP_AT_ENV, "0") or 0)
        if target and trainer.rank == 0 and step == target - 1:
            os.kill(os.getpid(), signal.SIGUSR1)


def _train(
    recipe: Path,
    sets: Sequence[str],
    workers: int = 1,
    cwd: Path | None = None,
    env: dict | None = None,
    timeout: float = 300.0,
    resume: Path | None = None,
    in_process: bool = False,
    stop_at: int = 0,
    launcher: Launcher | None = None,
) -> None:
    """One run; with ``stop_at`` it must end preempted at that update."""
    expected = EXIT_PREEMPTED if stop_at else 0
    if in_process:
        from slhub.run import train

        previous = os.environ.get(STOP_AT_ENV)
        os.environ[STOP_AT_ENV] = str(stop_at or "")
        try:
            train(recipe, list(sets), resume=resume)
        except Preempted as exc:
            if not stop_at or exc.step != stop_at:
                raise
            return
        finally:
            if previous is None:
                os.environ.pop(STOP_AT_ENV, None)
            else:
                os.environ[STOP_AT_ENV] = previous
        if stop_at:
            raise AssertionError(f"the run was not preempted at update {stop_at}")
        return
    env = {**(env or os.environ), STOP_AT_ENV: str(stop_at or "")}
    argv = ["train", "--config", str(recipe)]
    for item in sets:
        argv += ["--set", item]
    if resume is not None:
        argv += ["--resume", str(resume)]
    if launcher is not None:
        codes, stderr = launcher(argv, workers, env, cwd or Path.cwd(), timeout)
        ok = codes == [expected] * workers
        args = argv
        code: Any = codes
    else:
        args = [*_command(workers), *argv]
        proc = subprocess.run(
            args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
        code, stderr = proc.returncode, proc.stderr
        if stop_at and workers > 1:  # torchrun reports its workers' 75 as its own failure
            ok = code != 0 and f"stop signal at update {stop_at}:" in stderr
        else:
            ok = code == expected
    if not ok:
        raise AssertionError(f"{' '.join(args)} exited {code}:\n{stderr[-4000:]}")


def check_resume_exact(
    recipe: str | Path,
    *,
    stop_at: int,
    workdir: str | Path,
    workers: int = 1,
    overrides: Sequence[str] = (),
    in_place: bool = False,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
    in_process: bool = False,
    launcher: Launcher | None = None,
) -> ResumeCheck:
    """Train ``recipe`` uninterrupted and stopped-at-``stop_at``-then-resumed; compare.

    Both runs go to ``trainer.steps`` of the recipe (after ``overrides``); the
    recipe is not changed to stop early, so a schedule over ``trainer.steps``
    is the same in both. The stopped run adds the extra plugin :class:`StopAt`,
    is preempted at update ``stop_at`` (>= 2) as a real job would be, and is
    resumed from its ``step_{stop_at}.pt`` into a fresh directory (or, with
    ``in_place``, into its own) with the same plugins. Each run starts fresh
    processes: ``python -m slhub`` for one worker, ``torchrun --standalone
    --nproc-per-node=workers`` otherwise, with ``OMP_NUM_THREADS=1`` and
    ``cwd`` (default: the current directory) on ``PYTHONPATH``. With
    ``in_process`` (one worker only) the three runs call
    :func:`slhub.train` in this process instead: much faster, and exact as
    well, since every run seeds and restores every random stream itself. A
    ``launcher`` replaces how the processes start (a test suite may fork them
    from a warm server): ``launcher(argv, workers, env, cwd, timeout)`` runs
    ``slhub ARGV`` on ``workers`` ranks with torchrun's environment and
    returns ``(exit statuses by rank, stderr)``.

    :raises AssertionError: a run failed, or the final checkpoints differ in
        step, model, optimizer, scheduler or any rank's state (the message
        names the first differing path).
    """
    workdir = Path(workdir).absolute()
    cwd = Path(cwd or os.getcwd()).absolute()
    run_env = dict(os.environ if env is None else env)
    run_env.setdefault("OMP_NUM_THREADS", "1")
    run_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(cwd), run_env.get("PYTHONPATH", "")) if p
    )
    check = ResumeCheck(workdir / "uninterrupted", workdir / "stopped", workdir / "resumed")
    resumed = check.stopped if in_place else check.resumed
    check = ResumeCheck(check.uninterrupted, check.stopped, resumed)
    if stop_at < 2:
        raise ValueError("stop_at must be >= 2 (StopAt signals after update stop_at - 1)")
    recipe = Path(recipe)
    plugins = as_recipe(recipe, list(overrides)).plugins
    base = list(overrides)
    stopping = [*base, f"plugins={json.dumps([*plugins, 'slhub.testing:StopAt'])}"]
    launch: dict[str, Any] = {
        "workers": workers, "cwd": cwd, "env": run_env, "timeout": timeout, "launcher": launcher
    }  # fmt: skip
    if in_process:
        if workers != 1:
            raise ValueError("in_process runs one worker only")
        launch = {"in_process": True}
    _train(recipe, [*base, f"trainer.output_dir={check.uninterrupted}"], **launch)
    _train(recipe, [*stopping, f"trainer.output_dir={check.stopped}"], **launch, stop_at=stop_at)
    _train(recipe, [*stopping, f"trainer.output_dir={resumed}"], **launch,
           resume=check.stopped / checkpoint.step_file(stop_at))  # fmt: skip
    assert_same_state(check.final("uninterrupted"), check.final("resumed"))
    return check


def check_resume_and_revalidate(
    recipe: str | Path,
    plugin: Any,
    *,
    stop_at: int,
    workdir: str | Path,
    rel_tol: float = 1e-6,
    abs_tol: float = 1e-12,
    **resume: Any,
) -> ResumeCheck:
    """:func:`check_resume_exact`, then check that the checkpoint is ``plugin``'s model.

    Why: equal final checkpoints prove that the resumed run continued the
    uninterrupted one, not that the weights are this plugin's model or that the
    validation the run logged is what they compute; every model package's
    example-recipe test needs both, so they live here once. Checked: the final
    checkpoints are at ``trainer.steps`` and ``stop_at``; the run records
    ``plugin``'s class (``module:Class``) as its model plugin, on ``workers``
    ranks, and :class:`StopAt` as its last extra plugin; both runs log the same
    records after ``stop_at``, validating exactly every ``validate_every``
    updates (at least once); and :meth:`ResumeCheck.revalidate`, on a
    :class:`StandInTrainer` holding the run's recorded ``trainer`` keys and
    ``plugin``'s sections, gives the last logged validation: the same metric
    names, each within ``rel_tol``/``abs_tol``. ``resume`` goes to
    :func:`check_resume_exact` (``workers``, ``overrides``, ``cwd``,
    ``in_process``...). Returns its :class:`ResumeCheck`.
    """
    check = check_resume_exact(recipe, stop_at=stop_at, workdir=workdir, **resume)
    final, stopped = check.final("resumed"), check.final("stopped")
    run = final.run
    assert run is not None
    recorded = final.recipe
    config = recorded["trainer"]
    steps, every = config["steps"], config.get("validate_every", 0)
    assert (final.step, stopped.step) == (steps, stop_at), (final.step, stopped.step)
    assert final.world_size == resume.get("workers", 1), final.world_size
    kind = type(plugin)
    plugins = [(p["name"], p["object"], p["role"]) for p in final.plugins]
    model = (recorded["plugin"], f"{kind.__module__}:{kind.__qualname__}", "model")
    stop = ("slhub.testing:StopAt", "slhub.testing:StopAt", "extra")
    names = [recorded["plugin"], *recorded.get("plugins", [])]
    assert [p[0] for p in plugins] == names and plugins[0] == model, plugins
    assert plugins[-1] == stop and all(p[2] == "extra" for p in plugins[1:]), plugins
    later = check.metrics_after("uninterrupted", stop_at)
    assert later == check.metrics_after("resumed", stop_at), "the runs log differently"
    validated = [s for s in range(stop_at + 1, steps + 1) if every and s % every == 0]
    logged_at = [r["step"] for r in later if any(k.startswith("validation/") for k in r)]
    assert logged_at == validated, (logged_at, validated)
    if not validated:
        raise ValueError(f"the recipe validates no update after {stop_at}: nothing to compare")
    declared = plugin.recipe_sections() if hasattr(plugin, "recipe_sections") else {}
    sections = {name: recorded[name] for name in declared or {} if name in recorded}
    trainer = StandInTrainer(plugin, sections, **config)
    metrics, logged = check.revalidate(plugin, trainer, step=validated[-1])
    assert set(logged) == {"step", *(f"validation/{key}" for key in metrics)}, (logged, metrics)
    for key, value in metrics.items():
        expected = logged[f"validation/{key}"]
        tolerance = max(rel_tol * abs(expected), abs_tol)
        assert abs(value - expected) <= tolerance, f"validation/{key}: {value} != {expected}"
    return check
