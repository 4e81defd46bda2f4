"""NeRD as a learned simulator of a MuJoCo robot: episodes from ``slhub data collect``,
rollouts that beat both baselines, exact resume, and ``slhub eval`` against the run's
held-out episodes and against fresh ones from the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import slhub
from helpers import REPO, cli_error, script_module, warm_launcher
from slhub.builtin.nerd.plugin import NerdPlugin
from slhub.evaluation import run_eval
from slhub.testing import check_resume_and_revalidate

pytest.importorskip("mujoco")
pytest.importorskip("gymnasium")

PENDULUM = REPO / "examples" / "nerd" / "pendulum" / "sl.train.yaml"
ENV = "gymnasium:InvertedPendulum-v5"
#: A small budget: a tiny model, 400 updates (the example recipe trains longer).
SMALL = [
    "trainer.steps=400",
    "trainer.validate_every=200",
    "trainer.save_every=200",
    "trainer.batch_size=32",
    "trainer.device=cpu",
    "model.width=32",
    "model.layers=1",
    "model.heads=2",
    "model.mlp_hidden=64",
    "validation.horizons=[10, 100]",
    "data.split.validation_ratio=0.2",
]


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory) -> Path:
    from slhub.sim import collect

    out = tmp_path_factory.mktemp("pendulum") / "episodes"
    collect(out, ENV, episodes=24, steps=130, actions="smooth", seed=0, through_termination=True)
    return out


@pytest.fixture(scope="module")
def trained(pendulum: Path, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("run") / "nerd"
    slhub.train(PENDULUM, [*SMALL, f"data.path={pendulum}", f"trainer.output_dir={run}"])
    return run


def _last_validation(run: Path) -> dict[str, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "validation/one_step_mse" in r][-1]
    return {k.removeprefix("validation/"): v for k, v in last.items() if k != "step"}


def _beats_both_baselines(metrics: dict[str, float], groups: tuple[str, ...] = ("",)) -> None:
    for group in groups:
        for k in (10, 100):
            rollout = metrics[f"rollout_{group}mse_{k}"]
            assert rollout < metrics[f"baseline_{group}mse_{k}"], (group, k, metrics)
            assert rollout < metrics[f"linear_{group}mse_{k}"], (group, k, metrics)


def test_nerd_learns_the_pendulum_better_than_both_baselines(trained: Path):
    _beats_both_baselines(_last_validation(trained))


def test_eval_reproduces_the_runs_last_validation_exactly(trained: Path):
    assert run_eval(trained / "last.pt") == _last_validation(trained)


def test_eval_against_fresh_simulator_episodes_is_deterministic(trained: Path):
    first = run_eval(trained / "last.pt", env=ENV, episodes=4, steps=120, seed=7)
    again = run_eval(trained / "last.pt", env=ENV, episodes=4, steps=120, seed=7)
    other = run_eval(trained / "last.pt", env=ENV, episodes=4, steps=120, seed=8)
    assert first == again and first != other
    assert set(first) == set(_last_validation(trained))
    _beats_both_baselines(first)


def test_eval_refuses_what_it_cannot_judge_in_one_line(
    trained: Path, pendulum: Path, tmp_path: Path, capsys
):
    ckpt = str(trained / "last.pt")
    line = cli_error(capsys, "eval", "--checkpoint", ckpt, "--env", "gymnasium:Nope-v5")
    assert "gymnasium:Nope-v5" in line
    line = cli_error(capsys, "eval", "--checkpoint", ckpt, "--set", "validation.horizons=[500]")
    assert "horizons up to 500" in line
    v1 = tmp_path / "v1.pt"
    torch.save({"step": 1, "model": {}, "optimizer": {}, "rng": {}}, v1)
    assert "records no recipe" in cli_error(capsys, "eval", "--checkpoint", str(v1))
    ends = pendulum / "episode_ends.npy"
    saved = ends.read_bytes()
    try:  # the same files, other episode boundaries: not the data the run trained on
        values = np.load(ends)
        values[0] -= 1
        np.save(ends, values)
        assert "changed since the run" in cli_error(capsys, "eval", "--checkpoint", ckpt)
    finally:
        ends.write_bytes(saved)


def test_the_pendulum_recipe_resumes_exactly(pendulum: Path, tmp_path: Path):
    check_resume_and_revalidate(
        PENDULUM, NerdPlugin(), stop_at=int(np.random.default_rng().integers(2, 20)),
        workdir=tmp_path, in_process=True,
        overrides=[*SMALL, "trainer.steps=20", "trainer.validate_every=10",
                   "trainer.save_every=10", f"data.path={pendulum}"],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("recipe", "env"),
    [("hopper", "gymnasium:Hopper-v5"), ("ant", "gymnasium:Ant-v5")],
)
def test_the_contact_rich_recipes_resume_exactly(recipe: str, env: str, tmp_path: Path):
    """Hopper-v5 and Ant-v5 (contacts as extra inputs, a free base): their example recipes,
    made small, on a few collected episodes."""
    from slhub.sim import collect

    data = tmp_path / "episodes"
    collect(data, env, episodes=6, steps=40, actions="smooth", seed=0, through_termination=True)
    small = ["model.width=16", "model.layers=1", "model.heads=2", "model.mlp_hidden=32",
             "model.history=4", "validation.horizons=[2, 8]", "trainer.batch_size=8",
             "trainer.device=cpu", "data.split.validation_ratio=0.34"]  # fmt: skip
    check_resume_and_revalidate(
        REPO / "examples" / "nerd" / recipe / "sl.train.yaml", NerdPlugin(),
        stop_at=int(np.random.default_rng().integers(2, 8)), workdir=tmp_path, in_process=True,
        overrides=[*small, "trainer.steps=8", "trainer.validate_every=4",
                   "trainer.save_every=4", f"data.path={data}"],
    )  # fmt: skip


@pytest.mark.slow
def test_the_example_recipe_holds_docs_claims_on_every_measure(tmp_path: Path):
    """The pendulum recipe as published, on the data its header collects, holds
    docs/nerd.md's claims with a margin on any CPU: the whole state, the cart position and
    the 10-step pole angle at under half of either baseline's error; the 100-step pole
    angle, which is about the held state's (0.514 with AVX-512, 0.861 without, against
    0.521), at under twice the held state's."""
    from slhub.sim import collect

    data = tmp_path / "inverted_pendulum"
    collect(data, ENV, episodes=60, steps=200, actions="smooth", seed=0, through_termination=True)
    run = tmp_path / "run"
    slhub.train(PENDULUM, [f"data.path={data}", f"trainer.output_dir={run}", "trainer.device=cpu"])
    metrics = _last_validation(run)
    for group, k in [("", 10), ("", 100), ("cart_position_", 10), ("cart_position_", 100),
                     ("pole_angle_", 10)]:  # fmt: skip
        best_baseline = min(metrics[f"baseline_{group}mse_{k}"], metrics[f"linear_{group}mse_{k}"])
        assert metrics[f"rollout_{group}mse_{k}"] < 0.5 * best_baseline, (group, k, metrics)
    pole = metrics["rollout_pole_angle_mse_100"]
    assert pole < 2 * metrics["baseline_pole_angle_mse_100"], metrics


