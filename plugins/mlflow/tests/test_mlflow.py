"""The mlflow plugin, through real runs of the sl_ddp example against a real tracking server.

The MLflow run is read back through ``MlflowClient`` (``mlflow_runs``); what it holds
must be the effective history of the run's metrics.jsonl, as ``slhub.read_metrics``
returns it: every numeric value of every line at its step, no step of a metric twice,
across every process that logged into the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow", reason="mlflow is not installed: pip install mlflow")

import slhub  # noqa: E402
from helpers import TESTS, run_cli, run_torchrun  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from slhub import SlhubError, hookimpl, read_metrics  # noqa: E402
from slhub.testing import STOP_AT_ENV, StandInTrainer, hooks_of  # noqa: E402

from cut_proxy import Relay  # noqa: E402
from mlflow_runs import EXPERIMENT, expected, history, resume_rows, runs_of, shown, the_run  # noqa: E402
from slhub_mlflow import tracker  # noqa: E402
from slhub_mlflow.history import numeric, params, rows_before  # noqa: E402
from slhub_mlflow.plugin import MlflowLogger  # noqa: E402

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
    f"mlflow.experiment={EXPERIMENT}",
    'mlflow.tags={"ci": "yes"}',
    "mlflow.log_checkpoints=true",
    'trainer.best={"metric": "validation/mse"}',
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


class CutAt:
    """Cuts the relay to the server once the server holds update ``step - 1`` (None:
    never): the server is lost mid-run, after it received part of the run."""

    def __init__(self, relay: Relay | None = None, server: str = "", step: int | None = None):
        self.relay, self.server, self.step = relay, server, step

    @hookimpl
    def on_commit(self, trainer: slhub.Trainer, step: int) -> None:
        if self.relay is None or step != self.step:
            return
        client = MlflowClient(self.server)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            runs = runs_of(client, trainer.run_id)
            if runs and (self.step - 1) in history(client, runs[0].info.run_id):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the server never held update {self.step - 1}")
        self.relay.cut()


def train(out: Path, *extra: str, plugins: list[Any] | None = None, **kwargs: Any) -> Path:
    """One in-process run of the recipe into ``out`` with the mlflow plugin."""
    overrides = [*OVERRIDES, *extra, f"trainer.output_dir={out}"]
    if plugins is None:
        overrides.append('plugins=["mlflow"]')  # as a recipe lists it
    return slhub.train(RECIPE, overrides, plugins=plugins, **kwargs)


def run_id(run: Path) -> str:
    return json.loads((run / "run.json").read_text())["run_id"]


def assert_checkpoints_logged(client: MlflowClient, mlflow_run: str, run: Path, into: Path):
    """The run's last.pt and best.pt are the MLflow run's artifacts, byte for byte."""
    into.mkdir()
    assert json.loads((run / "run.json").read_text())["best"]["step"] > 0
    for name in ("last.pt", "best.pt"):
        got = client.download_artifacts(mlflow_run, f"checkpoints/{name}", str(into))
        assert Path(got).read_bytes() == (run / name).read_bytes()


@pytest.fixture(scope="module")
def client(mlflow_server: str) -> MlflowClient:
    return MlflowClient(mlflow_server)


@pytest.fixture(scope="module")
def importable_examples(mlflow_server: str):
    """The recipe names ``examples.sl_ddp.plugin:SlDdpPlugin``: importable from the
    repository; the server comes from ``MLFLOW_TRACKING_URI``, as a user would set it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO))
        patch.setenv("OMP_NUM_THREADS", "1")
        patch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
        yield


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, importable_examples) -> Path:
    """A whole run, shared by the tests that compare against it."""
    return train(tmp_path_factory.mktemp("mlflow") / "uninterrupted")


