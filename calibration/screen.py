"""The keyboard rig's screen through a camera: ArUco markers around the screen -> the homography
that rectifies the screen region to the game's frame; key press -> first changed pixel latency.

Markers (:class:`ScreenMarkers`): square ArUco markers taped around the screen's border, at the
corners and the middle of each side, each on a white square (its quiet zone). Their positions
are given in *frame pixels*: the game frame's pixel centres are at integer coordinates
(0..W-1, 0..H-1), so the frame itself spans [-0.5, W-0.5] x [-0.5, H-0.5] and the markers lie
outside it. On a real monitor, measure where the tape is in those units (a marker 28 frame
pixels wide, 4 frame pixels from the picture's edge, ...) or tape them where the defaults say.
The simulated camera (``hardware.screen_camera``) draws exactly this layout.

Homography (:func:`calibrate_screen`): OpenCV's ``cv2.aruco.ArucoDetector`` (the 4.7+ API; the
old free functions are gone in OpenCV 5) finds the markers, their corners (sub-pixel refined)
are paired with the layout's, and ``cv2.findHomography`` (least squares over every corner of
every marker seen, after a RANSAC pass that drops a misdetected one) gives ``H``: camera pixel ->
frame pixel. With the camera's intrinsics (``vla calibrate intrinsics``) the corners are first
undistorted, so ``H`` maps *ideal* (undistorted) camera pixels and the lens's distortion is
removed as well; without them a distorted lens bends the straight edges and ``H`` is a
least-squares compromise (``residual_px`` shows it).

Rectifying (:class:`Rectifier`): one ``cv2.remap`` per frame, with maps built once from ``H``
(and the intrinsics): each frame pixel looks up where it is seen in the camera image. It needs
numpy and OpenCV only, so an edge agent (a Raspberry Pi) loads the camera's calibration file (or
the ``describe()`` of the camera on the bridge, which carries the file's sections) and reads
rectified 210 x 160 frames: ``Rectifier.from_calibration(cal)(camera_frame)``.

Latency (:func:`flash_latencies`, :func:`measure_key_latency`): the screen shows its
``key_flash`` test pattern (black; white while any key is held). A key is pressed at random
moments; for each press, the first camera frame whose rectified screen differs from the frame
before the press by more than ``threshold`` grey levels on average marks the change. Key press
-> that frame's timestamp is the end-to-end latency the agent lives with (keyboard link, the
game's next tick, the monitor, the camera's exposure phase and its capture latency); the median
over the presses is saved. When the screen's own display times are known (the host screen's
``game_state`` stream, or the screen object in a test), ``camera_ms`` separates the camera's
part: display -> first frame that shows it, minus half a frame period (the exposure falls at a
uniformly random point of the camera's period after the change).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import cv2
import numpy as np

from calibration.io import KeyLatency, ScreenHomography, now_iso

DICTIONARIES = {n: getattr(cv2.aruco, n) for n in dir(cv2.aruco) if n.startswith("DICT_")}
_CORNER_SIGNS = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], np.float64)  # TL, TR, BR, BL (ArUco's order)


@dataclasses.dataclass(frozen=True)
class ScreenMarkers:
    """Where the ArUco markers sit around the screen, in frame pixels (see the module docstring)."""

    frame_size: tuple[int, int] = (160, 210)
    """The game frame (width, height): ALE's 160 x 210."""
    marker_px: float = 28.0
    """Side of a marker's black square, in frame pixels."""
    gap_px: float = 6.0
    """From the picture's edge to a marker's white quiet zone, in frame pixels."""
    quiet_px: float = 6.0
    """Width of the white border around each marker (ArUco needs one), in frame pixels."""
    dictionary: str = "DICT_4X4_50"
    """The ArUco dictionary (an OpenCV ``cv2.aruco.DICT_*`` name)."""
    first_id: int = 0
    """Marker ids first_id .. first_id + 7: corners TL, TR, BR, BL, then the middles of top, right, bottom, left."""

    def __post_init__(self) -> None:
        if self.dictionary not in DICTIONARIES:
            raise ValueError(f"unknown ArUco dictionary {self.dictionary!r}")
        if min(self.marker_px, self.quiet_px) <= 0 or self.gap_px < 0:
            raise ValueError("marker_px and quiet_px must be positive and gap_px non-negative")
        object.__setattr__(self, "frame_size", tuple(int(v) for v in self.frame_size))

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(range(self.first_id, self.first_id + 8))

    def centres(self) -> np.ndarray:
        """[8, 2] marker centres in frame pixels, in id order."""
        w, h = self.frame_size
        d = self.gap_px + self.quiet_px + self.marker_px / 2  # picture edge -> marker centre
        x0, y0, x1, y1 = -0.5 - d, -0.5 - d, w - 0.5 + d, h - 0.5 + d
        xm, ym = (w - 1) / 2, (h - 1) / 2
        return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1], [xm, y0], [x1, ym], [xm, y1], [x0, ym]])

    def corners(self) -> dict[int, np.ndarray]:
        """Marker id -> its 4 corners [4, 2] (TL, TR, BR, BL as ArUco reports them), frame pixels."""
        half = self.marker_px / 2
        return {i: c + half * _CORNER_SIGNS for i, c in zip(self.ids, self.centres())}

    def extent(self) -> tuple[float, float, float, float]:
        """(x0, y0, x1, y1): the box holding the picture and every marker's quiet zone, frame pixels."""
        r = self.marker_px / 2 + self.quiet_px
        c = self.centres()
        return float(c[:, 0].min() - r), float(c[:, 1].min() - r), float(c[:, 0].max() + r), float(c[:, 1].max() + r)

    def frame_corners(self) -> np.ndarray:
        """[4, 2] the picture's outer corners (TL, TR, BR, BL), frame pixels."""
        w, h = self.frame_size
        return np.array([[-0.5, -0.5], [w - 0.5, -0.5], [w - 0.5, h - 0.5], [-0.5, h - 0.5]])

    def aruco_dictionary(self):
        return cv2.aruco.getPredefinedDictionary(DICTIONARIES[self.dictionary])

    def marker_image(self, marker_id: int, side_px: int) -> np.ndarray:
        """The marker's black-and-white image, ``side_px`` square (no quiet zone), uint8."""
        return cv2.aruco.generateImageMarker(self.aruco_dictionary(), int(marker_id), int(side_px))

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "frame_size": list(self.frame_size)}

    @classmethod
    def from_dict(cls, d: dict | None) -> "ScreenMarkers":
        return cls(**(d or {}))


