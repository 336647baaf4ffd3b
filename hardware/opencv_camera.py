"""A USB / V4L2 camera or a video file through OpenCV (``cv2.VideoCapture``).

Two modes, chosen from ``source``:

- **Live** (an ``int`` device index, a ``/dev/video*`` path, or a ``scheme://`` stream URL): the
  driver asks for ``width`` x ``height`` at ``fps`` (CAP_PROP_FRAME_WIDTH / HEIGHT / FPS), then a
  background thread reads continuously and keeps only the latest frame, so ``read()`` returns a
  fresh frame rather than one that sat in the driver's buffer. ``read()`` waits for a frame it has
  not returned yet. After ``max_consecutive_failures`` failed grabs in a row the thread stops and
  every ``read()`` raises DeviceError (loudly, with the count and the source).
- **File** (any other string: a path to a video file): frames are decoded in order, one per
  ``read()``, paced at ``fps`` (playback at the camera's nominal rate, whatever the file's own
  rate), looping to the start when ``loop=True`` (else DeviceError at the end of the file).

Every frame is converted BGR -> RGB and resized to ``width`` x ``height`` if it differs (a camera
may not honour the requested size). Depth is not available from OpenCV cameras.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import cv2
import numpy as np

from hardware.base import Camera, CameraFrame, DeviceError

log = logging.getLogger(__name__)


class OpenCVCamera(Camera):
    """An OpenCV camera or video file.

    Args:
        source: USB device index (``int``), a ``/dev/video*`` path or a stream URL (live), or a
            video file path (``str``).
        name, width, height, fps: As for every camera; frames come out ``height x width x 3`` RGB.
        depth: Must be False (OpenCV cameras have no depth); True raises ValueError.
        loop: File mode: start again at the end of the file instead of raising DeviceError.
        max_consecutive_failures: Live mode: failed grabs in a row before the camera is declared dead.
        fourcc: Live mode: pixel format to request, e.g. ``"MJPG"`` (USB cameras often need it for
            full frame rate at 720p and up); None leaves the driver default.
        backend: ``cv2.CAP_*`` API preference (``cv2.CAP_V4L2`` ...); default ``cv2.CAP_ANY``.
    """

    def __init__(self, source: int | str = 0, name: str = "", width: int = 640, height: int = 480,
                 fps: float = 30.0, depth: bool = False, loop: bool = True, max_consecutive_failures: int = 30,
                 fourcc: str | None = None, backend: int | None = None) -> None:
        name = name or f"opencv:{source}"
        if depth:
            raise ValueError(f"camera {name!r}: OpenCV cameras have no depth stream; use depth=False "
                             f"(or the realsense_camera driver for RGB-D)")
        super().__init__(name, width, height, fps, depth=False)
        if isinstance(source, bool) or not isinstance(source, (int, str)):
            raise ValueError(f"camera {name!r}: source must be a device index (int) or a path/URL (str), "
                             f"got {source!r}")
        if max_consecutive_failures < 1:
            raise ValueError(f"camera {name!r}: max_consecutive_failures must be >= 1, got {max_consecutive_failures}")
        if fourcc is not None and len(fourcc) != 4:
            raise ValueError(f"camera {name!r}: fourcc must be 4 characters like 'MJPG', got {fourcc!r}")
        self.source = source
        self.loop = bool(loop)
        self.max_consecutive_failures = int(max_consecutive_failures)
        self.fourcc = fourcc
        self.backend = cv2.CAP_ANY if backend is None else int(backend)
        self.is_live = isinstance(source, int) or source.startswith("/dev/video") or "://" in source

        self._cap: Any = None
        self._index = 0  # file mode: frames returned; live mode: frames grabbed
        self._warned_size = False
        # live mode: the reader thread publishes the latest frame under _cv
        self._cv = threading.Condition()
        self._latest: tuple[np.ndarray, int, int] | None = None  # (bgr, t_mono_ns, index)
        self._last_read_index = -1
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------------------------------
    # lifecycle
    # ----------------------------------------------------------------------------------------

    def _connect(self) -> None:
        if not self.is_live and not os.path.isfile(self.source):
            raise DeviceError(f"camera {self.name!r}: video file {self.source!r} does not exist")
        cap = cv2.VideoCapture(self.source, self.backend)
        if not cap.isOpened():
            cap.release()
            what = "camera device" if self.is_live else "video file"
            raise DeviceError(f"camera {self.name!r}: cannot open {what} {self.source!r} with OpenCV "
                              f"(missing, busy, or an unsupported format)")
        self._cap = cap
        self._index = 0
        self._warned_size = False
        if not self.is_live:
            file_fps = cap.get(cv2.CAP_PROP_FPS)
            if file_fps > 0 and abs(file_fps - self.fps) > 0.5:
                log.info("camera %r: file is %.2f fps, played back at %.2f fps", self.name, file_fps, self.fps)
            self._restart_pacing()
            return
        if self.fourcc is not None:
            cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*self.fourcc))
        cap.set(cv2.CAP_PROP_FRAME_WIDTH, self.width)
        cap.set(cv2.CAP_PROP_FRAME_HEIGHT, self.height)
        cap.set(cv2.CAP_PROP_FPS, self.fps)
        cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)  # honoured by some backends (V4L2); the thread drains the rest
        self._latest, self._last_read_index, self._error = None, -1, None
        self._stop.clear()
        self._thread = threading.Thread(target=self._reader, name=f"{self.name}-reader", daemon=True)
        self._thread.start()

    def _disconnect(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            if self._thread.is_alive():
                log.warning("camera %r: reader thread still blocked in a grab; releasing anyway", self.name)
            self._thread = None
        if self._cap is not None:
            self._cap.release()
            self._cap = None

    # ----------------------------------------------------------------------------------------
    # frames
    # ----------------------------------------------------------------------------------------

    def read(self, timeout_s: float = 1.0) -> CameraFrame:
        self._require_connected()
        if self.is_live:
            bgr, t_ns, index = self._wait_fresh(timeout_s)
        else:
            bgr, t_ns, index = self._read_file(timeout_s)
        return CameraFrame(rgb=self._to_rgb(bgr), t_mono_ns=t_ns, index=index)

    def _read_file(self, timeout_s: float) -> tuple[np.ndarray, int, int]:
        self._pace(timeout_s, f" (playback at {self.fps} fps)")
        ok, bgr = self._cap.read()
        if not ok and self.loop:
            self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
            ok, bgr = self._cap.read()
        if not ok:
            end = "end of the video file" if not self.loop else "no frame could be decoded from the video file"
            raise DeviceError(f"camera {self.name!r}: {end} {self.source!r} after {self._index} frames"
                              + (" (loop=False)" if not self.loop else ""))
        index = self._index
        self._index += 1
        return bgr, time.monotonic_ns(), index

    def _wait_fresh(self, timeout_s: float) -> tuple[np.ndarray, int, int]:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while True:
                if self._error is not None:
                    raise DeviceError(self._error)
                if self._latest is not None and self._latest[2] > self._last_read_index:
                    self._last_read_index = self._latest[2]
                    return self._latest
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeviceError(f"camera {self.name!r}: no new frame from {self.source!r} "
                                      f"within {timeout_s:.3f} s")
                self._cv.wait(left)

    def _reader(self) -> None:
        """Grab continuously, keep only the newest frame; give up loudly after too many failures in a row."""
        failures = 0
        while not self._stop.is_set():
            ok, bgr = self._cap.read()
            t_ns = time.monotonic_ns()
            if ok and bgr is not None:
                failures = 0
                with self._cv:
                    self._latest = (bgr, t_ns, self._index)
                    self._index += 1
                    self._cv.notify_all()
                continue
            failures += 1
            if failures >= self.max_consecutive_failures:
                msg = (f"camera {self.name!r}: {failures} consecutive failed reads from {self.source!r}; "
                       f"the camera stopped delivering frames (unplugged or in use?)")
                log.error(msg)
                with self._cv:
                    self._error = msg
                    self._cv.notify_all()
                return
            self._stop.wait(min(0.5 / self.fps, 0.05))  # don't spin on a failing device

    def _to_rgb(self, bgr: np.ndarray) -> np.ndarray:
        if bgr.ndim == 2:
            bgr = cv2.cvtColor(bgr, cv2.COLOR_GRAY2BGR)
        h, w = bgr.shape[:2]
        if (h, w) != (self.height, self.width):
            if not self._warned_size and self.is_live:
                log.warning("camera %r delivers %dx%d, resizing to the requested %dx%d", self.name, w, h,
                            self.width, self.height)
                self._warned_size = True
            bgr = cv2.resize(bgr, (self.width, self.height), interpolation=cv2.INTER_AREA)
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "source": self.source, "live": self.is_live, "loop": self.loop}
