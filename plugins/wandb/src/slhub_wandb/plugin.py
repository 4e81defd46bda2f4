"""The ``wandb`` extra plugin: rank 0 mirrors metrics.jsonl into one W&B run per slhub run.

metrics.jsonl is the run's source of truth; this plugin only mirrors it. At its
first metrics line rank 0 starts a mirror process (:mod:`slhub_wandb.mirror`) that
follows the file and logs every line as it is (every key but ``step``) at W&B step
= the line's ``step``, so an update line and the validation line of the same update
share one W&B row. Training processes never import ``wandb``: an update costs what
it costs without the plugin, and W&B's work runs beside it.

One W&B run per slhub run. The W&B run id is slhub's ``run_id``, which a resume in
place keeps and a resume into a fresh directory replaces: the first continues the
same W&B run (``resume="allow"``), the second starts a new one whose config names
its parent (run.json's ``resumed_from``).

Never an update twice. After a resume in place from update k, the W&B run already
holds every line an earlier process logged, up to some update m >= k (a crash
between checkpoints). Those are exactly the metrics.jsonl lines written before
this process's resume marker, so the plugin reads them at its first line and skips
every line with a step <= m: slhub resumes exactly, so a skipped line equals the
one W&B holds, and W&B keeps steps increasing. What the W&B run shows is then the
effective history of metrics.jsonl (``slhub.read_metrics``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import structlog
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from slhub import SlhubError, Trainer, hookimpl, unwritable_reason

from slhub_wandb.mirror import (
    Closing,
    MirrorSpec,
    current_cpu,
    mirror_cpus,
    update_thread_cpus,
)

if importlib.util.find_spec("wandb") is None:  # fail when the plugin loads, not mid-run
    raise ImportError(
        "the wandb package is not installed: pip install wandb (or pip install slhub-wandb)"
    )

#: The recipe section this plugin owns (optional: every key has a default).
SECTION = "wandb"
#: Where slhub writes a run's identity and its metrics history.
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
#: What a resume marker in metrics.jsonl holds as ``event``.
RESUME_EVENT = "resume"
#: The history key that marks the first row a resumed process logs: the update it resumed from.
RESUME_KEY = "slhub/resume"
#: The W&B exit code of each ``on_fit_end`` status (75: slhub's exit status when preempted).
EXIT_CODES = {"done": 0, "preempted": 75, "failed": 1}
#: The longest wait for a W&B run folder name no earlier process of this run holds.
MAX_NAME_WAIT_S = 2.0
#: The longest wait, when the run ends, for the mirror to log its last lines and finish.
MAX_FINISH_WAIT_S = 600.0

LOG = structlog.get_logger("slhub")


class WandbSection(BaseModel):
    """``wandb:`` in a recipe; omitted, the defaults apply."""

    model_config = ConfigDict(extra="forbid")

    #: The W&B project (and entity: a user or team; None: the logged-in default).
    project: str = Field(default="slhub", min_length=1)
    entity: str | None = None
    #: Group and tags of the W&B run, as W&B shows them.
    group: str | None = None
    tags: list[str] = Field(default_factory=list)
    #: ``offline`` writes the run under ``dir`` only (``wandb sync`` uploads it later);
    #: ``disabled`` logs nothing.
    mode: Literal["online", "offline", "disabled"] = "online"
    #: Where W&B keeps its files (``<dir>/wandb/``); relative to ``trainer.output_dir``.
    dir: str = Field(default=".", min_length=1)

    @field_validator("dir")
    @classmethod
    def _home(cls, value: str) -> str:
        """``~`` is the user's home, as in a shell, never a directory named ``~``."""
        return os.path.expanduser(value)


def dir_of(trainer: Trainer) -> Path:
    """Where W&B keeps its files: ``wandb.dir``, relative to the output directory."""
    return Path(trainer.output_dir) / trainer.section(SECTION).dir


