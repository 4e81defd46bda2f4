"""Two Gloo workers: exact recovery, the weighted-update oracle, rank-0
artifacts, one collective per update, the zero-weight rule and error propagation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import (
    REPO,
    SL_DDP,
    assert_tree_equal,
    cli_error,
    launch_workers,
    launch_workers_ok,
    load,
    metrics_of,
    run_torchrun,
    subprocess_env,
    warm_launcher,
    write_recipe,
)
from slhub.testing import check_resume_exact


def _recipe(tmp_path: Path, name: str, plugin: str, **changes) -> Path:
    return write_recipe(tmp_path / f"{name}.yaml", plugin=plugin, **changes)


@pytest.fixture(scope="module")
def recovery_runs(tmp_path_factory):
    """A continuous 12-update run and one stopped after 6 then resumed in place to 12."""
    tmp = tmp_path_factory.mktemp("recovery")
    common = dict(trainer__validate_every=3, trainer__save_every=6, trainer__batch_size=16)
    recipe = _recipe(
        tmp,
        "probe",
        "slhub_testplugins:RecoveryProbe",
        trainer__steps=12,
        trainer__output_dir=str(tmp / "unused"),
        **common,
    )
    check = check_resume_exact(
        recipe, stop_at=6, workdir=tmp, workers=2, in_place=True, cwd=REPO, env=subprocess_env(),
        launcher=warm_launcher,
    )  # fmt: skip
    return check.uninterrupted, check.resumed, recipe


def test_interrupted_and_resumed_run_is_bit_identical(recovery_runs):
    continuous, resumed, _ = recovery_runs
    a, b = load(continuous / "last.pt"), load(resumed / "last.pt")
    assert a["step"] == b["step"] == 12
    for key in ("model", "optimizer", "ranks"):
        assert_tree_equal(a[key], b[key], key)
    assert len(a["ranks"]) == 2
    for rank_state in a["ranks"]:
        assert set(rank_state["rng"]) == {"python", "numpy", "torch", "cuda"}
    # per-rank state really is per rank: buffers, RNG and sampler differ between ranks
    r0, r1 = a["ranks"]
    assert not torch.equal(r0["buffers"]["input_mean"], r1["buffers"]["input_mean"])
    assert not torch.equal(r0["sampler"], r1["sampler"])
    assert not torch.equal(r0["rng"]["torch"], r1["rng"]["torch"])
    later = lambda folder: [m for m in metrics_of(folder) if m["step"] > 6]  # noqa: E731
    assert later(continuous) == later(resumed) and len(later(resumed)) == 8
    assert [m["step"] for m in metrics_of(resumed) if "train/loss" in m] == list(range(1, 13))


def test_resume_with_another_world_size_names_both(recovery_runs, tmp_path: Path, capsys):
    continuous, _, recipe = recovery_runs
    line = cli_error(
        capsys,
        "train",
        "--config",
        str(recipe),
        "--set",
        f"trainer.output_dir={tmp_path / 'one'}",
        "--resume",
        str(continuous / "step_6.pt"),
    )
    assert "world size 2" in line and "world size 1" in line
    assert not (tmp_path / "one").exists()


def _oracle(recipe_path: Path, steps: int) -> tuple[dict, dict]:
    """Independent single-process Adam updates on the concatenated batches of both ranks."""
    import yaml

    from examples.sl_ddp.plugin import masked_mse
    from slhub.testing import StandInTrainer, build, hooks_of, sampler_generator
    from slhub_testplugins import OracleProbe

    recipe = yaml.safe_load(recipe_path.read_text())
    cfg = recipe["trainer"]
    plugin = OracleProbe()
    trainer = StandInTrainer(
        plugin,
        {name: recipe[name] for name in plugin.recipe_sections()},
        batch_size=cfg["batch_size"],
        lr=cfg["lr"],
        seed=cfg["seed"],
    )
    model = build(trainer, plugin)  # seeded as the loop seeds it; Adam(lr) as the loop's
    optimizer = trainer.optimizer
    hooks = hooks_of(plugin)
    generators = [sampler_generator(cfg["seed"], r) for r in (0, 1)]
    for step in range(1, steps + 1):
        batches = [hooks.sample(trainer=trainer, generator=g, step=step) for g in generators]
        xs, ys, masks = zip(*batches)
        masks = list(masks)
        if step == 2:
            masks[1] = torch.zeros_like(masks[1])  # as OracleProbe does on rank 1, update 2
        x, y, mask = (torch.cat(t) for t in (xs, ys, masks))
        loss, _ = masked_mse(model(x), y, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.state_dict(), optimizer.state_dict()


def _assert_close_tree(a, b, tol=1e-6, where=""):
    if isinstance(a, torch.Tensor):
        assert (a.double() - b.double()).abs().max().item() <= tol, where
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            _assert_close_tree(a[key], b[key], tol, f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"lengths differ at {where}"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close_tree(x, y, tol, f"{where}[{i}]")
    else:
        assert a == b, where


def test_weighted_update_matches_concatenated_batch_oracle(tmp_path: Path):
    out = tmp_path / "oracle"
    recipe = _recipe(
        tmp_path,
        "oracle",
        "slhub_testplugins:OracleProbe",
        trainer__steps=3,
        trainer__save_every=1,
        trainer__validate_every=0,
        trainer__lr=0.01,
        trainer__output_dir=str(out),
    )
    launch_workers_ok("train", "--config", str(recipe))
    weights = {m["step"]: m["train/weight"] for m in metrics_of(out)}
    assert weights[1] != weights[3]  # unequal valid counts happen
    for steps in (1, 3):
        ckpt = load(out / f"step_{steps}.pt")
        model, optimizer = _oracle(recipe, steps)
        _assert_close_tree(ckpt["model"], model, where="model")
        _assert_close_tree(ckpt["optimizer"], optimizer, where="optimizer")


def test_sl_ddp_under_torchrun_writes_only_rank0_artifacts(tmp_path: Path):
    out = tmp_path / "ddp"
    proc = run_torchrun("train", "--config", str(SL_DDP), "--set", f"trainer.output_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir() if p.name != ".slhub.lock") == [
        "last.pt",
        "metrics.jsonl",
        "run.json",
        "step_100.pt",
        "step_200.pt",
    ]
    assert [m["step"] for m in metrics_of(out) if "validation/mse" in m] == [50, 100, 150, 200]
    assert json.loads((out / "run.json").read_text())["world_size"] == 2
    assert len(load(out / "last.pt")["ranks"]) == 2
    assert "rank=1" not in proc.stderr  # rank 1 logs warnings only


def test_one_python_collective_per_update(tmp_path: Path):
    out = tmp_path / "count"
    recipe = _recipe(
        tmp_path,
        "count",
        "slhub_testplugins:CollectiveCounter",
        trainer__steps=8,
        trainer__save_every=0,
        trainer__validate_every=0,
        trainer__output_dir=str(out),
    )
    launch_workers_ok("train", "--config", str(recipe))
    counts = [m["train/collectives"] for m in metrics_of(out)]
    assert counts[1:] == [1] * 7  # update 1 also sees start-up; later updates: the agreement only


def test_update_with_zero_total_weight_is_skipped(tmp_path: Path):
    out = tmp_path / "zero"
    recipe = _recipe(
        tmp_path,
        "zero",
        "slhub_testplugins:ZeroWeightEverywhere",
        trainer__steps=3,
        trainer__save_every=1,
        trainer__validate_every=0,
        trainer__output_dir=str(out),
    )
    launch_workers_ok("train", "--config", str(recipe))
    step1, step2, step3 = (load(out / f"step_{k}.pt") for k in (1, 2, 3))
    assert_tree_equal(step1["model"], step2["model"])
    assert_tree_equal(step1["optimizer"], step2["optimizer"])
    assert not torch.equal(step2["model"]["0.weight"], step3["model"]["0.weight"])
    assert all(torch.isfinite(v).all() for v in step3["model"].values())
    line2 = next(m for m in metrics_of(out) if m["step"] == 2)
    assert line2["train/loss"] is None and line2["train/weight"] == 0


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
@pytest.mark.parametrize(
    ("phase", "rank", "expected"),
    [
        ("admission", 1, "rank 1 failed during admission"),
        ("sampling", 1, "rank 1 failed during sampling"),
        ("objective", 1, "rank 1 failed during objective"),
        ("nonfinite", 1, "rank 1 failed during non-finite loss"),
        ("validation", 0, "rank 0 failed during validation"),
        ("io", 0, "rank 0 failed during checkpoint I/O"),
        ("state", 1, "rank 1 failed during checkpoint I/O"),
    ],
)
def test_rank_local_failure_fails_every_rank_with_origin(tmp_path, phase, rank, expected):
    out = tmp_path / "fault"
    recipe = _recipe(
        tmp_path,
        "fault",
        "slhub_testplugins:FaultInjector",
        trainer__steps=4,
        trainer__validate_every=2,
        trainer__save_every=2,
        trainer__output_dir=str(out),
    )
    env = {"SLHUB_FAULT_PHASE": phase, "SLHUB_FAULT_RANK": str(rank), "SLHUB_FAULT_STEP": "2"}
    _, results = launch_workers("train", "--config", str(recipe), env=env, timeout=120)
    for worker_rank, (rc, err) in enumerate(results):
        assert rc == 2, (worker_rank, err[-2000:])
        error_lines = [line for line in err.splitlines() if line.startswith("slhub: error:")]
        assert len(error_lines) == 1 and expected in error_lines[0], err[-2000:]
        if worker_rank == rank:
            detail = error_lines[0].split(expected, 1)[1]
            causes = ("injected", "loss is nan", "Not a directory", "pickle")
            assert any(w in detail for w in causes), detail
    if phase == "admission":
        assert not out.exists()  # nothing claimed when a rank could not start
    if phase == "state":
        assert not (out / "step_2.pt").exists()  # no checkpoint from a failed gather
    if phase == "validation":  # the committed update is saved although its validation failed
        assert load(out / "step_2.pt")["step"] == 2 and not (out / "step_4.pt").exists()


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_torchrun_failure_ends_the_job_nonzero(tmp_path: Path):
    recipe = _recipe(
        tmp_path,
        "fault",
        "slhub_testplugins:FaultInjector",
        trainer__steps=4,
        trainer__output_dir=str(tmp_path / "out"),
    )
    proc = run_torchrun(
        "train", "--config", str(recipe), env={"SLHUB_FAULT_PHASE": "objective"}, timeout=60
    )
    assert proc.returncode != 0
    assert "rank 1 failed during objective: RuntimeError: injected objective failure" in proc.stderr


def test_validate_time_save_writes_gathered_state_without_a_collective(tmp_path: Path):
    out = tmp_path / "best"
    recipe = _recipe(
        tmp_path,
        "best",
        "slhub_testplugins:HookProbe",
        trainer__steps=4,
        trainer__validate_every=2,
        trainer__save_every=4,
        trainer__output_dir=str(out),
    )
    launch_workers_ok(
        "train", "--config", str(recipe), env={"SLHUB_PROBE_SAVE_BEST": "1"}, timeout=60
    )
    best, last = load(out / "best.pt"), load(out / "last.pt")
    assert best["step"] == 4 and len(best["ranks"]) == 2
    assert_tree_equal(best["ranks"], last["ranks"])
    assert_tree_equal(best["model"], last["model"])


@pytest.mark.slow  # fault matrix / cross-process check: `python -m pytest -m slow`
def test_models_that_differ_between_ranks_end_every_rank_with_one_line(tmp_path: Path):
    """DDP's constructor compares the ranks' parameters; its RuntimeError was a traceback
    and exit 1 on every rank."""
    recipe = _recipe(
        tmp_path, "differ", "slhub_testplugins:RankDependentModel", trainer__steps=2,
        trainer__output_dir=str(tmp_path / "out"),
    )  # fmt: skip
    _, results = launch_workers("train", "--config", str(recipe), timeout=120)
    for rank, (rc, err) in enumerate(results):
        assert rc == 2, (rank, err[-2000:])
        last = err.strip().splitlines()[-1]
        assert last.startswith("slhub: error: the ranks' models differ (build_model must"), last
        assert "Traceback" not in err
