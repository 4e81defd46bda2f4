"""The checkpoint component owns resume: every refusal is raised in one module, the
bootstrap and the loop call it at a few documented entry points, the registry of
stateful objects saves and restores each rank's own state, and what the plugins
opened (decode threads, readers) is closed however a run ends."""

from __future__ import annotations

import ast
import collections
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import slhub
from examples.sl_ddp.plugin import SlDdpPlugin
from helpers import DATASETS, REPO, write_recipe
from slhub import checkpoint, hookimpl
from slhub.errors import PluginError, SlhubError
from slhub.preemption import Preempted
from slhub.testing import STOP_AT_ENV

SLHUB = REPO / "slhub"
RESUME = SLHUB / "checkpoint" / "resume.py"

#: What each refusal of a resume says (a phrase of its one line).
REFUSALS = {
    "nothing to train": "nothing to train",
    "world size": "exact recovery needs the same world size",
    "v1 world size": "a v1 checkpoint holds one process's state",
    "plugins": "plugins differ",
    "code": "code differs from the checkpoint's",
    "recipe": "recipe differs from the checkpoint's",
    "dataset": "the dataset differs from the checkpoint's",
    "EMA missing": "holds no EMA weights",
    "EMA dropped": "checkpoint holds EMA weights",
}


def _raised_text(node: ast.Raise) -> str:
    """The string pieces of a ``raise`` statement, joined (f-strings' constant parts)."""
    parts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)]
    return "".join(p for p in parts if isinstance(p, str))


def refusal_sites() -> dict[str, set[str]]:
    """Every module of slhub/ that raises each refusal, by refusal."""
    sites: dict[str, set[str]] = collections.defaultdict(set)
    for path in sorted(SLHUB.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise):
                continue
            text = _raised_text(node)
            for name, phrase in REFUSALS.items():
                if phrase in text:
                    sites[name].add(str(path.relative_to(REPO)))
    return sites


def test_every_refusal_of_a_resume_is_raised_in_checkpoint_resume():
    sites = refusal_sites()
    assert set(sites) == set(REFUSALS), f"refusals not found: {set(REFUSALS) - set(sites)}"
    home = {str(RESUME.relative_to(REPO))}
    elsewhere = {name: found for name, found in sites.items() if found != home}
    assert not elsewhere, f"refusals raised outside {RESUME.relative_to(REPO)}: {elsewhere}"


# ------------------------------------------------------------- entry points


def _calls_into_checkpoint(run: Any) -> collections.Counter:
    """``(caller module, callee)`` for every call from slhub/run.py or slhub/trainer.py
    into slhub/checkpoint/ while ``run()`` runs."""
    import slhub.run
    import slhub.trainer

    callers = {slhub.run.__file__: "run.py", slhub.trainer.__file__: "trainer.py"}
    component = str(SLHUB / "checkpoint")
    calls: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(component):
            return
        caller = frame.f_back
        if caller is not None and caller.f_code.co_filename in callers:
            calls[(callers[caller.f_code.co_filename], frame.f_code.co_qualname)] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def test_the_bootstrap_and_the_loop_call_the_checkpoint_component_at_its_entry_points(
    tmp_path: Path,
):
    """A resume from a file: run.py plans once (``plan_resume``; ``StartRequest.auto``
    decides whether admission locks the directory) and opens the run directory once
    (``open_run``); the loop builds the manager, registers rng/sampler/buffers, loads
    the plan once, calls ``boundary`` once per update, binds the opened run and closes
    what was registered (from ``fit`` and again, idempotently, from the bootstrap)."""
    recipe = write_recipe(
        tmp_path / "r.yaml", trainer__steps=6, trainer__save_every=2,
        trainer__validate_every=3, trainer__output_dir=str(tmp_path / "a"),
    )  # fmt: skip
    slhub.train(recipe, ["trainer.steps=2"])
    calls = _calls_into_checkpoint(
        lambda: slhub.train(
            recipe, [f"trainer.output_dir={tmp_path / 'b'}"], resume=tmp_path / "a" / "step_2.pt"
        )
    )
    from_run = {callee: n for (caller, callee), n in calls.items() if caller == "run.py"}
    assert from_run == {"plan_resume": 1, "StartRequest.auto": 1, "open_run": 1}
    from_loop = {callee: n for (caller, callee), n in calls.items() if caller == "trainer.py"}
    assert from_loop == {
        "CheckpointManager.__init__": 1,
        "CheckpointManager.register": 3,  # rng, sampler, buffers
        "CheckpointManager.load": 1,
        "CheckpointManager.bind": 1,
        "CheckpointManager.boundary": 4,  # updates 3..6
        "CheckpointManager.close": 2,
    }


