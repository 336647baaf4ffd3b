"""Intel RealSense RGB-D camera (D4xx) through pyrealsense2, live or from a recording.

- **Live**: the first connected RealSense, or the one with ``serial``. Colour is streamed as RGB8
  at ``width`` x ``height`` @ ``fps``; with ``depth=True`` a Z16 depth stream (``depth_width`` x
  ``depth_height``, default the colour size) is aligned to the colour image with ``rs.align``.
  ``read()`` drains the pipeline's queue and returns the newest frame set, so a slow reader never
  gets a stale one.
- **Playback** (``playback_file``: a ``.db3`` recording, as librealsense 2.56+ writes, or an
  older ROS1 ``.bag``): played with ``set_real_time(False)`` (set before streaming starts) and
  paced by ``read()`` at ``fps``, one recorded frame set per period, looping when ``loop=True``
  (by restarting the pipeline), else DeviceError at the end. librealsense's playback pipeline is
  not frame-exact: on a loaded machine it can still drop frames, repeat a set, or pair colour and
  depth from different times; the driver skips repeated sets and sets whose colour and depth
  timestamps are more than half a frame apart. ``real_time=True`` plays at the recorded timing
  instead (frames are dropped when reading falls behind, as with a live camera).

Depth comes out in metres (float32, 0 where the camera has no measurement), scaled by the depth
sensor's ``depth_scale``, on the colour image's pixel grid. Colour frames of a recording are
converted to RGB from whatever format was recorded (RGB8 / BGR8 / RGBA8 / BGRA8), and both images
are resized to ``width`` x ``height`` if the recording differs.

pyrealsense2 is imported on ``connect()`` (it is the optional ``realsense`` extra).
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from types import ModuleType
from typing import Any

import cv2
import numpy as np

from hardware.base import Camera, CameraFrame, DeviceError

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'vla-stack[realsense]'"


class RealSenseCamera(Camera):
    """A RealSense camera or a RealSense recording.

    Args:
        name, width, height, fps, depth: As for every camera; ``depth=True`` adds aligned depth.
        serial: Live mode: the camera's serial number (from the site file); None takes the only /
            first connected camera.
        playback_file: Play this ``.db3`` / ``.bag`` recording instead of a live camera.
        loop: Playback: start again at the end of the recording.
        real_time: Playback: follow the recorded timing (dropping frames) instead of one frame set
            per ``read()`` paced at ``fps``.
        depth_width, depth_height: Live mode: depth stream resolution (default the colour size;
            D4xx depth supports e.g. 640x480, 848x480, 1280x720).
        rs_module: Use this module instead of importing ``pyrealsense2`` (for tests).
    """

    def __init__(self, name: str = "realsense", width: int = 640, height: int = 480, fps: float = 30.0,
                 depth: bool = False, serial: str | None = None, playback_file: str | None = None,
                 loop: bool = True, real_time: bool = False, depth_width: int | None = None,
                 depth_height: int | None = None, rs_module: ModuleType | Any | None = None) -> None:
        super().__init__(name, width, height, fps, depth)
        if serial is not None and playback_file is not None:
            raise ValueError(f"camera {name!r}: give either serial (live camera) or playback_file, not both")
        if playback_file is not None and not str(playback_file).endswith((".db3", ".bag")):
            raise ValueError(f"camera {name!r}: playback_file must be a .db3 or .bag recording, got {playback_file!r}")
        self.serial = None if serial is None else str(serial)
        self.playback_file = None if playback_file is None else str(playback_file)
        self.loop = bool(loop)
        self.real_time = bool(real_time)
        self.depth_width = int(depth_width or width)
        self.depth_height = int(depth_height or height)
        self._rs_module = rs_module

        self._rs: Any = None
        self._pipe: Any = None
        self._align: Any = None
        self._playback: Any = None
        self._depth_scale = 0.0
        self._index = 0

    @property
    def is_playback(self) -> bool:
        return self.playback_file is not None

    # ----------------------------------------------------------------------------------------
    # lifecycle
    # ----------------------------------------------------------------------------------------

    def _connect(self) -> None:
        rs = self._rs_module
        if rs is None:
            try:
                rs = importlib.import_module("pyrealsense2")
            except ImportError as e:
                raise DeviceError(f"camera {self.name!r}: pyrealsense2 is not installed or cannot load ({e}); "
                                  f"install it with: {INSTALL_HINT} (it needs the system library libusb-1.0)") from e
        self._rs = rs
        if self.is_playback:
            if not os.path.isfile(self.playback_file):
                raise DeviceError(f"camera {self.name!r}: recording {self.playback_file!r} does not exist")
        else:
            serials = [d.get_info(rs.camera_info.serial_number) for d in rs.context().query_devices()]
            if not serials:
                raise DeviceError(f"camera {self.name!r}: no RealSense device found (check the USB 3 cable, "
                                  f"udev rules, and that no other process holds the camera)")
            if self.serial is not None and self.serial not in serials:
                raise DeviceError(f"camera {self.name!r}: no RealSense with serial {self.serial!r}; "
                                  f"connected: {', '.join(serials)}")
        self._start_pipeline()
        self._index = 0
        self._restart_pacing()

    def _start_pipeline(self) -> None:
        rs = self._rs
        cfg = rs.config()
        if self.is_playback:
            # Paced playback loops by restarting the pipeline at the end (see _next_recorded):
            # librealsense's repeat_playback lets the syncer mis-pair colour and depth at the wrap.
            cfg.enable_device_from_file(self.playback_file, repeat_playback=self.loop and self.real_time)
            cfg.enable_stream(rs.stream.color)  # playback cannot convert formats: take what was recorded
            if self.has_depth:
                cfg.enable_stream(rs.stream.depth)
            source = f"recording {self.playback_file!r}"
        else:
            if self.serial is not None:
                cfg.enable_device(self.serial)
            cfg.enable_stream(rs.stream.color, self.width, self.height, rs.format.rgb8, int(round(self.fps)))
            if self.has_depth:
                cfg.enable_stream(rs.stream.depth, self.depth_width, self.depth_height, rs.format.z16,
                                  int(round(self.fps)))
            source = f"RealSense {self.serial or '(first found)'}"
        pipe = rs.pipeline()
        try:
            if self.is_playback:
                # Set the playback speed before streaming starts: a recording started in real time
                # drops the frames that play before set_real_time(False) lands. The pipeline reuses
                # the device that resolve() opened.
                cfg.resolve(rs.pipeline_wrapper(pipe)).get_device().as_playback().set_real_time(self.real_time)
            profile = pipe.start(cfg)
        except RuntimeError as e:
            streams = f"colour {self.width}x{self.height}@{self.fps:g}" + (" + depth" if self.has_depth else "")
            raise DeviceError(f"camera {self.name!r}: cannot start {source} with {streams}: {e}") from e
        try:
            device = profile.get_device()
            if self.is_playback:
                self._playback = device.as_playback()
            if self.has_depth:
                self._depth_scale = float(device.first_depth_sensor().get_depth_scale())
                self._align = rs.align(rs.stream.color)
        except RuntimeError as e:
            pipe.stop()
            raise DeviceError(f"camera {self.name!r}: {source} started but could not be configured: {e}") from e
        self._pipe = pipe
        self._last_numbers: tuple[int, int] | None = None  # playback: frame numbers of the last set returned

    def _disconnect(self) -> None:
        self._stop_pipeline()

    def _stop_pipeline(self) -> None:
        pipe, self._pipe = self._pipe, None
        playback, self._align, self._playback = self._playback, None, None
        if pipe is not None:
            if playback is not None and not self.real_time:
                # back to real time before stopping: a pipeline stopped while its file plays with real_time off can
                # hang or abort in librealsense (its issues #3126 and #2743: a reader blocked on a consumer that has
                # gone); once it aborted a whole test run in pipe.stop (test_bgr_recording_comes_out_rgb, a fresh-clone CI)
                try:
                    playback.set_real_time(True)
                except RuntimeError as e:
                    log.warning("camera %r: could not set playback back to real time before stopping: %s",
                                self.name, e)
            try:
                pipe.stop()
            except RuntimeError as e:
                log.warning("camera %r: pipeline stop failed: %s", self.name, e)

    # ----------------------------------------------------------------------------------------
    # frames
    # ----------------------------------------------------------------------------------------

    def read(self, timeout_s: float = 1.0) -> CameraFrame:
        self._require_connected()
        if self.is_playback and not self.real_time:
            frames = self._next_recorded(timeout_s)
        else:
            frames = self._newest(timeout_s)
        t_ns = time.monotonic_ns()
        if self._align is not None:
            frames = self._align.process(frames)
        colour = frames.get_color_frame()
        if not colour:
            raise DeviceError(f"camera {self.name!r}: frame set without a colour frame")
        rgb = self._to_rgb(colour)
        depth = None
        if self.has_depth:
            d = frames.get_depth_frame()
            if not d:
                raise DeviceError(f"camera {self.name!r}: frame set without a depth frame (depth=True)")
            depth = np.asanyarray(d.get_data()).astype(np.float32) * np.float32(self._depth_scale)
            if depth.shape != (self.height, self.width):
                depth = cv2.resize(depth, (self.width, self.height), interpolation=cv2.INTER_NEAREST)
        index = self._index
        self._index += 1
        return CameraFrame(rgb=rgb, t_mono_ns=t_ns, index=index, depth=depth)

    def _newest(self, timeout_s: float) -> Any:
        """Live: the newest frame set, draining anything queued; else wait for the next one."""
        latest = None
        while True:
            fs = self._pipe.poll_for_frames()
            if not fs:
                break
            latest = fs
        if latest is not None:
            return latest
        ok, fs = self._pipe.try_wait_for_frames(max(1, int(timeout_s * 1000)))
        if not ok:
            raise DeviceError(f"camera {self.name!r}: no frame within {timeout_s:.3f} s")
        return fs

    def _next_recorded(self, timeout_s: float) -> Any:
        """Playback: the next recorded frame set, paced at fps; DeviceError at the end (loop=False)."""
        self._pace(timeout_s, f" (playback at {self.fps} fps)")
        deadline = time.monotonic() + timeout_s
        while True:
            ok, fs = self._pipe.try_wait_for_frames(50)
            if ok:
                key = self._frame_numbers(fs)
                if key == self._last_numbers:
                    continue  # the syncer sometimes hands out the same set twice (e.g. at the end)
                if self._paired(fs):
                    self._last_numbers = key
                    return fs
                log.warning("camera %r: skipping a recorded frame set whose colour and depth are from "
                            "different times", self.name)
                continue
            if self._playback.current_status() == self._rs.playback_status.stopped:
                if not self.loop:
                    raise DeviceError(f"camera {self.name!r}: end of recording {self.playback_file!r} after "
                                      f"{self._index} frames (loop=False)")
                self._stop_pipeline()
                self._start_pipeline()  # from the start again
            if time.monotonic() > deadline:
                raise DeviceError(f"camera {self.name!r}: no frame from recording {self.playback_file!r} "
                                  f"within {timeout_s:.3f} s")

    def _frame_numbers(self, frames: Any) -> tuple[int, int]:
        colour, depth = frames.get_color_frame(), frames.get_depth_frame()
        return (colour.get_frame_number() if colour else -1, depth.get_frame_number() if depth else -1)

    def _paired(self, frames: Any) -> bool:
        """True unless colour and depth are more than half a frame apart (librealsense's syncer can
        mis-pair the streams of a recording, e.g. one recorded with irregular timing)."""
        if not self.has_depth:
            return True
        colour, depth = frames.get_color_frame(), frames.get_depth_frame()
        if not colour or not depth:
            return False
        half_period_ms = 500.0 / max(colour.get_profile().fps(), 1)
        return abs(colour.get_timestamp() - depth.get_timestamp()) <= half_period_ms

    def _to_rgb(self, colour: Any) -> np.ndarray:
        rs = self._rs
        img = np.asanyarray(colour.get_data())
        fmt = colour.get_profile().format()
        if fmt == rs.format.rgb8:
            rgb = img
        elif fmt == rs.format.bgr8:
            rgb = img[..., ::-1]
        elif fmt == rs.format.rgba8:
            rgb = img[..., :3]
        elif fmt == rs.format.bgra8:
            rgb = img[..., 2::-1]
        else:
            raise DeviceError(f"camera {self.name!r}: colour format {fmt} is not supported "
                              f"(record RGB8 / BGR8 / RGBA8 / BGRA8)")
        if rgb.shape[:2] != (self.height, self.width):
            rgb = cv2.resize(rgb, (self.width, self.height), interpolation=cv2.INTER_AREA)
        return np.array(rgb, dtype=np.uint8, order="C")  # a copy: librealsense recycles its frame buffers

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "serial": self.serial, "playback_file": self.playback_file,
                "depth_scale": self._depth_scale or None}
