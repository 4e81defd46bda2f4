"""A policy trained inside a learned MuJoCo env, scored in MuJoCo (docs/nerd.md,
"Training a policy inside the learned simulator"): InvertedPendulum-v5 (the default) or
Hopper-v5 (``--env Hopper-v5``), each with its settings in :data:`ROBOTS`.

1. Collect episodes of the env, kept going through falls (``slhub data collect``).
   InvertedPendulum-v5: the LQR expert with Gaussian action noise and as many of
   :func:`sweep` (the same LQR tracking a cart target that sweeps the rail), in one
   store. Hopper-v5: smooth random actions (``--actions smooth``). Or take ``--data``.
2. Train the robot's NeRD recipe (``examples/nerd/<robot>/sl.train.yaml``, with the
   robot's model overrides and ``--set``) and export it, or take ``--export``.
3. For every seed, train stable-baselines3 PPO for ``--rl-steps`` env steps inside the
   learned simulator (:class:`slhub.sim.learned.LearnedEnv`) and, with the same seed and
   hyperparameters, in MuJoCo.
4. Run both policies in MuJoCo (deterministic actions, the same ``--eval-episodes`` reset
   seeds) and print the mean return per seed and over seeds (± the standard deviation
   across seeds).

Needs the ``rl`` extra (``pip install -e ".[rl]"``) beside ``sim``. Run it with
``OMP_NUM_THREADS=1``: PPO's and NeRD's networks are small.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "nerd" / "pendulum" / "sl.train.yaml"
ENV = "InvertedPendulum-v5"
EXPERT = "slhub.sim.experts:inverted_pendulum"
#: :func:`sweep`, for ``--policy`` (this folder is put on ``sys.path``).
SWEEP = "policy_in_learned_sim:sweep"
#: The cart target of :func:`sweep`: amplitude (m) and period (s). The cart meets the
#: rail's stops at 1 m (and the pole often falls there: the model needs both); the
#: target's acceleration, ``0.95 (2 pi / 6)^2`` or about 1 m/s^2, tilts the pole by about
#: 0.1 rad, inside the env's 0.2.
SWEEP_AMPLITUDE, SWEEP_PERIOD = 0.95, 6.0
#: The NeRD: the pendulum recipe with a history of one step (the pendulum's state is
#: qpos and qvel, all a step of the simulator reads; it also trains and steps faster).
MODEL = [
    "model.history=1", "model.width=64", "model.layers=2", "model.heads=4",
    "model.mlp_hidden=256", "trainer.batch_size=256", "trainer.device=cpu",
    "validation.horizons=[10, 50]", "data.split.validation_ratio=0.2",
]  # fmt: skip
#: PPO's settings, the same in both envs (stable-baselines3's defaults otherwise).
PPO_SETTINGS = {"n_steps": 1024, "batch_size": 256, "learning_rate": 1e-3}
#: What tests/test_learned_sim.py runs: the published run with one seed (about four
#: minutes on two cores; with 5000 updates the policy scored 607 of 1000).
TEST_SIZE = ["--seeds", "0", "--eval-episodes", "5"]


@dataclass(frozen=True)
class Robot:
    """One env's settings: its recipe, where its data comes from, the model overrides,
    the sizes each flag defaults to, and PPO's settings."""

    env: str
    recipe: Path
    #: ``slhub.sim.collect`` keyword arguments per data source; a ``noise`` of None is
    #: ``--noise``.
    sources: dict[str, dict[str, Any]]
    model: list[str]
    episodes: int
    steps: int
    updates: int
    rl_steps: int
    ppo: dict[str, Any] = field(default_factory=dict)


