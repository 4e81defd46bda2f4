"""Plot a NeRD rollout against the true cart-pole trajectory (makes docs/nerd_rollout.png).

Needs the ``plot`` extra (matplotlib). Uses only the exported model (``slhub.export.load``)
and the numpy cart-pole simulator, on a fresh trajectory whose seed is used by
neither the training nor the validation split:

    python -m slhub export --checkpoint outputs/nerd_cartpole/last.pt --out exports/nerd_cartpole
    python scripts/plot_nerd_rollout.py --export exports/nerd_cartpole --out docs/nerd_rollout.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from slhub.data import generate_trajectories, wrap_angle
from slhub.export import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", required=True, help="directory written by `slhub export`")
    parser.add_argument("--out", default="docs/nerd_rollout.png")
    parser.add_argument("--horizon", type=int, default=100)
    parser.add_argument("--seed", type=int, default=2025, help="seed of the plotted trajectory")
    parser.add_argument("--trajectories", type=int, default=64, help="for the printed MSE")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    predictor = load(args.export)
    history = predictor.history
    states, actions = generate_trajectories(
        args.trajectories, history + args.horizon - 1, seed=args.seed
    )
    tokens = np.concatenate([states[:, :history], actions[:, :history]], axis=-1)
    future = actions[:, history : history + args.horizon - 1]

    def as_tensor(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(predictor.dtype)

    predicted = predictor.rollout(
        as_tensor(tokens), as_tensor(future), input_names=predictor.input_names
    )
    predicted = predicted.double().numpy()
    truth = states[:, history : history + args.horizon]
    constant = np.broadcast_to(states[:, history - 1 : history], truth.shape)

    def mse(pred: np.ndarray) -> float:
        diff = pred - truth
        diff[..., 1] = wrap_angle(diff[..., 1])
        return float(np.mean(diff**2))

    print(
        f"{args.trajectories} fresh trajectories, {args.horizon}-step rollout state MSE: "
        f"NeRD {mse(predicted):.4g}, constant-state baseline {mse(constant.copy()):.4g}"
    )

    time = np.arange(history + args.horizon) * 0.02
    fig, axes = plt.subplots(2, 2, figsize=(10, 6), sharex=True)
    labels = [
        "cart position x [m]",
        "pole angle θ [rad]",
        "cart velocity ẋ [m/s]",
        "pole rate θ̇ [rad/s]",
    ]
    for i, ax in enumerate(axes.flat):
        ax.plot(time[: history + args.horizon], states[0, : history + args.horizon, i], "k-")
        ax.plot(time[history:], predicted[0, :, i], "C1--")
        ax.axvspan(0, time[history - 1], color="0.9")
        ax.set_ylabel(labels[i])
        ax.grid(alpha=0.3)
    axes[0, 0].legend(["ground truth", "NeRD rollout"], loc="best")
    for ax in axes[1]:
        ax.set_xlabel("time [s] (grey: true history given to the model)")
    fig.suptitle(f"NeRD cart-pole: {args.horizon}-step autoregressive rollout (seed {args.seed})")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