# --------------------------------------------------------------------------------------------
# homography
# --------------------------------------------------------------------------------------------


def detect_markers(image: np.ndarray, markers: ScreenMarkers) -> dict[int, np.ndarray]:
    """The layout's markers found in ``image`` (RGB or grey): id -> corners [4, 2] in camera pixels."""
    grey = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    params = cv2.aruco.DetectorParameters()
    params.cornerRefinementMethod = cv2.aruco.CORNER_REFINE_SUBPIX
    detector = cv2.aruco.ArucoDetector(markers.aruco_dictionary(), params)
    corners, ids, _ = detector.detectMarkers(grey)
    wanted = set(markers.ids)
    out: dict[int, np.ndarray] = {}
    for c, i in zip(corners, [] if ids is None else ids.reshape(-1)):
        if int(i) in wanted and int(i) not in out:
            out[int(i)] = np.asarray(c, np.float64).reshape(4, 2)
    return out


def undistort_px(points: np.ndarray, K: np.ndarray, dist: np.ndarray) -> np.ndarray:
    """Camera pixels -> ideal (undistorted) pixels of the same K."""
    pts = np.asarray(points, np.float64).reshape(-1, 1, 2)
    crit = (cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 100, 1e-10)
    return cv2.undistortPointsIter(pts, K, dist, None, K, crit).reshape(-1, 2)


def distort_px(points: np.ndarray, K: np.ndarray, dist: np.ndarray) -> np.ndarray:
    """Ideal (undistorted) pixels -> where the lens puts them (OpenCV's distortion model)."""
    pts = np.asarray(points, np.float64).reshape(-1, 2)
    xy = (pts - K[:2, 2]) / np.array([K[0, 0], K[1, 1]])
    obj = np.concatenate([xy, np.ones((len(xy), 1))], 1).reshape(-1, 1, 3)
    out, _ = cv2.projectPoints(obj, np.zeros(3), np.zeros(3), K, np.asarray(dist, np.float64))
    return out.reshape(-1, 2)


