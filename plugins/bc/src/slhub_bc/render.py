"""Headless numpy rendering of cart-pole states to 64 x 64 grayscale frames.

The camera is fixed: 0.04 m per pixel, x in [-1.28, 1.28] m, y in [-0.6, 1.96] m
(y up). The cart is a 0.4 x 0.2 m box centred at (x, 0); the pole is a capsule of
radius 0.04 m from the cart centre to ``2 * HALF_LENGTH`` m along the angle
(theta = 0 points up). Edges are anti-aliased over one pixel, so sub-pixel motion
changes the image; parts outside the frame are cut off. Values lie in [0, 1].
"""

from __future__ import annotations

import numpy as np
from slhub.sim import cartpole

SIZE = 64
PIXEL = 0.04
LEFT, TOP = -1.28, 1.96
CART_HALF = np.array([0.2, 0.1])
POLE_RADIUS = 0.04

_COLS = LEFT + (np.arange(SIZE) + 0.5) * PIXEL
_ROWS = TOP - (np.arange(SIZE) + 0.5) * PIXEL
_PX, _PY = (g.astype(np.float32) for g in np.meshgrid(_COLS, _ROWS))  # row 0 at the top


def render(states: np.ndarray) -> np.ndarray:
    """Frames ``[..., 64, 64]`` (float32) of states ``[..., 4]``."""
    lead = states.shape[:-1]
    flat = np.asarray(states, dtype=np.float32).reshape(-1, 4)
    x, theta = flat[:, 0, None, None], flat[:, 1, None, None]
    # Cart: signed distance to a box.
    qx = np.abs(_PX - x) - np.float32(CART_HALF[0])
    qy = np.abs(_PY) - np.float32(CART_HALF[1])
    cart = np.hypot(np.maximum(qx, 0), np.maximum(qy, 0)) + np.minimum(np.maximum(qx, qy), 0)
    # Pole: distance to the segment from (x, 0) to the tip, minus the radius.
    dx, dy = 2 * cartpole.HALF_LENGTH * np.sin(theta), 2 * cartpole.HALF_LENGTH * np.cos(theta)
    rx, ry = _PX - x, _PY
    along = np.clip((rx * dx + ry * dy) / (4 * cartpole.HALF_LENGTH**2), 0.0, 1.0)
    pole = np.hypot(rx - along * dx, ry - along * dy) - POLE_RADIUS
    frames = np.clip(0.5 - np.minimum(cart, pole) / PIXEL, 0.0, 1.0)
    return frames.reshape(lead + (SIZE, SIZE))
