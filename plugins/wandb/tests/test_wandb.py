"""The wandb plugin, through real runs of the sl_ddp example with W&B offline.

The W&B run is read back from its offline files (``wandb_files``: the records
``wandb sync`` would upload); what it shows must be the effective history of the
run's metrics.jsonl, as ``slhub.read_metrics`` returns it: every key and value of
every line at its step (an update line and that update's validation line share one
W&B row), no step logged twice, across every process that logged into the run.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import slhub
from helpers import TESTS, run_cli, run_torchrun
from slhub import SlhubError, hookimpl, read_metrics
from slhub.testing import STOP_AT_ENV, StandInTrainer, hooks_of

from slhub_wandb.plugin import RESUME_KEY, WandbLogger, already_logged, read_records
from wandb_files import config, history, of_type, run_files, summary

#: The slhub repository this package lives in: its examples/ hold the recipe.
REPO = Path(__file__).resolve().parents[3]
#: This folder: the torchrun workers import the rank spy from it.
HERE = Path(__file__).resolve().parent
RECIPE = REPO / "examples" / "sl_ddp" / "cpu.yaml"
STEPS = 20
#: Validation every 5 updates and checkpoints at 10 and 20.
OVERRIDES = [
    f"trainer.steps={STEPS}",
    "trainer.validate_every=5",
    "trainer.save_every=10",
    "data.train_size=256",
    "data.validation_size=64",
    "wandb.mode=offline",
    "wandb.project=slhub-tests",
    'wandb.tags=["ci"]',
]


class CrashAt:
    """Fails update ``step`` after it is computed (None: never), as a crash between
    checkpoints would: the lines of the updates before it are already logged."""

    def __init__(self, step: int | None = None) -> None:
        self.step = step

    @hookimpl
    def on_commit(self, step: int) -> None:
        if step == self.step:
            raise RuntimeError(f"injected crash at update {step}")


class SigtermAt:
    """Sends this process SIGTERM after update ``step - 1`` commits (None: never), as a
    scheduler preempting the job does; the run stops at update ``step``."""

    def __init__(self, step: int | None = None) -> None:
        self.step = step

    @hookimpl
    def on_commit(self, step: int) -> None:
        if self.step is not None and step == self.step - 1:
            os.kill(os.getpid(), signal.SIGTERM)


def train(out: Path, *extra: str, plugins: list[Any] | None = None, **kwargs: Any) -> Path:
    """One in-process run of the recipe into ``out`` with the wandb plugin."""
    overrides = [*OVERRIDES, *extra, f"trainer.output_dir={out}"]
    if plugins is None:
        overrides.append('plugins=["wandb"]')  # as a recipe lists it
    return slhub.train(RECIPE, overrides, plugins=plugins, **kwargs)


def run_id(run: Path) -> str:
    return json.loads((run / "run.json").read_text())["run_id"]


def shown(run: Path) -> dict[int, dict[str, Any]]:
    """What the W&B run of ``run`` shows, over every process that logged into it:
    ``step -> row`` (the resume key apart), each step from one process only."""
    rows: dict[int, dict[str, Any]] = {}
    for path in run_files(run, run_id(run)):
        for step, row in history(path):
            assert step not in rows, f"step {step} logged twice ({path})"
            rows[step] = {key: value for key, value in row.items() if key != RESUME_KEY}
    return rows


def expected(run: Path) -> dict[int, dict[str, Any]]:
    """The effective history of the run's metrics.jsonl, merged by step."""
    rows: dict[int, dict[str, Any]] = {}
    for line in read_metrics(run / "metrics.jsonl"):
        rows.setdefault(line["step"], {}).update(
            {key: value for key, value in line.items() if key != "step"}
        )
    return rows


def resume_rows(run: Path) -> list[tuple[int, int]]:
    """``(step, resumed from)`` of every row that carries the resume key."""
    return [
        (step, row[RESUME_KEY])
        for path in run_files(run, run_id(run))
        for step, row in history(path)
        if RESUME_KEY in row
    ]