def _apply(H: np.ndarray, pts: np.ndarray) -> np.ndarray:
    p = np.concatenate([pts, np.ones((len(pts), 1))], 1) @ H.T
    return p[:, :2] / p[:, 2:]


def calibrate_screen(image: np.ndarray, markers: ScreenMarkers | None = None, K=None, dist=None,
                     min_markers: int = 4) -> ScreenHomography:
    """Find the markers in ``image`` and solve the homography camera pixel -> frame pixel (see the
    module docstring). ``K`` / ``dist``: the camera's intrinsics, to undistort first. Raises
    ValueError naming what is missing when fewer than ``min_markers`` markers are seen."""
    markers = markers or ScreenMarkers()
    found = detect_markers(image, markers)
    if len(found) < min_markers:
        raise ValueError(f"found {len(found)} of the screen's 8 ArUco markers ({markers.dictionary}, ids "
                         f"{markers.ids[0]}..{markers.ids[-1]}: {sorted(found)}); need {min_markers}. Is the whole "
                         f"screen in view, lit, and in focus?")
    layout = markers.corners()
    cam = np.concatenate([found[i] for i in sorted(found)])
    plane = np.concatenate([layout[i] for i in sorted(found)])
    undistorted = K is not None
    if undistorted:
        K = np.asarray(K, np.float64)
        dist = np.zeros(5) if dist is None else np.asarray(dist, np.float64).reshape(-1)
        cam = undistort_px(cam, K, dist)
    _, inl = cv2.findHomography(cam, plane, cv2.RANSAC, 3.0)
    keep = inl.reshape(-1).astype(bool) if inl is not None else np.ones(len(cam), bool)
    H, _ = cv2.findHomography(cam[keep], plane[keep], 0)
    if H is None:
        raise ValueError("the markers' corners do not determine a homography (degenerate view)")
    H = H / H[2, 2]
    residual = float(np.sqrt(np.mean(np.sum((_apply(H, cam[keep]) - plane[keep]) ** 2, 1))))
    corners = _apply(np.linalg.inv(H), markers.frame_corners())
    if undistorted:
        corners = distort_px(corners, K, dist)
    h, w = image.shape[:2]
    return ScreenHomography(H=H, frame_size=markers.frame_size, image_size=(w, h), corners_px=corners,
                            markers=markers.to_dict(), markers_seen=len(found), residual_px=residual,
                            undistorted=undistorted, created=now_iso())


class Rectifier:
    """Camera frame -> the screen's picture at the game's frame size, one ``cv2.remap``."""

    def __init__(self, H, frame_size: tuple[int, int], K=None, dist=None) -> None:
        w, h = (int(v) for v in frame_size)
        self.H, self.frame_size = np.asarray(H, np.float64), (w, h)
        u, v = np.meshgrid(np.arange(w, dtype=np.float64), np.arange(h, dtype=np.float64))
        cam = _apply(np.linalg.inv(self.H), np.stack([u.ravel(), v.ravel()], 1))
        if K is not None:
            cam = distort_px(cam, np.asarray(K, np.float64),
                             np.zeros(5) if dist is None else np.asarray(dist, np.float64).reshape(-1))
        self.map_x = cam[:, 0].reshape(h, w).astype(np.float32)
        self.map_y = cam[:, 1].reshape(h, w).astype(np.float32)

    @classmethod
    def from_calibration(cls, cal) -> "Rectifier":
        """From a ``calibration.io.CalibrationFile`` with a ``screen`` section (and its intrinsics
        when the homography was solved on undistorted corners)."""
        s = cal.screen
        if s is None:
            raise ValueError(f"{cal.path}: no screen section (run `vla calibrate screen`)")
        if s.undistorted and cal.intrinsics is None:
            raise ValueError(f"{cal.path}: the screen homography was solved on undistorted pixels but the file has "
                             "no intrinsics section")
        i = cal.intrinsics if s.undistorted else None
        return cls(s.H, s.frame_size, None if i is None else i.K, None if i is None else i.dist)

    @classmethod
    def from_description(cls, description: dict) -> "Rectifier":
        """From a camera's ``describe()`` on the bridge (its calibration file's sections)."""
        c = (description or {}).get("calibration") or {}
        s = c.get("screen")
        if s is None:
            raise ValueError(f"camera {description.get('name')!r} has no screen calibration (run `vla calibrate screen`)")
        i = c.get("intrinsics") if s.get("undistorted") else None
        return cls(s["H"], s["frame_size"], None if i is None else i["K"], None if i is None else i["dist"])

    def __call__(self, image: np.ndarray) -> np.ndarray:
        return cv2.remap(image, self.map_x, self.map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)


