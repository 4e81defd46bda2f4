"""Public simulator adapters: MuJoCo through gymnasium, for ``slhub data collect`` and for
evaluation rollouts that restore a recorded ``sim_state`` and replay its actions.

The simulator libraries are an optional extra (``pip install 'slhub[sim]'``:
mujoco and gymnasium[mujoco]); importing this package needs neither, opening a
simulator does, and names the extra in one line when they are missing.

- :func:`open_simulator` (``gymnasium:Hopper-v5``) returns a :class:`Simulator`;
  :func:`simulators` lists the prefixes (built-in ``gymnasium``, others from the
  entry-point group :data:`SIMULATOR_GROUP`).
- :class:`GymnasiumMujoco` — the built-in adapter: ``reset(seed)``, ``step(action)``,
  exact ``state()`` / ``restore(state)``, ``qpos``/``qvel`` and their names,
  ``contact()``, ``render()``.
- :func:`collect` — episodes rolled out into slhub's dataset store.
- :func:`rollout_policy` — a policy judged in closed loop (returns, lengths, success,
  fixed reset seeds, observation history, action chunks, a time budget), for
  validation and ``slhub eval``; :func:`write_video` writes one rollout as mp4.
- :mod:`slhub.sim.cartpole` — the numpy cart-pole (no simulator library): its
  dynamics (:func:`~slhub.sim.cartpole.cartpole_step`), constants and state names,
  random trajectories and their episodes in slhub's store
  (:func:`~slhub.sim.cartpole.cartpole_store`); ``from slhub.sim import cartpole``.
- :mod:`slhub.sim.learned` — a NeRD export in place of MuJoCo: the gymnasium env
  :class:`~slhub.sim.learned.LearnedEnv` (``slhub/Learned-v0``) runs a gymnasium MuJoCo
  env's own observation, reward and termination code on the predicted states, to train
  a policy inside the learned simulator; ``import slhub.sim.learned`` (needs gymnasium).
- :mod:`slhub.sim.contacts` — contact inputs of a state (per-body forces, or contact
  slots: point, normal, depth, active), as collect records them and as a learned
  simulator computes them from its predicted state
  (:class:`StateContacts`; :data:`CONTACT_COMPONENTS`, a slot's components).
- :mod:`slhub.sim.names` — component names from a MuJoCo model's joints and actuators.
- :mod:`slhub.sim.experts` — demonstrators for ``--policy``: an LQR for
  InvertedPendulum-v5 (``slhub.sim.experts:inverted_pendulum``) and inverse kinematics
  with a joint PD for Reacher-v5 (``slhub.sim.experts:reacher``).
"""

from slhub.errors import SimulatorError
from slhub.sim import cartpole
from slhub.sim.actions import KNOT_EVERY, SOURCES, load_policy
from slhub.sim.collect import FORMAT, Collection, collect
from slhub.sim.contacts import COMPONENTS as CONTACT_COMPONENTS
from slhub.sim.contacts import ContactInputs, StateContacts
from slhub.sim.gymnasium_mujoco import GymnasiumMujoco
from slhub.sim.names import actuator_names, body_names, joint_names, qpos_names, qvel_names
from slhub.sim.rollout import ROLLOUT_FEATURES, Camera, Rollouts, reset_seeds, rollout_policy
from slhub.sim.simulator import SIMULATOR_GROUP, Simulator, Step, open_simulator, simulators
from slhub.sim.video import write_video

__all__ = [
    "CONTACT_COMPONENTS",
    "FORMAT",
    "KNOT_EVERY",
    "ROLLOUT_FEATURES",
    "SIMULATOR_GROUP",
    "SOURCES",
    "Camera",
    "Collection",
    "ContactInputs",
    "GymnasiumMujoco",
    "Rollouts",
    "Simulator",
    "SimulatorError",
    "StateContacts",
    "Step",
    "actuator_names",
    "body_names",
    "cartpole",
    "collect",
    "joint_names",
    "load_policy",
    "open_simulator",
    "qpos_names",
    "qvel_names",
    "reset_seeds",
    "rollout_policy",
    "simulators",
    "write_video",
]