ROBOTS = {
    ENV: Robot(
        ENV, RECIPE,
        {"expert": {"actions": "policy", "policy": EXPERT, "noise": None},
         "sweep": {"actions": "policy", "policy": SWEEP, "noise": None}},
        MODEL, episodes=100, steps=200, updates=10000, rl_steps=30000, ppo=PPO_SETTINGS,
    ),
    # Smooth random actions from the reset pose in short episodes: many of the steps
    # are the first ones (the hopper upright, then falling), where PPO's early episodes
    # live. The recipe as it is (a history of 10 steps, contact forces as inputs) with
    # wider batches; PPO with stable-baselines3's defaults but batches of 128, and
    # 30000 env steps: what fits a CPU budget of about 25 minutes on two shared cores.
    "Hopper-v5": Robot(
        "Hopper-v5", REPO / "examples" / "nerd" / "hopper" / "sl.train.yaml",
        {"smooth": {"actions": "smooth"}},
        ["trainer.batch_size=128", "trainer.device=cpu", "validation.horizons=[10, 50]"],
        episodes=300, steps=100, updates=3000, rl_steps=30000,
        ppo={"n_steps": 2048, "batch_size": 128},
    ),
}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a new folder for its files")
    parser.add_argument("--env", choices=sorted(ROBOTS), default=ENV, help="the MuJoCo env")
    parser.add_argument("--data", type=Path, help="a dataset collected from --env")
    parser.add_argument("--export", type=Path, help="a NeRD export of --env")
    parser.add_argument("--episodes", type=int, help="episodes of each source")
    parser.add_argument("--steps", type=int, help="steps per collected episode")
    parser.add_argument("--noise", type=float, default=1.0, help="the expert's action noise")
    parser.add_argument("--updates", type=int, help="NeRD training updates")
    parser.add_argument("--set", action="append", default=[], help="recipe KEY=VALUE")
    parser.add_argument("--rl-steps", type=int, help="PPO env steps per env")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--eval-episodes", type=int, default=10)
    args = parser.parse_args(argv)
    robot = ROBOTS[args.env]
    for name in ("episodes", "steps", "updates", "rl_steps"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(robot, name))
    if str(Path(__file__).parent) not in sys.path:  # collect imports SWEEP by name
        sys.path.insert(0, str(Path(__file__).parent))
    started = time.perf_counter()
    export = args.export or _train(robot, args)
    table: dict[str, Any] = {"env": robot.env, "export": str(export)}
    for where in ("learned", "mujoco"):
        returns = []
        for seed in args.seeds:
            policy = _ppo(robot, where, export, seed, args.rl_steps)
            returns.append(_score(robot.env, policy, args.eval_episodes))
            print(f"{where} seed {seed}: {returns[-1]:.1f}", flush=True)
        table[where] = {"mean": float(np.mean(returns)), "std": float(np.std(returns)),
                        "per_seed": returns}  # fmt: skip
    table["seconds"] = round(time.perf_counter() - started, 1)
    _print(table, args)
    return table


def _train(robot: Robot, args: argparse.Namespace) -> Path:
    import slhub
    from slhub.export.writer import run_export

    data = args.data or args.out / "data"
    if args.data is None and not data.exists():
        _collect(robot, data, args)
    run, export = args.out / "run", args.out / "export"
    if not (run / "last.pt").exists():
        slhub.train(robot.recipe, [*robot.model, f"trainer.steps={args.updates}",
                             f"trainer.validate_every={args.updates}",
                             f"trainer.save_every={args.updates}", f"data.path={data}",
                             f"trainer.output_dir={run}", *args.set])  # fmt: skip
    if not export.exists():
        run_export(run / "last.pt", export)
    return export