def test_ant_passive_motion_reports_nerds_measures(tmp_path: Path, capsys):
    """Ant-v5's free base: a tiny run on passive-motion episodes (``--actions zero`` from
    random initial states, as NeRD judges it) logs base position, base orientation and
    joint position errors for the model and both baselines, and ``slhub eval`` on fresh
    passive episodes from random states prints them."""
    from slhub import cli
    from slhub.sim import collect

    data = tmp_path / "episodes"
    collect(data, "gymnasium:Ant-v5", episodes=4, steps=30, actions="zero", seed=0,
            through_termination=True, init="random")  # fmt: skip
    run = tmp_path / "run"
    slhub.train(
        REPO / "examples" / "nerd" / "ant" / "sl.train.yaml",
        ["model.width=16", "model.layers=1", "model.heads=2", "model.mlp_hidden=32",
         "model.history=4", "validation.horizons=[2, 20]", "trainer.batch_size=8",
         "trainer.device=cpu", "data.split.validation_ratio=0.5", "trainer.steps=2",
         "trainer.validate_every=2", "trainer.save_every=2", f"data.path={data}",
         f"trainer.output_dir={run}"],
    )  # fmt: skip
    measures = [
        f"{kind}_{name}_{k}"
        for kind in ("rollout", "baseline", "linear")
        for name in ("base_position", "base_orientation", "joint_position")
        for k in (2, 20)
    ]
    logged = _last_validation(run)
    assert all(name in logged and logged[name] >= 0 for name in measures), logged
    argv = ["eval", "--checkpoint", str(run / "last.pt"), "--env", "gymnasium:Ant-v5",
            "--actions", "zero", "--init", "random", "--episodes", "2",
            "--steps", "30"]  # fmt: skip
    assert cli.main(argv) == 0
    printed = {line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert set(measures) <= printed


@pytest.mark.slow
def test_nerd_on_two_gloo_workers_beats_both_baselines_and_resumes_exactly(
    pendulum: Path, tmp_path: Path
):
    check = check_resume_and_revalidate(
        PENDULUM, NerdPlugin(), stop_at=int(np.random.default_rng().integers(2, 400)),
        workdir=tmp_path, workers=2, launcher=warm_launcher, cwd=REPO,
        overrides=[*SMALL, f"data.path={pendulum}"], timeout=600,
    )  # fmt: skip
    _beats_both_baselines(_last_validation(check.resumed))


def test_the_rollout_plot_draws_the_recorded_truth_and_the_models_rollout(
    trained: Path, pendulum: Path, tmp_path: Path
):
    from slhub.data import open_dataset

    script = script_module("plot_nerd_rollout")
    out = tmp_path / "rollout.png"
    fig = script.main(["--checkpoint", str(trained / "last.pt"), "--out", str(out),
                       "--components", "qpos.hinge", "--horizon", "50"])  # fmt: skip
    assert out.stat().st_size > 0
    truth, rollout = fig.axes[0].lines[:2]
    episode = int(fig.texts[0].get_text().split("episode ")[1].split()[0])
    dataset = open_dataset(pendulum)
    hinge = dataset.read("qpos", episode, 0, 10 + 50)[:, 1]
    assert np.array_equal(truth.get_ydata(), hinge)  # the recorded episode, as it is
    # the orange line is the exported model's rollout from the same history
    from slhub.export import load
    from slhub.export.writer import run_export

    run_export(trained / "last.pt", tmp_path / "export")
    predictor = load(tmp_path / "export")
    state = np.concatenate([dataset.read(f, episode, 0, 60) for f in ("qpos", "qvel")], -1)
    action = dataset.read("action", episode, 0, 60)
    tokens = torch.from_numpy(np.concatenate([state[:10], action[:10]], -1)[None]).float()
    future = torch.from_numpy(action[None, 10:59]).float()
    rolled = predictor.rollout(tokens, future, input_names=predictor.input_names)
    assert np.array_equal(rollout.get_ydata(), rolled[0, :, 1].double().numpy())
