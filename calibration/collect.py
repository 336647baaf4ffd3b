"""Driving the arm over the bridge to collect calibration views.

:func:`view_poses` plans gripper poses around a pivot point: each pose is the start pose rotated
rigidly about the pivot (so a point at the pivot stays where it was in a camera that moves with
the gripper, whatever the unknown camera offset), by 40-100 % of ``max_angle_deg`` about an axis
that changes from pose to pose (tilts in every direction plus a roll), and moved towards or away
from the pivot by ``distance_scale``. For an eye-in-hand camera the pivot is the board's centre
(roughly: it only keeps the board in view); for eye-to-hand the pivot is the TCP itself (the
board rides on the gripper and turns in place in front of the fixed camera).

:func:`move_to` reaches a pose with ``ee_delta`` commands (the bridge clips each step to the
site's limits) until the TCP is within tolerance and the joints are still; :func:`collect`
visits every pose and keeps the image and the gripper pose *measured* once the arm is still
(targets the arm could not reach are fine: the measured pose is what calibration uses).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Sequence

import numpy as np

from calibration import geometry as G

log = logging.getLogger(__name__)


@dataclasses.dataclass
class View:
    image: np.ndarray  # [H, W, 3] uint8 RGB
    T_base_gripper: np.ndarray  # [4, 4] measured TCP pose when the image was taken
    reached: bool  # whether the planned pose was reached within tolerance
    t_mono_ns: int  # image capture time


def view_poses(T_start: np.ndarray, pivot: np.ndarray, n: int, max_angle_deg: float = 20.0,
               distance_scale: tuple[float, float] = (1.0, 1.0), shift_deg: float = 0.0,
               seed: int = 0) -> list[np.ndarray]:
    """``n`` gripper poses [4, 4] around ``pivot`` (base frame). The first is the start pose scaled
    to the middle distance. ``shift_deg``: then turn each pose (but the first) about the TCP by up
    to this angle, so that the board lands in different parts of the image (intrinsics need the
    corners of the image covered; hand-eye does not). See the module docstring."""
    if n < 1:
        raise ValueError(f"the number of poses must be >= 1, got {n}")
    if not 0 < max_angle_deg <= 60:
        raise ValueError(f"max_angle_deg must be in (0, 60], got {max_angle_deg}")
    lo, hi = distance_scale
    if not 0.2 <= lo <= hi <= 2.0:
        raise ValueError(f"distance_scale must be (lo, hi) with 0.2 <= lo <= hi <= 2, got {distance_scale}")
    T_start = np.asarray(T_start, np.float64)
    pivot = np.asarray(pivot, np.float64).reshape(3)
    rng = np.random.default_rng(seed)
    arm = T_start[:3, 3] - pivot
    dist = float(np.linalg.norm(arm))
    # a frame whose z runs from the pivot to the TCP: tilts rotate about x/y, roll about z
    z = arm / dist if dist > 1e-6 else T_start[:3, 2]
    x = np.cross(z, [0.0, 0.0, 1.0]) if abs(z[2]) < 0.9 else np.cross(z, [1.0, 0.0, 0.0])
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    golden = np.pi * (3.0 - np.sqrt(5.0))
    poses = []
    for i in range(n):
        if i == 0:
            R, s = np.eye(3), (lo + hi) / 2
        else:
            phi = i * golden
            roll = rng.uniform(-0.5, 0.5)  # some rotation about the viewing direction too
            axis = np.cos(phi) * x + np.sin(phi) * y + roll * z
            axis /= np.linalg.norm(axis)
            angle = np.radians(max_angle_deg) * (0.4 + 0.6 * ((i * 0.618034) % 1.0))
            R, s = G.rotvec_to_mat(axis * angle), rng.uniform(lo, hi)
        if i > 0 and shift_deg > 0:  # about an axis across the viewing direction, through the TCP
            psi = rng.uniform(0, 2 * np.pi)
            R_shift = G.rotvec_to_mat((np.cos(psi) * x + np.sin(psi) * y) * np.radians(shift_deg) * rng.uniform(0.5, 1))
        else:
            R_shift = np.eye(3)
        T = np.eye(4)
        T[:3, :3] = R_shift @ R @ T_start[:3, :3]
        T[:3, 3] = pivot + R @ (arm * s)
        poses.append(T)
    return poses


def arm_state(robot) -> dict[str, np.ndarray]:
    """The arm's newest state arrays (a capture in sync mode, the stream otherwise)."""
    if robot.sync:
        return dict(robot.arm.request("capture").arrays)
    return dict(robot.readers[robot.arm_name].latest(robot.timeout_s, newer_than_ns=time.monotonic_ns()).arrays)


def pose_of(state: dict[str, np.ndarray]) -> np.ndarray:
    return G.pose(np.asarray(state["ee_pos"], np.float64), np.asarray(state["ee_quat"], np.float64))


