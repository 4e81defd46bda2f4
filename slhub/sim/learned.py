"""A learned simulator in place of MuJoCo: a gymnasium env whose integration step is a
NeRD export's prediction.

:class:`LearnedEnv` wraps the real gymnasium MuJoCo env (``InvertedPendulum-v5``,
``Hopper-v5``, ...) and replaces only its integration step, the ``do_simulation``
that every gymnasium MuJoCo env calls inside its own ``step``. That step asks the
export for the next state, writes the predicted ``qpos`` and ``qvel`` into the env's
``MjData`` and forward-computes it (``mj_forward``, then ``mj_rnePostConstraint`` as
gymnasium does after ``mj_step``). Everything else is the env's own code, run on the
predicted state: observation, reward, termination, info, the reset distribution, the
time limit (``truncated``) and rendering. A policy trained in it is then run in the
real env unchanged (same spaces).

What the export must be, checked when the env is made (one ``ValueError`` line
otherwise):

- its state is exactly the env's ``qpos`` and ``qvel``, named as ``slhub data
  collect`` names them (``qpos.<joint component>``, ``qvel.<joint component>``,
  :mod:`slhub.sim.names`), in any order;
- its action has one component per actuator; actions are clipped to the control
  range first, as MuJoCo clamps them;
- its extra inputs, if any, are contact inputs: ``contact.<body>`` (per body, the
  summed normal force of its active contacts) or ``contact_geometry.<slot>_<component>``
  (the contact slots' point, normal, depth and active mask); each step computes them
  from the current (predicted, forward-computed) state the way collect records them
  (:mod:`slhub.sim.contacts`); other extra inputs are refused;
- the model has no actuator activations (``model.na == 0``): its state would not be
  ``qpos`` and ``qvel`` alone.

History: an episode starts from the real env's reset state. A causal export steps
from there with no history (its first window positions are trained on exactly
that: a prefix); a non-causal export needs ``history - 1`` steps before it, so by
default that many real MuJoCo steps with zero action follow the reset
(``warm_start``) and make its history (they count towards the env's time limit).

Quantities MuJoCo derives from the state (body positions, contact forces) are the
predicted state's after ``mj_forward``; after a real ``mj_step`` the env reads them
at the start of the last sub-step. Envs that use only ``qpos``/``qvel`` for
observation, reward and termination (InvertedPendulum-v5, Hopper-v5, Walker2d-v5,
HalfCheetah-v5, Swimmer-v5) therefore see exactly what they would see in MuJoCo given
the same states (tested for InvertedPendulum-v5 and Hopper-v5); Ant-v5's contact cost
and Reacher-v5's fingertip differ from MuJoCo's by that sub-step.

``gymnasium.make("slhub/Learned-v0", env_id="InvertedPendulum-v5", export=DIR)``
makes one once this module is imported (or with the id
``"slhub.sim.learned:slhub/Learned-v0"``, which imports it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from slhub.errors import SimulatorError
from slhub.sim.contacts import ContactInputs
from slhub.sim.names import qpos_names, qvel_names
from slhub.sim.render import import_mujoco

#: The gymnasium id this module registers.
ENV_ID = "slhub/Learned-v0"

try:
    import gymnasium
except ImportError:  # the sim extra is missing: LearnedEnv says so when made
    gymnasium = None  # type: ignore[assignment]

_Base: Any = gymnasium.Env if gymnasium is not None else object


class LearnedEnv(_Base):
    """``env_id``'s gymnasium MuJoCo env with ``export`` as its integration step.

    :param env_id: a gymnasium MuJoCo env id, ``InvertedPendulum-v5`` (a
        ``gymnasium:`` prefix, as ``slhub data collect`` writes it, is accepted).
    :param export: an export directory (:func:`slhub.export.load`) or a loaded
        predictor (``state_names``, ``action_names``, ``extra_names``, ``input_names``,
        ``dtype``, ``history``, ``simulator(past, state, input_names=...)``).
    :param warm_start: real MuJoCo steps (zero action) after each reset that make the
        export's first history; default 0 for a causal export, ``history - 1`` else.
    :param make_kwargs: passed to ``gymnasium.make`` for the real env
        (``max_episode_steps``, ``render_mode``, the env's own options).
    :raises ValueError: the export does not simulate this env (one line).
    """

    def __init__(
        self,
        env_id: str,
        export: str | Path | Any,
        *,
        warm_start: int | None = None,
        **make_kwargs: Any,
    ) -> None:
        if gymnasium is None:
            raise SimulatorError(
                "a learned env needs gymnasium, which is not installed: pip install 'slhub[sim]'"
            )
        import torch

        self._torch = torch
        self._mujoco = import_mujoco()
        self.env_id = env_id.removeprefix("gymnasium:")
        self.predictor = _load(export)
        self.env = gymnasium.make(self.env_id, disable_env_checker=True, **make_kwargs)
        try:
            raw = self.env.unwrapped
            self._raw = raw
            self.model, self.data = raw.model, raw.data
            self._layout = _Layout(self.predictor, self.model, self.env_id, _where(export))
        except BaseException:
            self.env.close()
            raise
        causal = bool(getattr(self.predictor, "causal", True))
        default = 0 if causal else int(self.predictor.history) - 1
        self.warm_start = default if warm_start is None else int(warm_start)
        if self.warm_start < 0:
            raise ValueError(f"warm_start {warm_start!r}: a number of steps >= 0")
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space
        self.metadata = self.env.metadata
        self.render_mode = self.env.render_mode
        self.dt = float(raw.dt)
        limited = np.asarray(self.model.actuator_ctrllimited, dtype=bool)
        ranges = np.array(self.model.actuator_ctrlrange, dtype=np.float64).reshape(-1, 2)
        ranges[~limited] = (-np.inf, np.inf)
        self._low, self._high = ranges[:, 0], ranges[:, 1]
        self._real_step = raw.do_simulation
        raw.do_simulation = self._predict  # the env's own step calls it
        self._sim: Any = None

    # ------------------------------------------------------------ gymnasium API

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._sim = None  # the real integration step while warming up
        observation, info = self.env.reset(seed=seed, options=options)
        torch, predictor = self._torch, self.predictor
        past = []
        zero = np.zeros(self.model.nu, dtype=np.float64)
        for _ in range(self.warm_start):
            past.append(np.concatenate([self._layout.state(self.data), zero, self._extra()]))
            observation, _, _, _, info = self.env.step(zero)
        width = len(predictor.input_names)
        history = torch.from_numpy(np.asarray(past, dtype=np.float64).reshape(1, -1, width))
        state = torch.from_numpy(self._layout.state(self.data)[None])
        self._sim = predictor.simulator(
            history.to(predictor.dtype), state.to(predictor.dtype),
            input_names=predictor.input_names,
        )  # fmt: skip
        return observation, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        if self._sim is None:
            raise SimulatorError(f"{ENV_ID} ({self.env_id}): step before reset")
        return self.env.step(action)

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    # ------------------------------------------------------------ the integration step

    def _predict(self, ctrl: Any, n_frames: int) -> None:
        """The env's ``do_simulation``: the export's next state instead of ``mj_step``."""
        if self._sim is None:
            self._real_step(ctrl, n_frames)
            return
        ctrl = np.asarray(ctrl, dtype=np.float64)
        if ctrl.shape != (self.model.nu,):
            raise ValueError(
                f"Action dimension mismatch. Expected {(self.model.nu,)}, found {ctrl.shape}"
            )
        applied = np.clip(ctrl, self._low, self._high)
        torch, predictor = self._torch, self.predictor
        control = torch.from_numpy(np.concatenate([applied, self._extra()])[None])
        following = self._sim.step(control.to(predictor.dtype))
        qpos, qvel = self._layout.split(following[0].to(torch.float64).numpy())
        mujoco, model, data = self._mujoco, self.model, self.data
        data.qpos[:] = qpos
        data.qvel[:] = qvel
        data.ctrl[:] = applied
        data.time += self.dt
        mujoco.mj_forward(model, data)
        mujoco.mj_rnePostConstraint(model, data)

    def _extra(self) -> np.ndarray:
        """The export's extra inputs at the current (forward-computed) state."""
        return self._layout.contacts(self._mujoco, self.data)


class _Layout:
    """Where the export's state, action and extra components are in MuJoCo's arrays."""

    def __init__(self, predictor: Any, model: Any, env_id: str, where: str) -> None:
        names = tuple(predictor.state_names)
        wanted = [f"qpos.{n}" for n in qpos_names(model)] + [f"qvel.{n}" for n in qvel_names(model)]
        if sorted(names) != sorted(wanted) or len(set(names)) != len(names):
            raise ValueError(
                f"{where} predicts the state {list(names)}; a learned {env_id} needs exactly "
                f"its qpos and qvel, {wanted} (slhub data collect's names, any order)"
            )
        if model.na:
            raise ValueError(
                f"{env_id} has {model.na} actuator activations, which are not in a qpos, "
                "qvel state; a learned env cannot simulate it"
            )
        actions = tuple(predictor.action_names)
        if len(actions) != model.nu:
            raise ValueError(
                f"{where} takes {len(actions)} action components {list(actions)}; "
                f"{env_id} has {model.nu} controls"
            )
        try:
            self.contacts = ContactInputs(model, predictor.extra_names, f"a learned {env_id}")
        except ValueError as exc:
            raise ValueError(f"{where} takes extra inputs it cannot be given: {exc}") from None
        order = {name: index for index, name in enumerate(names)}
        self.gather = np.array([order[n] for n in wanted])  # export -> qpos, qvel
        self.scatter = np.array([wanted.index(n) for n in names])  # qpos, qvel -> export
        self.nq = model.nq

    def state(self, data: Any) -> np.ndarray:
        """The export's state vector of ``data``."""
        return np.concatenate([data.qpos, data.qvel]).astype(np.float64)[self.scatter]

    def split(self, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``qpos``, ``qvel`` of an export's state vector."""
        ordered = state[self.gather]
        return ordered[: self.nq], ordered[self.nq :]


def _load(export: str | Path | Any) -> Any:
    if isinstance(export, str | Path):
        from slhub.export import load

        return load(export)
    return export


def _where(export: Any) -> str:
    return f"export {export}" if isinstance(export, str | Path) else "the export"


if gymnasium is not None and ENV_ID not in gymnasium.registry:
    gymnasium.register(ENV_ID, entry_point=f"{__name__}:LearnedEnv")
