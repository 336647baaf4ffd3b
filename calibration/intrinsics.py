"""Camera intrinsics from ChArUco views: ``CharucoDetector`` -> ``matchImagePoints`` ->
``cv2.calibrateCameraExtended``, with the reprojection error per view and a coverage picture.

What makes a good set of views: 10-20 frames in which the board is tilted by 20-45 degrees in
different directions (a board that always faces the camera pins the focal length poorly) and
whose corners together cover the image, corners and edges included (distortion lives there).
The coverage picture shows where corners were seen; ``coverage`` is the share of an 8 x 6 grid
of the image that saw at least one corner.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import cv2
import numpy as np

from calibration.board import BoardDetector, BoardSpec, Detection
from calibration.io import Intrinsics, now_iso

MIN_VIEWS = 6
COVERAGE_GRID = (8, 6)  # cells across, down


@dataclasses.dataclass
class IntrinsicsResult:
    K: np.ndarray  # [3, 3]
    dist: np.ndarray  # [5] k1, k2, p1, p2, k3 (fewer terms are fixed at 0 by the flags)
    image_size: tuple[int, int]  # (width, height)
    rms_px: float  # reprojection error over every corner of every view
    per_view_rms_px: np.ndarray  # [V]
    std_fx_fy: tuple[float, float]  # standard deviations of fx and fy from OpenCV's estimate
    coverage: float  # share of the COVERAGE_GRID cells that saw a corner
    board: BoardSpec
    detections: list[Detection]

    @property
    def views(self) -> int:
        return len(self.detections)

    def section(self) -> Intrinsics:
        """The part that goes into the calibration file."""
        return Intrinsics(K=self.K, dist=self.dist, image_size=self.image_size, rms_px=round(self.rms_px, 4),
                          views=self.views, coverage=round(self.coverage, 3), board=self.board.to_dict(),
                          created=now_iso())


def detect_views(images: Iterable[np.ndarray], board: BoardSpec, min_corners: int = 6
                 ) -> tuple[list[Detection], list[int], tuple[int, int]]:
    """Detect the board in every image: ``(detections, indices of the images used, (width, height))``.
    Images without the board are skipped; images of another size than the first raise ValueError."""
    det = BoardDetector(board, min_corners=min_corners)
    found, used, size = [], [], None
    for i, img in enumerate(images):
        img = np.asarray(img)
        s = (int(img.shape[1]), int(img.shape[0]))
        if size is None:
            size = s
        elif s != size:
            raise ValueError(f"image {i} is {s[0]}x{s[1]} but the first one is {size[0]}x{size[1]}: calibrate "
                             "one camera at one resolution")
        d = det.detect(img)
        if d is not None:
            found.append(d)
            used.append(i)
    if size is None:
        raise ValueError("no images to calibrate from")
    return found, used, size


def coverage_fraction(detections: Sequence[Detection], image_size: tuple[int, int],
                      grid: tuple[int, int] = COVERAGE_GRID) -> float:
    w, h = image_size
    hit = np.zeros((grid[1], grid[0]), bool)
    for d in detections:
        p = d.image_points
        cx = np.clip((p[:, 0] / w * grid[0]).astype(int), 0, grid[0] - 1)
        cy = np.clip((p[:, 1] / h * grid[1]).astype(int), 0, grid[1] - 1)
        hit[cy, cx] = True
    return float(hit.mean())


def calibrate_intrinsics(detections: Sequence[Detection], image_size: tuple[int, int], board: BoardSpec,
                         min_views: int = MIN_VIEWS, flags: int = 0) -> IntrinsicsResult:
    """Solve K and the distortion from board detections (``detect_views``). Raises ValueError with
    what to do when there are too few views. ``flags``: ``cv2.CALIB_*`` (e.g. ``CALIB_FIX_K3``)."""
    if len(detections) < min_views:
        raise ValueError(f"only {len(detections)} view(s) show the ChArUco board; intrinsics need at least "
                         f"{min_views} (tilt the board 20-45 degrees in different directions, fill the image)")
    obj = [d.object_points.reshape(-1, 1, 3).astype(np.float32) for d in detections]
    img = [d.image_points.reshape(-1, 1, 2).astype(np.float32) for d in detections]
    w, h = image_size
    crit = (cv2.TERM_CRITERIA_COUNT + cv2.TERM_CRITERIA_EPS, 100, 1e-10)
    rms, K, dist, _rvecs, _tvecs, std_in, _std_ex, per_view = cv2.calibrateCameraExtended(
        obj, img, (int(w), int(h)), None, None, flags=flags, criteria=crit)
    std_in = np.asarray(std_in).reshape(-1)
    return IntrinsicsResult(K=np.asarray(K, np.float64), dist=np.asarray(dist, np.float64).reshape(-1),
                            image_size=(int(w), int(h)), rms_px=float(rms),
                            per_view_rms_px=np.asarray(per_view, np.float64).reshape(-1),
                            std_fx_fy=(float(std_in[0]), float(std_in[1])),
                            coverage=coverage_fraction(detections, image_size), board=board,
                            detections=list(detections))


def calibrate_from_images(images: Iterable[np.ndarray], board: BoardSpec, min_views: int = MIN_VIEWS,
                          flags: int = 0) -> IntrinsicsResult:
    """``detect_views`` + ``calibrate_intrinsics``."""
    dets, _used, size = detect_views(images, board)
    return calibrate_intrinsics(dets, size, board, min_views=min_views, flags=flags)


def _colour(i: int) -> tuple[int, int, int]:
    hsv = np.uint8([[[(i * 37) % 180, 220, 255]]])
    b, g, r = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0]
    return int(b), int(g), int(r)


def coverage_image(result: IntrinsicsResult, path: str | None = None) -> np.ndarray:
    """A picture of where the board's corners were seen (one colour per view, with its outline),
    the coverage grid (cells that saw a corner are green), the reprojection error of each view as
    bars below, and the summary above. BGR uint8; written to ``path`` (PNG) when given."""
    w, h = result.image_size
    scale = 640.0 / max(w, h) if max(w, h) != 640 else 1.0
    W, H = int(round(w * scale)), int(round(h * scale))
    top, bottom = 44, 70
    canvas = np.full((top + H + bottom, W, 3), 24, np.uint8)
    img = canvas[top:top + H]
    gx, gy = COVERAGE_GRID
    hit = np.zeros((gy, gx), bool)
    for d in result.detections:
        p = d.image_points
        hit[np.clip((p[:, 1] / h * gy).astype(int), 0, gy - 1), np.clip((p[:, 0] / w * gx).astype(int), 0, gx - 1)] = True
    for j in range(gy):
        for i in range(gx):
            x0, y0 = int(i * W / gx), int(j * H / gy)
            x1, y1 = int((i + 1) * W / gx), int((j + 1) * H / gy)
            if hit[j, i]:
                img[y0:y1, x0:x1] = (40, 60, 40)
            cv2.rectangle(img, (x0, y0), (x1 - 1, y1 - 1), (70, 70, 70), 1)
    for k, d in enumerate(result.detections):
        col = _colour(k)
        pts = (d.image_points * scale).astype(np.float32)
        cv2.polylines(img, [cv2.convexHull(pts).astype(np.int32)], True, col, 1, cv2.LINE_AA)
        for x, y in pts:
            cv2.circle(img, (int(round(x)), int(round(y))), 2, col, -1, cv2.LINE_AA)
    # per-view reprojection error: one bar per view, in the view's colour, scaled to the worst
    errs = np.asarray(result.per_view_rms_px, np.float64)
    base_y, bar_h = top + H + bottom - 16, bottom - 30
    worst = max(float(errs.max()) if errs.size else 0.0, 1e-9)
    bw = max(2, min(24, (W - 20) // max(1, len(errs))))
    for k, e in enumerate(errs):
        x0 = 10 + k * bw
        cv2.rectangle(canvas, (x0, base_y - int(round(bar_h * e / worst))), (x0 + bw - 3, base_y), _colour(k), -1)
    cv2.putText(canvas, f"reprojection error per view (px), worst {worst:.3f}", (10, top + H + 14),
                cv2.FONT_HERSHEY_SIMPLEX, 0.42, (200, 200, 200), 1, cv2.LINE_AA)
    K = result.K
    lines = [f"{result.views} views, rms {result.rms_px:.3f} px, coverage {result.coverage * 100:.0f}% "
             f"of a {gx}x{gy} grid, image {w}x{h}",
             f"fx {K[0, 0]:.1f}  fy {K[1, 1]:.1f}  cx {K[0, 2]:.1f}  cy {K[1, 2]:.1f}"]
    for i, text in enumerate(lines):
        cv2.putText(canvas, text, (6, 17 + 19 * i), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (230, 230, 230), 1, cv2.LINE_AA)
    if path:
        if not cv2.imwrite(path, canvas):
            raise OSError(f"could not write the coverage picture to {path}")
    return canvas
