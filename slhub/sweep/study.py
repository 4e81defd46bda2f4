"""The sweep's loop: its Optuna study, trial after trial, until the budget is met.

Everything a trial's values and fate depend on is in the study's storage, never in
the sweep's process, so a killed sweep rerun with the same command ends with the
trials an uninterrupted one has:

- the sampler is built afresh before each new trial, seeded with ``seed + number``:
  trial N's values depend on the seed, N and the finished trials stored, not on
  what the process drew before;
- each validation value is reported in step order, and the pruner decides from the
  stored values alone;
- a trial the study holds as running (its sweep was killed) is run again with
  ``--resume auto`` in its directory, with its stored values: it continues from
  its last checkpoint, and its result is told to the same trial number.

One sweep process runs a study at a time: it holds a lock in the output directory,
which its trials inherit, so a rerun while a killed sweep's trial still runs is
refused instead of racing it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
from pathlib import Path
from types import FrameType
from typing import Any

from slhub.errors import SlhubError, shown
from slhub.sweep.spec import Sweep, SweepError, SweepFile
from slhub.sweep.trial import VALIDATION, final_value, last_line, run_trial, train_command

#: Exit status of a sweep stopped by SIGTERM: rerun the same command to continue.
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130
LOCK_FILE = ".sweep.lock"
#: Which study an output directory's trials belong to.
OWNER_FILE = "sweep.json"
#: The study's record of the sweep it runs (a rerun must be the same sweep).
DEFINITION_ATTR = "slhub_sweep"
FINISHED = ("COMPLETE", "PRUNED", "FAIL")


class SweepStopped(SlhubError):
    """A stop signal ended the sweep between reports; the trial checkpointed."""

    exit_code = EXIT_PREEMPTED


def trial_dir(sweep: Sweep, number: int) -> Path:
    return sweep.output_dir / f"trial_{number:03d}"


def definition(sweep: Sweep, recipe_digest: str) -> dict[str, Any]:
    """What makes two runs of a sweep the same sweep (the trial budget may change)."""
    spec = sweep.spec
    return json.loads(
        json.dumps(
            {
                "recipe_digest": recipe_digest,
                "set": spec.set,
                "space": {k: v.model_dump(exclude_unset=True) for k, v in spec.space.items()},
                "objective": spec.objective.model_dump(),
                "seed": spec.seed,
                "sampler": spec.sampler.model_dump(),
                "pruner": spec.pruner.model_dump(),
                "workers": spec.workers,
            },
            sort_keys=True,
            default=str,
        )
    )


def import_optuna() -> Any:
    """optuna, or one line naming the extra that installs it."""
    try:
        import optuna
    except ImportError:
        raise SweepError(
            "slhub sweep needs optuna, which is not installed: pip install 'slhub[sweep]'"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_storage(sweep: Sweep) -> Any:
    optuna = import_optuna()
    try:
        return optuna.storages.RDBStorage(sweep.storage)
    except Exception as exc:  # noqa: BLE001 - a URL or database a user gave
        raise SweepError(
            f"{sweep.path}: storage {shown(sweep.storage)}: cannot open ({shown(str(exc), 200)})"
        ) from None


def load_study(sweep: Sweep) -> Any:
    """The sweep's existing study, or one line saying how to start it."""
    optuna = import_optuna()
    if sweep.default_storage and not (sweep.output_dir / "study.db").is_file():
        raise SweepError(
            f"{sweep.output_dir}: no sweep here yet; run: slhub sweep --config {sweep.path}"
        )
    storage = open_storage(sweep)
    try:
        return optuna.load_study(study_name=sweep.study, storage=storage)
    except KeyError:
        raise SweepError(
            f"{sweep.storage}: holds no study {sweep.study}; run: slhub sweep --config {sweep.path}"
        ) from None


def sampler(spec: SweepFile, number: int) -> Any:
    """The sampler that draws trial ``number``: a fresh one seeded with ``seed + number``,
    so its draws depend on the stored trials alone."""
    samplers = import_optuna().samplers
    seed = (spec.seed + number) % 2**32
    if spec.sampler.name == "random":
        return samplers.RandomSampler(seed=seed)
    return samplers.TPESampler(seed=seed, n_startup_trials=spec.sampler.n_startup_trials)


def ask(study: Any, spec: SweepFile, distributions: dict[str, Any]) -> Any:
    """A new trial of ``study`` with every value of the space drawn."""
    study.sampler = sampler(spec, len(study.get_trials(deepcopy=False)))
    return study.ask(distributions)


