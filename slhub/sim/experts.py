"""Experts that make demonstrations from the simulator itself, for ``slhub data collect
--actions policy --policy slhub.sim.experts:NAME`` (and ``--noise STD`` for DART).

Each expert is ``FUNCTION(observation, simulator) -> action`` (what
:mod:`slhub.sim.actions` calls). It reads the observation only, and the
simulator's MuJoCo model (``simulator.model``, as :class:`GymnasiumMujoco` has) for
what the physics says, never the env's own data: a behavior-cloned policy sees
the same observation, so what the expert does is something it can learn, and the
expert is a pure function of it (no randomness, no memory between steps), which
keeps a collect byte-identical.

- :func:`inverted_pendulum` (``InvertedPendulum-v5``): an LQR about the upright
  equilibrium from MuJoCo's own finite-difference linearization
  (``mjd_transitionFD``), held over the env's frame skip, with the gain from
  scipy's discrete-time Riccati solver; clipped to the ctrlrange.
- :func:`reacher` (``Reacher-v5``): inverse kinematics by damped least squares on
  the fingertip's Jacobian (``mj_jacBody``), then a joint-space PD toward that pose
  with small torques, since the env charges ``|action|^2`` each step.

Gains are derived once per model and kept beside it (a weak reference: they go
when the model does).
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from slhub.errors import SimulatorError
from slhub.sim.render import import_mujoco
from slhub.sim.simulator import Simulator

#: LQR state cost on (cart position, pole angle, cart velocity, pole angular velocity):
#: the angle matters most (the env terminates past 0.2 rad); the cart is kept near the
#: rail's middle (its joint stops at +-1 m).
PENDULUM_Q = (1.0, 10.0, 0.1, 0.1)
#: LQR control cost (the ctrlrange is +-3).
PENDULUM_R = 0.1

#: Reacher's PD: the action is ``REACHER_GAIN`` times the joint move to the target
#: pose less ``REACHER_DAMPING`` times the joint velocity (tuned on the mean return
#: over seeds 0-19: the env charges the distance and ``|action|^2`` every step).
REACHER_GAIN = 0.25
REACHER_DAMPING = 0.05
#: Inverse kinematics: damping of the least squares (m^2: keeps a step finite where
#: the arm is stretched out or folded), iterations, the largest step (rad), and the
#: elbow bend (rad) of the alternative starts.
REACHER_LAMBDA = 1e-4
REACHER_ITERATIONS = 12
REACHER_MAX_STEP = 0.3
REACHER_ELBOW = 1.5

_pendulum_gains: weakref.WeakKeyDictionary[Any, np.ndarray] = weakref.WeakKeyDictionary()
_reachers: weakref.WeakKeyDictionary[Any, _Arm] = weakref.WeakKeyDictionary()


def inverted_pendulum(observation: np.ndarray, simulator: Simulator) -> np.ndarray:
    """The LQR force keeping InvertedPendulum's pole up and its cart centred.

    ``observation`` is ``(x, theta, x_dot, theta_dot)``, the model's ``qpos, qvel``.
    """
    model = _model(simulator, "inverted_pendulum")
    if model.nq != 2 or model.nv != 2 or model.nu != 1 or model.na != 0:
        raise SimulatorError(
            f"--policy slhub.sim.experts:inverted_pendulum: {simulator.name} is not an "
            f"inverted pendulum (nq {model.nq}, nu {model.nu}; it wants InvertedPendulum-v5)"
        )
    gain = _pendulum_gains.get(model)
    if gain is None:
        gain = _pendulum_gains[model] = pendulum_gain(model, _frame_skip(model, simulator))
    state = np.asarray(observation, dtype=np.float64)
    action = -gain @ state
    return _clip(action, model)


def pendulum_gain(
    model: Any,
    frame_skip: int,
    q: tuple[float, ...] = PENDULUM_Q,
    r: float = PENDULUM_R,
) -> np.ndarray:
    """The discrete LQR gain ``K`` (``u = -K x``) of ``model`` linearized at rest at
    ``qpos = qvel = 0``, for controls held ``frame_skip`` physics steps (one env step).

    ``mjd_transitionFD`` gives ``x' = A x + B u`` of one ``mj_step``; held over ``k``
    steps that is ``A^k`` and ``(A^(k-1) + ... + I) B``.
    """
    from scipy.linalg import solve_discrete_are

    mujoco = import_mujoco()
    linear = copy.copy(model)  # the caller's model is left as it is
    if linear.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4:
        # mjd_transitionFD refuses RK4 (InvertedPendulum's); semi-implicit Euler at the same
        # timestep has the same equilibrium and nearly the same one-step map
        linear.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
    data = mujoco.MjData(linear)
    mujoco.mj_resetData(linear, data)
    mujoco.mj_forward(linear, data)
    size = 2 * linear.nv + linear.na
    a = np.zeros((size, size))
    b = np.zeros((size, linear.nu))
    mujoco.mjd_transitionFD(linear, data, 1e-6, True, a, b, None, None)
    held_a, held_b = np.eye(size), np.zeros_like(b)
    for _ in range(frame_skip):
        held_a, held_b = a @ held_a, a @ held_b + b
    # MuJoCo's state is (qpos as tangent, qvel): for slide and hinge joints that is the
    # observation's (x, theta, x_dot, theta_dot)
    cost_q, cost_r = np.diag(np.asarray(q, dtype=np.float64)), np.eye(model.nu) * r
    p = solve_discrete_are(held_a, held_b, cost_q, cost_r)
    return np.linalg.solve(cost_r + held_b.T @ p @ held_b, held_b.T @ p @ held_a)


@dataclass
class _Arm:
    """What the reacher expert keeps per model: its own MjData for the kinematics, and
    the arm joints' places and limits."""

    data: Any
    fingertip: int
    #: Where the arm joints are in ``qpos`` and in ``qvel``.
    arm_qpos: np.ndarray
    arm_dofs: np.ndarray
    #: Per arm joint: bounded (``low`` .. ``high``), or a hinge that turns freely (its
    #: moves are taken the short way round).
    limited: np.ndarray
    low: np.ndarray
    high: np.ndarray


