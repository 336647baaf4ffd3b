"""A simulated camera filming the rig's screen (driver ``screen_camera``; kind ``camera``, so the
bridge's CameraService serves it like any camera). A real USB camera is ``opencv_camera``.

It renders what a camera pointed at a monitor sees, from the frame the screen
(``hardware.ale_screen``, ``screen: "@screen"`` in a site) displayed at the instant of exposure.
Each imperfection is a parameter (defaults moderate; 0 turns it off):

================  ==========================================================================
parameter         effect
================  ==========================================================================
yaw/pitch/roll    the camera's tilt against the screen plane, degrees: a perspective
                  homography (plane -> camera), ``hfov_deg`` the lens's horizontal field of
                  view, ``fill`` the share of the image height the screen + markers take
                  frontally, ``offset`` the shift of their centre (fractions of the image)
dist              OpenCV's lens distortion (k1, k2, p1, p2, k3) of the pinhole ``ideal_K()``
blur_sigma        Gaussian blur, pixels (focus, the monitor's glow)
noise_std         Gaussian sensor noise, grey levels (a bank of 4 noise frames, randomly
                  shifted per frame: cheap, and never the same twice in a row)
exposure          brightness gain
flicker           exposure flicker amplitude: gain x (1 + flicker * sin(2 pi flicker_hz t)),
                  the beat of the monitor's refresh and the camera's exposure
jitter_ms         standard deviation of each frame interval around 1/fps
drop_prob         probability that a frame is lost (the next one comes a period later,
                  its ``index`` skips one, as a camera's sequence number would)
latency_ms        capture latency: a frame delivered at t shows the screen as it was at
                  t - latency_ms (the stamp ``t_mono_ns`` is the delivery time, as a real
                  driver stamps frames when they reach the host)
================  ==========================================================================

ArUco markers (``calibration.screen.ScreenMarkers``, ``markers:`` the layout's fields) sit around
the screen's border like tape markers on a real monitor, so ``vla calibrate screen`` finds the
screen. Ground truth for tests: :meth:`ScreenCamera.true_homography` (frame pixel -> ideal camera
pixel), :meth:`ScreenCamera.true_corners` (the picture's corners in the delivered image),
:meth:`ScreenCamera.ideal_K` and ``dist``.

Rendering: the screen plane (picture, bezel, markers) is painted once at ``canvas_scale``
canvas pixels per frame pixel; each frame pastes the game's picture in (nearest neighbour, as a
monitor scales it) and one ``cv2.remap`` (maps built once, distortion included) films it; without
distortion it is exactly ``cv2.warpPerspective`` of the canvas (:meth:`camera_from_canvas`).
About 5-8 ms a frame at 640 x 480 with the defaults on this machine's CPU (2 shared cores). Numpy and OpenCV only, no torch.
"""

from __future__ import annotations

import math
import time
from typing import Any

import cv2
import numpy as np

from hardware.base import Camera, CameraFrame, DeviceError


def _rotation(yaw_deg: float, pitch_deg: float, roll_deg: float) -> np.ndarray:
    y, p, r = (math.radians(v) for v in (yaw_deg, pitch_deg, roll_deg))
    Ry = np.array([[math.cos(y), 0, math.sin(y)], [0, 1, 0], [-math.sin(y), 0, math.cos(y)]])
    Rx = np.array([[1, 0, 0], [0, math.cos(p), -math.sin(p)], [0, math.sin(p), math.cos(p)]])
    Rz = np.array([[math.cos(r), -math.sin(r), 0], [math.sin(r), math.cos(r), 0], [0, 0, 1]])
    return Rz @ Rx @ Ry


