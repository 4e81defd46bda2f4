"""Offscreen frames of a MuJoCo model that show the robot, on a machine without a display.

MuJoCo picks its OpenGL backend from ``MUJOCO_GL`` when it is first imported;
:func:`import_mujoco` sets it to ``egl`` (headless) unless the user chose one.
Before the first frame, shadow maps and offscreen multisampling are turned off:
small frames gain nothing from them and a headless EGL may not support them.
Models without a light of their own (InvertedPendulum) get a brighter headlight:
the default one leaves them nearly black.

Cameras: a name the model defines (Hopper's ``track``), else ``follow`` (the
default): slhub's own, which follows body 1, the robot's root, from the side at the
model's extent, for models without a camera of their own (InvertedPendulum).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from slhub.errors import SimulatorError, one_line

#: The camera slhub places itself: follows body 1 from the side.
FOLLOW = "follow"


def import_mujoco() -> Any:
    """``mujoco``, imported with ``MUJOCO_GL=egl`` unless set; one line naming the extra
    when it is not installed."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        import mujoco
    except ImportError as exc:
        raise SimulatorError(
            f"simulating needs {exc.name or 'mujoco'}, which is not installed: "
            "pip install 'slhub[sim]'"
        ) from None
    return mujoco


def prepare_model(model: Any) -> None:
    """The rendering settings above, set on ``model`` before its first frame (they do
    not touch the physics)."""
    model.vis.quality.shadowsize = 0
    model.vis.quality.offsamples = 0
    if model.nlight == 0:
        model.vis.headlight.ambient[:] = 0.4
        model.vis.headlight.diffuse[:] = 0.8


class OffscreenCamera:
    """Renders ``size x size`` RGB frames of one model from one camera."""

    def __init__(self, model: Any, camera: str = FOLLOW, size: int = 64) -> None:
        mujoco = import_mujoco()
        self._mujoco = mujoco
        index = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if index >= 0:
            self._camera: Any = index
        elif camera == FOLLOW:
            view = mujoco.MjvCamera()
            view.type = mujoco.mjtCamera.mjCAMERA_TRACKING
            view.trackbodyid = 1 if model.nbody > 1 else 0
            view.distance = float(model.stat.extent)
            view.elevation = -20.0
            view.azimuth = 90.0
            self._camera = view
        else:
            have = [model.camera(i).name for i in range(model.ncam)]
            raise SimulatorError(
                f"--camera {camera!r}: the model has no such camera (cameras: "
                f"{', '.join([FOLLOW, *have])})"
            )
        prepare_model(model)
        model.vis.global_.offwidth = max(int(model.vis.global_.offwidth), size)
        model.vis.global_.offheight = max(int(model.vis.global_.offheight), size)
        try:
            self._renderer = mujoco.Renderer(model, size, size)
        except Exception as exc:  # noqa: BLE001 - no GL context: one line, not a traceback
            raise SimulatorError(
                f"cannot render offscreen with MUJOCO_GL={os.environ.get('MUJOCO_GL')} (mujoco "
                "reads it when first imported: set it before anything imports mujoco): "
                f"{one_line(exc, limit=200)}"
            ) from None

    def render(self, data: Any) -> np.ndarray:
        """The frame of ``data``'s current kinematics (``mj_forward`` done)."""
        self._renderer.update_scene(data, self._camera)
        return np.array(self._renderer.render(), dtype=np.uint8)

    def close(self) -> None:
        self._renderer.close()
