"""A camera that renders a named MuJoCo camera ("front" or "wrist") of a :class:`SimFranka`.

Each ``SimCamera`` owns a private ``MjData``: a frame copies the simulator's state with
``sim.snapshot_qpos()`` (a short hold of the physics lock), runs forward kinematics on the copy
and renders it, so rendering never blocks the physics thread.

Threads: the ``mujoco.Renderer`` (an EGL/OSMesa GL context) is bound to the thread that created
it. It is created lazily by the first ``read()`` / ``render_now()`` and every later frame must be
rendered in that same thread (a frame from another thread raises ``DeviceError``). The bridge
does this naturally: the stream thread calls ``read()``; in fast mode the command thread calls
``render_now()``. ``disconnect()`` frees the renderer when called from that thread; called from
another thread it logs a warning and leaves the GL context allocated until the process exits (it
cannot be freed there).

Speed settings: shadows, reflections, skybox, fog and haze off, no multisampling
(``model.vis.quality.offsamples = 0``, set by ``SimFranka`` when it builds the model).
Measured on the CPU-only build machine (2 cores, no GPU: Mesa llvmpipe through EGL), Panda scene,
median of 10 frames after the first (the first frame of a camera takes 0.4-1.2 s: GL context and
mesh upload). The cost is mostly geometry, so it grows slowly with resolution:

=========  ===========  ===================
size       RGB          RGB + depth
=========  ===========  ===================
224x224    22-33 ms     37-50 ms
640x480    28-40 ms     43-62 ms
=========  ===========  ===================

Ground truth for calibration: :meth:`SimCamera.ideal_K` is the pinhole matrix of the rendered
image (square pixels, principal point at the image centre, no distortion; ``fy = (h / 2) /
tan(fovy / 2)``), and :func:`camera_pose_cv` is a camera's pose in the world with OpenCV's axes
(MuJoCo's camera looks along -z with y up; OpenCV's looks along +z with y down).

Depth is a second render pass (``mujoco.Renderer`` renders depth separately), so ask for it only
where it is used. (Not measured on a GPU, where EGL uses the vendor driver and should be far faster.)
"""

from __future__ import annotations

import logging
import os
import threading
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from hardware.base import Camera, CameraFrame, DeviceError  # noqa: E402

log = logging.getLogger(__name__)
_ORPHANED_RENDERERS: list = []
_OFF_FLAGS = ("mjRND_SHADOW", "mjRND_REFLECTION", "mjRND_SKYBOX", "mjRND_FOG", "mjRND_HAZE")
MJ_TO_CV = np.diag([1.0, -1.0, -1.0])  # camera axes: MuJoCo (x right, y up, looks along -z) -> OpenCV


def ideal_intrinsics(model: mujoco.MjModel, camera: str, width: int, height: int) -> np.ndarray:
    """[3, 3] pinhole matrix of ``camera`` rendered at ``width`` x ``height`` (OpenCV pixel convention:
    pixel centres at integer coordinates, so the image centre is ((w - 1) / 2, (h - 1) / 2))."""
    cam = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
    if cam < 0:
        raise ValueError(f"the model has no camera {camera!r}")
    f = (height / 2.0) / np.tan(np.radians(model.cam_fovy[cam]) / 2.0)
    return np.array([[f, 0.0, (width - 1) / 2.0], [0.0, f, (height - 1) / 2.0], [0.0, 0.0, 1.0]])


def camera_pose_cv(model: mujoco.MjModel, data: mujoco.MjData, camera: str) -> np.ndarray:
    """[4, 4] pose of ``camera`` in the world with OpenCV's camera axes (x right, y down, looking
    along +z): ``x_world = T @ x_cam``. Needs ``data`` after ``mj_kinematics`` + ``mj_camlight``."""
    cam = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
    if cam < 0:
        raise ValueError(f"the model has no camera {camera!r}")
    T = np.eye(4)
    T[:3, :3] = data.cam_xmat[cam].reshape(3, 3) @ MJ_TO_CV
    T[:3, 3] = data.cam_xpos[cam]
    return T