def exit_code(path: Path) -> int:
    [record] = of_type(path, "exit")
    return record.exit_code


@pytest.fixture(scope="module")
def importable_examples(offline_wandb):
    """The recipe names ``examples.sl_ddp.plugin:SlDdpPlugin``: importable from the repository."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO))
        patch.setenv("OMP_NUM_THREADS", "1")
        yield


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, importable_examples) -> Path:
    """A whole run, shared by the tests that compare against it."""
    return train(tmp_path_factory.mktemp("wandb") / "uninterrupted")


def test_the_run_shows_the_metrics_history_with_the_recipe_as_config(uninterrupted: Path):
    [path] = run_files(uninterrupted, run_id(uninterrupted))
    rows = shown(uninterrupted)
    assert rows == expected(uninterrupted)
    assert sorted(rows) == list(range(1, STEPS + 1))
    assert {"train/loss", "train/lr", "validation/mse"} <= set(rows[5])
    identity = json.loads((uninterrupted / "run.json").read_text())
    logged = config(path)
    assert {key: logged[key] for key in identity["recipe"]} == identity["recipe"]
    assert logged["slhub"]["run_id"] == identity["run_id"]
    assert logged["slhub"]["recipe_digest"] == identity["recipe_digest"]
    assert logged["slhub"]["source"] == identity["source"]
    assert "parent" not in logged["slhub"]
    [run] = of_type(path, "run")
    assert (run.run_id, run.project, list(run.tags)) == (identity["run_id"], "slhub-tests", ["ci"])
    assert summary(path)["slhub/status"] == "done"
    assert summary(path)["slhub/step"] == STEPS
    assert exit_code(path) == 0
    assert resume_rows(uninterrupted) == []


@pytest.mark.parametrize("interruption", ["sigterm", "crash"])
def test_a_resume_in_place_continues_the_run_and_logs_each_update_once(
    interruption: str, uninterrupted: Path, tmp_path: Path
):
    run = tmp_path / "run"
    if interruption == "sigterm":  # preempted at update 13: step_13.pt written, resumed from it
        with pytest.raises(SlhubError, match="preempted by a stop signal at update 13"):
            train(run, plugins=["wandb", SigtermAt(13)])
        plugins: list[Any] = ["wandb", SigtermAt()]
        resumed_from, status, code = 13, "preempted", 75
    else:  # crashed in update 17: 11..16 and validation 15 logged, redone from step_10.pt
        with pytest.raises(SlhubError, match="injected crash at update 17"):
            train(run, plugins=["wandb", CrashAt(17)])
        plugins = ["wandb", CrashAt()]
        resumed_from, status, code = 10, "failed", 1
    first = run_files(run, run_id(run))
    train(run, plugins=plugins, resume="auto")

    files = run_files(run, run_id(run))
    assert len(files) == 2 and files[0] == first[0]  # one W&B run, two processes
    assert (summary(files[0])["slhub/status"], exit_code(files[0])) == (status, code)
    assert (summary(files[1])["slhub/status"], exit_code(files[1])) == ("done", 0)
    rows = shown(run)
    assert rows == expected(run)
    assert rows == expected(uninterrupted)  # the same steps and values as without interruption
    last_before = max(step for step, _ in history(files[0]))
    assert min(step for step, _ in history(files[1])) == last_before + 1
    assert resume_rows(run) == [(last_before + 1, resumed_from)]
    assert summary(files[1])["slhub/resumes"][0]["step"] == resumed_from


def test_a_resume_into_a_fresh_directory_starts_a_run_naming_its_parent(
    uninterrupted: Path, tmp_path: Path
):
    fresh = tmp_path / "fresh"
    train(fresh, resume=str(uninterrupted / "step_10.pt"))
    parent = run_id(uninterrupted)
    assert run_id(fresh) != parent
    [path] = run_files(fresh, run_id(fresh))
    rows = shown(fresh)
    assert sorted(rows) == list(range(11, STEPS + 1))
    assert rows == expected(fresh)
    assert rows == {step: row for step, row in expected(uninterrupted).items() if step > 10}
    assert config(path)["slhub"]["parent"] == parent
    assert config(path)["slhub"]["resumed_from"]["step"] == 10
    [run] = of_type(path, "run")
    assert parent in run.notes


def test_already_logged_reads_the_lines_before_this_process_marker(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": s, "train/loss": 1.0} for s in range(1, 7)]
    marker = {"step": 4, "event": "resume", "checkpoint": "step_4.pt"}
    path.write_text("".join(json.dumps(r) + "\n" for r in [*lines, marker]) + '{"step": 5, "tr')
    records = read_records(path)  # the torn last line is left out
    assert already_logged(records, first_step=5) == 6
    assert already_logged(records[:6], first_step=1) == 0  # a fresh run
    assert already_logged(records, first_step=8) == 0  # a marker of another process


def test_only_rank_0_starts_a_mirror_that_finishes_with_the_run(tmp_path: Path, offline_wandb):
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "standin", "recipe": {}}))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 2.0}) + "\n")
    section = {"wandb": {"mode": "offline", "project": "slhub-tests"}}
    for rank in (1, 0):
        plugin = WandbLogger()
        trainer = StandInTrainer(plugin, section, rank=rank, output_dir=str(tmp_path))
        hooks = hooks_of(plugin)
        hooks.admit(trainer=trainer)
        hooks.on_log(trainer=trainer, step=1, metrics={"step": 1, "train/loss": 2.0})
        assert (plugin.mirror is not None) == (rank == 0)
        mirror = plugin.mirror
        hooks.on_fit_end(trainer=trainer, status="done")
        assert plugin.mirror is None
        if mirror is not None:
            assert mirror.returncode == 0  # finished, not left running
    [path] = run_files(tmp_path, trainer.run_id)
    assert history(path) == [(1, {"train/loss": 2.0})]
    assert summary(path)["slhub/status"] == "done"


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc/PID/environ")
@pytest.mark.parametrize(("user_setting", "mirror_sees"), [(None, "false"), ("true", "true")])
def test_the_mirror_starts_wandb_without_its_telemetry_unless_the_user_set_it(
    tmp_path: Path, offline_wandb, monkeypatch, user_setting, mirror_sees
):
    if user_setting is None:
        monkeypatch.delenv("WANDB_ERROR_REPORTING", raising=False)
    else:
        monkeypatch.setenv("WANDB_ERROR_REPORTING", user_setting)
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "quiet", "recipe": {}}))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 2.0}) + "\n")
    plugin = WandbLogger()
    section = {"wandb": {"mode": "offline", "project": "slhub-tests"}}
    trainer = StandInTrainer(plugin, section, rank=0, output_dir=str(tmp_path))
    hooks = hooks_of(plugin)
    hooks.on_log(trainer=trainer, step=1, metrics={"step": 1, "train/loss": 2.0})
    assert plugin.mirror is not None
    environ = environment_of(plugin.mirror.pid)
    hooks.on_fit_end(trainer=trainer, status="done")
    assert f"WANDB_ERROR_REPORTING={mirror_sees}".encode() in environ


def environment_of(pid: int, limit_s: float = 10.0) -> list[bytes]:
    """The environment a started process runs with, from /proc/PID/environ.

    Popen returns once the child has begun its exec, which can be before the kernel
    has laid out the new program's environment; until then the file reads empty."""
    deadline = time.monotonic() + limit_s
    while True:
        text = Path(f"/proc/{pid}/environ").read_bytes()
        if text or time.monotonic() > deadline:
            return text.split(b"\0")
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("wandb.colour=blue", "colour"),
        ("wandb.mode=sometimes", "wandb.mode"),
    ],
)
def test_a_bad_wandb_section_is_one_line_and_no_artifact(
    tmp_path: Path, offline_wandb, setting: str, message: str
):
    out = tmp_path / "out"
    sets = [*OVERRIDES, f"trainer.output_dir={out}", 'plugins=["wandb"]', setting]
    proc = run_cli("train", "--config", str(RECIPE), *(a for s in sets for a in ("--set", s)),
                   env=offline_wandb)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("slhub: error: ") and message in line, line
    assert not out.exists()


