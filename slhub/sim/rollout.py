"""Closed-loop rollouts of a policy in a simulator: what judges a policy in its environment.

:func:`rollout_policy` runs ``episodes`` episodes and returns their returns, lengths
and successes (:class:`Rollouts`); training validation (BC's ``validation.env``) and
``slhub eval --env`` share it, so a policy is judged the same way in both.

- **Seeds**: episode ``e`` resets the env with :func:`reset_seeds` ``(seed, n)[e]``,
  the seed ``slhub data collect --seed SEED`` gives its episode ``e``: the same initial
  state whatever the number of episodes, and the starts of a collected dataset can
  be replayed. Nothing else is random here: a deterministic policy gets the same
  returns every time, and no process-wide random stream is drawn from.
- **Observations**: before every action, the features ``slhub data collect``
  records are taken from the simulator (``observation``: the env's; ``qpos``,
  ``qvel``; ``image``: a frame rendered with :class:`Camera`), and the policy sees each
  at the ``history`` offsets (``-2, 0``: two steps back and now); before an episode's
  first step the first one repeats, as a padded window repeats an episode's edge.
- **Action chunks**: ``act`` returns ``[n, nu]`` (or ``[nu]``); its rows are applied in
  order and the policy is asked again once they are spent (receding horizon: return
  the first ``n_action_steps`` of a chunk, as diffusion_policy executes them).
- **Ends**: an episode ends when the env terminates or truncates, or after
  ``max_steps`` steps. **Success** is ``info["is_success"]`` at any step where the env
  reports it (robomimic's convention); InvertedPendulum and Reacher report none.
- **Time budget**: a started episode is finished; a new one starts only while
  ``time_budget_s`` lasts (so at least one runs); :attr:`Rollouts.episodes` says how
  many ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slhub.errors import SimulatorError
from slhub.sim.simulator import Simulator

#: The per-step features a rollout can show a policy (those ``slhub data collect`` records).
ROLLOUT_FEATURES = ("observation", "qpos", "qvel", "image")

#: ``act(window) -> actions``: ``window`` maps each feature to ``[K, ...]`` at the history
#: offsets; the result is ``[n, nu]`` (applied in order) or ``[nu]``.
Act = Callable[[dict[str, np.ndarray]], Any]


@dataclass(frozen=True)
class Camera:
    """Which camera renders frames, and their side in pixels (as ``collect --render``)."""

    name: str = "follow"
    size: int = 64


@dataclass(frozen=True)
class Rollouts:
    """What :func:`rollout_policy` ran: one entry per episode, in order."""

    returns: tuple[float, ...]
    lengths: tuple[int, ...]
    #: Per episode, whether ``info["is_success"]`` was true at some step; None when the
    #: env never reports it.
    successes: tuple[bool, ...] | None
    seeds: tuple[int, ...]
    #: Episodes asked for (more than ran when the time budget stopped the rollouts).
    planned: int
    #: The first episode's frames ``[length + 1, size, size, 3]`` uint8 (with ``video``).
    frames: np.ndarray | None
    elapsed_s: float
    #: Seconds of simulated time per step (a video's frame rate is ``1 / dt``).
    dt: float

    @property
    def episodes(self) -> int:
        return len(self.returns)

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns))

    @property
    def mean_length(self) -> float:
        return float(np.mean(self.lengths))

    @property
    def success_rate(self) -> float | None:
        return None if self.successes is None else float(np.mean(self.successes))

    def metrics(self, prefix: str = "env_") -> dict[str, float]:
        """Mean return and length, episodes run, and the success rate where the env
        reports success: what a validation reports."""
        out = {
            f"{prefix}return": self.mean_return,
            f"{prefix}length": self.mean_length,
            f"{prefix}episodes": float(self.episodes),
        }
        if self.success_rate is not None:
            out[f"{prefix}success"] = self.success_rate
        return out


def reset_seeds(seed: int, episodes: int) -> list[int]:
    """The env reset seed of each episode: ``slhub data collect``'s derivation
    (``SeedSequence(seed).spawn(episodes)``, each child's first child)."""
    out = []
    for child in np.random.SeedSequence(int(seed)).spawn(int(episodes)):
        reset_seed, _ = child.spawn(2)
        out.append(int(reset_seed.generate_state(1)[0]))
    return out


def rollout_policy(
    simulator: Simulator,
    act: Act,
    *,
    episodes: int,
    seed: int = 0,
    max_steps: int | None = None,
    features: Sequence[str] = ("observation",),
    history: Sequence[int] = (0,),
    render: Camera | None = None,
    video: Camera | None = None,
    time_budget_s: float | None = None,
    clip: bool = True,
) -> Rollouts:
    """Roll ``act`` out in ``simulator`` for ``episodes`` episodes (module docstring).

    :param features: what ``act`` sees, among :data:`ROLLOUT_FEATURES`; ``image``
        needs ``render``.
    :param history: step offsets ``<= 0`` of each feature in ``act``'s window.
    :param video: also render the first episode from this camera (:attr:`Rollouts.frames`).
    :param clip: clip actions to the ctrlrange of limited actuators, as collect does.
    :raises SimulatorError: a bad argument, or ``act`` returning a wrong shape or a
        non-finite action.
    """
    _check(episodes, max_steps, features, history, render, time_budget_s)
    offsets = np.asarray(history, dtype=np.int64)
    reach = int(-offsets.min())
    nu = len(simulator.action_names)
    low, high = simulator.ctrl_range[:, 0], simulator.ctrl_range[:, 1]
    seeds = reset_seeds(seed, episodes)
    started = time.monotonic()
    returns: list[float] = []
    lengths: list[int] = []
    successes: list[bool | None] = []
    frames: list[np.ndarray] = []
    for index, reset_seed in enumerate(seeds):
        if index and time_budget_s is not None and time.monotonic() - started >= time_budget_s:
            break
        observation = simulator.reset(reset_seed)
        past: list[dict[str, np.ndarray]] = []
        queue: list[np.ndarray] = []
        total, steps, success = 0.0, 0, None
        while max_steps is None or steps < max_steps:
            past.append(_record(simulator, observation, features, render))
            if index == 0 and video is not None:
                frames.append(simulator.render(video.name, video.size))
            del past[: max(len(past) - reach - 1, 0)]  # only the history is kept
            if not queue:
                queue = list(_actions(act(_window(past, offsets, features)), nu))
            action = queue.pop(0)
            if clip:
                action = np.clip(action, low, high)
            step = simulator.step(action)
            total += step.reward
            steps += 1
            if step.success is not None:
                success = bool(success) or step.success
            observation = step.observation
            if step.terminated or step.truncated:
                break
        if index == 0 and video is not None:
            frames.append(simulator.render(video.name, video.size))
        returns.append(float(total))
        lengths.append(steps)
        successes.append(success)
    reported = None if all(s is None for s in successes) else tuple(bool(s) for s in successes)
    return Rollouts(
        returns=tuple(returns),
        lengths=tuple(lengths),
        successes=reported,
        seeds=tuple(seeds[: len(returns)]),
        planned=int(episodes),
        frames=np.stack(frames) if frames else None,
        elapsed_s=time.monotonic() - started,
        dt=float(simulator.dt),
    )


def _record(
    simulator: Simulator,
    observation: np.ndarray,
    features: Sequence[str],
    render: Camera | None,
) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name in features:
        if name == "observation":
            out[name] = np.array(observation)
        elif name == "qpos":
            out[name] = simulator.qpos
        elif name == "qvel":
            out[name] = simulator.qvel
        else:
            assert render is not None
            out[name] = simulator.render(render.name, render.size)
    return out


def _window(
    past: list[dict[str, np.ndarray]], offsets: np.ndarray, features: Sequence[str]
) -> dict[str, np.ndarray]:
    """Each feature at ``offsets`` from the last recorded step; before the first step
    the first one repeats."""
    now = len(past) - 1
    rows = [past[max(now + int(o), 0)] for o in offsets]
    return {name: np.stack([row[name] for row in rows]) for name in features}


def _actions(raw: Any, nu: int) -> np.ndarray:
    try:
        actions = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        raise SimulatorError(f"the policy returned {type(raw).__name__}, not actions") from None
    shape = list(actions.shape)
    if actions.ndim == 1:
        actions = actions[None]
    if actions.ndim != 2 or actions.shape[1] != nu or len(actions) == 0:
        raise SimulatorError(
            f"the policy returned actions of shape {shape}; the simulator takes "
            f"[n, {nu}] (or [{nu}])"
        )
    if not np.isfinite(actions).all():
        raise SimulatorError("the policy returned a non-finite action")
    return actions


def _check(
    episodes: int,
    max_steps: int | None,
    features: Sequence[str],
    history: Sequence[int],
    render: Camera | None,
    time_budget_s: float | None,
) -> None:
    if isinstance(episodes, bool) or not isinstance(episodes, int | np.integer) or episodes < 1:
        raise SimulatorError(f"episodes {episodes!r}: an integer >= 1")
    if max_steps is not None and (isinstance(max_steps, bool) or int(max_steps) < 1):
        raise SimulatorError(f"max_steps {max_steps!r}: an integer >= 1, or None")
    unknown = [name for name in features if name not in ROLLOUT_FEATURES]
    if unknown or not features:
        raise SimulatorError(
            f"features {list(features)}: a rollout shows the policy {', '.join(ROLLOUT_FEATURES)}"
        )
    if "image" in features and render is None:
        raise SimulatorError("the image feature needs a camera to render it (render=Camera(...))")
    if not len(history) or any(int(o) > 0 for o in history):
        raise SimulatorError(f"history {list(history)}: step offsets <= 0 (0 is now)")
    if time_budget_s is not None and not time_budget_s > 0:
        raise SimulatorError(f"time_budget_s {time_budget_s!r}: seconds > 0, or None")
