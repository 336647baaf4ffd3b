"""Calibration files: one YAML file per device, one section per calibration.

``vla calibrate`` writes them and a site file names them (``devices.<name>.calibration``); the
bridge loads a camera's intrinsics into the camera when it serves it, and every section shows
in the device's ``describe()`` under ``calibration``. A file::

    version: 1
    device: wrist                     # the site device it belongs to
    intrinsics:                       # vla calibrate intrinsics
      image_size: [640, 480]          # width, height the calibration was made at
      K: [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]
      dist: [k1, k2, p1, p2, k3]      # OpenCV's distortion model (4, 5, 8, 12 or 14 numbers)
      rms_px: 0.21                    # reprojection error over every corner of every view
      views: 15
      coverage: 0.62                  # share of an 8 x 6 grid of the image that saw board corners
    hand_eye:                         # vla calibrate hand-eye
      mode: eye_in_hand               # T = the camera in the gripper (TCP) frame; eye_to_hand: in the base frame
      T: [[...], [...], [...], [0, 0, 0, 1]]   # x_frame = T @ x_camera, camera axes as OpenCV's (z forward, y down)
      residual_mm: 0.8                # spread of the board's pose implied by each view (consistency)
      residual_deg: 0.1
      views: 12
      method: park
    latency:                          # vla calibrate latency
      offset_mono_ns: 1234            # device monotonic clock minus the host's (t_host = t_device - offset)
      offset_wall_ns: -56
      rtt_ms: {min: 0.3, p50: 0.4, p90: 0.6, p99: 1.1}
      stream_delay_ms: {p50: 2.1, p90: 3.0, p99: 5.2}   # capture -> host receive, on the host clock (null: no stream)
      samples: 200
    screen:                           # vla calibrate screen (calibration/screen.py)
      H: [[...], [...], [...]]        # camera pixel -> game frame pixel (ideal pixels when undistorted: true)
      frame_size: [160, 210]          # the rectified picture (width, height): the game's frame
      image_size: [640, 480]          # the camera image it was solved at
      corners_px: [[x, y], ...]       # the picture's corners TL, TR, BR, BL as seen in the camera image
      markers: {marker_px: 28, ...}   # the ArUco layout around the screen (calibration.screen.ScreenMarkers)
      markers_seen: 8
      residual_px: 0.3                # RMS of the marker corners through H, in frame pixels
      undistorted: true               # the corners were undistorted with this file's intrinsics first
    key_latency:                      # vla calibrate key-latency: key press -> first changed camera frame
      median_ms: 83.0                 # end to end (keyboard, game tick, monitor, camera), over the presses
      p90_ms: 95.1
      presses: 12
      samples_ms: [...]
      camera_ms: 61.2                 # the camera's own part, when the screen's display times were known
      camera_fps: 30.0
      method: key_flash

Sections are optional; writing one keeps the others. Files are written atomically (a temp file
renamed over the old one). Anything malformed raises :class:`CalibrationFileError` naming the
file and the field. Needs numpy and PyYAML only (the bridge loads these files on a Raspberry Pi).
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import os
import tempfile
from typing import Any

import numpy as np
import yaml

VERSION = 1
SECTIONS = ("intrinsics", "hand_eye", "latency", "screen", "key_latency")
HAND_EYE_MODES = ("eye_in_hand", "eye_to_hand")
DIST_LENGTHS = (4, 5, 8, 12, 14)


class CalibrationFileError(ValueError):
    """A calibration file is missing, unreadable or malformed; the message names the file and field."""


@dataclasses.dataclass(frozen=True)
class Intrinsics:
    K: np.ndarray  # [3, 3]
    dist: np.ndarray  # [4 | 5 | 8 | 12 | 14]
    image_size: tuple[int, int]  # (width, height)
    rms_px: float | None = None
    views: int | None = None
    coverage: float | None = None
    board: dict | None = None
    created: str | None = None

    @property
    def fx(self) -> float:
        return float(self.K[0, 0])

    @property
    def fy(self) -> float:
        return float(self.K[1, 1])


@dataclasses.dataclass(frozen=True)
class HandEye:
    mode: str  # eye_in_hand | eye_to_hand
    T: np.ndarray  # [4, 4] camera pose in the gripper (eye_in_hand) or base (eye_to_hand) frame
    residual_mm: float | None = None
    residual_deg: float | None = None
    views: int | None = None
    method: str | None = None
    created: str | None = None

    @property
    def frame(self) -> str:
        """The frame ``T`` is expressed in."""
        return "gripper" if self.mode == "eye_in_hand" else "base"


@dataclasses.dataclass(frozen=True)
class Latency:
    offset_mono_ns: int  # device monotonic clock - host monotonic clock
    offset_wall_ns: int  # device wall clock - host wall clock
    rtt_ms: dict  # {min, p50, p90, p99}
    samples: int
    stream_delay_ms: dict | None = None  # {p50, p90, p99}, or None when the device has no stream
    created: str | None = None

    def to_host_mono_ns(self, t_device_mono_ns: int) -> int:
        """A device's monotonic timestamp on the host's monotonic clock."""
        return int(t_device_mono_ns) - int(self.offset_mono_ns)


@dataclasses.dataclass(frozen=True)
class ScreenHomography:
    H: np.ndarray  # [3, 3] camera pixel (ideal, when undistorted) -> game frame pixel
    frame_size: tuple[int, int]  # (width, height) of the rectified picture
    image_size: tuple[int, int]  # (width, height) of the camera image
    corners_px: np.ndarray  # [4, 2] the picture's corners (TL, TR, BR, BL) in the camera image
    markers: dict | None = None  # the marker layout (calibration.screen.ScreenMarkers.to_dict())
    markers_seen: int | None = None
    residual_px: float | None = None
    undistorted: bool = False
    created: str | None = None


@dataclasses.dataclass(frozen=True)
class KeyLatency:
    median_ms: float  # key press -> first changed camera frame, median over the presses
    presses: int
    p90_ms: float | None = None
    samples_ms: list | None = None
    camera_ms: float | None = None  # the camera's part (display -> frame), when display times were known
    camera_fps: float | None = None
    method: str | None = None
    created: str | None = None


@dataclasses.dataclass(frozen=True)
class CalibrationFile:
    path: str
    device: str | None = None
    intrinsics: Intrinsics | None = None
    hand_eye: HandEye | None = None
    latency: Latency | None = None
    screen: ScreenHomography | None = None
    key_latency: KeyLatency | None = None

    def summary(self) -> dict[str, Any]:
        """msgpack-able summary (what the bridge's ``describe`` shows under ``calibration``)."""
        out: dict[str, Any] = {"file": self.path, "sections": [s for s in SECTIONS if getattr(self, s) is not None]}
        for name in out["sections"]:
            out[name] = _section_to_yaml(getattr(self, name))
        return out


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


class _Checker:
    def __init__(self, path: str, section: str, raw: Any, fields: tuple[str, ...]) -> None:
        self.path, self.section = path, section
        if not isinstance(raw, dict):
            raise self.error(None, f"must be a mapping, got {type(raw).__name__}")
        bad = sorted(set(raw) - set(fields))
        if bad:
            close = difflib.get_close_matches(str(bad[0]), fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(fields)}"
            raise self.error(bad[0], "unknown field" + hint)
        self.raw = raw

    def error(self, field: str | None, msg: str) -> CalibrationFileError:
        where = self.section if field is None else f"{self.section}.{field}"
        return CalibrationFileError(f"{self.path}: {where}: {msg}")

    def matrix(self, field: str, shape: tuple[int, ...], required: bool = True) -> np.ndarray | None:
        if field not in self.raw:
            if required:
                raise self.error(field, f"required (a {'x'.join(map(str, shape))} list of numbers)")
            return None
        v = self.raw[field]
        try:
            if _has_bool(v):
                raise ValueError
            a = np.asarray(v, np.float64)
        except (TypeError, ValueError):
            a = None
        if a is None or a.shape != shape or not np.all(np.isfinite(a)):
            raise self.error(field, f"must be a {'x'.join(map(str, shape))} list of finite numbers, got {v!r:.80}")
        return a

    def number(self, field: str, required: bool = False, positive: bool = False, integer: bool = False,
               lo: float | None = None, hi: float | None = None) -> Any:
        if field not in self.raw or self.raw[field] is None:
            if required:
                raise self.error(field, "required (a number)")
            return None
        v = self.raw[field]
        kinds = (int,) if integer else (int, float)
        if isinstance(v, bool) or not isinstance(v, kinds) or (isinstance(v, float) and not math.isfinite(v)):
            raise self.error(field, f"must be {'an integer' if integer else 'a finite number'}, got {v!r:.40}")
        if positive and v <= 0:
            raise self.error(field, f"must be positive, got {v!r}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise self.error(field, f"must be in [{lo}, {hi}], got {v!r}")
        return v

    def stats(self, field: str, keys: tuple[str, ...], required: bool = True) -> dict | None:
        v = self.raw.get(field)
        if v is None:
            if required:
                raise self.error(field, f"required (a mapping with {', '.join(keys)} in ms)")
            return None
        if not isinstance(v, dict) or set(v) - set(keys) or not all(
                not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and x >= 0
                for x in v.values()):
            raise self.error(field, f"must map some of {', '.join(keys)} to non-negative numbers (ms), got {v!r:.80}")
        return {k: float(x) for k, x in v.items()}

    def string(self, field: str) -> str | None:
        v = self.raw.get(field)
        if v is not None and not isinstance(v, str):
            raise self.error(field, f"must be a string, got {v!r:.40}")
        return v


def _has_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return True
    return isinstance(v, (list, tuple)) and any(_has_bool(x) for x in v)


def _intrinsics(path: str, raw: Any) -> Intrinsics:
    c = _Checker(path, "intrinsics", raw, ("image_size", "K", "dist", "rms_px", "views", "coverage", "board", "created"))
    size = raw.get("image_size")
    if not (isinstance(size, (list, tuple)) and len(size) == 2 and all(
            type(s) is int and s > 0 for s in size)):
        raise c.error("image_size", f"must be [width, height], two positive integers, got {size!r:.60}")
    K = c.matrix("K", (3, 3))
    if not (K[0, 0] > 0 and K[1, 1] > 0 and K[1, 0] == 0 and K[2, 0] == 0 and K[2, 1] == 0 and K[2, 2] == 1):
        raise c.error("K", f"must be [[fx, s, cx], [0, fy, cy], [0, 0, 1]] with fx, fy > 0, got {K.tolist()}")
    dist = raw.get("dist")
    if not isinstance(dist, (list, tuple)) or len(dist) not in DIST_LENGTHS:
        raise c.error("dist", f"must be a list of {', '.join(map(str, DIST_LENGTHS))} numbers "
                              f"(OpenCV's k1, k2, p1, p2[, k3, ...]), got {dist!r:.80}")
    d = c.matrix("dist", (len(dist),))
    board = raw.get("board")
    if board is not None and not isinstance(board, dict):
        raise c.error("board", "must be a mapping (the board's squares_x, squares_y, square_m, marker_m, dictionary)")
    return Intrinsics(K=K, dist=d, image_size=(int(size[0]), int(size[1])),
                      rms_px=c.number("rms_px", lo=0), views=c.number("views", integer=True, lo=0),
                      coverage=c.number("coverage", lo=0, hi=1), board=board, created=c.string("created"))


def _hand_eye(path: str, raw: Any) -> HandEye:
    c = _Checker(path, "hand_eye", raw, ("mode", "T", "residual_mm", "residual_deg", "views", "method", "created"))
    mode = raw.get("mode")
    if mode not in HAND_EYE_MODES:
        raise c.error("mode", f"must be one of {', '.join(HAND_EYE_MODES)}, got {mode!r:.40}")
    T = c.matrix("T", (4, 4))
    R = T[:3, :3]
    if not (np.allclose(T[3], [0, 0, 0, 1]) and np.allclose(R.T @ R, np.eye(3), atol=1e-5)
            and np.linalg.det(R) > 0):
        raise c.error("T", "must be a rigid transform: an orthonormal rotation (det +1) and a last row [0, 0, 0, 1]")
    return HandEye(mode=mode, T=T, residual_mm=c.number("residual_mm", lo=0),
                   residual_deg=c.number("residual_deg", lo=0), views=c.number("views", integer=True, lo=0),
                   method=c.string("method"), created=c.string("created"))


def _latency(path: str, raw: Any) -> Latency:
    c = _Checker(path, "latency", raw, ("offset_mono_ns", "offset_wall_ns", "rtt_ms", "stream_delay_ms", "samples",
                                        "created"))
    return Latency(offset_mono_ns=c.number("offset_mono_ns", required=True, integer=True),
                   offset_wall_ns=c.number("offset_wall_ns", required=True, integer=True),
                   rtt_ms=c.stats("rtt_ms", ("min", "p50", "p90", "p99")),
                   samples=c.number("samples", required=True, integer=True, positive=True),
                   stream_delay_ms=c.stats("stream_delay_ms", ("p50", "p90", "p99"), required=False),
                   created=c.string("created"))


def _size(c: "_Checker", field: str) -> tuple[int, int]:
    size = c.raw.get(field)
    if not (isinstance(size, (list, tuple)) and len(size) == 2 and all(type(v) is int and v > 0 for v in size)):
        raise c.error(field, f"must be [width, height], two positive integers, got {size!r:.60}")
    return int(size[0]), int(size[1])


def _screen(path: str, raw: Any) -> ScreenHomography:
    c = _Checker(path, "screen", raw, ("H", "frame_size", "image_size", "corners_px", "markers", "markers_seen",
                                       "residual_px", "undistorted", "created"))
    H = c.matrix("H", (3, 3))
    if abs(np.linalg.det(H)) < 1e-12:
        raise c.error("H", "must be invertible")
    markers = raw.get("markers")
    if markers is not None and not isinstance(markers, dict):
        raise c.error("markers", "must be a mapping (calibration.screen.ScreenMarkers fields)")
    und = raw.get("undistorted", False)
    if type(und) is not bool:
        raise c.error("undistorted", f"must be true or false, got {und!r:.40}")
    return ScreenHomography(H=H, frame_size=_size(c, "frame_size"), image_size=_size(c, "image_size"),
                            corners_px=c.matrix("corners_px", (4, 2)), markers=markers,
                            markers_seen=c.number("markers_seen", integer=True, lo=0),
                            residual_px=c.number("residual_px", lo=0), undistorted=und, created=c.string("created"))


def _key_latency(path: str, raw: Any) -> KeyLatency:
    c = _Checker(path, "key_latency", raw, ("median_ms", "p90_ms", "presses", "samples_ms", "camera_ms", "camera_fps",
                                            "method", "created"))
    samples = raw.get("samples_ms")
    if samples is not None and not (isinstance(samples, list) and all(
            not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) for x in samples)):
        raise c.error("samples_ms", f"must be a list of numbers (ms), got {samples!r:.60}")
    return KeyLatency(median_ms=c.number("median_ms", required=True, lo=0),
                      presses=c.number("presses", required=True, integer=True, positive=True),
                      p90_ms=c.number("p90_ms", lo=0), samples_ms=samples, camera_ms=c.number("camera_ms"),
                      camera_fps=c.number("camera_fps", positive=True), method=c.string("method"),
                      created=c.string("created"))


_PARSERS = {"intrinsics": _intrinsics, "hand_eye": _hand_eye, "latency": _latency, "screen": _screen,
            "key_latency": _key_latency}


def parse_calibration(raw: Any, path: str = "<calibration>") -> CalibrationFile:
    if not isinstance(raw, dict):
        raise CalibrationFileError(f"{path}: (top level): a calibration file must be a mapping with 'version' and "
                                   f"sections ({', '.join(SECTIONS)})")
    known = ("version", "device", *SECTIONS)
    bad = sorted(set(raw) - set(known), key=str)
    if bad:
        close = difflib.get_close_matches(str(bad[0]), known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(known)}"
        raise CalibrationFileError(f"{path}: {bad[0]}: unknown field{hint}")
    v = raw.get("version")
    if type(v) is not int or v != VERSION:
        raise CalibrationFileError(f"{path}: version: this code reads calibration files of version {VERSION}, got {v!r}")
    dev = raw.get("device")
    if dev is not None and not isinstance(dev, str):
        raise CalibrationFileError(f"{path}: device: must be a string (the site device name), got {dev!r:.40}")
    sections = {s: _PARSERS[s](path, raw[s]) for s in SECTIONS if raw.get(s) is not None}
    return CalibrationFile(path=path, device=dev, **sections)


def load_calibration(path: str) -> CalibrationFile:
    """Read and validate a calibration file (:class:`CalibrationFileError` names what is wrong)."""
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise CalibrationFileError(f"{path}: calibration file not found (write it with `vla calibrate`)") from None
    except (OSError, yaml.YAMLError) as e:
        raise CalibrationFileError(f"{path}: not a readable YAML file: {e}") from None
    return parse_calibration(raw, path)


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


def _plain(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return _plain(v.tolist())
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, np.generic):
        return v.item()
    return v


def _section_to_yaml(section: Any) -> dict:
    return {k: _plain(v) for k, v in dataclasses.asdict(section).items() if v is not None}


def section_name(section: Any) -> str:
    for name, cls in (("intrinsics", Intrinsics), ("hand_eye", HandEye), ("latency", Latency),
                      ("screen", ScreenHomography), ("key_latency", KeyLatency)):
        if isinstance(section, cls):
            return name
    raise TypeError(f"not a calibration section: {type(section).__name__}")


def save_section(path: str, section: Intrinsics | HandEye | Latency | ScreenHomography | KeyLatency, device: str | None = None) -> CalibrationFile:
    """Write ``section`` into the calibration file at ``path`` (created if missing), keeping its
    other sections; atomic. The result is read back and validated before it replaces the old file."""
    name = section_name(section)
    raw: dict[str, Any] = {"version": VERSION}
    if os.path.exists(path):
        old = load_calibration(path)  # a malformed file is not silently overwritten
        raw.update({s: _section_to_yaml(getattr(old, s)) for s in SECTIONS if getattr(old, s) is not None})
        if old.device:
            raw["device"] = old.device
    if device:
        raw["device"] = device
    raw[name] = _section_to_yaml(section)
    raw = {k: raw[k] for k in ("version", "device", *SECTIONS) if k in raw}
    parse_calibration(raw, path)  # what we write must read back
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".calib-", suffix=".yaml", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"# written by `vla calibrate` ({now_iso()}); see calibration/io.py for the fields\n")
            yaml.safe_dump(raw, f, sort_keys=False, default_flow_style=None, width=120)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return load_calibration(path)