def sweep(observation: np.ndarray, simulator: Any) -> np.ndarray:
    """The LQR expert tracking a cart target that sweeps the rail, ``A sin(2 pi t / T)``
    at the simulator's time ``t``: the pole kept up at every cart position and speed a
    policy may reach, which the expert alone (it keeps the cart centred) never shows."""
    from slhub.sim.experts import pendulum_gain

    model = simulator.model
    skip = max(1, round(simulator.dt / float(model.opt.timestep)))
    gain = _GAINS.get(id(model))
    if gain is None:
        gain = _GAINS[id(model)] = pendulum_gain(model, skip)
    phase = 2 * np.pi * float(simulator.data.time) / SWEEP_PERIOD
    speed = 2 * np.pi / SWEEP_PERIOD * SWEEP_AMPLITUDE * np.cos(phase)
    target = np.array([SWEEP_AMPLITUDE * np.sin(phase), 0.0, speed, 0.0])
    action = -gain @ (np.asarray(observation, dtype=np.float64) - target)
    low, high = model.actuator_ctrlrange[:, 0], model.actuator_ctrlrange[:, 1]
    return np.clip(action, low, high)


_GAINS: dict[int, np.ndarray] = {}


def _collect(robot: Robot, data: Path, args: argparse.Namespace) -> None:
    """``--episodes`` episodes of each of the robot's sources; several go into one store
    (the pendulum's: the noisy expert, the upright pole near the rail's middle, and
    :func:`sweep`, the upright pole along the whole rail)."""
    from slhub.data import ArrayEpisodes, open_dataset, write_store
    from slhub.sim import collect

    sources = {
        name: {**how, "noise": args.noise} if how.get("noise", 0) is None else how
        for name, how in robot.sources.items()
    }
    if len(sources) == 1:
        collect(data, f"gymnasium:{robot.env}", episodes=args.episodes, steps=args.steps,
                seed=0, through_termination=True, **next(iter(sources.values())))  # fmt: skip
        return
    parts = []
    for name, how in sources.items():
        part = args.out / f"data_{name}"
        if not part.exists():
            collect(part, f"gymnasium:{robot.env}", episodes=args.episodes, steps=args.steps,
                    seed=0, through_termination=True, **how)  # fmt: skip
        parts.append(open_dataset(part))
    keep = ("qpos", "qvel", "action", "reward", "terminated", "truncated")
    episodes = [
        {key: part.read(key, index, 0, int(length)) for key in keep}
        for part in parts
        for index, length in enumerate(part.lengths)
    ]
    names = {key: parts[0].features[key].names for key in ("qpos", "qvel", "action")}
    provenance = {"format": "policy_in_learned_sim", "parts": list(sources), "noise": args.noise}
    write_store(ArrayEpisodes(episodes, fps=parts[0].fps, names=names), data,
                provenance=provenance)  # fmt: skip


def _ppo(robot: Robot, where: str, export: Path, seed: int, steps: int) -> Any:
    import gymnasium
    import torch
    from stable_baselines3 import PPO

    from slhub.sim.learned import LearnedEnv

    torch.manual_seed(seed)
    env = LearnedEnv(robot.env, export) if where == "learned" else gymnasium.make(robot.env)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **robot.ppo)
    model.learn(total_timesteps=steps)
    env.close()
    return model


def _score(env_id: str, policy: Any, episodes: int) -> float:
    """Mean return in MuJoCo over reset seeds 10000.. (the same for every policy)."""
    import gymnasium

    env = gymnasium.make(env_id)
    returns = []
    for episode in range(episodes):
        observation, _ = env.reset(seed=10_000 + episode)
        total, done = 0.0, False
        while not done:
            action, _ = policy.predict(observation, deterministic=True)
            observation, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def _print(table: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\n{table['env']}, PPO {args.rl_steps} env steps, seeds {args.seeds}, "
          f"{args.eval_episodes} MuJoCo episodes each ({table['seconds']} s)")  # fmt: skip
    print("| policy trained in | return in MuJoCo (mean ± std over seeds) | per seed |")
    print("|---|---|---|")
    for where, label in (("learned", "learned simulator (NeRD)"), ("mujoco", "MuJoCo")):
        row = table[where]
        seeds = ", ".join(f"{r:.1f}" for r in row["per_seed"])
        print(f"| {label} | {row['mean']:.1f} ± {row['std']:.1f} | {seeds} |")
    print(json.dumps(table))


if __name__ == "__main__":
    main()