# ------------------------------------------------------------- the registry


class Counter:
    """A stateful object: how many updates it saw, saved under its key."""

    def __init__(self) -> None:
        self.count = 0
        self.loaded: Any = None
        self.closed = 0

    def state_dict(self) -> dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loaded = dict(state)
        self.count = state["count"]

    def close(self) -> None:
        self.closed += 1


class Registers(SlDdpPlugin):
    """The sl_ddp model registering a :class:`Counter` under ``key`` (and ``also``)."""

    def __init__(self, key: str = "counter", also: str | None = None, hook_key: str | None = None):
        super().__init__()
        self.key, self.also, self.hook_key = key, also, hook_key
        self.counter = Counter()

    @hookimpl
    def build_model(self, trainer: Any) -> torch.nn.Module:
        model = super().build_model(trainer)
        self.counter = Counter()
        trainer.register_state(self.key, self.counter)
        if self.also is not None:
            trainer.register_state(self.also, Counter())
        return model

    @hookimpl
    def on_commit(self, trainer: Any, step: int) -> None:
        self.counter.count += 1

    @hookimpl
    def state_dict(self, trainer: Any) -> dict[str, Any] | None:
        return {self.hook_key: 1} if self.hook_key else None


def _sl_recipe(tmp_path: Path, **changes: Any) -> Path:
    return write_recipe(
        tmp_path / "r.yaml", trainer__steps=4, trainer__save_every=2,
        trainer__output_dir=str(tmp_path / "run"), **changes,
    )  # fmt: skip


def test_a_registered_object_is_saved_in_its_ranks_entry_restored_and_closed(tmp_path: Path):
    recipe = _sl_recipe(tmp_path)
    first = Registers()
    out = slhub.train(recipe, plugin=first)
    assert first.counter.closed == 1
    saved = checkpoint.load(out / "step_2.pt")
    assert saved.ranks[0]["counter"] == {"count": 2}
    assert list(saved.ranks[0])[-3:] == ["rng", "sampler", "buffers"]  # the loop's own keys
    again = Registers()
    slhub.train(recipe, [f"trainer.output_dir={tmp_path / 'b'}"], resume=out / "step_2.pt",
                plugin=again)  # fmt: skip
    assert again.counter.loaded == {"count": 2} and again.counter.count == 4
    assert again.counter.closed == 1
    assert checkpoint.load(tmp_path / "b" / "last.pt").ranks[0]["counter"] == {"count": 4}


class CountsFromAdmit:
    """An extra plugin (no build_model) registering its :class:`Counter` from ``admit``."""

    def __init__(self) -> None:
        self.counter = Counter()

    @hookimpl
    def admit(self, trainer: Any) -> None:
        trainer.register_state("extra_counter", self.counter)

    @hookimpl
    def on_commit(self, trainer: Any, step: int) -> None:
        self.counter.count += 1


def test_an_extra_plugin_registering_from_admit_is_restored_at_once(tmp_path: Path):
    recipe = _sl_recipe(tmp_path)
    out = slhub.train(recipe, plugins=[CountsFromAdmit()])
    assert checkpoint.load(out / "step_2.pt").ranks[0]["extra_counter"] == {"count": 2}
    again = CountsFromAdmit()
    slhub.train(recipe, [f"trainer.output_dir={tmp_path / 'b'}"], resume=out / "step_2.pt",
                plugins=[again])  # fmt: skip
    assert again.counter.loaded == {"count": 2} and again.counter.count == 4
    assert again.counter.closed == 1


@pytest.mark.parametrize(
    ("plugin", "key"),
    [
        (Registers(also="counter"), "counter"),
        (Registers(key="rng"), "rng"),  # the loop's own
    ],
)
def test_a_key_registered_twice_is_a_plugin_error_naming_it(tmp_path: Path, plugin, key):
    with pytest.raises(PluginError, match=f"'{key}' is registered twice"):
        slhub.train(_sl_recipe(tmp_path), plugin=plugin)


def test_a_registered_key_a_hook_also_returns_is_a_plugin_error_naming_it(tmp_path: Path):
    with pytest.raises(SlhubError, match="'counter' is both registered"):
        slhub.train(_sl_recipe(tmp_path), plugin=Registers(hook_key="counter"))