class _Lock:
    """The sweep's exclusive lock on its output directory (inherited by its trials)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_FILE
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise SweepError(
                f"{folder}: another sweep, or a trial of a killed one, still runs here; "
                "wait for it to end or stop it"
            ) from None

    def release(self) -> None:
        os.close(self.fd)


class SweepRun:
    """One invocation of ``slhub sweep`` on a validated sweep."""

    def __init__(self, sweep: Sweep, recipe_digest: str) -> None:
        self.sweep = sweep
        self.definition = definition(sweep, recipe_digest)
        self.optuna = import_optuna()
        self.created_dir = False
        self.created_db = False
        self.created_study = False
        self._stop: int | None = None
        self._lock_fd: int | None = None
        self.storage: Any = None

    # ------------------------------------------------------------ the study

    def _open(self) -> Any:
        sweep = self.sweep
        db = sweep.output_dir / "study.db"
        self.created_db = sweep.default_storage and not db.exists()
        self.storage = storage = open_storage(sweep)
        optuna = self.optuna
        try:
            study = optuna.load_study(study_name=sweep.study, storage=storage)
        except KeyError:
            study = optuna.create_study(
                study_name=sweep.study,
                storage=storage,
                direction=sweep.spec.objective.direction,
            )
            study.set_user_attr(DEFINITION_ATTR, self.definition)
            self.created_study = True
        stored = study.user_attrs.get(DEFINITION_ATTR)
        if stored != self.definition:
            differ = sorted(
                k for k in set(self.definition) | set(stored or {})
                if (stored or {}).get(k) != self.definition.get(k)
            )  # fmt: skip
            raise SweepError(
                f"{sweep.path}: study {sweep.study} in {sweep.storage} runs another sweep "
                f"({', '.join(differ)} differ); restore the sweep file and recipe, or choose "
                "another study name or output_dir"
            )
        study.pruner = sweep.spec.pruner.build()
        return study

    # ------------------------------------------------------------ running

    def run(self) -> int:
        """Run trials until the budget is met; returns the exit status (0)."""
        sweep = self.sweep
        self.created_dir = not sweep.output_dir.exists()
        try:
            sweep.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SweepError(
                f"{sweep.output_dir}: cannot create the sweep's output_dir ({exc})"
            ) from None
        lock = _Lock(sweep.output_dir)
        self._lock_fd = lock.fd
        previous = signal.signal(signal.SIGTERM, self._on_stop)
        try:
            owner = self._check_owner()
            study = self._open()
            if owner is None:
                _write_owner(sweep)
            distributions = {k: p.distribution() for k, p in sweep.spec.space.items()}
            for frozen in study.get_trials(deepcopy=False):
                if frozen.state.name != "RUNNING":
                    continue
                if set(frozen.params) != set(distributions):  # killed while it was asked
                    study.tell(frozen.number, state=self.optuna.trial.TrialState.FAIL)
                    print(f"trial {frozen.number} failed (its values were not all drawn)")
                    continue
                self._run(study, frozen.number, frozen.params, resumed=True)
            while self._finished(study) < sweep.spec.trials:
                trial = ask(study, sweep.spec, distributions)
                trial.set_user_attr("dir", str(trial_dir(sweep, trial.number)))
                self._run(study, trial.number, trial.params, resumed=False)
        finally:
            signal.signal(signal.SIGTERM, previous)
            lock.release()
        print(
            f"sweep {sweep.study}: {sweep.spec.trials} trials done; the summary: "
            f"slhub sweep --config {sweep.path} --summary"
        )
        return 0

    def _check_owner(self) -> dict[str, Any] | None:
        """The output directory's record of its study: it must be this sweep's study, and
        a directory without one must hold no trials (another sweep's or a user's)."""
        sweep = self.sweep
        path = sweep.output_dir / OWNER_FILE
        try:
            owner = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            if any(p.name.startswith("trial_") for p in sweep.output_dir.iterdir()):
                raise SweepError(
                    f"{sweep.output_dir}: holds trial folders but no {OWNER_FILE}: not this "
                    "sweep's output_dir; choose another"
                ) from None
            return None
        except (OSError, ValueError) as exc:
            raise SweepError(f"{path}: unreadable ({exc})") from None
        if owner != _owner(sweep):
            raise SweepError(
                f"{sweep.output_dir}: holds the trials of study {owner.get('study')!r} "
                f"(storage {owner.get('storage') or 'study.db there'}), not {sweep.study!r}; "
                "choose another output_dir, or the study name and storage that own it"
            )
        return owner

    def _finished(self, study: Any) -> int:
        return sum(t.state.name in FINISHED for t in study.get_trials(deepcopy=False))

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop = signum

    def _stopped(self, where: str) -> SweepStopped:
        why = f"signal {self._stop}" if self._stop is not None else "a stop signal"
        return SweepStopped(
            f"sweep stopped by {why} {where}; rerun the same command to continue: "
            f"slhub sweep --config {self.sweep.path}"
        )

    def _run(self, study: Any, number: int, params: dict[str, Any], *, resumed: bool) -> None:
        sweep = self.sweep
        if self._stop is not None:
            raise self._stopped(f"before trial {number}")
        run_dir = trial_dir(sweep, number)
        shown_params = ", ".join(f"{k}={v!r}" for k, v in params.items())
        verb = "resumed" if resumed else "started"
        print(f"trial {number} {verb} ({shown_params}): {run_dir}", flush=True)
        command = train_command(sweep.recipe, sweep.overrides(params), run_dir, sweep.spec.workers)
        reporter = _Reporter(study, self.storage, number)
        metric = sweep.spec.objective.metric
        outcome = run_trial(
            command, run_dir, metric, reporter.report,
            check_metric=not reporter.metric_seen(), keep_fds=(self._lock_fd,),
        )  # fmt: skip
        if outcome.missing is not None:
            self._refuse_metric(study, number, run_dir, outcome.missing)
        if outcome.status == EXIT_INTERRUPTED:
            raise KeyboardInterrupt  # Ctrl-C reached the trial: the sweep ends as it does
        if outcome.status == EXIT_PREEMPTED:  # not pruned: the trial got a stop signal
            raise self._stopped(f"in trial {number} (its checkpoint is written)")
        state = self.optuna.trial.TrialState
        if outcome.pruned:
            frozen = study.tell(number, state=state.PRUNED)
            print(f"trial {number} pruned at update {frozen.last_step}", flush=True)
            return
        final = final_value(run_dir, metric) if outcome.status == 0 else None
        if final is None:
            why = (
                f"exit {outcome.status}: {last_line(run_dir)}"
                if outcome.status
                else f"{metric} was never logged"
            )
            study.tell(number, state=state.FAIL)
            print(f"trial {number} failed ({shown(why, 300)})", flush=True)
            return
        step, value = final
        study.tell(number, value)
        print(f"trial {number} complete: {metric}={value!r} at update {step}", flush=True)

    def _refuse_metric(
        self, study: Any, number: int, run_dir: Path, record: dict[str, Any]
    ) -> None:
        """The objective's metric is not among the trial's validation metrics: stop, and
        when this sweep began now, take back all it made (no study, no run)."""
        sweep = self.sweep
        logged = sorted(k for k in record if k.startswith(VALIDATION))
        message = (
            f"{sweep.path}: objective.metric: {sweep.spec.objective.metric} is never logged; "
            f"the recipe's validation logs {', '.join(logged) or 'nothing'}"
        )
        first = len(study.get_trials(deepcopy=False)) == 1
        if self.created_study and first:
            self.optuna.delete_study(study_name=sweep.study, storage=self.storage)
            shutil.rmtree(run_dir, ignore_errors=True)
            (sweep.output_dir / OWNER_FILE).unlink(missing_ok=True)
            if self.created_db:
                (sweep.output_dir / "study.db").unlink(missing_ok=True)
            if self.created_dir:
                (sweep.output_dir / LOCK_FILE).unlink(missing_ok=True)
                _remove_empty(sweep.output_dir)
            raise SweepError(message + " (the sweep was not started)")
        raise SweepError(message + f" (trial {number} stopped)")


def _owner(sweep: Sweep) -> dict[str, Any]:
    return {"study": sweep.study, "storage": sweep.spec.storage}


def _write_owner(sweep: Sweep) -> None:
    from slhub.atomic import atomic_write

    try:
        atomic_write(json.dumps(_owner(sweep)) + "\n", sweep.output_dir / OWNER_FILE)
    except OSError as exc:
        raise SweepError(f"{sweep.output_dir}: cannot write {OWNER_FILE} ({exc})") from None


def _remove_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


class _Reporter:
    """Reports a trial's validation values to the study and asks the pruner, through the
    storage's public API: the trial may have been asked by a sweep process since killed."""

    def __init__(self, study: Any, storage: Any, number: int) -> None:
        self.study = study
        self.storage = storage
        study_id = storage.get_study_id_from_name(study.study_name)
        self.trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)

    def metric_seen(self) -> bool:
        """Whether any trial of the study reported a value: then the metric is logged."""
        return any(t.intermediate_values for t in self.study.get_trials(deepcopy=False))

    def report(self, step: int, value: float) -> bool:
        """Store ``value`` at ``step`` (once: a resumed trial logs the updates after its
        checkpoint again, with the same values) and return the pruner's word."""
        trial = self.storage.get_trial(self.trial_id)
        if step not in trial.intermediate_values:
            self.storage.set_trial_intermediate_value(self.trial_id, step, value)
            trial = self.storage.get_trial(self.trial_id)
        return bool(self.study.pruner.prune(self.study, trial))
