"""``slhub data collect``: roll a simulator out and write the episodes as slhub's store.

Step ``t`` of an episode records the state *before* action ``t`` and what action
``t`` did:

================  ======================================================================
feature           per step
================  ======================================================================
``observation``   the env's observation (what the action source saw)
``action``        float64, the action applied (names: the actuators)
``policy_action`` float64, the clean policy action (only for ``policy`` with ``noise``)
``reward``        float64, the reward action ``t`` earned
``terminated``    bool, the env terminated after action ``t`` (the episode ends there)
``truncated``     bool, the env's time limit (``steps``) ended the episode after ``t``
``qpos``          float64, names from the joints (:mod:`slhub.sim.names`)
``qvel``          float64, likewise
``sim_state``     float64, ``mj_getState(mjSTATE_INTEGRATION)``: restore it, apply
                  ``action[t:]``, and the episode replays bit for bit
``contact``       float64 per body, the normal contact force (only where geoms can touch;
                  ``--contacts force``, the default)
``contact_geometry`` float64, eight per contact slot: the point on the robot, the normal,
                  the depth and an active mask (only where geoms can touch; ``--contacts
                  geometry``; :mod:`slhub.sim.contacts`)
``image``         uint8 ``size x size x 3`` (only with ``render``)
================  ======================================================================

Initial states: the env's own reset (``init="reset"``), or, with ``init="random"``,
a state drawn around it (:mod:`slhub.sim.initial_states`: the base turned, moving
and dropped, every joint anywhere in its range and moving), as NeRD starts its
episodes.

Seeds: ``SeedSequence(seed).spawn(episodes)`` gives episode ``e`` its own child,
split in three: one seeds the env's reset, one the action source's ``Generator``
and one the random initial state. Episode ``e`` is therefore the same whatever the
number of episodes, and the same command writes a byte-identical dataset.

The episodes are held in memory until :func:`slhub.data.write_store` builds the
store under a temporary name and renames it into place: a collect killed while
simulating leaves nothing on disk, one stopped by SIGTERM or Ctrl-C while writing
removes its temporary folder.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slhub.data import ArrayEpisodes, write_store
from slhub.errors import DatasetError, SimulatorError, SlhubError, one_line
from slhub.sim.actions import KNOT_EVERY, ActionSource, Policy, make_source
from slhub.sim.contacts import COMPONENTS, KINDS
from slhub.sim.initial_states import INITS, RANGES
from slhub.sim.names import planar_root
from slhub.sim.render import FOLLOW
from slhub.sim.simulator import Simulator, open_simulator

#: ``meta.json``'s ``source.format`` for a collected dataset.
FORMAT = "slhub.collect/1"


@dataclass(frozen=True)
class Collection:
    """What :func:`collect` wrote."""

    path: Path
    env: str
    lengths: tuple[int, ...]

    def __str__(self) -> str:
        return (
            f"collected {len(self.lengths)} episodes ({sum(self.lengths)} steps; length min "
            f"{min(self.lengths)}, max {max(self.lengths)}) of {self.env} to {self.path}"
        )


def collect(
    destination: str | Path,
    env: str,
    *,
    episodes: int,
    steps: int,
    actions: str = "uniform",
    seed: int = 0,
    policy: str | None = None,
    noise: float = 0.0,
    render: bool = False,
    camera: str = FOLLOW,
    size: int = 64,
    progress: bool = False,
    through_termination: bool = False,
    contacts: str = "force",
    init: str = "reset",
) -> Collection:
    """Collect ``episodes`` episodes of at most ``steps`` steps of ``env`` (``PREFIX:ENV``)
    into a new store at ``destination``.

    :param actions: ``uniform``, ``smooth``, ``zero`` or ``policy``
        (:mod:`slhub.sim.actions`).
    :param policy: ``module:function`` for ``policy``; ``noise`` its Gaussian std.
    :param progress: a bar on stderr when it is a terminal.
    :param through_termination: keep simulating after the env terminates (the robot fell):
        a learned simulator needs the falls too; ``terminated`` still marks those steps
        and only the time limit ends an episode.
    :param contacts: the contact inputs recorded where geoms can touch: ``force``
        (feature ``contact``), ``geometry`` (``contact_geometry``) or both
        (``force,geometry``); :mod:`slhub.sim.contacts`.
    :param init: where episodes start: ``reset`` (the env's) or ``random`` (drawn
        around it; :mod:`slhub.sim.initial_states`).
    :raises DatasetError: ``destination`` exists.
    :raises SimulatorError: an unknown env, a missing library, a bad argument or policy,
        or a policy that raises (named with the episode and step; nothing is written).
    """
    destination = Path(destination)
    for name, value, low in (("--episodes", episodes, 1), ("--steps", steps, 1)):
        _check_int(name, value, low)
    _check_int("--seed", seed, 0)
    kinds = contact_kinds(contacts)
    if init not in INITS:
        raise SimulatorError(f"--init {init!r}: one of {', '.join(INITS)}")
    if render:
        _check_int("--size", size, 1)
    if destination.exists():
        raise DatasetError(f"{destination}: exists; collect writes a new directory")
    simulator = open_simulator(env, max_steps=steps)
    try:
        if "geometry" in kinds and not hasattr(simulator, "contact_geometry"):
            raise SimulatorError(
                f"--contacts geometry: simulator {simulator.name} records no contact geometry"
            )
        if init == "random" and not hasattr(simulator, "randomize"):
            raise SimulatorError(
                f"--init random: simulator {simulator.name} cannot start from a random state"
            )
        source = make_source(actions, simulator, policy=policy, noise=noise)
        if render:
            simulator.render(camera, size)  # an unknown camera or no GL: refused before simulating
        with _signals_unwind():
            recorded = _roll_out(
                simulator, source, episodes, steps, seed, render, camera, size, progress,
                through_termination, kinds, init,
            )  # fmt: skip
            dataset = ArrayEpisodes(
                recorded, fps=1.0 / simulator.dt, names=_names(simulator, recorded[0])
            )
            provenance = {
                "format": FORMAT,
                "env": simulator.name,
                "seed": int(seed),
                "episodes": int(episodes),
                "steps": int(steps),
                "actions": actions,
                "policy": policy,
                "noise": float(noise),
                "knot_every": KNOT_EVERY if actions == "smooth" else None,
                "render": {"camera": camera, "size": size} if render else None,
                "sim_state": "mujoco mj_getState(mjSTATE_INTEGRATION)",
                "through_termination": bool(through_termination),
                "init": init,
                "init_ranges": dict(RANGES) if init == "random" else None,
                "versions": dict(simulator.versions),
                "floating_base": floating_base(simulator),
                **contact_provenance(simulator, recorded[0]),
            }
            write_store(dataset, destination, provenance=provenance)
    finally:
        simulator.close()
    return Collection(destination, simulator.name, tuple(int(n) for n in dataset.lengths))


def _roll_out(
    simulator: Simulator,
    source: ActionSource,
    episodes: int,
    steps: int,
    seed: int,
    render: bool,
    camera: str,
    size: int,
    progress: bool,
    through_termination: bool = False,
    kinds: tuple[str, ...] = ("force",),
    init: str = "reset",
) -> list[dict[str, np.ndarray]]:
    bar = _bar(episodes) if progress and sys.stderr.isatty() else None
    out = []
    try:
        for episode, child in enumerate(np.random.SeedSequence(seed).spawn(episodes)):
            reset_seed, action_seed, init_seed = child.spawn(3)
            observation = simulator.reset(int(reset_seed.generate_state(1)[0]))
            if init == "random":
                observation = simulator.randomize(np.random.default_rng(init_seed))  # type: ignore[attr-defined]
            source.begin(np.random.default_rng(action_seed), steps)
            rows: dict[str, list[Any]] = {}
            for index in range(steps):
                record = {
                    "observation": np.array(observation),
                    "qpos": simulator.qpos,
                    "qvel": simulator.qvel,
                    "sim_state": simulator.state(),
                }
                if "force" in kinds:
                    contact = simulator.contact()
                    if contact is not None:
                        record[KINDS["force"]] = contact
                if "geometry" in kinds:
                    geometry = simulator.contact_geometry()  # type: ignore[attr-defined]
                    if geometry is not None:
                        record[KINDS["geometry"]] = geometry
                if render:
                    record["image"] = simulator.render(camera, size)
                try:
                    action, clean = source(observation, simulator)
                except Exception as exc:
                    if isinstance(exc, SlhubError) or not isinstance(source, Policy):
                        raise
                    raise SimulatorError(
                        f"policy {source.spec} raised at episode {episode} step {index}: "
                        f"{one_line(exc, 160)}"
                    ) from exc
                step = simulator.step(action)
                record["action"] = np.asarray(action, dtype=np.float64)
                if clean is not None:
                    record["policy_action"] = clean
                record["reward"] = np.float64(step.reward)
                record["terminated"] = np.bool_(step.terminated)
                record["truncated"] = np.bool_(step.truncated)
                for key, value in record.items():
                    rows.setdefault(key, []).append(value)
                observation = step.observation
                if step.truncated or (step.terminated and not through_termination):
                    break
            out.append({key: np.stack(values) for key, values in sorted(rows.items())})
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return out


def _names(simulator: Simulator, episode: dict[str, np.ndarray]) -> dict[str, tuple[str, ...]]:
    names = {
        "qpos": simulator.qpos_names,
        "qvel": simulator.qvel_names,
        "action": simulator.action_names,
        "policy_action": simulator.action_names,
    }
    if simulator.contact_names is not None:
        names[KINDS["force"]] = simulator.contact_names
    slots = getattr(simulator, "contact_slots", None)
    if slots is not None:
        names[KINDS["geometry"]] = tuple(f"{slot}_{c}" for slot in slots for c in COMPONENTS)
    return {key: value for key, value in names.items() if key in episode}


def contact_kinds(contacts: str) -> tuple[str, ...]:
    """``--contacts`` as kinds (``force,geometry`` -> both, in :data:`KINDS` order).

    :raises SimulatorError: an unknown kind.
    """
    given = [k.strip() for k in str(contacts).split(",")]
    if not given or any(k not in KINDS for k in given):
        raise SimulatorError(f"--contacts {contacts!r}: force, geometry or both (force,geometry)")
    return tuple(k for k in KINDS if k in given)


def contact_provenance(simulator: Simulator, episode: dict[str, np.ndarray]) -> dict[str, Any]:
    """``meta.json``'s record of the contact inputs: ``contacts`` lists the kinds
    recorded; ``contact_geometry`` names the feature, its slots and their components."""
    kinds = [kind for kind, feature in KINDS.items() if feature in episode]
    out: dict[str, Any] = {"contacts": kinds}
    if "geometry" in kinds:
        out["contact_geometry"] = {
            "feature": KINDS["geometry"],
            "slots": list(simulator.contact_slots),  # type: ignore[attr-defined]
            "components": list(COMPONENTS),
        }
    return out


def floating_base(simulator: Simulator) -> dict[str, Any] | None:
    """The robot's floating base as ``meta.json`` records it: the first free joint (a
    robot's root comes first in MuJoCo's joint order), else a planar base's three joints
    (:func:`slhub.sim.names.planar_root`, from the simulator's MuJoCo ``model`` where it
    has one), and the features holding their ``qpos`` and ``qvel`` components, so a
    learned simulator can express each step in the base's frame without a recipe
    naming it; None without either."""
    qpos, qvel = set(simulator.qpos_names), set(simulator.qvel_names)
    for joint in simulator.joint_names:
        if all(f"{joint}_{c}" in qpos for c in ("x", "y", "z", "qw", "qx", "qy", "qz")) and all(
            f"{joint}_{c}" in qvel for c in ("vx", "vy", "vz", "wx", "wy", "wz")
        ):
            return {"joint": joint, "qpos": "qpos", "qvel": "qvel"}
    model = getattr(simulator, "model", None)
    planar = planar_root(model) if model is not None else None
    if planar is not None:
        return {"kind": "planar", "joints": list(planar), "qpos": "qpos", "qvel": "qvel"}
    return None


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise SimulatorError(f"{name} {value!r}: an integer >= {low}")


@contextmanager
def _signals_unwind() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C (the store's temporary folder is removed on the way
    out) and exits ``128 + 15``; outside the main thread nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        sys.stderr.write(f"slhub: collect stopped by signal {signum}; nothing written\n")
        sys.stderr.flush()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _bar(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="episode", desc="collect", file=sys.stderr)
