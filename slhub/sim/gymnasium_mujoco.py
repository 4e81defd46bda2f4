"""The built-in simulator: any gymnasium env built on MuJoCo (``gymnasium:Hopper-v5``).

Stepping goes through the env (its wrappers included: ``TimeLimit`` says
``truncated``), so rewards, terminations and observations are the env's own.
State is MuJoCo's: :meth:`GymnasiumMujoco.state` is ``mj_getState`` with
``mjSTATE_INTEGRATION`` (time, qpos, qvel, actuator activations, the solver's
warm start, controls, applied forces, mocap poses), everything ``mj_step`` reads,
so :meth:`~GymnasiumMujoco.restore` (``mj_setState``) followed by the same
actions reproduces an episode bit for bit on the same MuJoCo build.

Contact forces and frames are computed on a second ``MjData`` set to
:meth:`~GymnasiumMujoco.state` and ``mj_forward`` -ed: after ``mj_step`` the
env's own data holds kinematics and contacts of the last sub-step's start, not of
the state it reports, and the env's data is never touched beyond what it does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from slhub.errors import SimulatorError, one_line
from slhub.sim.contacts import body_contact_forces, contact_geometry, contact_geoms, slot_names
from slhub.sim.initial_states import random_state
from slhub.sim.names import actuator_names, body_names, joint_names, qpos_names, qvel_names
from slhub.sim.render import FOLLOW, OffscreenCamera, import_mujoco
from slhub.sim.simulator import Step

PREFIX = "gymnasium"


class GymnasiumMujoco:
    """A gymnasium MuJoCo env, by id (see :class:`slhub.sim.Simulator` for the members)."""

    def __init__(self, env: str, *, max_steps: int | None = None) -> None:
        self._mujoco = mujoco = import_mujoco()
        try:
            import gymnasium
        except ImportError as exc:
            raise SimulatorError(
                f"simulating needs {exc.name or 'gymnasium'}, which is not installed: "
                "pip install 'slhub[sim]'"
            ) from None
        self.name = f"{PREFIX}:{env}"
        options: dict[str, Any] = {"disable_env_checker": True}
        if max_steps is not None:
            options["max_episode_steps"] = int(max_steps)
        try:
            self.env = gymnasium.make(env, **options)
        except Exception as exc:  # noqa: BLE001 - an env that cannot be made is bad input
            raise SimulatorError(f"--env {self.name}: {one_line(exc, limit=240)}") from None
        raw = self.env.unwrapped
        self.model = getattr(raw, "model", None)
        self.data = getattr(raw, "data", None)
        if not isinstance(self.model, mujoco.MjModel) or not isinstance(self.data, mujoco.MjData):
            self.env.close()
            raise SimulatorError(
                f"--env {self.name}: {type(raw).__name__} is not a MuJoCo env (it has no "
                "MjModel); collect needs one, e.g. gymnasium:Hopper-v5"
            )
        model = self.model
        self.dt = float(raw.dt)
        self.joint_names = joint_names(model)
        self.qpos_names = qpos_names(model)
        self.qvel_names = qvel_names(model)
        self.action_names = actuator_names(model)
        self.contact_names = body_names(model) if _can_collide(model) else None
        self.contact_slots = slot_names(model) if self.contact_names is not None else None
        self._slot_geoms = contact_geoms(model)
        limited = np.asarray(model.actuator_ctrllimited, dtype=bool)
        ranges = np.array(model.actuator_ctrlrange, dtype=np.float64).reshape(model.nu, 2)
        ranges[~limited] = (-np.inf, np.inf)
        self.ctrl_range = ranges
        self.versions = {"mujoco": mujoco.__version__, "gymnasium": gymnasium.__version__}
        self._kind = mujoco.mjtState.mjSTATE_INTEGRATION
        self._size = mujoco.mj_stateSize(model, self._kind)
        self._view = mujoco.MjData(model)
        self._view_fresh = False
        self._cameras: dict[tuple[str, int], OffscreenCamera] = {}
        self._started = False

    # ------------------------------------------------------------ stepping

    def reset(self, seed: int) -> np.ndarray:
        observation, _ = self.env.reset(seed=int(seed))
        self._started = True
        self._view_fresh = False
        return _vector(observation, self.name)

    def randomize(self, rng: np.random.Generator) -> np.ndarray:
        """Redraw the state around the one :meth:`reset` left
        (:mod:`slhub.sim.initial_states`) and return the env's observation of it."""
        raw = self.env.unwrapped
        if not hasattr(raw, "_get_obs"):
            raise SimulatorError(
                f"--init random: {self.name} has no _get_obs to observe another state "
                "(gymnasium's MuJoCo envs have it)"
            )
        random_state(self._mujoco, self.model, self.data, rng)  # sets and forwards the env's data
        self._view_fresh = False
        # private: the env's own observation of a state set from outside has no public
        # method (its step and reset_model call _get_obs); tests/test_private_apis.py
        return _vector(raw._get_obs(), self.name)

    def step(self, action: np.ndarray) -> Step:
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (self.model.nu,):
            raise SimulatorError(
                f"{self.name}: an action of shape {list(action.shape)}; the env has "
                f"{self.model.nu} controls ({', '.join(self.action_names)})"
            )
        observation, reward, terminated, truncated, info = self.env.step(action)
        self._view_fresh = False
        success = info.get("is_success") if isinstance(info, dict) else None
        return Step(
            _vector(observation, self.name),
            float(reward),
            bool(terminated),
            bool(truncated),
            None if success is None else bool(success),
        )

    # ------------------------------------------------------------ state

    def state(self) -> np.ndarray:
        out = np.empty(self._size, dtype=np.float64)
        self._mujoco.mj_getState(self.model, self.data, out, self._kind)
        return out

    def restore(self, state: np.ndarray) -> None:
        """``mj_setState`` then ``mj_forward`` (positions and contacts of ``state``, for
        frames and observations). The env's own counters are not part of MuJoCo's
        state: ``truncated`` still counts steps from the last :meth:`reset`."""
        state = np.ascontiguousarray(state, dtype=np.float64)
        if state.shape != (self._size,):
            raise SimulatorError(
                f"{self.name}: a state of shape {list(state.shape)}; this model's integration "
                f"state has {self._size} values (a state of another model or MuJoCo build?)"
            )
        if not self._started:  # the env's wrappers refuse a step before the first reset
            self.reset(0)
        self._mujoco.mj_setState(self.model, self.data, state, self._kind)
        self._mujoco.mj_forward(self.model, self.data)
        self._view_fresh = False

    @property
    def qpos(self) -> np.ndarray:
        return np.array(self.data.qpos, dtype=np.float64)

    @property
    def qvel(self) -> np.ndarray:
        return np.array(self.data.qvel, dtype=np.float64)

    # ------------------------------------------------------------ derived views

    def contact(self) -> np.ndarray | None:
        """Per body (world left out), the summed normal force of the active contacts that
        touch one of its geoms, at the current state (a contact between two bodies
        counts for both)."""
        if self.contact_names is None:
            return None
        return body_contact_forces(self._mujoco, self.model, self._synced())

    def contact_geometry(self) -> np.ndarray | None:
        """The contact slots of :attr:`contact_slots` at the current state
        (:mod:`slhub.sim.contacts`), or None when no two geoms can collide."""
        if self.contact_slots is None:
            return None
        return contact_geometry(self.model, self._synced(), self._slot_geoms)

    def render(self, camera: str = FOLLOW, size: int = 64) -> np.ndarray:
        key = (camera, int(size))
        if key not in self._cameras:
            self._cameras[key] = OffscreenCamera(self.model, camera, int(size))
        return self._cameras[key].render(self._synced())

    def close(self) -> None:
        for camera in self._cameras.values():
            camera.close()
        self._cameras = {}
        self.env.close()

    def _synced(self) -> Any:
        """The second MjData at the current state, forward-computed."""
        if not self._view_fresh:
            self._mujoco.mj_setState(self.model, self._view, self.state(), self._kind)
            self._mujoco.mj_forward(self.model, self._view)
            self._view_fresh = True
        return self._view


def _can_collide(model: Any) -> bool:
    """Whether any two geoms may touch: explicit pairs, or contype/conaffinity bits that
    meet (InvertedPendulum's are all zero: no contact feature)."""
    if model.npair > 0:
        return True
    kinds = np.asarray(model.geom_contype, dtype=np.int64)
    affinities = np.asarray(model.geom_conaffinity, dtype=np.int64)
    meet = (kinds[:, None] & affinities[None, :]) | (kinds[None, :] & affinities[:, None])
    np.fill_diagonal(meet, 0)
    return bool(meet.any())


def _vector(observation: Any, name: str) -> np.ndarray:
    if not isinstance(observation, np.ndarray):
        raise SimulatorError(
            f"--env {name}: observations are {type(observation).__name__}, not one array; "
            "collect records array observations only"
        )
    return observation
