"""RWM as a world model of a MuJoCo robot: HalfCheetah-v5 episodes from
``slhub data collect``; on a small budget its forecast beats the held state, and the
example recipe resumes exactly (on two Gloo workers too, slow)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import slhub
from slhub.testing import check_resume_and_revalidate

from slhub_rwm.plugin import RwmPlugin

pytest.importorskip("mujoco")
pytest.importorskip("gymnasium")

#: A small budget on 16 episodes of 120 steps (the example recipe trains longer).
SMALL = [
    "trainer.steps=300",
    "trainer.validate_every=150",
    "trainer.save_every=150",
    "trainer.batch_size=32",
    "trainer.lr=0.003",
    "trainer.device=cpu",
    "rwm.history=8",
    "rwm.horizon=4",
    "rwm.hidden=32",
    "rwm.layers=1",
    "data.split.validation_ratio=0.25",
]


@pytest.fixture(scope="module")
def cheetah(tmp_path_factory) -> Path:
    from slhub.sim import collect

    out = tmp_path_factory.mktemp("cheetah") / "episodes"
    collect(out, "gymnasium:HalfCheetah-v5", episodes=16, steps=120, actions="smooth", seed=0)
    return out


def _recipe(repo: Path) -> Path:
    return repo / "examples" / "rwm" / "halfcheetah.yaml"


def test_the_forecast_beats_the_held_state_on_halfcheetah(cheetah, tmp_path, repo):
    run = tmp_path / "run"
    slhub.train(_recipe(repo), [*SMALL, f"data.path={cheetah}", f"trainer.output_dir={run}"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "validation/relative_error" in r][-1]
    assert last["validation/relative_error"] < last["validation/baseline_relative_error"], last


def test_the_halfcheetah_recipe_resumes_exactly(cheetah, tmp_path, repo):
    short = ["trainer.steps=12", "trainer.validate_every=6", "trainer.save_every=6"]
    check_resume_and_revalidate(
        _recipe(repo), RwmPlugin(), stop_at=int(np.random.default_rng().integers(2, 12)),
        workdir=tmp_path, in_process=True,
        overrides=[*SMALL, *short, f"data.path={cheetah}"],
    )  # fmt: skip


@pytest.mark.slow
def test_two_gloo_workers_beat_the_held_state_and_resume_exactly(cheetah, tmp_path, repo):
    check = check_resume_and_revalidate(
        _recipe(repo), RwmPlugin(), stop_at=int(np.random.default_rng().integers(2, 300)),
        workdir=tmp_path, workers=2, cwd=repo, overrides=[*SMALL, f"data.path={cheetah}"],
        timeout=600,
    )  # fmt: skip
    rows = [json.loads(x) for x in (check.resumed / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "validation/relative_error" in r][-1]
    assert last["validation/relative_error"] < last["validation/baseline_relative_error"], last
