"""Contact inputs of a MuJoCo state, as ``slhub data collect`` records them and as a
learned simulator computes them from its own predicted state.

Two kinds (``slhub data collect --contacts``):

- ``force`` (feature ``contact``): per body (world left out), the summed normal force
  of the active contacts touching one of its geoms
  (:func:`body_contact_forces`);
- ``geometry`` (feature ``contact_geometry``): a fixed number of contact slots, one per
  robot geom (a geom of a body other than the world) that can touch a geom of another
  body (contype/conaffinity bits that meet, or an explicit pair), in the model's geom
  order. A slot holds its geom's deepest active contact (the smallest distance among
  the contacts that have constraint rows, the first in MuJoCo's order on a tie) as
  eight components, named ``<geom>_<component>``:

  ==============  ===============================================================
  ``px py pz``    the contact point on the geom's own surface (world): MuJoCo's
                  ``contact.pos`` is the midpoint between the two surfaces, moved
                  half the distance along the normal to the geom's side
  ``nx ny nz``    the unit normal the contact pushes the geom along (from the other
                  geom towards it: ``+z`` for a geom resting on flat ground)
  ``depth``       the penetration, ``max(-dist, 0)`` (an active contact within the
                  margin has depth 0)
  ``active``      1 when the slot holds a contact, else 0 (and the other seven 0)
  ==============  ===============================================================

Every value is read from a forward-computed ``MjData`` (:func:`contact_geometry`), so
collection and a rollout that computes its contacts at a predicted state
(:class:`StateContacts`) run the same code; the geometry depends on ``qpos`` alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from slhub.sim.names import body_names, geom_names, qpos_names, qvel_names

#: ``--contacts`` kinds and the feature each records.
KINDS = {"force": "contact", "geometry": "contact_geometry"}
#: A geometry slot's components, in order.
COMPONENTS = ("px", "py", "pz", "nx", "ny", "nz", "depth", "active")


def contact_geoms(model: Any) -> tuple[int, ...]:
    """The geoms that get a slot: every robot geom that can touch a geom of another body
    (ascending geom index)."""
    bodies = np.asarray(model.geom_bodyid, dtype=np.int64)
    kinds = np.asarray(model.geom_contype, dtype=np.int64)
    affinities = np.asarray(model.geom_conaffinity, dtype=np.int64)
    meet = ((kinds[:, None] & affinities[None, :]) | (kinds[None, :] & affinities[:, None])) != 0
    meet &= bodies[:, None] != bodies[None, :]
    for index in range(model.npair):
        a, b = int(model.pair_geom1[index]), int(model.pair_geom2[index])
        meet[a, b] = meet[b, a] = True
    return tuple(int(g) for g in range(model.ngeom) if bodies[g] > 0 and meet[g].any())


def slot_names(model: Any) -> tuple[str, ...]:
    """The name of each geometry slot: its geom's."""
    names = geom_names(model)
    return tuple(names[g] for g in contact_geoms(model))


def geometry_names(model: Any) -> tuple[str, ...]:
    """The ``contact_geometry`` feature's component names: ``<slot>_<component>``."""
    return tuple(f"{slot}_{c}" for slot in slot_names(model) for c in COMPONENTS)


def contact_geometry(model: Any, data: Any, geoms: Sequence[int]) -> np.ndarray:
    """The slots of ``geoms`` (:func:`contact_geoms`) in forward-computed ``data``:
    float64 ``[len(geoms) * 8]``, slot by slot, :data:`COMPONENTS` in each."""
    out = np.zeros((len(geoms), len(COMPONENTS)), dtype=np.float64)
    slot_of = {geom: slot for slot, geom in enumerate(geoms)}
    deepest = np.full(len(geoms), np.inf)
    for index in range(data.ncon):
        touch = data.contact[index]
        if touch.efc_address < 0:
            continue
        dist = float(touch.dist)
        normal = np.array(touch.frame[:3], dtype=np.float64)  # from geom1 towards geom2
        for geom, side in ((touch.geom1, 1.0), (touch.geom2, -1.0)):
            slot = slot_of.get(int(geom))
            if slot is None or not dist < deepest[slot]:
                continue
            deepest[slot] = dist
            point = np.array(touch.pos, dtype=np.float64) - side * (0.5 * dist) * normal
            out[slot, 0:3] = point
            out[slot, 3:6] = -side * normal
            out[slot, 6] = max(-dist, 0.0)
            out[slot, 7] = 1.0
    return out.reshape(-1)


def body_contact_forces(mujoco: Any, model: Any, data: Any) -> np.ndarray:
    """Per body (world left out), the summed normal force of the active contacts that
    touch one of its geoms in forward-computed ``data`` (a contact between two bodies
    counts for both): the ``contact`` feature of ``slhub data collect``."""
    forces = np.zeros(model.nbody - 1, dtype=np.float64)
    wrench = np.zeros(6, dtype=np.float64)
    bodies = model.geom_bodyid
    for index in range(data.ncon):
        touch = data.contact[index]
        if touch.efc_address < 0:
            continue
        mujoco.mj_contactForce(model, data, index, wrench)
        for geom in (touch.geom1, touch.geom2):
            body = int(bodies[geom])
            if body > 0:
                forces[body - 1] += abs(wrench[0])
    return forces