def _tcp_speed(T_prev: np.ndarray, T: np.ndarray, dt: float) -> tuple[float, float]:
    dm, ddeg = G.pose_error(T, T_prev)
    return dm / dt, ddeg / dt


def move_to(robot, T_target: np.ndarray, tol_m: float = 0.001, tol_deg: float = 0.2, still_m_s: float = 0.002,
            still_deg_s: float = 0.2, max_commands: int = 100, rate_hz: float = 10.0,
            gripper: float | None = None) -> tuple[np.ndarray, bool]:
    """Steer the TCP to ``T_target`` with ``ee_delta`` commands through ``robot`` (a
    ``robot_io.robot.RobotClient``). Returns the measured pose once the TCP is still (slower than
    ``still_m_s`` and ``still_deg_s``), and whether it is within tolerance. In a fast simulation
    each command advances one control period; on a streaming robot commands go at ``rate_hz``.
    ``gripper``: the opening to hold (default: as measured at the start)."""
    period = 1.0 / rate_hz
    state = arm_state(robot)
    grip = float(state["gripper"][0]) if gripper is None else float(gripper)
    T_prev, t_prev = pose_of(state), time.monotonic()
    dt = robot.description.get("control_dt", period) if robot.sync else period
    T, reached = T_prev, False
    for k in range(max_commands + 30):
        T = pose_of(state)
        dpos = T_target[:3, 3] - T[:3, 3]
        drot = G.mat_to_rotvec(T_target[:3, :3] @ T[:3, :3].T)  # world-frame rotation, as ee_delta takes it
        reached = bool(np.linalg.norm(dpos) < tol_m and np.degrees(np.linalg.norm(drot)) < tol_deg)
        if k > 0:
            v, w = _tcp_speed(T_prev, T, dt if robot.sync else max(time.monotonic() - t_prev, 1e-3))
            still = v < still_m_s and w < still_deg_s
            if still and (reached or k >= max_commands):
                return T, reached
        if k >= max_commands:  # out of commands (outside the workspace, a joint limit): hold and settle
            dpos, drot = np.zeros(3), np.zeros(3)
        T_prev, t_prev = T, time.monotonic()
        robot.ee_delta(np.array([*dpos, *drot, grip], np.float32))
        if not robot.sync:
            time.sleep(max(0.0, period - (time.monotonic() - t_prev)))
        state = arm_state(robot)
    return pose_of(state), reached


def move_joints(robot, q: np.ndarray, tol_rad: float = 0.005, max_commands: int = 100, rate_hz: float = 10.0) -> bool:
    """Bring the joints to ``q`` with ``joint_position`` commands (each clipped to the site's
    largest joint step). Returns whether every joint is within ``tol_rad``."""
    q = np.asarray(q, np.float64)
    for _ in range(max_commands):
        state = arm_state(robot)
        err = q - np.asarray(state["q"], np.float64)
        if np.max(np.abs(err)) < tol_rad and np.max(np.abs(state["dq"])) < 0.05:
            return True
        t0 = time.monotonic()
        robot.joint_position(q.astype(np.float32))
        if not robot.sync:
            time.sleep(max(0.0, 1.0 / rate_hz - (time.monotonic() - t0)))
    return False


def collect(robot, camera: str, poses: Sequence[np.ndarray], tol_m: float = 0.001, tol_deg: float = 0.2,
            on_view: Callable[[int, View], None] | None = None) -> list[View]:
    """Visit every pose, and at each take the camera's image and the measured gripper pose. After
    a pose that was not reached the arm goes back to its starting joints first (a local IK that
    ran into a joint limit or a singularity would otherwise stay stuck there)."""
    q_start = np.asarray(arm_state(robot)["q"], np.float64)
    views: list[View] = []
    stuck = False
    for i, T_target in enumerate(poses):
        if stuck:
            move_joints(robot, q_start)
        T, reached = move_to(robot, T_target, tol_m=tol_m, tol_deg=tol_deg)
        stuck = not reached
        if not reached:
            err_m, err_deg = G.pose_error(T, T_target)
            log.warning("pose %d: stopped %.1f mm / %.1f deg from its target (workspace or joint limits); "
                        "using the pose the arm stopped at", i, err_m * 1e3, err_deg)
        t_still = time.monotonic_ns()
        obs = robot.observe(newer_than_ns=t_still)  # a frame and a state taken after the arm stopped
        T_meas = pose_of({"ee_pos": obs["state"][:3], "ee_quat": obs["state"][3:7]})
        if G.pose_error(T_meas, T)[0] > 0.002:
            log.warning("pose %d: the arm was still moving when the image was taken", i)
        view = View(image=np.asarray(obs["images"][camera]), T_base_gripper=T_meas, reached=reached,
                    t_mono_ns=int(obs["t"][camera]))
        views.append(view)
        if on_view is not None:
            on_view(i, view)
    return views