@pytest.mark.slow
def test_two_gloo_workers_preempted_and_resumed_in_place(tmp_path: Path, offline_wandb):
    """No worker imports wandb, rank 1 starts no mirror (so never contacts a tracker):
    one W&B run, a file for each process of rank 0; it shows the effective history."""
    spy = tmp_path / "spy"
    spy.mkdir()
    run = tmp_path / "run"
    plugins = json.dumps(["wandb", "wandb_spy:WandbSpy", "slhub.testing:StopAt"])
    sets = [*OVERRIDES, f"trainer.output_dir={run}", f"plugins={plugins}"]
    args = ["train", "--config", str(RECIPE), *(a for s in sets for a in ("--set", s))]
    path = os.pathsep.join([str(HERE), str(TESTS), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**offline_wandb, "PYTHONPATH": path, "WANDB_SPY_DIR": str(spy)}
    for stop_at, resume, code in (("13", [], 75), ("", ["--resume", "auto"], 0)):
        proc = run_torchrun(*args, *resume, env={**env, STOP_AT_ENV: stop_at}, timeout=300)
        assert proc.returncode != 0 if code else proc.returncode == 0, proc.stderr[-2000:]
        ranks = {r: json.loads((spy / f"rank{r}.json").read_text()) for r in (0, 1)}
        assert not ranks[0]["wandb_imported"] and not ranks[1]["wandb_imported"], ranks
    assert len(run_files(run, run_id(run))) == 2
    assert len(list((run / "wandb").glob("*run-*"))) == 2  # no run of rank 1's
    assert shown(run) == expected(run)
    assert resume_rows(run) == [(14, 13)]


needs_two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs a platform with CPU affinity and at least two CPUs",
)


