"""The hook contract: every spec documented (in code and in docs/hooks.md) and tested
by a ``test_hook_<name>`` below, each exercising the hook through a real training run."""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO, SL_DDP, load, metrics_of, one_line_error, run_cli
from slhub import hookimpl, hookspecs, train
from slhub.errors import PluginError, RankFailure, RecipeError, SlhubError
from slhub.testing import check_resume_exact, sampler_generator

SPECS = sorted(n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), "slhub_spec"))


def test_contract_has_the_designed_hooks():
    expected = {
        "build_model",
        "sample",
        "objective",
        "on_commit",
        "validate",
        "state_dict",
        "load_state_dict",
    }
    assert expected <= set(SPECS)


@pytest.mark.parametrize("name", SPECS)
def test_every_hookspec_is_documented(name: str):
    spec = getattr(hookspecs, name)
    doc = inspect.getdoc(spec) or ""
    for param in inspect.signature(spec).parameters:
        assert f":param {param}:" in doc, f"{name} does not document {param}"
        assert inspect.signature(spec).parameters[param].default is inspect.Parameter.empty
    if name not in ("on_commit", "load_state_dict", "on_log", "on_fit_end"):
        assert ":returns:" in doc, name
    if spec.slhub_spec.get("firstresult"):
        assert "Stops at the first non-None result" in doc, name
    docs = (REPO / "docs" / "hooks.md").read_text()
    assert re.search(rf"^## `{name}`", docs, re.M), f"docs/hooks.md has no section for {name}"


@pytest.mark.parametrize("name", SPECS)
def test_every_hookspec_has_a_test(name: str):
    assert callable(getattr(sys.modules[__name__], f"test_hook_{name}", None)), name


# ------------------------------------------------------------------ helpers


def _run(tmp_path: Path, plugin: str, *overrides: str, name: str = "out", resume=None) -> Path:
    out = tmp_path / name
    train(
        str(SL_DDP),
        [f"plugin={plugin}", f"trainer.output_dir={out}", *overrides],
        resume=str(resume) if resume else None,
    )
    return out


SHORT = ("trainer.steps=4", "trainer.validate_every=2", "trainer.save_every=2")


# ------------------------------------------------------------------- hooks


def test_hook_recipe_sections(tmp_path: Path):
    with pytest.raises(RecipeError, match=r"--set model\.hidden=0: model\.hidden: must be > 0"):
        _run(tmp_path, "examples.sl_ddp.plugin:SlDdpPlugin", "model.hidden=0")
    with pytest.raises(RecipeError, match=r"--set data\.size=3: data\.size: unknown key"):
        _run(tmp_path, "examples.sl_ddp.plugin:SlDdpPlugin", "data.size=3")
    assert not (tmp_path / "out").exists()


def test_hook_configure_optimizers(tmp_path: Path):
    out = _run(tmp_path, "slhub_testplugins:OwnOptimizer", *SHORT)
    ckpt = load(out / "last.pt")
    groups = ckpt["optimizer"]["param_groups"]
    assert [(g["lr"], g["momentum"]) for g in groups] == [(0.001, 0.9), (0.0001, 0.9)]
    assert all("momentum_buffer" in s for s in ckpt["optimizer"]["state"].values())
    assert ckpt["scheduler"]["schedule"] is None
    assert {m["train/lr"] for m in metrics_of(out) if "train/lr" in m} == {0.001}
    check = check_resume_exact(
        SL_DDP, stop_at=2, workdir=tmp_path / "resume", in_process=True,
        overrides=["plugin=slhub_testplugins:OwnOptimizer", *SHORT],
    )  # fmt: skip
    assert check.final("resumed").optimizer["param_groups"][1]["lr"] == 0.0001
    with pytest.raises(PluginError, match="configure_optimizers returned str"):
        _run(tmp_path, "slhub_testplugins:BadOptimizer", name="bad")