def reacher(observation: np.ndarray, simulator: Simulator) -> np.ndarray:
    """Torques moving Reacher's fingertip to the target: a joint-space PD toward the
    arm pose the inverse kinematics finds for the target.

    ``observation`` is ``cos q, sin q, target xy, q_dot, fingertip - target (xy)`` for
    the two arm joints ``q``; the fingertip and its Jacobian come from the model at
    ``q`` (``mj_kinematics``, ``mj_jacBody``), so the expert needs nothing else.
    Moving in joint space rather than along the straight line to the target keeps the
    arm away from its base, where the Jacobian is singular and a Cartesian controller
    crawls.
    """
    model = _model(simulator, "reacher")
    arm = _reachers.get(model)
    if arm is None:
        arm = _reachers[model] = _arm(model, simulator.name)
    obs = np.asarray(observation, dtype=np.float64)
    if obs.shape != (10,):
        raise SimulatorError(
            f"--policy slhub.sim.experts:reacher: observations of shape {list(obs.shape)}; "
            "Reacher-v5's have 10 values"
        )
    angles = np.arctan2(obs[2:4], obs[0:2])
    target, velocity = obs[4:6], obs[6:8]
    move = _move_to(model, arm, angles, target)
    return _clip(REACHER_GAIN * move - REACHER_DAMPING * velocity, model)