@pytest.mark.slow
def test_the_run_holds_the_metrics_history_with_the_recipe_as_params(
    uninterrupted: Path, client: MlflowClient
):
    run = the_run(client, run_id(uninterrupted))
    rows = shown(client, run.info.run_id)
    assert rows == expected(uninterrupted)
    assert sorted(rows) == list(range(1, STEPS + 1))
    assert {"train/loss", "train/lr", "validation/mse"} <= set(rows[5])
    identity = json.loads((uninterrupted / "run.json").read_text())
    assert run.data.params == params(identity["recipe"])
    assert run.data.params["trainer.lr"] == "0.001"
    assert run.data.params["plugins"] == '["mlflow"]'
    tags = run.data.tags
    assert tags["slhub.run_id"] == identity["run_id"]
    assert tags["slhub.recipe_digest"] == identity["recipe_digest"]
    assert json.loads(tags["slhub.source"]) == identity["source"]
    assert tags["ci"] == "yes"
    assert "slhub.parent" not in tags
    assert (tags["slhub.status"], tags["slhub.step"]) == ("done", str(STEPS))
    assert json.loads(tags["slhub.resumes"]) == []
    assert (run.info.status, run.info.run_name) == ("FINISHED", "uninterrupted")
    logged = client.download_artifacts(run.info.run_id, "slhub/run.json", str(uninterrupted.parent))
    assert json.loads(Path(logged).read_text()) == identity
    assert resume_rows(client, run.info.run_id) == []
    assert_checkpoints_logged(client, run.info.run_id, uninterrupted, uninterrupted / "got")


@pytest.mark.slow
@pytest.mark.parametrize("interruption", ["sigterm", "crash"])
def test_a_resume_in_place_continues_the_run_and_logs_each_update_once(
    interruption: str, uninterrupted: Path, client: MlflowClient, tmp_path: Path
):
    run = tmp_path / "run"
    if interruption == "sigterm":  # preempted at update 13: step_13.pt written, resumed from it
        with pytest.raises(SlhubError, match="preempted by a stop signal at update 13"):
            train(run, plugins=["mlflow", SigtermAt(13)])
        plugins: list[Any] = ["mlflow", SigtermAt()]
        resumed_from, status, mlflow_status = 13, "preempted", "KILLED"
    else:  # crashed in update 17: 16 logged, redone from last.pt, best.pt's update 15
        with pytest.raises(SlhubError, match="injected crash at update 17"):
            train(run, plugins=["mlflow", CrashAt(17)])
        plugins = ["mlflow", CrashAt()]
        resumed_from, status, mlflow_status = 15, "failed", "FAILED"
    first = the_run(client, run_id(run))
    assert (first.info.status, first.data.tags["slhub.status"]) == (mlflow_status, status)
    held_before = history(client, first.info.run_id)
    assert max(held_before) == max(r["step"] for r in read_metrics(run / "metrics.jsonl"))

    train(run, plugins=plugins, resume="auto")

    after = the_run(client, run_id(run))
    assert after.info.run_id == first.info.run_id  # the same MLflow run continues
    assert (after.info.status, after.data.tags["slhub.status"]) == ("FINISHED", "done")
    rows = shown(client, after.info.run_id)
    assert rows == expected(run)
    assert rows == expected(uninterrupted)  # the same steps and values as without interruption
    assert resume_rows(client, after.info.run_id) == [(resumed_from + 1, resumed_from)]
    assert json.loads(after.data.tags["slhub.resumes"])[0]["step"] == resumed_from


@pytest.mark.slow
def test_a_resume_into_a_fresh_directory_starts_a_run_naming_its_parent(
    uninterrupted: Path, client: MlflowClient, tmp_path: Path
):
    fresh = tmp_path / "fresh"
    train(fresh, resume=str(uninterrupted / "step_10.pt"))
    parent = run_id(uninterrupted)
    assert run_id(fresh) != parent
    run = the_run(client, run_id(fresh))
    rows = shown(client, run.info.run_id)
    assert sorted(rows) == list(range(11, STEPS + 1))
    assert rows == expected(fresh)
    assert rows == {step: row for step, row in expected(uninterrupted).items() if step > 10}
    tags = run.data.tags
    assert tags["slhub.parent"] == parent
    assert tags["slhub.parent_mlflow_run_id"] == the_run(client, parent).info.run_id
    assert json.loads(tags["slhub.resumed_from"])["step"] == 10
    assert parent in tags["mlflow.note.content"]
    assert_checkpoints_logged(client, run.info.run_id, fresh, tmp_path / "downloaded")


