"""Component names of a MuJoCo model's state and controls, for a dataset's feature names.

A vector feature is only as useful as the names of its components: ``qpos[3]``
means nothing in a plot, ``thigh_joint`` does. MuJoCo lays ``qpos`` and ``qvel``
out joint by joint, so the names follow the joints:

=========  ==========================================  =======================
joint      ``qpos``                                    ``qvel``
=========  ==========================================  =======================
hinge      ``NAME``                                    ``NAME``
slide      ``NAME``                                    ``NAME``
ball       ``NAME_qw NAME_qx NAME_qy NAME_qz``         ``NAME_wx NAME_wy NAME_wz``
free       ``NAME_x NAME_y NAME_z`` + the ball's four  ``NAME_vx NAME_vy NAME_vz`` + the ball's
=========  ==========================================  =======================

An unnamed joint is ``joint<i>``. An unnamed actuator is named after the joint or
body it drives (the gymnasium models leave their actuators unnamed), else
``actuator<i>``. :func:`planar_root` finds a planar robot's base joints (slide x,
slide z, hinge y). Every function takes the model only; none imports mujoco.
"""

from __future__ import annotations

from typing import Any

# mjtJoint and mjtTrn values (stable across MuJoCo 2.x-4.x); no import of mujoco needed.
FREE, BALL, SLIDE, HINGE = 0, 1, 2, 3
TRN_JOINT, TRN_JOINTINPARENT, TRN_TENDON, TRN_SITE, TRN_BODY = 0, 1, 3, 4, 5

_QUATERNION = ("qw", "qx", "qy", "qz")
_ANGULAR = ("wx", "wy", "wz")


def joint_names(model: Any) -> tuple[str, ...]:
    """Every joint's name, in the model's order (``joint<i>`` when unnamed)."""
    return tuple(model.joint(i).name or f"joint{i}" for i in range(model.njnt))


def qpos_names(model: Any) -> tuple[str, ...]:
    """One name per ``qpos`` component (``model.nq``)."""
    out: list[str] = []
    for index, name in enumerate(joint_names(model)):
        kind = int(model.jnt_type[index])
        if kind == FREE:
            out += [f"{name}_{c}" for c in ("x", "y", "z", *_QUATERNION)]
        elif kind == BALL:
            out += [f"{name}_{c}" for c in _QUATERNION]
        else:
            out.append(name)
    return tuple(out)


def qvel_names(model: Any) -> tuple[str, ...]:
    """One name per ``qvel`` component (``model.nv``)."""
    out: list[str] = []
    for index, name in enumerate(joint_names(model)):
        kind = int(model.jnt_type[index])
        if kind == FREE:
            out += [f"{name}_{c}" for c in ("vx", "vy", "vz", *_ANGULAR)]
        elif kind == BALL:
            out += [f"{name}_{c}" for c in _ANGULAR]
        else:
            out.append(name)
    return tuple(out)


def actuator_names(model: Any) -> tuple[str, ...]:
    """One name per control (``model.nu``); duplicates get their index appended."""
    names: list[str] = []
    for index in range(model.nu):
        name = model.actuator(index).name
        if not name:
            kind, target = int(model.actuator_trntype[index]), int(model.actuator_trnid[index, 0])
            if kind in (TRN_JOINT, TRN_JOINTINPARENT):
                name = model.joint(target).name
            elif kind == TRN_TENDON:
                name = model.tendon(target).name
            elif kind == TRN_SITE:
                name = model.site(target).name
            elif kind == TRN_BODY:
                name = model.body(target).name
        names.append(name or f"actuator{index}")
    return _unique(names)


def body_names(model: Any) -> tuple[str, ...]:
    """The names of bodies 1 .. nbody-1 (the world body 0 left out; ``body<i>`` when
    unnamed)."""
    return _unique([model.body(i).name or f"body{i}" for i in range(1, model.nbody)])


def planar_root(model: Any) -> tuple[str, str, str] | None:
    """The joints of a planar base: a body whose parent is the world and whose first
    three joints are a slide along +x, a slide along +z and a hinge about +y, in that
    order (Hopper, Walker2d, HalfCheetah), judged by type and axis, not name; None when
    no body is one."""
    wanted = ((SLIDE, (1.0, 0.0, 0.0)), (SLIDE, (0.0, 0.0, 1.0)), (HINGE, (0.0, 1.0, 0.0)))
    names = joint_names(model)
    for body in range(1, model.nbody):
        first, count = int(model.body_jntadr[body]), int(model.body_jntnum[body])
        if int(model.body_parentid[body]) != 0 or count < 3:
            continue
        joints = range(first, first + 3)
        if all(
            int(model.jnt_type[j]) == kind
            and all(abs(float(a) - b) < 1e-9 for a, b in zip(model.jnt_axis[j], axis, strict=True))
            for j, (kind, axis) in zip(joints, wanted, strict=True)
        ):
            return names[first], names[first + 1], names[first + 2]
    return None


def geom_names(model: Any) -> tuple[str, ...]:
    """Every geom's name, in the model's order (``geom<i>`` when unnamed)."""
    return _unique([model.geom(i).name or f"geom{i}" for i in range(model.ngeom)])


def _unique(names: list[str]) -> tuple[str, ...]:
    seen = {n: names.count(n) for n in names}
    return tuple(f"{n}_{i}" if seen[n] > 1 else n for i, n in enumerate(names))