# --------------------------------------------------------------------------------------------
# key -> pixel latency
# --------------------------------------------------------------------------------------------


def _grey(image: np.ndarray, rectify: Callable | None) -> np.ndarray:
    img = rectify(image) if rectify is not None else image
    return (img if img.ndim == 2 else cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)).astype(np.float32)


def first_change(frames: Sequence[tuple[int, np.ndarray]], t_press_ns: int, rectify: Callable | None = None,
                 threshold: float = 25.0) -> int | None:
    """Timestamp of the first frame after ``t_press_ns`` whose (rectified) picture differs from the
    last frame before the press by more than ``threshold`` grey levels on average; None if none does.
    ``frames``: (t_mono_ns, RGB or grey image) in time order."""
    before = [img for t, img in frames if t <= t_press_ns]
    if not before:
        return None
    base = _grey(before[-1], rectify)
    for t, img in frames:
        if t > t_press_ns and float(np.abs(_grey(img, rectify) - base).mean()) > threshold:
            return int(t)
    return None


def flash_latencies(frames: Sequence[tuple[int, np.ndarray]], presses_ns: Sequence[int],
                    shown_ns: Sequence[int | None] | None = None, camera_fps: float | None = None,
                    rectify: Callable | None = None, threshold: float = 25.0) -> KeyLatency:
    """Key press -> first changed frame, per press (see the module docstring). ``shown_ns``: when the
    screen first displayed each press's flash (None where unknown), for ``camera_ms``."""
    e2e, cam = [], []
    for k, tp in enumerate(presses_ns):
        tc = first_change(frames, tp, rectify, threshold)
        if tc is None:
            continue
        e2e.append((tc - tp) / 1e6)
        if shown_ns is not None and shown_ns[k] is not None and camera_fps:
            cam.append((tc - shown_ns[k]) / 1e6 - 500.0 / camera_fps)
    if not e2e:
        raise ValueError(f"no press of {len(presses_ns)} changed the picture by more than {threshold} grey levels: is "
                         "the screen showing its key_flash pattern, and in view?")
    return KeyLatency(median_ms=float(np.median(e2e)), p90_ms=float(np.percentile(e2e, 90)), presses=len(e2e),
                      samples_ms=[round(x, 3) for x in e2e], camera_ms=float(np.median(cam)) if cam else None,
                      camera_fps=camera_fps, method="key_flash", created=now_iso())


def measure_key_latency(press: Callable[[], int], release: Callable[[], None], read_frame: Callable[[], tuple],
                        presses: int = 12, hold_s: float = 0.25, gap_s: tuple[float, float] = (0.2, 0.4),
                        shown: Callable[[int], int | None] | None = None, camera_fps: float | None = None,
                        rectify: Callable | None = None, threshold: float = 25.0, seed: int = 0) -> KeyLatency:
    """Drive ``presses`` key presses at random moments and time them in the camera's frames.

    ``press()`` presses a key and returns the host's time.monotonic_ns() at the press;
    ``release()`` lets it go; ``read_frame()`` blocks for the camera's next frame and returns
    (t_mono_ns, rgb). ``shown(t_press_ns)``: when the screen first showed the flash of the press at
    that time (optional, for ``camera_ms``). The screen must show its ``key_flash`` pattern."""
    rng = np.random.default_rng(seed)
    frames: list[tuple[int, np.ndarray]] = []
    times: list[int] = []

    def film(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t, rgb = read_frame()
            frames.append((t, _grey(rgb, rectify)))  # kept small: the rectified grey picture

    film(0.2)
    shown_ns: list[int | None] = []
    for _ in range(presses):
        film(float(rng.uniform(*gap_s)))  # a random phase against the screen's ticks and the camera's frames
        times.append(press())
        film(hold_s)
        if shown is not None:
            shown_ns.append(shown(times[-1]))  # asked now, while the screen still remembers the press
        release()
    film(hold_s)
    return flash_latencies(frames, times, shown_ns if shown is not None else None, camera_fps, None, threshold)
