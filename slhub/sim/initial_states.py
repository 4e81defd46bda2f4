"""Random initial states (``--init random``), drawn around the env's own reset as NeRD
draws them for its datasets and its passive-motion evaluation.

From a gymnasium reset, every joint is redrawn (uniform draws, ranges in
:data:`RANGES`):

- a floating base (a free joint, or a planar base's slide-x, slide-z, hinge-y):
  its orientation turned from the reset one by up to ``tilt`` about a random axis
  (the planar base: about its hinge), its linear velocity and angular velocity
  drawn per component; its horizontal position kept;
- every other hinge or slide: a position within its range (a hinge without one:
  within one turn), a velocity per component;
- then the base is lifted until no geom of the robot is inside the floor or another
  world geom, and dropped from up to ``drop`` above that, so a passive episode is
  a fall, a bounce and a settling, not a robot at rest. A robot without a floating
  base (a pendulum, a reaching arm) is not lifted.

A free joint's linear velocity is in the world frame and its angular velocity in the
body frame, as MuJoCo keeps them; the draws are per component in those frames.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from slhub.sim.names import planar_root

#: Where an episode starts (``--init``): the env's reset, or a state drawn around it.
INITS = ("reset", "random")
#: How far each component is drawn: ``tilt`` (rad, the base's turn from its reset
#: orientation), ``linear`` (m/s, the base's velocity components), ``angular``
#: (rad/s, the base's), ``joint_speed`` (rad/s or m/s, every other joint's), and
#: ``drop`` (m, the height above touching the floor the robot is let go from).
RANGES: dict[str, float] = {
    "tilt": np.pi / 2,
    "linear": 1.0,
    "angular": np.pi,
    "joint_speed": 2 * np.pi,
    "drop": 0.3,
}
#: MuJoCo's joint types.
FREE, BALL, SLIDE, HINGE = 0, 1, 2, 3
#: The most lifts tried before a robot is let go where it is (each clears the deepest
#: penetration found; a handful suffice).
MAX_LIFTS = 20


def random_state(
    mujoco: Any, model: Any, data: Any, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A random ``(qpos, qvel)`` around ``data``'s (a reset) state; ``data`` is left at
    it, forward-computed. Draws from ``rng`` only, in a fixed order."""
    qpos = np.array(data.qpos, dtype=np.float64)
    qvel = np.array(data.qvel, dtype=np.float64)
    planar = _planar_joints(model)
    height: int | None = None  # the qpos index that lifts the base
    for joint in range(model.njnt):
        kind = int(model.jnt_type[joint])
        p, v = int(model.jnt_qposadr[joint]), int(model.jnt_dofadr[joint])
        if kind == FREE:
            qpos[p + 3 : p + 7] = _turned(mujoco, qpos[p + 3 : p + 7], rng)
            qvel[v : v + 3] = rng.uniform(-1, 1, 3) * RANGES["linear"]
            qvel[v + 3 : v + 6] = rng.uniform(-1, 1, 3) * RANGES["angular"]
            height = p + 2 if height is None else height
        elif kind == BALL:
            qpos[p : p + 4] = _turned(mujoco, qpos[p : p + 4], rng)
            qvel[v : v + 3] = rng.uniform(-1, 1, 3) * RANGES["angular"]
        elif joint in planar:
            role = planar.index(joint)  # 0: slide x, 1: slide z, 2: hinge y
            if role == 2:
                qpos[p] += rng.uniform(-1, 1) * RANGES["tilt"]
            qvel[v] = rng.uniform(-1, 1) * RANGES["angular" if role == 2 else "linear"]
            if role == 1:
                height = p
        else:
            qpos[p] = _within_range(model, joint, kind, qpos[p], rng)
            qvel[v] = rng.uniform(-1, 1) * RANGES["joint_speed"]
    data.qpos[:] = qpos
    data.qvel[:] = qvel
    mujoco.mj_forward(model, data)
    if height is not None:
        for _ in range(MAX_LIFTS):
            depth = _deepest_into_world(model, data)
            if depth <= 0.0:
                break
            data.qpos[height] += depth
            mujoco.mj_forward(model, data)
        data.qpos[height] += rng.uniform(0, 1) * RANGES["drop"]
        mujoco.mj_forward(model, data)
    return np.array(data.qpos, dtype=np.float64), np.array(data.qvel, dtype=np.float64)


def _planar_joints(model: Any) -> tuple[int, ...]:
    names = planar_root(model)
    if names is None:
        return ()
    return tuple(int(model.joint(name).id) for name in names)


def _turned(mujoco: Any, quaternion: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``quaternion`` (w, x, y, z) turned, in its own frame, by an angle within
    ``tilt`` about a uniformly random axis (MuJoCo's quaternion product)."""
    axis = rng.normal(size=3)
    axis /= max(float(np.linalg.norm(axis)), 1e-12)
    turn, out = np.empty(4), np.empty(4)
    mujoco.mju_axisAngle2Quat(turn, axis, rng.uniform(-1, 1) * RANGES["tilt"])
    mujoco.mju_mulQuat(out, np.ascontiguousarray(quaternion, dtype=np.float64), turn)
    mujoco.mju_normalize4(out)
    return out


def _within_range(model: Any, joint: int, kind: int, now: float, rng: np.random.Generator) -> float:
    """A limited joint's position uniform within its range; an unlimited hinge's within
    one turn; an unlimited slide keeps its reset position."""
    if bool(model.jnt_limited[joint]):
        low, high = (float(x) for x in model.jnt_range[joint])
        return float(rng.uniform(low, high))
    if kind == HINGE:
        return float(rng.uniform(-np.pi, np.pi))
    return float(now)


def _deepest_into_world(model: Any, data: Any) -> float:
    """How deep the robot is inside a world geom (the floor): the largest penetration
    of an active contact between a world geom and one of the robot's, 0 when none."""
    deepest = 0.0
    for i in range(int(data.ncon)):
        contact = data.contact[i]
        bodies = int(model.geom_bodyid[contact.geom1]), int(model.geom_bodyid[contact.geom2])
        if (bodies[0] == 0) != (bodies[1] == 0) and contact.exclude == 0:
            deepest = max(deepest, -float(contact.dist))
    return deepest