def run_probe(code: str) -> str:
    """What ``code`` prints, run by a fresh Python in a session of its own (so the
    CPUs and priorities it sets leave this process's alone)."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,
    ).stdout


@needs_two_cpus
def test_the_mirror_keeps_to_its_cpus_at_a_lower_priority():
    """The mirror (and W&B's service, which inherits it) keeps to the CPUs rank 0 chose
    for it, at nice NICENESS above where it started, and its session (its own, as rank 0
    starts it) at nice NICENESS where Linux weighs CPU time by session."""
    from slhub_wandb.mirror import AUTOGROUP, NICENESS

    first, second = sorted(os.sched_getaffinity(0))[:2]
    probe = (
        "import os; from slhub_wandb.mirror import keep_out_of_the_way, AUTOGROUP; "
        f"os.sched_setaffinity(0, {{{first}, {second}}}); before = os.nice(0); "
        f"keep_out_of_the_way({{{first}}}); "
        "session = AUTOGROUP.read_text().split()[-1] if AUTOGROUP.exists() else 'none'; "
        "print(sorted(os.sched_getaffinity(0)), before, os.nice(0), session)"
    )
    out = run_probe(probe)
    cpus, before, after, session = out.rsplit(maxsplit=3)
    assert cpus == f"[{first}]"
    assert int(after) == min(int(before) + NICENESS, 19)
    if AUTOGROUP.exists():
        assert session == str(NICENESS)


def test_the_mirror_takes_a_cpu_the_update_thread_is_not_on():
    from slhub_wandb.mirror import mirror_cpus

    assert mirror_cpus({0, 1}, 1) == {0}
    assert mirror_cpus({0, 1}, 0) == {1}
    assert mirror_cpus({0, 1, 2, 3}, 3) == {2}
    assert mirror_cpus({0, 1, 2, 3}, 1) == {3}
    assert mirror_cpus({4, 6}, None) == {6}  # where the platform does not say
    assert mirror_cpus({4, 6}, 2) == {6}
    assert mirror_cpus({3}, 3) == {3}  # one CPU: the mirror shares it


def test_the_update_thread_keeps_off_the_mirrors_cpu_only_with_cpus_to_spare():
    from slhub_wandb.mirror import update_thread_cpus

    assert update_thread_cpus({0, 1, 2, 3}, 1, {3}) == {0, 1, 2}
    assert update_thread_cpus({0, 1, 2, 3}, 3, {0}) == {1, 2, 3}
    assert update_thread_cpus({0, 1, 2, 3}, 4, {3}) is None  # every CPU has a compute thread
    assert update_thread_cpus({5, 9}, 1, {5}) == {9}
    assert update_thread_cpus({3}, 1, {3}) is None


@needs_two_cpus
def test_the_thread_says_which_cpu_it_runs_on(tmp_path: Path):
    from slhub_wandb.mirror import current_cpu

    second = sorted(os.sched_getaffinity(0))[1]
    probe = (
        "import os; from slhub_wandb.mirror import current_cpu; "
        f"os.sched_setaffinity(0, {{{second}}}); print(current_cpu())"
    )
    assert run_probe(probe).strip() == str(second)
    torn = tmp_path / "stat"
    torn.write_text("1234 (python) R 1 2", encoding="ascii")
    assert current_cpu(torn) is None
    assert current_cpu(tmp_path / "missing") is None


@needs_two_cpus
def test_rank_0_keeps_its_update_thread_off_the_mirrors_cpu_until_the_run_ends():
    """With one compute thread on two CPUs the update thread leaves the mirror's CPU
    while the mirror runs, and has both again when the run ends."""
    first, second = sorted(os.sched_getaffinity(0))[:2]
    probe = (
        "import json, os, torch; from slhub_wandb.plugin import keep_off_the_mirror, "
        f"restore_cpus; os.sched_setaffinity(0, {{{first}, {second}}}); "
        f"torch.set_num_threads(1); had = keep_off_the_mirror({{{first}}}); "
        "during = sorted(os.sched_getaffinity(0)); restore_cpus(had); "
        "print(json.dumps([sorted(had), during, sorted(os.sched_getaffinity(0))]))"
    )
    assert json.loads(run_probe(probe)) == [[first, second], [second], [first, second]]


class AffinityAt:
    """Records the CPU the update thread runs on at its first metrics line (before the
    other plugins see that line) and its CPUs when update ``step`` commits."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.first_cpu: int | None = None
        self.seen: set[int] | None = None

    @hookimpl(tryfirst=True)
    def on_log(self, step: int) -> None:
        from slhub_wandb.mirror import current_cpu

        if self.first_cpu is None:
            self.first_cpu = current_cpu()

    @hookimpl
    def on_commit(self, step: int) -> None:
        if step == self.step:
            self.seen = os.sched_getaffinity(0)


@needs_two_cpus
def test_a_run_keeps_its_update_thread_where_it_runs_off_the_mirrors_cpu_and_gives_it_back(
    tmp_path: Path, importable_examples
):
    """The update thread keeps the CPU it ran on at the first metrics line and every
    other but the mirror's (one CPU); when the run ends it has all of them again. The
    thread starts on the highest-numbered CPU, the one the mirror took before it looked
    where the update runs."""
    import torch

    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, {max(before)})  # move there; the scheduler keeps it there
    os.sched_setaffinity(0, before)
    probe = AffinityAt(3)
    torch.set_num_threads(1)
    try:
        train(tmp_path / "run", plugins=["wandb", probe])
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, before)
    assert probe.first_cpu is not None and probe.seen is not None
    assert probe.first_cpu in probe.seen
    assert len(before - probe.seen) == 1
    assert os.sched_getaffinity(0) == before


def test_a_session_priority_that_cannot_be_set_leaves_the_mirror_as_it_is(tmp_path):
    from slhub_wandb.mirror import lower_session_priority

    assert lower_session_priority(10, tmp_path / "absent" / "autogroup") is False
    written = tmp_path / "autogroup"
    assert lower_session_priority(10, written) is True
    assert written.read_text() == "10"
