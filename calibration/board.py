"""The ChArUco board: its geometry, its printable image, and finding it in a camera frame.

A ChArUco board is a chessboard whose white squares hold ArUco markers: each detected marker
names the chessboard corners around it, so a partly hidden or tilted board still gives corners
with known identities. OpenCV's board frame (the one every pose here is in): origin at the
top-left corner of the printed image, x along its columns, y down its rows, z into the board
(a camera facing the board looks along +z). Chessboard corner ``i`` sits at
``board.getChessboardCorners()[i]`` (metres).

Detection uses the OpenCV 4.7+ classes only: ``cv2.aruco.CharucoDetector.detectBoard`` gives
the interpolated chessboard corners and their ids, ``CharucoBoard.matchImagePoints`` pairs
them with their 3-D board points (what ``cv2.calibrateCamera`` and ``cv2.solvePnP`` take).

Needs numpy and OpenCV only (no project imports): the simulator prints the same board.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import cv2
import numpy as np

DICTIONARIES = {n: getattr(cv2.aruco, n) for n in dir(cv2.aruco) if n.startswith("DICT_")}


class BoardNotFound(ValueError):
    """Too few board corners were found in an image to use it."""


@dataclasses.dataclass(frozen=True)
class BoardSpec:
    """A ChArUco board. The defaults are the board the simulator prints
    (``SimFranka(calibration_board=...)``): 9 x 6 squares of 50 mm, 37 mm markers, 4x4 dictionary,
    45 x 30 cm (print it at 100 % scale on A2 or two A3 sheets; measure a square after printing)."""

    squares_x: int = 9
    """Squares along the board's x axis (columns of the printed image)."""
    squares_y: int = 6
    """Squares along the board's y axis (rows)."""
    square_m: float = 0.05
    """Side of one chessboard square, metres (measure the print: the scale of every pose depends on it)."""
    marker_m: float = 0.037
    """Side of one ArUco marker, metres (smaller than a square)."""
    dictionary: str = "DICT_4X4_50"
    """The ArUco dictionary (an OpenCV ``cv2.aruco.DICT_*`` name)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.squares_x, int) and isinstance(self.squares_y, int)
                and self.squares_x >= 3 and self.squares_y >= 3):
            raise ValueError(f"board: squares_x and squares_y must be integers >= 3, got "
                             f"{self.squares_x!r} x {self.squares_y!r}")
        if not (self.square_m > 0 and 0 < self.marker_m < self.square_m):
            raise ValueError(f"board: need 0 < marker_m < square_m, got marker_m={self.marker_m!r}, "
                             f"square_m={self.square_m!r}")
        if self.dictionary not in DICTIONARIES:
            raise ValueError(f"board: unknown ArUco dictionary {self.dictionary!r}; e.g. DICT_4X4_50, DICT_5X5_100")
        markers = (self.squares_x * self.squares_y) // 2
        size = int(self.dictionary.split("_")[-1]) if self.dictionary.split("_")[-1].isdigit() else 1 << 30
        if markers > size:
            raise ValueError(f"board: {self.squares_x}x{self.squares_y} squares need {markers} markers but "
                             f"{self.dictionary} has only {size}")

    @property
    def size_m(self) -> tuple[float, float]:
        """(width, height) of the board in metres."""
        return self.squares_x * self.square_m, self.squares_y * self.square_m

    @property
    def num_corners(self) -> int:
        return (self.squares_x - 1) * (self.squares_y - 1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BoardSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        bad = set(d) - known
        if bad:
            raise ValueError(f"board: unknown field {sorted(bad)[0]!r}; known: {', '.join(sorted(known))}")
        return cls(**d)

    def cv_board(self) -> cv2.aruco.CharucoBoard:
        d = cv2.aruco.getPredefinedDictionary(DICTIONARIES[self.dictionary])
        return cv2.aruco.CharucoBoard((self.squares_x, self.squares_y), self.square_m, self.marker_m, d)

    def image(self, px_per_square: int = 100, margin_px: int = 0) -> np.ndarray:
        """The printable board, ``[squares_y * px, squares_x * px]`` uint8 grey, top-left = board origin."""
        w, h = self.squares_x * px_per_square, self.squares_y * px_per_square
        return self.cv_board().generateImage((w + 2 * margin_px, h + 2 * margin_px), marginSize=margin_px,
                                             borderBits=1)

    def corners_3d(self) -> np.ndarray:
        """[N, 3] float64: every chessboard corner in the board frame, by corner id."""
        return np.asarray(self.cv_board().getChessboardCorners(), np.float64).reshape(-1, 3)


@dataclasses.dataclass
class Detection:
    """The board corners found in one image."""

    ids: np.ndarray  # [N] int32 chessboard corner ids
    image_points: np.ndarray  # [N, 2] float32 pixels
    object_points: np.ndarray  # [N, 3] float32 board frame, metres
    markers: int  # ArUco markers detected

    def __len__(self) -> int:
        return len(self.ids)


class BoardDetector:
    """Finds a ChArUco board in frames (RGB or grey). Reuse one per board: it keeps OpenCV's detector."""

    def __init__(self, board: BoardSpec, min_corners: int = 6) -> None:
        self.spec = board
        self.min_corners = int(min_corners)
        self.board = board.cv_board()
        self._detector = cv2.aruco.CharucoDetector(self.board)

    def detect(self, image: np.ndarray) -> Detection | None:
        """The board's corners in ``image``, or None when fewer than ``min_corners`` were found
        (or they all lie on one line, which pins no pose)."""
        grey = image if image.ndim == 2 else cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)
        ch_corners, ch_ids, _marker_corners, marker_ids = self._detector.detectBoard(grey)
        n_markers = 0 if marker_ids is None else len(marker_ids)
        if ch_ids is None or len(ch_ids) < self.min_corners:
            return None
        if self.board.checkCharucoCornersCollinear(ch_ids):
            return None
        obj, img = self.board.matchImagePoints(ch_corners, ch_ids)
        return Detection(ids=ch_ids.reshape(-1).astype(np.int32), image_points=img.reshape(-1, 2).astype(np.float32),
                         object_points=obj.reshape(-1, 3).astype(np.float32), markers=n_markers)

    def require(self, image: np.ndarray, what: str = "image") -> Detection:
        """``detect`` that raises :class:`BoardNotFound` naming ``what`` instead of returning None."""
        det = self.detect(image)
        if det is None:
            raise BoardNotFound(f"{what}: the ChArUco board ({self.spec.squares_x}x{self.spec.squares_y} squares, "
                                f"{self.spec.dictionary}) was not found (fewer than {self.min_corners} corners)")
        return det


def board_pose(det: Detection, K: np.ndarray, dist: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Pose of the board in the camera frame from one detection: ``(R [3, 3], t [3], rms px)``
    (``x_cam = R @ x_board + t``), by ``cv2.solvePnP`` (iterative, refined with Levenberg-Marquardt)."""
    obj = det.object_points.astype(np.float64)
    img = det.image_points.astype(np.float64)
    ok, rvec, tvec = cv2.solvePnP(obj, img, K, dist, flags=cv2.SOLVEPNP_ITERATIVE)
    if not ok:
        raise BoardNotFound("solvePnP found no board pose for this detection")
    rvec, tvec = cv2.solvePnPRefineLM(obj, img, K, dist, rvec, tvec)
    proj, _ = cv2.projectPoints(obj, rvec, tvec, K, dist)
    rms = float(np.sqrt(np.mean(np.sum((proj.reshape(-1, 2) - img) ** 2, axis=1))))
    R, _ = cv2.Rodrigues(rvec)
    return R, tvec.reshape(3), rms
