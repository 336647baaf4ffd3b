"""A synthetic test-pattern camera: no hardware, no rendering cost.

Used by the bridge benchmark and tests to measure transport alone. Each frame is a moving
gradient with the frame index written into its first pixels, so a reader can check that the
bytes it got belong to the frame it was told about. It is labelled as synthetic in
``describe()`` and never stands in for a real camera in results.
"""

from __future__ import annotations

import time

import numpy as np

from hardware.base import Camera, CameraFrame


class SyntheticCamera(Camera):
    def __init__(self, name: str = "synthetic", width: int = 640, height: int = 480, fps: float = 30.0,
                 depth: bool = False) -> None:
        super().__init__(name, width, height, fps, depth)
        self._base = None
        self._index = 0

    def _connect(self) -> None:
        y = np.linspace(0, 255, self.height, dtype=np.float32)[:, None]
        x = np.linspace(0, 255, self.width, dtype=np.float32)[None, :]
        self._base = np.stack([np.broadcast_to(x, (self.height, self.width)),
                               np.broadcast_to(y, (self.height, self.width)),
                               np.full((self.height, self.width), 128, np.float32)], -1).astype(np.uint8)
        self._index = 0
        self._restart_pacing()

    def _disconnect(self) -> None:
        self._base = None

    def read(self, timeout_s: float = 1.0) -> CameraFrame:
        self._require_connected()
        self._pace(timeout_s)
        rgb = np.roll(self._base, self._index % self.width, axis=1)
        rgb[0, :8, 0] = np.frombuffer(np.int64(self._index).tobytes(), np.uint8)
        depth = None
        if self.has_depth:
            depth = np.full((self.height, self.width), 1.0 + 0.001 * (self._index % 100), np.float32)
        frame = CameraFrame(rgb=rgb, t_mono_ns=time.monotonic_ns(), index=self._index, depth=depth)
        self._index += 1
        return frame

    def describe(self):
        return {**super().describe(), "synthetic": True}