class ContactInputs:
    """Where each of a model's contact input components comes from, and their values at
    a forward-computed ``MjData``.

    A component is a body's force (``contact.<body>``, or the bare body name) or a
    geometry slot's component (``contact_geometry.<slot>_<component>``, or bare).

    :raises ValueError: a component is neither (naming it and what the model offers).
    """

    def __init__(self, model: Any, names: Sequence[str], what: str = "this model") -> None:
        self.model = model
        self.geoms = contact_geoms(model)
        bodies = body_names(model)
        geometry = geometry_names(model)
        self.force_columns: list[tuple[int, int]] = []  # (input column, body index)
        self.geometry_columns: list[tuple[int, int]] = []  # (input column, slot component)
        unknown = []
        for column, name in enumerate(names):
            bare = name.removeprefix(f"{KINDS['geometry']}.")
            if bare in geometry and (bare != name or name not in bodies):
                self.geometry_columns.append((column, geometry.index(bare)))
                continue
            bare = name.removeprefix(f"{KINDS['force']}.")
            if bare in bodies:
                self.force_columns.append((column, bodies.index(bare)))
                continue
            unknown.append(name)
        if unknown:
            raise ValueError(
                f"the inputs {unknown} are not contact inputs of {what}, which computes "
                f"'{KINDS['force']}.<body>' (bodies {list(bodies)}) and "
                f"'{KINDS['geometry']}.<slot>_<component>' (slots {list(slot_names(model))})"
            )
        self.size = len(names)

    @property
    def forces(self) -> bool:
        return bool(self.force_columns)

    def __call__(self, mujoco: Any, data: Any) -> np.ndarray:
        """The contact inputs (float64 ``[size]``) at forward-computed ``data``."""
        out = np.zeros(self.size, dtype=np.float64)
        if self.force_columns:
            forces = body_contact_forces(mujoco, self.model, data)
            for column, body in self.force_columns:
                out[column] = forces[body]
        if self.geometry_columns:
            slots = contact_geometry(self.model, data, self.geoms)
            for column, component in self.geometry_columns:
                out[column] = slots[component]
        return out


class StateContacts:
    """A model's contact inputs computed from its own states: each state's ``qpos`` (and
    ``qvel``, and the action before it as the controls, for forces) is set on an
    ``MjData`` of ``env``'s model, forward-computed (warm start zeroed, so a state's
    inputs do not depend on the ones computed before), and read as collect reads it.

    :param env: the simulator the data was collected from (``gymnasium:Hopper-v5``).
    :param state_names: the state components (``qpos.<joint component>``,
        ``qvel.<...>``, or bare where qpos and qvel do not share names).
    :param action_names: the action components (the env's actuators, in order, to set
        the controls a force depends on; else the controls stay zero).
    :param extra_names: the contact inputs (:class:`ContactInputs`).
    :raises ValueError: the env does not open, a contact input is unknown, or the
        state lacks a ``qpos`` (or, for forces, a ``qvel``) component; one line.
    """

    def __init__(
        self,
        env: str,
        state_names: Sequence[str],
        action_names: Sequence[str],
        extra_names: Sequence[str],
    ) -> None:
        from slhub.errors import SlhubError, one_line
        from slhub.sim.render import import_mujoco
        from slhub.sim.simulator import open_simulator

        try:
            simulator = open_simulator(env)
        except SlhubError as exc:
            raise ValueError(one_line(exc)) from None
        try:
            model = getattr(simulator, "model", None)
        finally:
            simulator.close()
        if model is None:
            raise ValueError(f"{env}: not a MuJoCo simulator (it has no MjModel)")
        self._mujoco = import_mujoco()
        self.env = env
        self.model = model
        self.data = self._mujoco.MjData(model)
        self.inputs = ContactInputs(model, extra_names)
        names = list(state_names)
        self.qpos = _columns(names, qpos_names(model), "qpos", env)
        self.qvel = _columns(names, qvel_names(model), "qvel", env, needed=self.inputs.forces)
        actions = list(action_names)
        self.controls = len(actions) == model.nu

    def __call__(self, states: np.ndarray, actions: np.ndarray | None = None) -> np.ndarray:
        """Contact inputs ``[B, extra]`` (float64) of states ``[B, state]``; ``actions``
        ``[B, action]``: the action applied before each state (None: zero controls)."""
        mujoco, model, data = self._mujoco, self.model, self.data
        states = np.asarray(states, dtype=np.float64)
        out = np.zeros((states.shape[0], self.inputs.size), dtype=np.float64)
        for row, state in enumerate(states):
            data.qpos[:] = state[self.qpos]
            data.qvel[:] = state[self.qvel] if self.qvel is not None else 0.0
            data.ctrl[:] = 0.0
            if actions is not None and self.controls:
                data.ctrl[:] = np.asarray(actions[row], dtype=np.float64)
            data.qacc_warmstart[:] = 0.0
            mujoco.mj_forward(model, data)
            out[row] = self.inputs(mujoco, data)
        return out

    def tensor(self, states: Any, actions: Any = None) -> Any:
        """:meth:`__call__` on torch tensors, in the states' dtype: the ``contacts`` of
        :meth:`slhub.builtin.nerd.predictor.NerdPredictor.simulator`."""
        import torch

        values = self(
            states.detach().double().cpu().numpy(),
            None if actions is None else actions.detach().double().cpu().numpy(),
        )
        return torch.from_numpy(values).to(device=states.device, dtype=states.dtype)


def _columns(
    names: list[str], wanted: Sequence[str], feature: str, env: str, needed: bool = True
) -> np.ndarray | None:
    """Where ``feature``'s components sit among ``names`` (prefixed, else bare)."""
    for form in ([f"{feature}.{n}" for n in wanted], list(wanted)):
        if all(n in names for n in form):
            return np.array([names.index(n) for n in form], dtype=np.int64)
    if not needed:
        return None
    raise ValueError(
        f"the state lacks {env}'s {feature} components ({', '.join(wanted)}) that contacts "
        "are computed from"
    )