def check_writable(folder: Path) -> None:
    """Refuse, in one line naming ``wandb.dir``, a directory that could not be made or
    written: it, or the nearest folder of it that exists, must be a writable directory."""
    problem = unwritable_reason(folder)
    if problem is not None:
        raise SlhubError(
            f"{SECTION}.dir: cannot write W&B files into {folder}: {problem}; "
            "choose a writable directory"
        )


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every readable line of a metrics.jsonl, markers included, superseded ones too
    (a torn line, which a kill can leave, is skipped)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
    return records


def already_logged(records: list[dict[str, Any]], first_step: int) -> int:
    """The last step an earlier process of this run logged (0: none).

    A process resumed in place from update k appended the marker ``step = k`` just
    before its first line (step k + 1); every line before that marker was logged
    by an earlier process. Without that marker this process is the run's first.
    """
    for i in range(len(records) - 1, -1, -1):
        if records[i].get("event") == RESUME_EVENT:
            if records[i]["step"] != first_step - 1:
                return 0
            return max(
                (r["step"] for r in records[:i] if r.get("event") != RESUME_EVENT), default=0
            )
    return 0


def run_config(identity: dict[str, Any]) -> dict[str, Any]:
    """The W&B config: the recipe, and under ``slhub`` run.json's identity."""
    keys = ("run_id", "recipe_digest", "world_size", "source", "datasets", "resumed_from")
    slhub_part = {key: identity[key] for key in keys if identity.get(key) is not None}
    parent = identity.get("resumed_from") or {}
    if parent.get("run_id"):
        slhub_part["parent"] = parent["run_id"]
    return {**identity.get("recipe", {}), "slhub": slhub_part}


def wait_for_free_name(folder: Path, run_id: str, limit_s: float = MAX_NAME_WAIT_S) -> bool:
    """Wait (at most ``limit_s``) until W&B's folder for this run, named after the
    second it starts in, is not one an earlier process of the run already wrote
    (a resume within the second of a crash would write into it)."""
    deadline = time.monotonic() + limit_s
    while any((folder / "wandb").glob(f"*run-{time.strftime('%Y%m%d_%H%M%S')}-{run_id}")):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def cpus_for_the_mirror() -> set[int]:
    """The CPUs the mirror keeps to (:func:`~slhub_wandb.mirror.mirror_cpus`): not the
    one the calling (update) thread runs on, where it may use several; none where the
    platform has no CPU affinity."""
    if not hasattr(os, "sched_getaffinity"):
        return set()
    return mirror_cpus(os.sched_getaffinity(0), current_cpu())