@pytest.mark.slow
def test_a_lost_server_warns_once_and_sync_fills_the_run_afterwards(
    mlflow_server: str,
    client: MlflowClient,
    importable_examples,
    tmp_path: Path,
    capfd,
    monkeypatch,
):
    monkeypatch.setenv("COLUMNS", "1000")  # a warning's fields on one console line
    relay = Relay(int(mlflow_server.rsplit(":", 1)[1]))
    run = tmp_path / "lost"
    train(
        run, f"mlflow.tracking_uri={relay.uri}",
        plugins=["mlflow", CutAt(relay, mlflow_server, 8)],
    )  # fmt: skip
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if "mlflow logging stopped" in line]
    assert len(warnings) == 1, err[-3000:]
    assert relay.uri in warnings[0] and f"python -m slhub_mlflow.sync {run}" in warnings[0]
    assert sorted(expected(run)) == list(range(1, STEPS + 1))  # metrics.jsonl is complete
    mlflow_run = the_run(client, run_id(run))
    held = shown(client, mlflow_run.info.run_id)
    assert 7 <= max(held) < STEPS and mlflow_run.info.status == "RUNNING"

    command = ["-m", "slhub_mlflow.sync", str(run), "--tracking-uri", mlflow_server]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, *command, "--status", "done"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"continued MLflow run {mlflow_run.info.run_id}" in proc.stdout
    synced = the_run(client, run_id(run))
    assert shown(client, synced.info.run_id) == expected(run)
    assert (synced.info.status, synced.data.tags["slhub.status"]) == ("FINISHED", "done")


@pytest.mark.slow
def test_a_resume_in_place_sends_what_a_lost_server_missed(
    mlflow_server: str, client: MlflowClient, importable_examples, tmp_path: Path, monkeypatch
):
    """The first process loses the server at update 6 and is preempted at 13; the
    requeued one (the server back) sends 6..13 from metrics.jsonl, then its own lines."""
    relay = Relay(int(mlflow_server.rsplit(":", 1)[1]))
    run = tmp_path / "run"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", relay.uri)
    with pytest.raises(SlhubError, match="preempted by a stop signal at update 13"):
        train(run, plugins=["mlflow", CutAt(relay, mlflow_server, 6), SigtermAt(13)])
    first = the_run(client, run_id(run))
    assert 5 <= max(shown(client, first.info.run_id)) < 13
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    train(run, plugins=["mlflow", CutAt(), SigtermAt()], resume="auto")
    after = the_run(client, run_id(run))
    assert after.info.run_id == first.info.run_id
    assert shown(client, after.info.run_id) == expected(run)
    assert resume_rows(client, after.info.run_id) == [(14, 13)]


def test_rows_before_merges_lines_by_step_and_marks_each_resume():
    records = [
        {"step": 1, "train/loss": 2.0, "train/note": "text", "train/skipped": None},
        {"step": 2, "train/loss": 1.5},
        {"step": 2, "validation/mse": 3.0},
        {"step": 2, "event": "resume", "checkpoint": "step_2.pt"},
        {"step": 3, "train/loss": 1.0, "train/flag": True},
    ]
    assert list(rows_before(records, until=4)) == [
        (1, {"train/loss": 2.0}),
        (2, {"train/loss": 1.5, "validation/mse": 3.0}),
        (3, {"slhub/resume": 2.0, "train/loss": 1.0}),
    ]
    assert [step for step, _ in rows_before(records, until=3)] == [1, 2]
    assert numeric({"step": 4, "a b": 1, "x:y": 2.5}) == {"a b": 1.0, "x_y": 2.5}
    assert params({"trainer": {"lr": 0.1, "best": None}, "plugins": ["mlflow"], "data": {}}) == {
        "trainer.lr": "0.1",
        "trainer.best": "null",
        "plugins": '["mlflow"]',
        "data": "{}",
    }


