"""Optimization from the recipe: optimizers, schedules, clipping, accumulation and mixed
precision, each resumed bit for bit (one process and two Gloo workers), accumulation
against the concatenated-batch oracle, and one-line refusals of bad settings."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from examples.sl_ddp.plugin import masked_mse
from helpers import (
    REPO,
    cli_error,
    launch_workers,
    load,
    metrics_of,
    subprocess_env,
    warm_launcher,
    write_recipe,
)
from slhub.optim import ScheduleSection, build_schedule, lr_multiplier
from slhub.testing import (
    StandInTrainer,
    build,
    check_resume_exact,
    hooks_of,
    sampler_generator,
    stand_in,
)
from slhub_testplugins import AccumulationProbe

FEATURES = {
    "adamw_cosine_warmup": {
        "optim": {"name": "adamw", "weight_decay": 0.01, "betas": [0.8, 0.99]},
        "schedule": {"name": "cosine", "warmup_steps": 3, "min_lr_ratio": 0.1},
    },
    "sgd_step": {
        "optim": {"name": "sgd", "momentum": 0.9, "nesterov": True},
        "schedule": {"name": "step", "every": 4, "gamma": 0.5},
    },
    "clipping": {"trainer__grad_clip_norm": 0.5},
    "accumulate_3": {"trainer__accumulate": 3},
    "bf16_mixed": {"trainer__precision": "bf16-mixed"},
}


def _recipe(tmp_path: Path, feature: str, **more) -> Path:
    keys = {
        "trainer__steps": 10,
        "trainer__validate_every": 3,
        "trainer__save_every": 5,
        "trainer__lr": 0.01,
        "trainer__output_dir": str(tmp_path / "unused"),
        **FEATURES[feature],
        **more,
    }
    return write_recipe(tmp_path / f"{feature}.yaml", **keys)


@pytest.mark.parametrize("feature", list(FEATURES))
def test_feature_resumes_bit_exact_on_one_process(tmp_path: Path, feature: str):
    check = check_resume_exact(
        _recipe(tmp_path, feature), stop_at=5, workdir=tmp_path, in_process=True
    )
    _assert_feature_visible(feature, check.uninterrupted)


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
@pytest.mark.parametrize("feature", list(FEATURES))
def test_feature_resumes_bit_exact_on_two_gloo_workers(tmp_path: Path, feature: str):
    check = check_resume_exact(
        _recipe(tmp_path, feature), stop_at=5, workdir=tmp_path, workers=2, cwd=REPO,
        env=subprocess_env(), launcher=warm_launcher,
    )  # fmt: skip
    _assert_feature_visible(feature, check.uninterrupted)
    later = [m for m in metrics_of(check.uninterrupted) if m["step"] > 5]
    assert later == metrics_of(check.resumed)  # resumed into a fresh directory at update 5


def _assert_feature_visible(feature: str, run: Path) -> None:
    """The feature really acted: its trace in the metrics and the checkpoint."""
    train = [m for m in metrics_of(run) if "train/loss" in m]
    lrs = [m["train/lr"] for m in train]
    ckpt = load(run / "last.pt")
    if feature in FEATURES and "schedule" in FEATURES[feature]:
        assert ckpt["scheduler"]["schedule"]["last_epoch"] == 10
        cfg = ScheduleSection.model_validate(FEATURES[feature]["schedule"])
        f = lr_multiplier(cfg, 10)
        assert lrs == [pytest.approx(0.01 * f(i), rel=1e-12) for i in range(10)]
        assert len(set(lrs)) > 1
    else:  # a constant rate has no schedule to step or to save
        assert ckpt["scheduler"]["schedule"] is None
        assert lrs == [0.01] * 10
    if feature == "clipping":
        norms = [m["train/grad_norm"] for m in train]
        assert len(norms) == 10 and all(n > 0 and math.isfinite(n) for n in norms)
        assert any(n > 0.5 for n in norms)  # clipping had something to clip
    else:
        assert all("train/grad_norm" not in m for m in train)
    if feature == "sgd_step":
        assert "momentum_buffer" in next(iter(ckpt["optimizer"]["state"].values()))
    if feature.startswith("adamw"):
        assert ckpt["optimizer"]["param_groups"][0]["weight_decay"] == 0.01


def test_accumulation_equals_the_concatenated_batch_oracle(tmp_path: Path):
    """accumulate=3, batch 8 per worker, 2 workers: each update is the gradient of the
    weighted mean over all 48 samples, with unequal valid counts and one micro-batch
    (rank 1, update 2, the second) without any valid target."""
    accumulate, batch, world, steps = 3, 8, 2, 3
    out = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "acc.yaml", plugin="slhub_testplugins:AccumulationProbe",
        trainer__steps=steps, trainer__batch_size=batch, trainer__accumulate=accumulate,
        trainer__save_every=steps, trainer__validate_every=0, trainer__lr=0.01,
        trainer__output_dir=str(out),
    )  # fmt: skip
    _, results = launch_workers("train", "--config", str(recipe))
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-2000:]

    plugin = AccumulationProbe()
    trainer = StandInTrainer(plugin, {}, batch_size=batch, lr=0.01, seed=0, steps=steps)
    hooks = hooks_of(plugin)
    model = build(trainer, plugin)
    generators = [sampler_generator(0, r) for r in range(world)]
    weights = []
    for step in range(1, steps + 1):
        parts = []
        for rank, generator in enumerate(generators):
            stand_in(trainer).rank, plugin.drawn = (
                rank,
                {},
            )  # each rank's plugin counts its own draws
            for _ in range(accumulate):
                parts.append(hooks.sample(trainer=trainer, generator=generator, step=step))
        x, y, mask = (torch.cat(t) for t in zip(*parts))
        counts = [float(p[2].sum()) for p in parts]
        weights.append(sum(counts))
        if step == 2:
            assert counts[4] == 0 and len(set(counts)) > 2  # the zero micro-batch, unequal
        loss, _ = masked_mse(model(x), y, mask)
        trainer.optimizer.zero_grad()
        loss.backward()
        trainer.optimizer.step()
    ckpt = load(out / "last.pt")
    deviation = max((ckpt["model"][n] - p).abs().max().item() for n, p in model.named_parameters())
    assert deviation <= 1e-6, deviation
    logged = [m["train/weight"] for m in metrics_of(out) if "train/weight" in m]
    assert logged == weights


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["optim.name=lamb"], "--set optim.name=lamb: optim.name: must be one of 'adam'"),
        (["trainer.lr=-0.1"], "trainer.lr: must be > 0"),
        (["optim.weight_decay=-1"], "optim.weight_decay: must be >= 0"),
        (["optim.momentum=0.9"], "momentum applies to sgd only, not adam"),
        (["schedule.warmup_steps=500"], "schedule.warmup_steps (500) must be smaller than"),
        (["schedule.name=step"], "step decay needs every"),
        (["trainer.accumulate=0"], "trainer.accumulate: must be >= 1"),
        (["trainer.grad_clip_norm=0"], "trainer.grad_clip_norm: must be > 0"),
        (["trainer.precision=fp16-mixed"], "trainer.precision fp16-mixed needs a CUDA device"),
        (["trainer.precision=fp8"], "trainer.precision: must be one of 'fp32', 'bf16-mixed'"),
    ],
)
def test_bad_optimization_settings_exit_2_before_training(capsys, tmp_path, sets, expected):
    out = tmp_path / "out"
    args = []
    for item in [*sets, f"trainer.output_dir={out}", "trainer.device=cpu"]:
        args += ["--set", item]
    line = cli_error(capsys, "train", "--config", str(REPO / "examples/sl_ddp/cpu.yaml"), *args)
    assert expected in line
    assert not out.exists()


def test_fp16_on_cpu_is_refused_by_every_rank(tmp_path: Path):
    recipe = write_recipe(
        tmp_path / "r.yaml",
        trainer__precision="fp16-mixed",
        trainer__output_dir=str(tmp_path / "o"),
    )
    _, results = launch_workers("train", "--config", str(recipe))
    for rc, err in results:
        assert rc == 2 and "fp16-mixed needs a CUDA device" in err, err[-2000:]
    assert not (tmp_path / "o").exists()


def test_inspect_shows_optimizer_and_schedule(capsys, tmp_path: Path):
    from slhub import cli

    check = check_resume_exact(
        _recipe(tmp_path, "adamw_cosine_warmup"), stop_at=5, workdir=tmp_path, in_process=True
    )
    capsys.readouterr()
    assert cli.main(["inspect", str(check.uninterrupted / "last.pt")]) == 0
    out = capsys.readouterr().out
    assert "optim:      adamw betas=[0.8, 0.99]" in out and "weight_decay=0.01" in out
    assert "schedule:   cosine warmup_steps=3 min_lr_ratio=0.1" in out
    assert "stepped 10 times" in out
    # only what adamw and cosine read: no momentum, nesterov, every or gamma
    assert not any(key in out for key in ("momentum", "nesterov", "every=", "gamma"))


def test_a_constant_rate_has_no_schedule_and_a_warmup_has_one():
    """A constant rate without warmup steps nothing per update (no ``LambdaLR``, whose
    step and ``optimizer.step`` wrapper cost every update); with warmup it is scheduled."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    assert build_schedule(optimizer, ScheduleSection(), 10) is None
    warm = build_schedule(optimizer, ScheduleSection(warmup_steps=2), 10)
    assert isinstance(warm, torch.optim.lr_scheduler.LambdaLR)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05, rel=1e-12)
