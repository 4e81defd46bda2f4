"""Test-only plugins (importable as ``slhub_testplugins:Name`` with tests/ on the path).

Faults are injected here, through the public hook contract, never through hooks
in product code.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from examples.sl_ddp.plugin import SlDdpPlugin, masked_mse
from slhub import LossResult, SlhubError, hookimpl

#: In-process probes record what hooks received here.
RECORD: dict[str, list] = {"load_state_dict": []}


class ProbeNet(nn.Module):
    """An MLP with dropout and per-rank buffers (a sample counter and a running input mean)."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(4, hidden), nn.Tanh(), nn.Dropout(0.2), nn.Linear(hidden, 2)
        )
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))
        self.register_buffer("input_mean", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.seen += x.shape[0]
                self.input_mean.mul_(0.9).add_(0.1 * x.mean(0))
        return self.net(x)


class RecoveryProbe(SlDdpPlugin):
    """sl_ddp data with a model that has dropout and per-rank buffers."""

    @hookimpl
    def build_model(self, trainer) -> nn.Module:
        super().build_model(trainer)
        return ProbeNet(trainer.section("model").hidden)


class OracleProbe(SlDdpPlugin):
    """Unequal valid counts; rank 1 has no valid target at update 2."""

    @hookimpl
    def objective(self, trainer, model, batch) -> LossResult:
        x, y, mask = batch
        if trainer.rank == 1 and trainer.step == 1:
            mask = torch.zeros_like(mask)
        loss, count = masked_mse(model(x), y, mask)
        return LossResult(loss=loss, weight=count)


class ZeroWeightEverywhere(SlDdpPlugin):
    """Every rank reports weight 0 at update 2 (and a 0/0 NaN loss)."""

    @hookimpl
    def objective(self, trainer, model, batch) -> LossResult:
        x, y, mask = batch
        if trainer.step == 1:
            mask = torch.zeros_like(mask)
            loss = ((model(x) - y) ** 2 * mask).sum() / mask.sum()  # NaN on purpose
            return LossResult(loss=loss, weight=0)
        loss, count = masked_mse(model(x), y, mask)
        return LossResult(loss=loss, weight=count)


class FaultInjector(SlDdpPlugin):
    """Fails in SLHUB_FAULT_PHASE on SLHUB_FAULT_RANK at update SLHUB_FAULT_STEP."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = os.environ.get("SLHUB_FAULT_PHASE", "")
        self.rank = int(os.environ.get("SLHUB_FAULT_RANK", "1"))
        self.step = int(os.environ.get("SLHUB_FAULT_STEP", "2"))

    def _due(self, trainer, phase: str, step: int) -> bool:
        return self.phase == phase and trainer.rank == self.rank and step == self.step

    @hookimpl
    def build_model(self, trainer):
        if self.phase == "admission" and trainer.rank == self.rank:
            raise RuntimeError("injected admission failure")
        return super().build_model(trainer)

    @hookimpl
    def sample(self, trainer, generator, step):
        if self._due(trainer, "sampling", step):
            raise RuntimeError("injected sampling failure")
        return super().sample(trainer, generator)

    @hookimpl
    def objective(self, trainer, model, batch, step):
        result = super().objective(trainer, model, batch)
        if self._due(trainer, "objective", step):
            raise RuntimeError("injected objective failure")
        if self._due(trainer, "nonfinite", step):
            result.loss = result.loss * float("nan")
        return result

    @hookimpl
    def validate(self, trainer, model, step):
        if self._due(trainer, "validation", step):
            raise RuntimeError("injected validation failure")
        return super().validate(trainer, model, step)

    @hookimpl
    def state_dict(self, trainer):
        if self._due(trainer, "state", trainer.step):
            return {"fault": lambda: None}  # cannot be pickled: fails on this rank only
        return None

    @hookimpl
    def on_commit(self, trainer, step):
        if self._due(trainer, "io", step):
            out = Path(trainer.config.output_dir)
            shutil.rmtree(out)
            out.write_text("not a directory any more")  # the next checkpoint write fails


class HookProbe(SlDdpPlugin):
    """Exercises on_commit, save/restore and validate-time saves in one process."""

    def __init__(self) -> None:
        super().__init__()
        self.commits = 0

    @hookimpl
    def on_commit(self, trainer, step, result, metrics):
        self.commits += 1
        metrics["train/probe_commits"] = self.commits

    @hookimpl
    def state_dict(self, trainer):
        return {"probe": {"commits": self.commits}}

    @hookimpl
    def load_state_dict(self, trainer, state):
        RECORD["load_state_dict"].append(state["probe"])
        self.commits = state["probe"]["commits"]

    @hookimpl
    def validate(self, trainer, model, step):
        torch.rand(())  # a draw that must not shift the training streams
        if os.environ.get("SLHUB_PROBE_SAVE_BEST"):
            trainer.save("best.pt")
        return {"probe_step": float(step)}


class ZeroScale(SlDdpPlugin):
    """Overrides the built-in weighting: every update back-propagates zero."""

    @hookimpl
    def scale_loss(self, trainer, result, total_weight):
        return result.loss * 0.0


class NotAModule(SlDdpPlugin):
    @hookimpl
    def build_model(self, trainer):
        super().build_model(trainer)
        return "not a module"


class WrongObjective(SlDdpPlugin):
    @hookimpl
    def objective(self, trainer, model, batch):
        return 1.0


class UnknownHook:
    @hookimpl
    def build_modle(self, trainer):  # misspelled on purpose
        return None


def broken_on_import():
    raise AssertionError("never called")


class CollectiveCounter(SlDdpPlugin):
    """Counts torch.distributed collectives issued from Python between commits."""

    NAMES = (
        "all_reduce",
        "broadcast",
        "all_gather",
        "gather",
        "scatter",
        "reduce",
        "barrier",
        "all_gather_object",
        "gather_object",
        "broadcast_object_list",
        "all_to_all",
        "reduce_scatter",
        "scatter_object_list",
    )

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    @hookimpl
    def build_model(self, trainer):
        import torch.distributed as dist

        for name in self.NAMES:
            original = getattr(dist, name)

            def counted(*args, _original=original, **kwargs):
                self.count += 1
                return _original(*args, **kwargs)

            setattr(dist, name, counted)
        return super().build_model(trainer)

    @hookimpl
    def on_commit(self, trainer, step, metrics):
        metrics["train/collectives"] = self.count
        self.count = 0


# ------------------------------------------------------------------ extra plugins


class CommitLogConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    draws: int = Field(default=3, gt=0)


class CommitLog:
    """An extra plugin (entry point ``commit_log`` of the fake distribution ``fakeplug``).

    Owns the ``commit_log`` recipe section; on every commit it counts and draws
    ``draws`` numbers from this rank's global torch stream, so its checkpointed
    state differs by rank and depends on the random streams being restored.
    """

    def __init__(self) -> None:
        self.commits = 0
        self.draws = torch.zeros(0)

    @hookimpl
    def recipe_sections(self):
        return {"commit_log": CommitLogConfig}

    @hookimpl
    def on_commit(self, trainer, step, metrics):
        self.commits += 1
        self.draws = torch.rand(trainer.section("commit_log").draws)
        metrics["train/commit_log_commits"] = self.commits

    @hookimpl
    def state_dict(self, trainer):
        return {"commit_log": {"commits": self.commits, "draws": self.draws.clone()}}

    @hookimpl
    def load_state_dict(self, trainer, state):
        self.commits = state["commit_log"]["commits"]
        self.draws = state["commit_log"]["draws"].clone()

    @hookimpl
    def validate(self, step):
        return {"commit_log_commits": float(self.commits)}


class MetricsTap:
    """An extra plugin named ``slhub_testplugins:MetricsTap``: sees what earlier plugins added."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    @hookimpl
    def on_commit(self, step, metrics):
        self.steps.append(step)
        metrics["train/tap_saw_commit_log"] = "train/commit_log_commits" in metrics

    @hookimpl
    def state_dict(self):
        return {"metrics_tap": {"steps": torch.tensor(self.steps, dtype=torch.int64)}}

    @hookimpl
    def load_state_dict(self, state):
        self.steps = state["metrics_tap"]["steps"].tolist()


class ExtraWithObjective:
    """An extra plugin that wrongly implements a model hook."""

    @hookimpl
    def objective(self, trainer, model, batch):
        return None


class SteppedProbe(SlDdpPlugin):
    """Records the update numbers ``sample`` and ``objective`` receive (in RECORD)."""

    @hookimpl
    def sample(self, trainer, generator, step):
        RECORD.setdefault("sample_steps", []).append(step)
        return super().sample(trainer, generator)

    @hookimpl
    def objective(self, trainer, model, batch, step):
        RECORD.setdefault("objective_steps", []).append(step)
        return super().objective(trainer, model, batch)


class UserErrorInBuild(SlDdpPlugin):
    """Refuses its configuration the public way: ``slhub.SlhubError``."""

    @hookimpl
    def build_model(self, trainer):
        raise SlhubError("model.hidden must be even for this plugin (got 33)")


class Slow(SlDdpPlugin):
    """sl_ddp, slowed by SLHUB_SLOW_S seconds per update (default 0.01), so a test can
    signal or kill a run in the middle; the computation is unchanged. With SLHUB_GATE set,
    update 3 waits until that file exists (a test holds a run open while it acts)."""

    @hookimpl
    def on_commit(self, step):
        import time

        time.sleep(float(os.environ.get("SLHUB_SLOW_S", "0.01")))
        gate = os.environ.get("SLHUB_GATE")
        while gate and step == 3 and not Path(gate).exists():
            time.sleep(0.01)


class AccumulationProbe(SlDdpPlugin):
    """Counts micro-batches: rank 1's second micro-batch of update 2 has no valid target."""

    ZERO = (1, 2, 1)  # (rank, update, micro-batch index)

    def __init__(self) -> None:
        super().__init__()
        self.drawn: dict[int, int] = {}

    @hookimpl
    def sample(self, trainer, generator, step):
        index = self.drawn.get(step, 0)
        self.drawn[step] = index + 1
        x, y, mask = super().sample(trainer, generator)
        if (trainer.rank, step, index) == self.ZERO:
            mask = torch.zeros_like(mask)
        return x, y, mask


class WhereAmI:
    """An extra plugin that checkpoints where each rank ran: rank, LOCAL_RANK and device."""

    @hookimpl
    def state_dict(self, trainer):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return {"where": {"rank": trainer.rank, "local_rank": local, "device": str(trainer.device)}}


class OwnOptimizer(SlDdpPlugin):
    """Its own optimizer: SGD with momentum and two parameter groups (the output layer at
    a tenth of the rate), and no schedule."""

    @hookimpl
    def configure_optimizers(self, trainer, model):
        groups = [
            {"params": model[0].parameters()},
            {"params": model[2].parameters(), "lr": trainer.config.lr / 10},
        ]
        return torch.optim.SGD(groups, lr=trainer.config.lr, momentum=0.9), None


class BadOptimizer(SlDdpPlugin):
    @hookimpl
    def configure_optimizers(self):
        return "adam"


class RankDependentModel(SlDdpPlugin):
    """Builds a wider model on every rank but 0: DDP's check of the ranks' parameters fails."""

    @hookimpl
    def build_model(self, trainer) -> nn.Module:
        model = super().build_model(trainer)
        if trainer.rank == 0:
            return model
        return nn.Sequential(nn.Linear(4, 33), nn.Tanh(), nn.Linear(33, 2))


class ValidationTracker(SlDdpPlugin):
    """An early-stopping tracker: ``validate`` changes the state it checkpoints (the best
    score so far, a patience counter and the number of validations), so a boundary's
    checkpoint must hold rank 0's state after validation for a resume to be exact.

    The score is the validation MSE plus an offset that cycles with the number of
    validations, so it is not monotone (the best is not always the latest) and it
    depends on the restored count."""

    OFFSETS = (0.3, -0.2, 0.5, 0.0, -0.4)

    def __init__(self) -> None:
        super().__init__()
        self.best: float | None = None
        self.patience = 0
        self.validations = 0

    @hookimpl
    def validate(self, trainer, model, step):
        metrics = super().validate(trainer, model, step)
        score = metrics["mse"] + self.OFFSETS[self.validations % len(self.OFFSETS)]
        self.validations += 1
        if self.best is None or score < self.best:
            self.best, self.patience = score, 0
        else:
            self.patience += 1
        return {**metrics, "score": score, "patience": float(self.patience)}

    @hookimpl
    def on_commit(self, step):
        if step == int(os.environ.get("SLHUB_TRACKER_FAIL_AT", "0")):
            raise RuntimeError(f"injected failure at update {step}")

    @hookimpl
    def state_dict(self, trainer):
        return {
            "tracker": {"best": self.best, "patience": self.patience, "count": self.validations}
        }

    @hookimpl
    def load_state_dict(self, trainer, state):
        tracker = state.get("tracker", {})
        self.best = tracker.get("best")
        self.patience = tracker.get("patience", 0)
        self.validations = tracker.get("count", 0)


class DatasetProbe(SlDdpPlugin):
    """Records the dataset at ``SLHUB_PROBE_DATASET`` (split by ``SLHUB_PROBE_SPLIT_SEED``)
    from ``build_model``, as a plugin that trains on recorded data does."""

    @hookimpl
    def build_model(self, trainer):
        from slhub.data import open_dataset, split_episodes

        dataset = open_dataset(os.environ["SLHUB_PROBE_DATASET"])
        seed = int(os.environ.get("SLHUB_PROBE_SPLIT_SEED", "0"))
        trainer.record_dataset(
            "demos", dataset, split_episodes(dataset, validation_ratio=0.25, seed=seed)
        )
        return super().build_model(trainer)


class DiesInBuild(SlDdpPlugin):
    """Rank SLHUB_DIE_RANK (default 1) ends its process with status 3 in ``build_model``,
    without a word (as a crash or an out-of-memory kill would); the others build."""

    @hookimpl
    def build_model(self, trainer):
        if trainer.rank == int(os.environ.get("SLHUB_DIE_RANK", "1")):
            os._exit(3)
        return super().build_model(trainer)


class LaunchKillPoints(SlDdpPlugin):
    """Kill points for ``slhub launch`` tests, placed by the test (not by timing):

    - ``SLHUB_SIGKILL_AT=RANK:STEP``: that rank SIGKILLs itself in update STEP's
      on_commit, as the out-of-memory killer would;
    - ``SLHUB_TERM_LAUNCHER_AT=STEP``: rank 0 sends SIGTERM to its launcher (its parent,
      the elastic agent) in update STEP's on_commit;
    - ``SLHUB_TERM_LAUNCHER_AT=done``: rank 0 sends it once every worker of the launch
      left its done record (at the process's exit), and lingers so that the forwarded
      signal still finds it.
    """

    @hookimpl
    def on_commit(self, trainer, step):
        import signal

        kill = os.environ.get("SLHUB_SIGKILL_AT", "")
        if kill and [int(word) for word in kill.split(":")] == [trainer.rank, step]:
            os.kill(os.getpid(), signal.SIGKILL)
        term = os.environ.get("SLHUB_TERM_LAUNCHER_AT", "")
        if trainer.rank == 0 and term == str(step):
            os.kill(os.getppid(), signal.SIGTERM)
        if trainer.rank == 0 and term == "done" and step == trainer.config.steps:
            import atexit

            atexit.register(_term_launcher_after_done)


def _term_launcher_after_done() -> None:
    """(At exit, after ``slhub train`` returned.) SIGTERM to the launcher once this
    node's workers all left a done record (status 0) in the launch's status folder."""
    import json
    import signal
    import time

    folder = Path(os.environ["SLHUB_LAUNCH_STATUS"])
    workers = int(os.environ["LOCAL_WORLD_SIZE"])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        codes = []
        for path in folder.glob("[0-9]*.json"):
            try:
                codes.append(json.loads(path.read_text())["code"])
            except (OSError, ValueError, KeyError):
                pass
        if codes.count(0) >= workers:
            break
        time.sleep(0.01)
    os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(1)


class NonFinite:
    """An extra plugin whose metrics are NaN and infinities (a diverging metric does that)."""

    @hookimpl
    def on_commit(self, trainer, step, metrics):
        metrics["train/nan"] = float("nan")
        metrics["train/inf"] = float("inf")

    @hookimpl
    def validate(self, trainer, model, step):
        return {"nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"), "ok": 1.5}


class ReachesIntoEngine(SlDdpPlugin):
    """sl_ddp whose hook ``SLHUB_REACH_HOOK`` (``build_model``, ``admit``, ``on_commit``
    or ``validate``) reads ``trainer.<SLHUB_REACH_ATTR>``: an attribute of the engine,
    not of the :class:`slhub.Trainer` protocol."""

    def _reach(self, trainer, hook: str) -> None:
        if os.environ.get("SLHUB_REACH_HOOK") == hook:
            getattr(trainer, os.environ["SLHUB_REACH_ATTR"])

    @hookimpl
    def build_model(self, trainer) -> nn.Module:
        self._reach(trainer, "build_model")
        return super().build_model(trainer)

    @hookimpl
    def admit(self, trainer) -> None:
        self._reach(trainer, "admit")

    @hookimpl
    def on_commit(self, trainer) -> None:
        self._reach(trainer, "on_commit")

    @hookimpl
    def validate(self, trainer, model, step):
        self._reach(trainer, "validate")
        return super().validate(trainer, model, step)