def test_the_stand_in_trainer_keeps_registered_objects():
    from slhub.testing import StandInTrainer, stand_in

    trainer = StandInTrainer()
    counter = Counter()
    trainer.register_state("counter", counter)
    assert stand_in(trainer).registered == {"counter": counter}
    with pytest.raises(PluginError, match="'counter' is registered twice"):
        trainer.register_state("counter", Counter())
    stand_in(trainer).close()
    stand_in(trainer).close()
    assert counter.closed == 1


# ------------------------------------------------------- streams are closed


def _decoders() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("slhub-decode")]


def _nerd_recipe(tmp_path: Path) -> Path:
    dataset = tmp_path / "data" / "replay.zarr"
    shutil.copytree(DATASETS / "replay.zarr", dataset)
    recipe = write_recipe(
        tmp_path / "nerd.yaml", base=REPO / "examples" / "nerd" / "cartpole" / "sl.train.yaml",
        trainer__steps=4, trainer__batch_size=8, trainer__validate_every=0,
        trainer__save_every=2, trainer__device="cpu", trainer__output_dir=str(tmp_path / "run"),
        model__history=4, model__width=16, model__layers=1, model__heads=2,
        model__mlp_hidden=32, validation__horizons=[2], loss__features=None,
    )  # fmt: skip
    raw = yaml.safe_load(recipe.read_text())
    raw["data"] = {
        "path": str(dataset),
        "split": {"validation_ratio": 0.25, "seed": 0},
        "features": {"state": ["state"], "action": ["action"]},
        "decode": {"workers": 2, "ahead": 2},
    }
    recipe.write_text(yaml.safe_dump(raw))
    return recipe


class FailsAt:
    """An extra plugin failing the run in ``on_commit`` of update ``step``, or in
    ``admit`` (after the model and its stream were built)."""

    def __init__(self, step: int | None = None) -> None:
        self.step = step

    @hookimpl
    def admit(self, trainer: Any) -> None:
        if self.step is None:
            raise SlhubError("refused at admission")

    @hookimpl
    def on_commit(self, trainer: Any, step: int) -> None:
        if step == self.step:
            raise RuntimeError("failed mid-run")


def test_decode_threads_end_with_the_run_however_it_ends(tmp_path: Path, monkeypatch):
    assert not _decoders()
    recipe = _nerd_recipe(tmp_path)
    out = slhub.train(recipe)
    assert not _decoders(), "finished"
    saved = checkpoint.load(out / "step_2.pt")
    assert saved.ranks[0]["nerd"]["pending"].shape == (2, 8, 2)  # the stream's key
    with pytest.raises(SlhubError):
        slhub.train(recipe, [f"trainer.output_dir={tmp_path / 'f'}"], plugins=[FailsAt(3)])
    assert not _decoders(), "failed"
    with pytest.raises(SlhubError, match="refused at admission"):
        slhub.train(recipe, [f"trainer.output_dir={tmp_path / 'a'}"], plugins=[FailsAt()])
    assert not _decoders(), "failed at admission"
    monkeypatch.setenv(STOP_AT_ENV, "2")
    with pytest.raises(Preempted):
        slhub.train(recipe, [f"trainer.output_dir={tmp_path / 'p'}"],
                    plugins=["slhub.testing:StopAt"])  # fmt: skip
    assert not _decoders(), "preempted"


def test_a_stream_that_draws_nothing_ahead_saves_no_key(tmp_path: Path):
    recipe = _nerd_recipe(tmp_path)
    out = slhub.train(recipe, ["data.decode.workers=0", "data.decode.ahead=0"])
    entry = checkpoint.load(out / "last.pt").ranks[0]
    assert "nerd" not in entry and list(entry) == ["rng", "sampler", "buffers"]
    assert torch.is_tensor(entry["sampler"])


def test_closing_a_stream_twice_stops_its_threads_once(tmp_path: Path):
    from slhub.data import Role, TrainingData
    from slhub.data.training import DatasetSection

    shutil.copytree(DATASETS / "replay.zarr", tmp_path / "replay.zarr")
    section = DatasetSection.model_validate(
        {
            "path": str(tmp_path / "replay.zarr"),
            "decode": {"workers": 2, "ahead": 2},
            "cache_dir": str(tmp_path / "cache"),
            "features": {"state": ["state"], "action": ["action"]},
        }  # fmt: skip
    )
    roles = {"state": Role(default=("state",)), "action": Role(default=("action",))}
    data = TrainingData.open(section, roles)
    stream = data.stream({"state": range(0, 2), "action": range(0, 1)}, 4)
    stream.next(torch.Generator().manual_seed(0))
    assert _decoders()
    stream.close()
    stream.close()
    assert not _decoders()
    data.close()