def _move_to(model: Any, arm: _Arm, angles: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The joint move that puts the fingertip on ``target``: of the inverse-kinematics
    solutions from the elbow as it is and bent either way, the one that reaches (within
    a millimetre of the best) with the least joint travel."""
    best: tuple[float, float, np.ndarray] | None = None
    for elbow in (angles[1], REACHER_ELBOW, -REACHER_ELBOW):
        start = np.array([angles[0], elbow])
        pose, miss = _inverse_kinematics(model, arm, start, target)
        move = pose - angles
        move = np.where(arm.limited, move, (move + np.pi) % (2 * np.pi) - np.pi)
        found = (round(miss, 3), float(np.abs(move).sum()), move)
        if best is None or found[:2] < best[:2]:
            best = found
    assert best is not None
    return best[2]


def _inverse_kinematics(
    model: Any, arm: _Arm, start: np.ndarray, target: np.ndarray
) -> tuple[np.ndarray, float]:
    """Damped least squares on the fingertip's Jacobian from ``start``, each step at most
    :data:`REACHER_MAX_STEP` rad per joint; the pose and the fingertip's miss (m)."""
    mujoco = import_mujoco()
    data, at = arm.data, arm.arm_qpos
    data.qpos[:] = 0.0
    data.qpos[at] = np.clip(start, arm.low, arm.high)
    jacobian = np.zeros((3, model.nv))
    for _ in range(REACHER_ITERATIONS):
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        mujoco.mj_jacBody(model, data, jacobian, None, arm.fingertip)
        j = jacobian[:2][:, arm.arm_dofs]
        error = target - data.xpos[arm.fingertip][:2]
        step = j.T @ np.linalg.solve(j @ j.T + REACHER_LAMBDA * np.eye(2), error)
        step *= min(1.0, REACHER_MAX_STEP / max(float(np.abs(step).max()), 1e-12))
        data.qpos[at] = np.clip(data.qpos[at] + step, arm.low, arm.high)
    mujoco.mj_kinematics(model, data)
    return np.array(data.qpos[at]), float(np.linalg.norm(target - data.xpos[arm.fingertip][:2]))


def _arm(model: Any, name: str) -> _Arm:
    mujoco = import_mujoco()
    fingertip = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "fingertip")
    if fingertip < 0 or model.nq != 4 or model.nu != 2:
        raise SimulatorError(
            f"--policy slhub.sim.experts:reacher: {name} is not a reacher (no fingertip body, "
            f"or nq {model.nq}, nu {model.nu}; it wants Reacher-v5)"
        )
    joints = [int(model.actuator_trnid[i, 0]) for i in range(model.nu)]
    limited = np.asarray(model.jnt_limited, dtype=bool)[joints]
    ranges = np.asarray(model.jnt_range, dtype=np.float64)[joints]
    return _Arm(
        data=mujoco.MjData(model),
        fingertip=fingertip,
        arm_qpos=np.array([int(model.jnt_qposadr[j]) for j in joints]),
        arm_dofs=np.array([int(model.jnt_dofadr[j]) for j in joints]),
        limited=limited,
        low=np.where(limited, ranges[:, 0], -np.inf),
        high=np.where(limited, ranges[:, 1], np.inf),
    )


def _model(simulator: Simulator, expert: str) -> Any:
    model = getattr(simulator, "model", None)
    if model is None or not hasattr(model, "nq"):
        raise SimulatorError(
            f"--policy slhub.sim.experts:{expert}: {simulator.name} exposes no MuJoCo model "
            "(simulator.model); the experts read the physics from it"
        )
    return model


def _frame_skip(model: Any, simulator: Simulator) -> int:
    """Physics steps per env step (the env holds the control over them)."""
    return max(1, round(simulator.dt / float(model.opt.timestep)))


def _clip(action: np.ndarray, model: Any) -> np.ndarray:
    """``action`` inside the ctrlrange of the limited actuators."""
    ranges = np.asarray(model.actuator_ctrlrange, dtype=np.float64).reshape(model.nu, 2)
    limited = np.asarray(model.actuator_ctrllimited, dtype=bool)
    low = np.where(limited, ranges[:, 0], -np.inf)
    high = np.where(limited, ranges[:, 1], np.inf)
    return np.clip(np.asarray(action, dtype=np.float64).reshape(model.nu), low, high)