def test_hook_build_model(tmp_path: Path):
    with pytest.raises(PluginError, match="build_model returned str, expected torch.nn.Module"):
        _run(tmp_path, "slhub_testplugins:NotAModule")
    out = _run(tmp_path, "examples.sl_ddp.plugin:SlDdpPlugin", *SHORT, name="ok")
    assert load(out / "last.pt")["model"]["0.weight"].shape == (32, 4)


def test_hook_sample(tmp_path: Path):
    """sample draws with the trainer-owned generator, seeded per rank and checkpointed."""
    out = _run(tmp_path, "examples.sl_ddp.plugin:SlDdpPlugin", *SHORT)
    generator = sampler_generator(0, 0)
    for _ in range(4):
        torch.randint(0, 4096, (32,), generator=generator)
    assert torch.equal(load(out / "last.pt")["ranks"][0]["sampler"], generator.get_state())


def test_hook_objective(tmp_path: Path):
    with pytest.raises(RankFailure, match="rank 0 failed during objective: .*expected slhub"):
        _run(tmp_path, "slhub_testplugins:WrongObjective", *SHORT)


def test_hook_scale_loss(tmp_path: Path):
    """A model package can override the built-in weighting (trylast)."""
    out = _run(tmp_path, "slhub_testplugins:ZeroScale", *SHORT)
    first, last = load(out / "step_2.pt")["model"], load(out / "last.pt")["model"]
    assert all(torch.equal(first[k], last[k]) for k in first)  # zero gradients: Adam stays put


def test_hook_on_commit(tmp_path: Path):
    out = _run(tmp_path, "slhub_testplugins:HookProbe", *SHORT)
    commits = [m["train/probe_commits"] for m in metrics_of(out) if "train/loss" in m]
    assert commits == [1, 2, 3, 4]


class _Reporter:
    """An extra plugin recording what the reporting hooks receive."""

    def __init__(self, fail_at: int | None = None, fail_at_end: bool = False) -> None:
        self.lines: list[dict] = []
        self.ends: list[str] = []
        self.fail_at, self.fail_at_end = fail_at, fail_at_end

    @hookimpl
    def on_log(self, trainer, step, metrics):
        assert trainer.is_main and step == metrics["step"]
        assert trainer.run_id == json.loads((trainer.output_dir / "run.json").read_text())["run_id"]
        self.lines.append(dict(metrics))
        if step == self.fail_at:
            raise RuntimeError("logger lost its connection")

    @hookimpl
    def on_fit_end(self, trainer, status):
        self.ends.append(status)
        if self.fail_at_end:
            raise RuntimeError("cannot close")


def test_hook_on_log(tmp_path: Path):
    reporter = _Reporter()
    out = tmp_path / "out"
    train(str(SL_DDP), [*SHORT, f"trainer.output_dir={out}"], plugins=[reporter])
    # every metrics line, in order, exactly as written
    assert reporter.lines == metrics_of(out)
    assert [line["step"] for line in reporter.lines] == [1, 2, 2, 3, 4, 4]

    failing = _Reporter(fail_at=3)
    with pytest.raises(RankFailure, match="logger lost its connection"):
        train(str(SL_DDP), [*SHORT, f"trainer.output_dir={tmp_path / 'f'}"], plugins=[failing])
    assert failing.ends == ["failed"]


def test_hook_on_fit_end(tmp_path: Path, monkeypatch):
    from slhub.testing import STOP_AT_ENV, StopAt

    done = _Reporter(fail_at_end=True)  # its error is logged, the run still succeeds
    train(str(SL_DDP), [*SHORT, f"trainer.output_dir={tmp_path / 'd'}"], plugins=[done])
    assert done.ends == ["done"]
    assert load(tmp_path / "d" / "last.pt")["step"] == 4

    monkeypatch.setenv(STOP_AT_ENV, "3")
    stopped = _Reporter()
    with pytest.raises(SlhubError, match="stop signal at update 3"):
        train(str(SL_DDP), [*SHORT, f"trainer.output_dir={tmp_path / 's'}"],
              plugins=[stopped, StopAt()])  # fmt: skip
    assert stopped.ends == ["preempted"]