class SimCamera(Camera):
    def __init__(self, name: str = "sim_camera", sim=None, camera: str = "front", width: int = 224,
                 height: int = 224, fps: float = 30.0, depth: bool = False) -> None:
        super().__init__(name, width, height, fps, depth)
        if sim is None or not hasattr(sim, "snapshot_qpos") or not hasattr(sim, "model"):
            raise ValueError(f"camera {name!r}: sim= must be a SimFranka (something with .model and .snapshot_qpos())")
        self.sim = sim
        self.camera = camera
        model = sim.model
        self._cam_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if self._cam_id < 0:
            names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
            raise ValueError(f"camera {name!r}: the simulation has no camera {camera!r}; it has {names}")
        off_w, off_h = model.vis.global_.offwidth, model.vis.global_.offheight
        if self.width > off_w or self.height > off_h:
            raise ValueError(f"camera {name!r}: {self.width}x{self.height} exceeds the model's offscreen buffer "
                             f"{off_w}x{off_h}")
        self._data = mujoco.MjData(model)
        self._renderer: mujoco.Renderer | None = None
        self._render_thread: int | None = None
        self._index = 0
        self._resets = getattr(sim, "resets", None)  # the sim's reset count at the last frame

    # -- lifecycle ----------------------------------------------------------------------------
    def _connect(self) -> None:
        self._index = 0
        self._restart_pacing()

    def _disconnect(self) -> None:
        r, self._renderer = self._renderer, None
        if r is not None:
            if self._render_thread == threading.get_ident():
                r.close()
            else:  # its GL context is current in another thread: it can't be freed from here
                log.warning("camera %r: disconnect() from a thread other than the rendering thread; its GL "
                            "context stays allocated until the process exits", self.name)
                _ORPHANED_RENDERERS.append(r)  # keep it referenced so that GC never tries to free it here
        self._render_thread = None

    def release_renderer(self) -> None:
        """Free the GL context now; call it from the rendering thread when it stops rendering
        (the bridge's stream thread does, on its way out). The next frame makes a new one."""
        if self._renderer is not None and self._render_thread == threading.get_ident():
            self._renderer.close()
            self._renderer, self._render_thread = None, None

    def describe(self):
        return {**super().describe(), "camera": self.camera, "sim": True}

    def ideal_K(self) -> np.ndarray:
        """The exact pinhole matrix of this camera's frames (ground truth for calibration tests)."""
        return ideal_intrinsics(self.sim.model, self.camera, self.width, self.height)

    # -- frames -------------------------------------------------------------------------------
    def read(self, timeout_s: float = 1.0) -> CameraFrame:
        """Wait for the next frame time (paced at ``fps``) and render the current sim state."""
        self._require_connected()
        self._pace(timeout_s)
        return self._render()

    def render_now(self) -> CameraFrame:
        """Render the current sim state immediately, without pacing (fast training mode)."""
        self._require_connected()
        return self._render()

    def _get_renderer(self) -> mujoco.Renderer:
        tid = threading.get_ident()
        if self._renderer is None:
            r = mujoco.Renderer(self.sim.model, height=self.height, width=self.width)
            for flag in _OFF_FLAGS:
                r.scene.flags[getattr(mujoco.mjtRndFlag, flag)] = 0
            self._renderer, self._render_thread = r, tid
        elif self._render_thread != tid:
            raise DeviceError(f"camera {self.name!r}: its GL context belongs to another thread; render every frame "
                              f"of one SimCamera from the thread that rendered its first frame")
        return self._renderer

    @staticmethod
    def _fresh_scene(renderer: mujoco.Renderer) -> None:
        """Replace the renderer's ``MjvScene`` (cheap; the GL context stays). A scene kept across frames carries
        state into the next frame: the same qpos rendered after another episode came out with a few pixels one
        level apart (MuJoCo 4.0), enough to change a policy's actions, so a seed's episode would not repeat."""
        old = renderer.scene
        scene = mujoco.MjvScene(renderer._model, maxgeom=old.maxgeom)
        scene.flags[:] = old.flags
        renderer._scene = scene  # mujoco.Renderer has no public setter for its scene

    def _render(self) -> CameraFrame:
        renderer = self._get_renderer()
        resets = getattr(self.sim, "resets", None)
        if resets != self._resets:  # a new episode: a fresh scene, so its frames do not depend on the last one's
            self._fresh_scene(renderer)
            self._resets = resets
        t_ns = time.monotonic_ns()
        qpos, qvel, t_sim = self.sim.snapshot_qpos()
        d = self._data
        d.qpos[:] = qpos
        d.qvel[:] = qvel
        d.time = t_sim
        mujoco.mj_kinematics(self.sim.model, d)
        mujoco.mj_camlight(self.sim.model, d)
        renderer.update_scene(d, camera=self._cam_id)
        rgb = renderer.render().copy()
        depth = None
        if self.has_depth:
            renderer.enable_depth_rendering()
            try:
                depth = renderer.render().astype(np.float32, copy=True)
            finally:
                renderer.disable_depth_rendering()
        frame = CameraFrame(rgb=rgb, t_mono_ns=t_ns, index=self._index, depth=depth)
        self._index += 1
        return frame