@pytest.mark.slow
def test_on_log_only_queues_a_line(
    mlflow_server: str, client: MlflowClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """An update never waits for the server: every request goes out from the writer
    thread, none from the thread that calls on_log; the server receives every line."""
    senders: list[str] = []
    send = tracker.Link.send

    def recording_send(self: tracker.Link, *args: Any, **kwargs: Any) -> Any:
        senders.append(threading.current_thread().name)
        return send(self, *args, **kwargs)

    monkeypatch.setattr(tracker.Link, "send", recording_send)
    plugin = MlflowLogger()
    sections = {"mlflow": {"tracking_uri": mlflow_server, "experiment": EXPERIMENT}}
    trainer = StandInTrainer(plugin, sections, output_dir=str(tmp_path))
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "on-log-queue", "recipe": {}}))
    hooks = hooks_of(plugin)
    hooks.admit(trainer=trainer)
    lines = 2000
    for step in range(1, lines + 1):
        hooks.on_log(trainer=trainer, step=step, metrics={"step": step, "train/loss": 1.0 / step})
    hooks.on_fit_end(trainer=trainer, status="done")
    assert senders and set(senders) == {"slhub-mlflow"}, senders
    rows = shown(client, the_run(client, "on-log-queue").info.run_id)
    assert sorted(rows) == list(range(1, lines + 1))
    assert rows[7] == {"train/loss": 1.0 / 7}


def test_only_rank_0_contacts_the_server(tmp_path: Path):
    """Rank 1 passes admission with a server that does not exist, and logs nothing."""
    for rank in (1, 0):
        plugin = MlflowLogger()
        sections = {"mlflow": {"tracking_uri": "http://127.0.0.1:9"}}
        trainer = StandInTrainer(
            plugin, sections, rank=rank, world_size=2, output_dir=str(tmp_path)
        )
        hooks = hooks_of(plugin)
        if rank == 1:
            hooks.admit(trainer=trainer)
            hooks.on_log(trainer=trainer, step=1, metrics={"step": 1, "train/loss": 2.0})
            assert plugin.writer is None
            hooks.on_fit_end(trainer=trainer, status="done")
        else:
            with pytest.raises(SlhubError, match="cannot reach the MLflow tracking server"):
                hooks.admit(trainer=trainer)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "env", "message"),
    [
        ("mlflow.colour=blue", {}, "colour"),
        ("mlflow.tracking_uri=http://127.0.0.1:9", {}, "cannot reach the MLflow tracking server"),
        ("mlflow.experiment=slhub-tests", {"MLFLOW_TRACKING_URI": ""}, "mlflow.tracking_uri"),
    ],
)
def test_a_bad_mlflow_section_or_server_is_one_line_and_no_artifact(
    tmp_path: Path, mlflow_server: str, setting: str, env: dict[str, str], message: str
):
    out = tmp_path / "out"
    sets = [*OVERRIDES, f"trainer.output_dir={out}", 'plugins=["mlflow"]', setting]
    proc = run_cli("train", "--config", str(RECIPE), *(a for s in sets for a in ("--set", s)),
                   env={"MLFLOW_TRACKING_URI": mlflow_server, **env})  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("slhub: error: ") and message in line, line
    assert not out.exists()


@pytest.mark.slow
def test_two_gloo_workers_preempted_and_resumed_in_place(
    tmp_path: Path, mlflow_server: str, client: MlflowClient
):
    """Rank 1 never imports mlflow (so never contacts a tracker); the MLflow run of the
    preempted and resumed run holds the effective history."""
    spy = tmp_path / "spy"
    spy.mkdir()
    run = tmp_path / "run"
    plugins = json.dumps(["mlflow", "mlflow_spy:MlflowSpy", "slhub.testing:StopAt"])
    sets = [*OVERRIDES, f"trainer.output_dir={run}", f"plugins={plugins}"]
    args = ["train", "--config", str(RECIPE), *(a for s in sets for a in ("--set", s))]
    path = os.pathsep.join([str(HERE), str(TESTS), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {"PYTHONPATH": path, "MLFLOW_SPY_DIR": str(spy), "MLFLOW_TRACKING_URI": mlflow_server}
    for stop_at, resume, code in (("13", [], 75), ("", ["--resume", "auto"], 0)):
        proc = run_torchrun(*args, *resume, env={**env, STOP_AT_ENV: stop_at}, timeout=300)
        assert proc.returncode != 0 if code else proc.returncode == 0, proc.stderr[-2000:]
        ranks = {r: json.loads((spy / f"rank{r}.json").read_text()) for r in (0, 1)}
        assert ranks[0]["mlflow_imported"] and not ranks[1]["mlflow_imported"], ranks
    mlflow_run = the_run(client, run_id(run))
    assert mlflow_run.info.status == "FINISHED"
    assert shown(client, mlflow_run.info.run_id) == expected(run)
    assert resume_rows(client, mlflow_run.info.run_id) == [(14, 13)]