def keep_off_the_mirror(mirror: set[int]) -> set[int] | None:
    """Keep the calling (update) thread off the ``mirror``'s CPUs where it has CPUs to
    spare (:func:`~slhub_wandb.mirror.update_thread_cpus`); the CPUs it had, or None
    where it keeps them all. Threads started before (torch's compute threads, data
    workers) keep theirs; threads it starts afterwards inherit its CPUs."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    cpus = update_thread_cpus(allowed, torch.get_num_threads(), mirror)
    if cpus is None:
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return None
    return allowed


def restore_cpus(cpus: set[int]) -> None:
    """Give the calling thread back the CPUs it had (a sweep's next trial starts its
    own mirror from here)."""
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        pass


class WandbLogger:
    """Mirrors rank 0's metrics lines into W&B (one instance per run)."""

    def __init__(self) -> None:
        #: The mirror process of this slhub process (rank 0, from its first metrics line).
        self.mirror: subprocess.Popen[str] | None = None
        #: The update thread's CPUs before it kept off the mirror's (None: it did not).
        self.update_cpus: set[int] | None = None

    @hookimpl
    def recipe_sections(self) -> dict[str, type[BaseModel]]:
        return {SECTION: WandbSection}

    @hookimpl
    def admit(self, trainer: Trainer) -> None:
        """Rank 0 refuses a ``dir`` it could not write before the run writes anything:
        the W&B run starts only at the first metrics line, too late for one line."""
        if trainer.is_main and trainer.section(SECTION).mode != "disabled":
            check_writable(dir_of(trainer))

    @hookimpl
    def on_log(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        """Start the mirror at rank 0's first line; it reads every line from the file."""
        if self.mirror is None and trainer.is_main:
            if trainer.section(SECTION).mode != "disabled":
                cpus = cpus_for_the_mirror()
                self.mirror = self._start(trainer, step, cpus)
                self.update_cpus = keep_off_the_mirror(cpus)

    @hookimpl
    def on_fit_end(self, trainer: Trainer, status: str) -> None:
        """Hand the mirror how the run ended (``slhub/status``: done, preempted or
        failed, at ``slhub/step``, and the matching W&B exit code) and wait until it
        has logged every line and finished the W&B run."""
        if self.update_cpus is not None:
            restore_cpus(self.update_cpus)
            self.update_cpus = None
        if self.mirror is None:
            return
        mirror, self.mirror = self.mirror, None
        closing = Closing(status, trainer.step, EXIT_CODES.get(status, 1))
        try:
            assert mirror.stdin is not None
            mirror.stdin.write(closing.to_line())
            mirror.stdin.close()
        except OSError:
            pass  # the mirror is gone already: its exit status says why
        try:
            code = mirror.wait(timeout=MAX_FINISH_WAIT_S)
        except subprocess.TimeoutExpired:
            LOG.warning("W&B mirror still running; it finishes by itself", pid=mirror.pid)
            return
        if code != 0:
            LOG.warning("W&B mirror failed; metrics.jsonl holds every line", exit_code=code)

    def _start(self, trainer: Trainer, first_step: int, cpus: set[int]) -> subprocess.Popen[str]:
        """Start the mirror, kept to ``cpus``, that logs this process's lines into the
        run's W&B run."""
        section: WandbSection = trainer.section(SECTION)
        output_dir = Path(trainer.output_dir)
        identity = json.loads((output_dir / RUN_FILE).read_text(encoding="utf-8"))
        records = read_records(output_dir / METRICS_FILE)
        markers = [r for r in records if r.get("event") == RESUME_EVENT]
        first_row = {}
        if markers and markers[-1]["step"] == first_step - 1:
            first_row = {RESUME_KEY: markers[-1]["step"]}
        folder = dir_of(trainer)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SlhubError(
                f"{SECTION}.dir: cannot create {folder} ({exc.strerror or exc})"
            ) from None
        run_id = trainer.run_id or identity["run_id"]
        if not wait_for_free_name(folder, run_id):
            LOG.warning("W&B run folder of this second exists (clock behind)", dir=str(folder))
        parent = identity.get("resumed_from") or {}
        notes = None
        if parent.get("run_id"):
            notes = f"resumed from run {parent['run_id']} at update {parent.get('step')}"
        spec = MirrorSpec(
            metrics=str(output_dir / METRICS_FILE),
            skip_through=already_logged(records, first_step),
            first_row=first_row,
            init={
                "id": run_id,
                "resume": "allow",
                "project": section.project,
                "entity": section.entity,
                "group": section.group,
                "tags": section.tags or None,
                "mode": section.mode,
                "dir": str(folder),
                "name": output_dir.name,
                "notes": notes,
            },
            config=run_config(identity),
            summary={
                "slhub/resumes": [
                    {"step": m["step"], "checkpoint": m.get("checkpoint")} for m in markers
                ]
            },
            cpus=sorted(cpus),
        )
        package_root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        # W&B's reports on itself (error and usage telemetry) cost the mirror CPU on
        # every line; a user who sets the variable keeps them.
        env.setdefault("WANDB_ERROR_REPORTING", "false")
        process = subprocess.Popen(
            [sys.executable, "-m", "slhub_wandb.mirror"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            text=True,
            start_new_session=True,  # a signal to the job's process group leaves it running
        )
        assert process.stdin is not None
        process.stdin.write(spec.to_line())
        process.stdin.flush()
        return process
