"""State BC judged in MuJoCo: the example recipes (examples/bc/pendulum_state.yaml,
reacher_state.yaml) at a short budget, trained on DART demonstrations of slhub's own
experts and rolled out in the env from starts no demonstration had, against the expert's
return from the same starts (the figures at full budget are in plugins/bc/README.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import slhub
import yaml

pytest.importorskip("mujoco")
from slhub.data import open_dataset  # noqa: E402
from slhub.sim import collect  # noqa: E402

#: Evaluation starts: collect's seed 1000 (the demonstrations use seed 0).
EVAL_SEED = 1000


def _returns(path: Path) -> list[float]:
    dataset = open_dataset(path)
    return [float(dataset.read("reward", e, 0, n).sum()) for e, n in enumerate(dataset.lengths)]


def _expert_return(tmp_path: Path, env: str, expert: str, episodes: int, steps: int) -> float:
    """The clean expert's mean return from the evaluation starts (``reset_seeds(1000, n)``)."""
    path = tmp_path / "expert"
    collect(path, env, episodes=episodes, steps=steps, actions="policy", policy=expert,
            seed=EVAL_SEED)  # fmt: skip
    return float(np.mean(_returns(path)))


def _train(tmp_path: Path, repo: Path, example: str, dataset: Path, overrides: list[str]) -> Path:
    recipe = yaml.safe_load((repo / example).read_text())
    recipe["data"]["path"] = str(dataset)
    recipe["trainer"].update(device="cpu", output_dir=str(tmp_path / "run"))
    recipe.pop("validation", None)  # judged once, below, by slhub eval
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    slhub.train(path, overrides)
    return tmp_path / "run" / "last.pt"


def _budget(steps: int) -> list[str]:
    """``steps`` updates, validated and saved once, at the end."""
    return [f"trainer.{key}={steps}" for key in ("steps", "validate_every", "save_every")]


def test_state_bc_balances_the_inverted_pendulum_as_the_expert_does(tmp_path, repo):
    """8 DART episodes of 250 steps and 300 updates: the policy holds the pole for the
    env's whole 1000 steps from 5 new starts, >= 90% of the expert's return (1000)."""
    env, expert = "gymnasium:InvertedPendulum-v5", "slhub.sim.experts:inverted_pendulum"
    demos = tmp_path / "demos"
    collect(demos, env, episodes=8, steps=250, actions="policy", policy=expert, noise=0.5,
            seed=0)  # fmt: skip
    assert min(_returns(demos)) == 250.0  # the noisy demonstrator itself never fell
    last = _train(tmp_path, repo, "examples/bc/pendulum_state.yaml", demos,
                  _budget(300))  # fmt: skip
    metrics = slhub.evaluate(last, env=env, episodes=5, seed=EVAL_SEED)
    reference = _expert_return(tmp_path, env, expert, episodes=5, steps=1000)
    assert reference == 1000.0
    assert metrics["env_episodes"] == 5.0
    assert metrics["env_return"] >= 0.9 * reference, metrics


@pytest.mark.slow
def test_state_bc_reaches_the_target_of_reacher_as_the_expert_does(tmp_path, repo):
    """200 DART episodes and 1500 updates: from 20 new starts the policy's return is
    within 10% of the way from random's to the expert's (Reacher's returns are
    negative: -3.5 for the expert, about -43 for uniform random torques)."""
    env, expert = "gymnasium:Reacher-v5", "slhub.sim.experts:reacher"
    demos = tmp_path / "demos"
    collect(demos, env, episodes=200, steps=50, actions="policy", policy=expert, noise=0.1,
            seed=0)  # fmt: skip
    last = _train(tmp_path, repo, "examples/bc/reacher_state.yaml", demos,
                  _budget(1500))  # fmt: skip
    metrics = slhub.evaluate(last, env=env, episodes=20, seed=EVAL_SEED)
    reference = _expert_return(tmp_path, env, expert, episodes=20, steps=50)
    random_path = tmp_path / "random"
    collect(random_path, env, episodes=20, steps=50, actions="uniform", seed=EVAL_SEED)
    random_return = float(np.mean(_returns(random_path)))
    score = (metrics["env_return"] - random_return) / (reference - random_return)
    assert score >= 0.9, (metrics, reference, random_return)