class ScreenCamera(Camera):
    def __init__(self, name: str = "screen_camera", screen: Any = None, width: int = 640, height: int = 480,
                 fps: float = 30.0, hfov_deg: float = 60.0, yaw_deg: float = 12.0, pitch_deg: float = -8.0,
                 roll_deg: float = 2.0, fill: float = 0.85, offset: tuple[float, float] = (0.0, 0.0),
                 dist: tuple[float, ...] = (-0.08, 0.02, 0.0, 0.0, 0.0), blur_sigma: float = 0.7,
                 noise_std: float = 3.0, exposure: float = 1.0, flicker: float = 0.04, flicker_hz: float = 7.0,
                 jitter_ms: float = 2.0, drop_prob: float = 0.0, latency_ms: float = 50.0, background: int = 30,
                 canvas_scale: int = 2, markers: dict | None = None, seed: int = 0) -> None:
        super().__init__(name, width, height, fps, depth=False)
        from calibration.screen import ScreenMarkers  # numpy + OpenCV; the layout calibration looks for

        if isinstance(screen, str):  # another process's screen: its game_state stream (hardware.remote_screen)
            from hardware.remote_screen import RemoteScreen

            screen = RemoteScreen(screen, name=f"{name}-screen")
        if screen is None or not hasattr(screen, "frame_at"):
            raise ValueError(f"camera {name!r}: screen= must be the screen it films (a hardware.base.Screen; in a "
                             f"site: screen: \"@<screen device>\", or the screen's stream endpoint when it runs "
                             f"in another process)")
        for k, v in (("blur_sigma", blur_sigma), ("noise_std", noise_std), ("flicker", flicker),
                     ("jitter_ms", jitter_ms), ("latency_ms", latency_ms), ("exposure", exposure)):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"camera {name!r}: {k} must be a finite number >= 0, got {v!r}")
        if not 0 <= drop_prob < 1:
            raise ValueError(f"camera {name!r}: drop_prob must be in [0, 1), got {drop_prob}")
        if not 0 < fill <= 1 or not 10 <= hfov_deg <= 170 or canvas_scale < 1:
            raise ValueError(f"camera {name!r}: need 0 < fill <= 1, 10 <= hfov_deg <= 170, canvas_scale >= 1")
        self.screen = screen
        self.markers = ScreenMarkers.from_dict(markers)
        self.blur_sigma, self.noise_std, self.exposure = float(blur_sigma), float(noise_std), float(exposure)
        self.flicker, self.flicker_hz = float(flicker), float(flicker_hz)
        self.jitter_ms, self.drop_prob, self.latency_ms = float(jitter_ms), float(drop_prob), float(latency_ms)
        self.background, self.scale, self.seed = int(background), int(canvas_scale), int(seed)
        self.params = {"yaw_deg": yaw_deg, "pitch_deg": pitch_deg, "roll_deg": roll_deg, "hfov_deg": hfov_deg,
                       "fill": fill, "offset": list(offset)}
        self.true_dist = np.asarray(dist, np.float64).reshape(-1)
        if self.true_dist.size not in (4, 5, 8, 12, 14) or not np.all(np.isfinite(self.true_dist)):
            raise ValueError(f"camera {name!r}: dist must hold 4, 5, 8, 12 or 14 finite numbers")
        W, H = self.width, self.height
        f = (W / 2) / math.tan(math.radians(hfov_deg) / 2)
        self._K = None
        self._ideal_K = np.array([[f, 0, (W - 1) / 2], [0, f, (H - 1) / 2], [0, 0, 1]])
        # screen plane (frame pixels) -> ideal camera pixels: K [r1 r2 t] A (A centres the plane)
        x0, y0, x1, y1 = self.markers.extent()
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        Z = f * (y1 - y0) / (fill * H)
        R = _rotation(yaw_deg, pitch_deg, roll_deg)
        t = np.array([offset[0] * W * Z / f, offset[1] * H * Z / f, Z])
        A = np.array([[1, 0, -cx], [0, 1, -cy], [0, 0, 1.0]])
        Hm = self._ideal_K @ np.column_stack([R[:, 0], R[:, 1], t]) @ A
        self._H = Hm / Hm[2, 2]
        ext = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]])
        seen = self._project(ext)
        if not (np.all(seen[:, 0] > 0) and np.all(seen[:, 0] < W - 1) and np.all(seen[:, 1] > 0)
                and np.all(seen[:, 1] < H - 1)):
            raise ValueError(f"camera {name!r}: the screen and its markers do not fit in the {W}x{H} image "
                             f"(corners at {np.round(seen).tolist()}): lower fill, tilt or offset")
        # canvas: the screen plane painted at `scale` canvas pixels per frame pixel
        s = self.scale
        self._origin = (x0, y0)
        cw, ch = int(math.ceil((x1 - x0) * s)), int(math.ceil((y1 - y0) * s))
        canvas = np.full((ch, cw, 3), self.background, np.uint8)
        for i, corners in self.markers.corners().items():
            q = self.markers.quiet_px
            (qx0, qy0), (qx1, qy1) = np.round(self._canvas_index(corners[[0, 2]] + [[-q, -q], [q, q]])).astype(int)
            canvas[qy0:qy1, qx0:qx1] = 255  # the white quiet zone
            (mx0, my0), (mx1, _) = np.round(self._canvas_index(corners[[0, 2]])).astype(int)
            side = mx1 - mx0
            canvas[my0:my0 + side, mx0:mx0 + side] = self.markers.marker_image(i, side)[..., None]
        fw, fh = self.markers.frame_size
        self._pic = np.round(self._canvas_index(np.array([-0.5, -0.5]))).astype(int)  # the picture's top-left
        self._pic_shape = (fh, fw)
        self._canvas0 = canvas
        self._build_maps()
        self._rng = np.random.default_rng(self.seed)
        self._noise = None
        self._index = 0
        self._next_ns = 0
        self._render_est_ns = 15_000_000
        self.dropped = 0

    # -- geometry -----------------------------------------------------------------------------
    def _canvas_index(self, p_edge: np.ndarray) -> np.ndarray:
        """A frame-pixel *edge* coordinate -> the canvas pixel index that starts there. The two images
        share one continuous plane: canvas = (p - origin) * scale - 0.5 (pixel centres at integers)."""
        return (np.asarray(p_edge, np.float64) - np.array(self._origin)) * self.scale

    def canvas_to_plane(self) -> np.ndarray:
        """[3, 3] canvas pixel -> frame pixel (p = (canvas + 0.5) / scale + origin)."""
        s = self.scale
        ox, oy = self._origin
        return np.array([[1 / s, 0, 0.5 / s + ox], [0, 1 / s, 0.5 / s + oy], [0, 0, 1.0]])

    def camera_from_canvas(self) -> np.ndarray:
        """[3, 3] canvas pixel -> ideal camera pixel (without distortion the image is exactly
        ``cv2.warpPerspective(canvas, this, (width, height))``)."""
        return self._H @ self.canvas_to_plane()

    def true_homography(self) -> np.ndarray:
        """[3, 3] frame pixel -> ideal (undistorted) camera pixel: ground truth for calibration."""
        return self._H.copy()

    def ideal_K(self) -> np.ndarray:
        """The exact pinhole matrix of the rendered images (before ``dist``)."""
        return self._ideal_K.copy()

    def _project(self, plane_pts: np.ndarray) -> np.ndarray:
        p = np.concatenate([plane_pts, np.ones((len(plane_pts), 1))], 1) @ self._H.T
        return p[:, :2] / p[:, 2:]

    def true_corners(self) -> np.ndarray:
        """[4, 2] the picture's outer corners (TL, TR, BR, BL) in the delivered (distorted) image."""
        from calibration.screen import distort_px

        return distort_px(self._project(self.markers.frame_corners()), self._ideal_K, self.true_dist)

    def _build_maps(self) -> None:
        self._distorted = bool(np.any(self.true_dist != 0))
        if not self._distorted:
            self._maps = None
            return
        from calibration.screen import undistort_px

        W, H = self.width, self.height
        u, v = np.meshgrid(np.arange(W, dtype=np.float64), np.arange(H, dtype=np.float64))
        ideal = undistort_px(np.stack([u.ravel(), v.ravel()], 1), self._ideal_K, self.true_dist)
        Minv = np.linalg.inv(self.camera_from_canvas())
        p = np.concatenate([ideal, np.ones((len(ideal), 1))], 1) @ Minv.T
        c = p[:, :2] / p[:, 2:]
        self._maps = (c[:, 0].reshape(H, W).astype(np.float32), c[:, 1].reshape(H, W).astype(np.float32))

    # -- lifecycle ------------------------------------------------------------------------------
    def _connect(self) -> None:
        if hasattr(self.screen, "endpoint") and not self.screen.is_connected:  # a RemoteScreen: subscribe now
            self.screen.connect()
        if not getattr(self.screen, "is_connected", True):
            raise DeviceError(f"camera {self.name!r}: the screen it films is not connected (list it before the camera)")
        self._rng = np.random.default_rng(self.seed)
        self._index = 0
        self._next_ns = time.monotonic_ns()
        self.dropped = 0

    def _disconnect(self) -> None:
        if hasattr(self.screen, "endpoint"):
            self.screen.disconnect()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sim": True, "films": getattr(self.screen, "name", None),
                **self.params, "dist_true": self.true_dist.tolist(), "blur_sigma": self.blur_sigma,
                "noise_std": self.noise_std, "exposure": self.exposure, "flicker": self.flicker,
                "flicker_hz": self.flicker_hz, "jitter_ms": self.jitter_ms, "drop_prob": self.drop_prob,
                "latency_ms": self.latency_ms, "markers": self.markers.to_dict(), "dropped": self.dropped}

    # -- rendering ------------------------------------------------------------------------------
    def render(self, picture: np.ndarray | None, t_s: float = 0.0) -> np.ndarray:
        """The camera image of the screen showing ``picture`` ([h, w, 3] uint8 at the layout's frame
        size; None: the screen is dark) at time ``t_s`` (seconds, for the flicker)."""
        canvas = self._canvas0.copy()
        fh, fw = self._pic_shape
        x, y = self._pic
        s = self.scale
        if picture is not None:
            if picture.shape[:2] != (fh, fw):
                raise DeviceError(f"camera {self.name!r}: the screen shows {picture.shape[1]}x{picture.shape[0]} "
                                  f"frames but the marker layout says {fw}x{fh}")
            canvas[y:y + fh * s, x:x + fw * s] = np.repeat(np.repeat(picture, s, 0), s, 1)
        else:
            canvas[y:y + fh * s, x:x + fw * s] = 0
        bg = (self.background,) * 3
        if self._maps is None:
            img = cv2.warpPerspective(canvas, self.camera_from_canvas(), (self.width, self.height),
                                      flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=bg)
        else:
            img = cv2.remap(canvas, self._maps[0], self._maps[1], cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                            borderValue=bg)
        gain = self.exposure * (1.0 + self.flicker * math.sin(2 * math.pi * self.flicker_hz * t_s))
        if gain == 1.0 and self.blur_sigma == 0 and self.noise_std == 0:
            return img  # exactly the warp
        out = img
        if self.blur_sigma > 0:
            out = cv2.GaussianBlur(out, (0, 0), self.blur_sigma)
        if gain != 1.0:
            out = cv2.convertScaleAbs(out, alpha=gain)  # saturating, in uint8
        if self.noise_std > 0:
            if self._noise is None:
                self._noise = [np.round(self._rng.standard_normal((self.height, self.width, 3), np.float32)
                                        * self.noise_std).astype(np.int16) for _ in range(4)]
            n = np.roll(self._noise[int(self._rng.integers(4))],
                        (int(self._rng.integers(self.height)), int(self._rng.integers(self.width))), (0, 1))
            out = np.clip(out.astype(np.int16) + n, 0, 255).astype(np.uint8)
        return out

    def read(self, timeout_s: float = 1.0) -> CameraFrame:
        """The next frame: delivered on the camera's (jittered) schedule, showing the screen as it was
        ``latency_ms`` before delivery."""
        self._require_connected()
        period_ns = 1e9 / self.fps
        now = time.monotonic_ns()
        if now - self._next_ns > period_ns:  # the reader fell behind: frames were missed, skip ahead
            missed = int((now - self._next_ns) // period_ns)
            self._next_ns += int(missed * period_ns)
            self._index += missed
        target = self._next_ns
        wake = target - self._render_est_ns
        if (wake - now) / 1e9 > timeout_s:
            raise DeviceError(f"camera {self.name!r}: no frame within {timeout_s:.3f} s")
        if wake > now:
            time.sleep((wake - now) / 1e9)
        t0 = time.monotonic_ns()
        t_expose = target - int(self.latency_ms * 1e6)
        shown = self.screen.frame_at(t_expose)
        rgb = self.render(None if shown is None else shown.rgb, t_expose / 1e9)
        t1 = time.monotonic_ns()
        self._render_est_ns = int(0.8 * self._render_est_ns + 0.2 * 2.0 * (t1 - t0)) + 500_000
        if target > t1:
            time.sleep((target - t1) / 1e9)
        stamp = max(target, time.monotonic_ns())
        frame = CameraFrame(rgb=rgb, t_mono_ns=stamp, index=self._index)
        # the next frame: one period later, jittered; sometimes lost on the way
        self._index += 1
        step = period_ns
        while self.drop_prob and self._rng.random() < self.drop_prob:
            step += period_ns
            self._index += 1
            self.dropped += 1
        jitter = self._rng.normal(0.0, self.jitter_ms * 1e6) if self.jitter_ms else 0.0
        self._next_ns = target + int(max(step + jitter, 0.2 * period_ns))
        return frame
