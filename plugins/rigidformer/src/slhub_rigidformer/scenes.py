"""Scenes of falling, spinning 2-D boxes that bounce on the ground, made in numpy.

Each scene holds between ``min_objects`` and ``max_objects`` boxes in the
vertical x-y plane (y up, ground at y = 0). A box is a rectangle with random half
extents in [0.1, 0.3], random centre (x in [-2, 2], y in [0.5, 2.5]), angle,
velocity (each component in [-1, 1]) and spin (in [-3, 3] rad/s). Every step of
``dt`` seconds (semi-implicit Euler):

1. ``v_y -= gravity * dt``; the centre moves by ``v * dt``; the angle by ``omega * dt``.
2. Ground contact: if the lowest corner is below y = 0, the box is lifted so that
   it touches the ground; a downward ``v_y`` is reflected with ``restitution``,
   ``v_x`` is multiplied by ``friction`` and ``omega`` by ``spin_damping``.

Boxes do not collide with each other (each moves independently); the model sees
each box as the four corner points of the current frame and their displacement
since the previous frame, and predicts their displacement to the next frame.
Padded object slots hold zeros and are marked invalid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Corners of the unit box, counter-clockwise from bottom-left.
_UNIT_CORNERS = np.array([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])
POINTS = 4
FEATURES = 2 * 2 * POINTS  # corners now + displacement since the previous frame
TARGETS = 2 * POINTS  # displacement to the next frame


@dataclass(frozen=True)
class Scenes:
    """``corners [S, steps + 1, M, 4, 2]`` (float32) and ``counts [S]`` of valid objects."""

    corners: np.ndarray
    counts: np.ndarray

    @property
    def num_scenes(self) -> int:
        return int(self.corners.shape[0])

    @property
    def steps(self) -> int:
        return int(self.corners.shape[1]) - 1

    @property
    def max_objects(self) -> int:
        return int(self.corners.shape[2])

    def valid(self) -> np.ndarray:
        """``[S, M]`` mask of the slots that hold an object."""
        return np.arange(self.max_objects)[None, :] < self.counts[:, None]

    def examples(self, scene: np.ndarray, t: np.ndarray):
        """Features ``[B, M, 16]``, targets ``[B, M, 8]`` and valid mask ``[B, M]`` at frames t."""
        prev, now, nxt = (self.corners[scene, t + k] for k in (-1, 0, 1))
        b, m = now.shape[:2]
        features = np.concatenate([now.reshape(b, m, -1), (now - prev).reshape(b, m, -1)], -1)
        targets = (nxt - now).reshape(b, m, -1)
        return features, targets, self.valid()[scene]


def box_corners(center: np.ndarray, angle: np.ndarray, half: np.ndarray) -> np.ndarray:
    """World corners ``[..., 4, 2]`` of boxes with centres ``[..., 2]``, angles, half extents."""
    cos, sin = np.cos(angle)[..., None], np.sin(angle)[..., None]
    local = _UNIT_CORNERS * half[..., None, :]
    x = local[..., 0] * cos - local[..., 1] * sin
    y = local[..., 0] * sin + local[..., 1] * cos
    return np.stack([x, y], axis=-1) + center[..., None, :]


def simulate(
    num_scenes: int,
    steps: int,
    seed: int,
    min_objects: int = 1,
    max_objects: int = 6,
    dt: float = 0.05,
    gravity: float = 9.8,
    restitution: float = 0.5,
    friction: float = 0.8,
    spin_damping: float = 0.8,
) -> Scenes:
    """Simulate ``num_scenes`` scenes of ``steps`` steps; deterministic in its arguments."""
    rng = np.random.default_rng(seed)
    shape = (num_scenes, max_objects)
    counts = rng.integers(min_objects, max_objects + 1, size=num_scenes)
    half = rng.uniform(0.1, 0.3, size=shape + (2,))
    center = np.stack([rng.uniform(-2.0, 2.0, shape), rng.uniform(0.5, 2.5, shape)], -1)
    angle = rng.uniform(-np.pi, np.pi, shape)
    vel = rng.uniform(-1.0, 1.0, size=shape + (2,))
    omega = rng.uniform(-3.0, 3.0, shape)

    corners = np.empty((num_scenes, steps + 1) + shape[1:] + (POINTS, 2))
    corners[:, 0] = box_corners(center, angle, half)
    for t in range(steps):
        vel[..., 1] -= gravity * dt
        center = center + vel * dt
        angle = angle + omega * dt
        lowest = box_corners(center, angle, half)[..., 1].min(-1)
        contact = lowest < 0.0
        center[..., 1] -= np.where(contact, lowest, 0.0)
        vel[..., 1] = np.where(
            contact & (vel[..., 1] < 0.0), -restitution * vel[..., 1], vel[..., 1]
        )
        vel[..., 0] = np.where(contact, friction * vel[..., 0], vel[..., 0])
        omega = np.where(contact, spin_damping * omega, omega)
        corners[:, t + 1] = box_corners(center, angle, half)
    valid = np.arange(max_objects)[None, :] < counts[:, None]
    corners *= valid[:, None, :, None, None]  # padded slots hold zeros
    return Scenes(corners=corners.astype(np.float32), counts=counts)


def normalization(scenes: Scenes) -> dict[str, np.ndarray]:
    """Mean and standard deviation of features and targets over valid objects of all frames."""
    t = np.arange(1, scenes.steps)
    s = np.arange(scenes.num_scenes)
    ss, tt = (a.reshape(-1) for a in np.meshgrid(s, t, indexing="ij"))
    features, targets, valid = scenes.examples(ss, tt)
    features, targets = features[valid].astype(np.float64), targets[valid].astype(np.float64)
    return {
        "feature_mean": features.mean(0),
        "feature_std": np.maximum(features.std(0), 1e-6),
        "target_mean": targets.mean(0),
        "target_std": np.maximum(targets.std(0), 1e-6),
    }
