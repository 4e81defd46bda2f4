"""Plot NeRD rollouts against the true trajectories of any robot (docs/nerd_rollout.png's figure).

Needs the ``plot`` extra (matplotlib). The checkpoint's model is rebuilt as ``slhub eval``
rebuilds it (its recipe, the weights it validated) and rolled out from the first
``history`` true steps of a held-out episode with the recorded actions; a few state
components are drawn, true against predicted, with the two baselines validation
reports ("state held", "change held") dashed. The episodes are the run's own held-out
ones, other recorded ones (``--set data.path=...``) or fresh ones from the simulator
(``--env``)::

    python scripts/plot_nerd_rollout.py --checkpoint outputs/nerd_cartpole/last.pt \\
        --out outputs/figures/nerd_rollout.png
    python scripts/plot_nerd_rollout.py --checkpoint outputs/nerd_hopper/last.pt \\
        --env gymnasium:Hopper-v5 --components qpos.rootz qpos.rooty qpos.thigh_joint \\
        --out outputs/figures/hopper.png
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slhub.builtin.nerd.data import window_offsets
from slhub.builtin.nerd.loss import rollout_episodes
from slhub.evaluation import prepared


def main(argv: list[str] | None = None) -> Any:
    """Draw and save the figure; returns it (its lines are what the tests check)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a NeRD checkpoint (v2)")
    parser.add_argument("--out", default="outputs/figures/nerd_rollout.png")
    parser.add_argument("--horizon", type=int, default=100)
    parser.add_argument("--episode", type=int, default=0, help="which long-enough episode")
    parser.add_argument("--components", nargs="*", help="state components (default: 4 first)")
    parser.add_argument("--env", help="fresh episodes from this simulator (PREFIX:ENV)")
    parser.add_argument("--seed", type=int, default=2025, help="with --env")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizons = f"validation.horizons=[{args.horizon}]"
    options = {"overrides": [*args.overrides, horizons], "seed": args.seed}
    if args.env:
        steps = prepared_history(args.checkpoint) + args.horizon + 1
        options.update(env=args.env, episodes=max(4, args.episode + 1), steps=steps)
    with prepared(args.checkpoint, **options) as ready:
        model, data = ready.model, ready.plugin._data
        layout, history = model.layout, model.arch.history
        validation = ready.trainer.section("validation")
        chosen = rollout_episodes(data, history, validation)[args.episode]
        window = window_offsets(layout, history + args.horizon, 0)
        whole = data.read(window, np.array([[chosen, history + args.horizon - 1]]))
        states = torch.from_numpy(whole["state"])
        inputs = [whole["action"]] + ([whole["extra"]] if layout.extra_names else [])
        controls = torch.from_numpy(np.concatenate(inputs, axis=-1))
        dtype = next(model.parameters()).dtype
        tokens = torch.cat([states[:, :history], controls[:, :history]], -1).to(dtype)
        with torch.no_grad():
            predicted = model.rollout(tokens, controls[:, history:].to(dtype)).double()[0]
        fps = data.dataset.fps or 1.0
        metrics = ready.validate()
    names = args.components or list(layout.state_names[:4])
    missing = [n for n in names if n not in layout.state_names]
    if missing:
        raise SystemExit(f"{missing[0]!r} is not a state component: {list(layout.state_names)}")
    truth = states[0].numpy()
    predicted = predicted.numpy()
    for i in layout.angles:  # drawn continuous: a wrap at +-pi is no vertical line
        truth[:, i] = np.unwrap(truth[:, i])
        start = truth[history - 1, i]
        predicted[:, i] = np.unwrap(np.concatenate([[start], predicted[:, i]]))[1:]
    last, before = truth[history - 1], truth[history - 2] if history > 1 else truth[history - 1]
    ahead = np.arange(1, args.horizon + 1)[:, None]
    held, linear = np.broadcast_to(last, (args.horizon, len(last))), last + ahead * (last - before)
    time = np.arange(len(truth)) / fps
    rows = (len(names) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(10, 2.6 * rows + 0.6), sharex=True, squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        i = layout.state_names.index(name)
        ax.axvspan(0, time[history - 1], color="0.9")
        ax.plot(time, truth[:, i], "k-", label="ground truth")
        ax.plot(time[history:], predicted[:, i], "C1-", label="NeRD rollout")
        ax.plot(time[history:], held[:, i], "C7--", lw=1, label="state held")
        span = np.ptp(truth[:, i]) or 1.0
        low, high = truth[:, i].min() - 0.5 * span, truth[:, i].max() + 0.5 * span
        ax.plot(time[history:], np.clip(linear[:, i], low, high), "C2:", lw=1, label="change held")
        ax.set_ylim(low, high)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    axes.flat[0].legend(loc="best", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("time [s] (grey: the true history the model starts from)")
    robot = args.env or Path(str(data.dataset.path)).name.split("-")[0]
    k = args.horizon
    fig.suptitle(
        f"NeRD on {robot}: a {k}-step rollout of held-out episode {chosen}\n"
        f"{k}-step MSE over every held-out episode: rollout "
        f"{metrics[f'rollout_mse_{k}']:.3g}, state held {metrics[f'baseline_mse_{k}']:.3g}, "
        f"change held {metrics[f'linear_mse_{k}']:.3g}",
        fontsize=10,
    )
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")
    return fig


def prepared_history(checkpoint_path: str) -> int:
    """The model's history length, from the checkpoint's recipe."""
    from slhub import checkpoint

    recipe = checkpoint.load(checkpoint_path).recipe or {}
    return int((recipe.get("model") or {}).get("history", 10))


if __name__ == "__main__":
    main()
