"""Hand-eye calibration with ``cv2.calibrateHandEye``: where a camera sits relative to the arm.

Data: at each of N arm poses, the gripper's pose in the base frame (``T_base_gripper``: the arm
state's ``ee_pos`` / ``ee_quat``, the TCP) and the board's pose in the camera frame
(``T_cam_board``: ``calibration.board.board_pose`` on that pose's image).

* ``eye_in_hand``: the camera rides on the gripper and the board is fixed in the cell. The
  unknown is ``X = T_gripper_cam``; for every pair of poses ``A_ij X = X B_ij`` with ``A`` the
  gripper's motion and ``B`` the board's apparent motion. OpenCV's ``calibrateHandEye`` takes
  ``T_base_gripper`` ("gripper2base") and ``T_cam_board`` ("target2cam") and returns
  ``T_gripper_cam`` ("cam2gripper").
* ``eye_to_hand``: the camera is fixed in the cell and the board rides on the gripper. The same
  equation holds with the base and gripper swapped, so the usual trick is to pass the inverted
  arm poses ``T_gripper_base``: OpenCV then returns ``T_base_cam``.

Both unknowns come with a consistency check: the other fixed transform (the board in the base
frame for eye-in-hand, the board in the gripper frame for eye-to-hand) computed from every view
should be the same; ``residual_mm`` / ``residual_deg`` are the RMS spread of those estimates. The
camera frame is OpenCV's (x right, y down, z forward).

Pose diversity matters more than the count: rotate the gripper by 15-30 degrees about at least
two different axes (pure translations pin nothing of the rotation; small rotations amplify noise).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import cv2
import numpy as np

from calibration import geometry as G
from calibration.board import BoardDetector, BoardSpec, board_pose
from calibration.io import HAND_EYE_MODES, HandEye, now_iso

METHODS = {"tsai": cv2.CALIB_HAND_EYE_TSAI, "park": cv2.CALIB_HAND_EYE_PARK, "horaud": cv2.CALIB_HAND_EYE_HORAUD,
           "andreff": cv2.CALIB_HAND_EYE_ANDREFF, "daniilidis": cv2.CALIB_HAND_EYE_DANIILIDIS}
MIN_POSES = 3
MIN_ROTATION_DEG = 2.0  # relative rotations smaller than this carry no information on the rotation


@dataclasses.dataclass
class HandEyeResult:
    mode: str
    T: np.ndarray  # [4, 4] T_gripper_cam (eye_in_hand) or T_base_cam (eye_to_hand)
    fixed: np.ndarray  # [4, 4] the other unknown: T_base_board (eye_in_hand) or T_gripper_board (eye_to_hand)
    residual_mm: float
    residual_deg: float
    views: int
    method: str

    def section(self) -> HandEye:
        return HandEye(mode=self.mode, T=self.T, residual_mm=round(self.residual_mm, 4),
                       residual_deg=round(self.residual_deg, 4), views=self.views, method=self.method,
                       created=now_iso())


def _check_inputs(gripper_poses: Sequence[np.ndarray], board_poses: Sequence[np.ndarray], mode: str) -> None:
    if mode not in HAND_EYE_MODES:
        raise ValueError(f"hand-eye mode must be one of {', '.join(HAND_EYE_MODES)}, got {mode!r}")
    if len(gripper_poses) != len(board_poses):
        raise ValueError(f"{len(gripper_poses)} gripper poses but {len(board_poses)} board poses: one of each per view")
    if len(gripper_poses) < MIN_POSES:
        raise ValueError(f"hand-eye calibration needs at least {MIN_POSES} views (10-20 recommended), got "
                         f"{len(gripper_poses)}")
    for name, poses in (("gripper", gripper_poses), ("board", board_poses)):
        for i, T in enumerate(poses):
            T = np.asarray(T)
            if T.shape != (4, 4) or not np.all(np.isfinite(T)):
                raise ValueError(f"{name} pose {i} must be a finite 4x4 matrix, got shape {T.shape}")
    # The rotations must differ about at least two axes: collect the relative rotation axes.
    R0 = np.asarray(gripper_poses[0])[:3, :3]
    axes = []
    for T in gripper_poses[1:]:
        r = G.mat_to_rotvec(R0.T @ np.asarray(T)[:3, :3])
        if np.degrees(np.linalg.norm(r)) >= MIN_ROTATION_DEG:
            axes.append(r / np.linalg.norm(r))
    spread = np.linalg.svd(np.asarray(axes), compute_uv=False) if len(axes) >= 2 else np.zeros(1)
    if len(axes) < 2 or spread[1] < 0.1:
        raise ValueError(f"the gripper rotations are too alike for hand-eye calibration: rotate it by at least "
                         f"{MIN_ROTATION_DEG:.0f} degrees (15-30 recommended) about two or more different axes")


def calibrate_hand_eye(gripper_poses: Sequence[np.ndarray], board_poses: Sequence[np.ndarray],
                       mode: str = "eye_in_hand", method: str = "park") -> HandEyeResult:
    """Solve the hand-eye transform from ``T_base_gripper`` [4, 4] and ``T_cam_board`` [4, 4] per
    view. ``method``: one of ``METHODS`` or ``"auto"`` (every method, keep the smallest residual)."""
    _check_inputs(gripper_poses, board_poses, mode)
    if method == "auto":
        results = [calibrate_hand_eye(gripper_poses, board_poses, mode, m) for m in METHODS]
        return min(results, key=lambda r: r.residual_mm + r.residual_deg)
    if method not in METHODS:
        raise ValueError(f"unknown hand-eye method {method!r}; known: auto, {', '.join(METHODS)}")
    arm = [np.asarray(T, np.float64) for T in gripper_poses]
    if mode == "eye_to_hand":
        arm = [G.inv(T) for T in arm]  # T_gripper_base: OpenCV then solves for T_base_cam
    cam = [np.asarray(T, np.float64) for T in board_poses]
    R_cam, t_cam = cv2.calibrateHandEye([T[:3, :3] for T in arm], [T[:3, 3] for T in arm],
                                        [T[:3, :3] for T in cam], [T[:3, 3] for T in cam],
                                        method=METHODS[method])
    X = G.from_rt(R_cam, t_cam)
    # Consistency: the board's pose in the arm's other frame, implied by each view.
    fixed = [A @ X @ B for A, B in zip(arm, cam)]
    fixed_mean, res_mm, res_deg = _mean_pose(fixed)
    return HandEyeResult(mode=mode, T=X, fixed=fixed_mean, residual_mm=res_mm, residual_deg=res_deg,
                         views=len(arm), method=method)


def _mean_pose(poses: Sequence[np.ndarray]) -> tuple[np.ndarray, float, float]:
    """Mean pose (chordal mean rotation) and the RMS translation (mm) / rotation (deg) spread."""
    t = np.array([T[:3, 3] for T in poses])
    U, _, Vt = np.linalg.svd(sum(T[:3, :3] for T in poses))
    R = U @ np.diag([1.0, 1.0, np.linalg.det(U @ Vt)]) @ Vt
    mean = G.from_rt(R, t.mean(axis=0))
    res_mm = float(np.sqrt(np.mean(np.sum((t - t.mean(axis=0)) ** 2, axis=1)))) * 1000.0
    res_deg = float(np.sqrt(np.mean([G.angle_deg(R.T @ T[:3, :3]) ** 2 for T in poses])))
    return mean, res_mm, res_deg


def hand_eye_from_views(images: Sequence[np.ndarray], gripper_poses: Sequence[np.ndarray], K: np.ndarray,
                        dist: np.ndarray, board: BoardSpec, mode: str = "eye_in_hand", method: str = "park",
                        max_reprojection_px: float = 2.0) -> tuple[HandEyeResult, list[int]]:
    """The whole solve from raw views: find the board in each image, its pose by PnP with the
    camera's intrinsics ``K`` / ``dist``, then :func:`calibrate_hand_eye`. Views where the board is
    not found (or its PnP fit is worse than ``max_reprojection_px``) are left out. Returns the
    result and the indices of the views used."""
    if len(images) != len(gripper_poses):
        raise ValueError(f"{len(images)} images but {len(gripper_poses)} gripper poses: one of each per view")
    det = BoardDetector(board)
    used, arm, cam = [], [], []
    for i, (img, T) in enumerate(zip(images, gripper_poses)):
        d = det.detect(np.asarray(img))
        if d is None:
            continue
        R, t, rms = board_pose(d, np.asarray(K, np.float64), np.asarray(dist, np.float64))
        if rms > max_reprojection_px:
            continue
        used.append(i)
        arm.append(np.asarray(T, np.float64))
        cam.append(G.from_rt(R, t))
    if len(used) < MIN_POSES:
        raise ValueError(f"the ChArUco board was found in only {len(used)} of {len(images)} views; hand-eye needs at "
                         f"least {MIN_POSES} (10-20 recommended): check that the camera sees the board at every pose")
    return calibrate_hand_eye(arm, cam, mode=mode, method=method), used
