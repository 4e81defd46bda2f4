"""Offscreen frames of a MuJoCo model that show the robot, on a machine without a display.

MuJoCo picks its OpenGL backend from ``MUJOCO_GL`` when it is first imported;
:func:`import_mujoco` sets it to ``egl`` (headless) unless the user chose one.
Before the first frame, shadow maps and offscreen multisampling are turned off:
small frames gain nothing from them and a headless EGL may not support them.
Models without a light of their own (InvertedPendulum) get a brighter headlight:
the default one leaves them nearly black. Seen from slhub's own cameras, models
without a floor (a plane geom) get a grey backdrop behind the robot, square to the
view, drawn into the scene only (the physics never sees it): against MuJoCo's black
background a frame of InvertedPendulum averages 7/255 even so, with the backdrop
about 150/255, and the pole keeps its contrast.

Cameras: a name the model defines (Hopper's ``track``), else one of slhub's own,
for models without a camera of their own (InvertedPendulum): ``follow`` (the
default) follows body 1, the robot's root, from the side at the model's extent;
``fixed`` looks the same way at the model's centre and stays there, so the root's
own motion shows (InvertedPendulum's cart along its rail, which ``follow`` keeps
in the middle of every frame).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from slhub.errors import SimulatorError, one_line

#: The camera slhub places itself: follows body 1 from the side.
FOLLOW = "follow"
#: The camera slhub places itself that stays put: looks at the model's centre.
FIXED = "fixed"
#: The backdrop's colour (RGBA) for models without a floor.
BACKDROP_RGBA = (0.3, 0.32, 0.36, 1.0)
#: Plane geoms (``mjtGeom.mjGEOM_PLANE``): a model with one has a floor to see against.
_PLANE = 0


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
        elif camera in (FOLLOW, FIXED):
            view = mujoco.MjvCamera()
            if camera == FOLLOW:
                view.type = mujoco.mjtCamera.mjCAMERA_TRACKING
                view.trackbodyid = 1 if model.nbody > 1 else 0
            else:
                view.type = mujoco.mjtCamera.mjCAMERA_FREE
                view.lookat[:] = model.stat.center
            view.distance = float(model.stat.extent)
            view.elevation = -20.0
            view.azimuth = 90.0
            self._camera = view
        else:
            have = [model.camera(i).name for i in range(model.ncam)]
            raise SimulatorError(
                f"--camera {camera!r}: the model has no such camera (cameras: "
                f"{', '.join([FOLLOW, FIXED, *have])})"
            )
        prepare_model(model)
        types = np.asarray(model.geom_type)
        own = isinstance(self._camera, mujoco.MjvCamera)  # a model's camera is left as it is
        self._backdrop = own and not bool((types == _PLANE).any())
        self._extent = float(model.stat.extent)
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
        if self._backdrop:
            self._add_backdrop(self._renderer.scene)
        return np.array(self._renderer.render(), dtype=np.uint8)

    def _add_backdrop(self, scene: Any) -> None:
        """A wide thin box one model extent behind the camera's look-at point, square to
        its view, wide enough to fill the background."""
        if scene.ngeom >= scene.maxgeom:
            return
        mujoco = self._mujoco
        eye = scene.camera[0]
        forward = np.asarray(eye.forward, dtype=np.float64)
        up = np.asarray(eye.up, dtype=np.float64)
        position = np.asarray(eye.pos, dtype=np.float64)
        distance = float(self._camera.distance)
        centre = position + forward * (distance + self._extent)
        normal = -forward
        side = np.cross(up, normal)
        side /= np.linalg.norm(side)
        rotation = np.column_stack([side, np.cross(normal, side), normal])
        half = 4.0 * (distance + 2.0 * self._extent)
        mujoco.mjv_initGeom(
            scene.geoms[scene.ngeom],
            mujoco.mjtGeom.mjGEOM_BOX,
            np.array([half, half, 0.01]),
            centre,
            rotation.reshape(-1),
            np.asarray(BACKDROP_RGBA, dtype=np.float32),
        )
        scene.ngeom += 1

    def close(self) -> None:
        self._renderer.close()