def test_hook_validate(tmp_path: Path, monkeypatch):
    """Validation results are logged, a validate-time save writes the boundary state,
    and validation's own random draws do not shift the training stream."""
    monkeypatch.setenv("SLHUB_PROBE_SAVE_BEST", "1")
    out = _run(tmp_path, "slhub_testplugins:HookProbe", *SHORT)
    lines = [m for m in metrics_of(out) if "validation/probe_step" in m]
    assert [(m["step"], m["validation/probe_step"]) for m in lines] == [(2, 2.0), (4, 4.0)]
    best = load(out / "best.pt")
    assert best["step"] == 4 and torch.equal(
        best["model"]["0.weight"], load(out / "last.pt")["model"]["0.weight"]
    )
    plain = _run(tmp_path, "examples.sl_ddp.plugin:SlDdpPlugin", *SHORT, name="plain")
    a, b = load(out / "last.pt"), load(plain / "last.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert torch.equal(a["ranks"][0]["rng"]["torch"], b["ranks"][0]["rng"]["torch"])


def test_hook_state_dict(tmp_path: Path):
    out = _run(tmp_path, "slhub_testplugins:HookProbe", *SHORT)
    assert load(out / "step_2.pt")["ranks"][0]["probe"] == {"commits": 2}
    assert load(out / "last.pt")["ranks"][0]["probe"] == {"commits": 4}


def test_hook_load_state_dict(tmp_path: Path):
    from slhub_testplugins import RECORD

    RECORD["load_state_dict"].clear()
    out = _run(tmp_path, "slhub_testplugins:HookProbe", *SHORT)
    resumed = _run(
        tmp_path, "slhub_testplugins:HookProbe", *SHORT, name="r", resume=out / "step_2.pt"
    )
    assert RECORD["load_state_dict"] == [{"commits": 2}]
    commits = [m["train/probe_commits"] for m in metrics_of(resumed) if "train/loss" in m]
    assert commits == [3, 4]


class RefusesAtAdmission:
    """Refuses the run in ``admit`` (when ``refuse``), naming what it saw of the trainer."""

    def __init__(self, refuse: bool = True) -> None:
        self.refuse = refuse

    @hookimpl
    def admit(self, trainer) -> None:
        if self.refuse:
            raise SlhubError(f"refused at update {trainer.step}, run_id {trainer.run_id}")


def test_hook_admit(tmp_path: Path):
    """Called after the model is built and a resume's state loaded, before rank 0 writes
    anything: a refusal leaves no output directory (fresh) and no new artifact (resume)."""
    out = tmp_path / "o"
    with pytest.raises(SlhubError, match="refused at update 0, run_id None"):
        train(str(SL_DDP), [*SHORT, f"trainer.output_dir={out}"], plugins=[RefusesAtAdmission()])
    assert not out.exists()
    first = tmp_path / "first"
    train(str(SL_DDP), [*SHORT, f"trainer.output_dir={first}"],
          plugins=[RefusesAtAdmission(refuse=False)])  # fmt: skip
    resumed = tmp_path / "r"
    with pytest.raises(SlhubError, match="refused at update 2, run_id None"):
        train(str(SL_DDP), [*SHORT, f"trainer.output_dir={resumed}"],
              plugins=[RefusesAtAdmission()], resume=str(first / "step_2.pt"))  # fmt: skip
    assert not resumed.exists()


def test_hook_export(tmp_path: Path):
    """slhub export asks every installed plugin; a checkpoint none recognizes exits 2."""
    out = _run(tmp_path, "examples.sl_ddp.plugin:SlDdpPlugin", *SHORT)
    line = one_line_error(
        run_cli("export", "--checkpoint", str(out / "last.pt"), "--out", str(tmp_path / "x"))
    )
    assert "export" in line and str(out / "last.pt") in line
