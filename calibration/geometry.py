"""Rigid transforms in numpy: quaternions are (w, x, y, z) like the bridge's ``ee_quat``; a pose is
a [4, 4] matrix ``T`` with ``x_parent = T @ x_child`` (``T_a_b``: frame b expressed in frame a)."""

from __future__ import annotations

import numpy as np


def quat_to_mat(q) -> np.ndarray:
    w, x, y, z = np.asarray(q, np.float64) / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def mat_to_quat(R) -> np.ndarray:
    """Rotation matrix -> unit quaternion (w >= 0)."""
    R = np.asarray(R, np.float64)
    t = np.trace(R)
    if t > 0:
        s = 2.0 * np.sqrt(t + 1.0)
        q = [0.25 * s, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s]
    else:
        i = int(np.argmax(np.diag(R)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2.0 * np.sqrt(1.0 + R[i, i] - R[j, j] - R[k, k])
        q = [0.0, 0.0, 0.0, 0.0]
        q[0] = (R[k, j] - R[j, k]) / s
        q[1 + i] = 0.25 * s
        q[1 + j] = (R[j, i] + R[i, j]) / s
        q[1 + k] = (R[k, i] + R[i, k]) / s
    q = np.asarray(q)
    q /= np.linalg.norm(q)
    return -q if q[0] < 0 else q


def rotvec_to_mat(r) -> np.ndarray:
    """Axis-angle vector (rad) -> rotation matrix (Rodrigues)."""
    r = np.asarray(r, np.float64)
    theta = float(np.linalg.norm(r))
    if theta < 1e-12:
        return np.eye(3)
    k = r / theta
    Kx = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(theta) * Kx + (1 - np.cos(theta)) * Kx @ Kx


def mat_to_rotvec(R) -> np.ndarray:
    """Rotation matrix -> axis-angle vector (rad), via the quaternion (stable near 0 and pi)."""
    q = mat_to_quat(R)
    s = float(np.linalg.norm(q[1:]))
    if s < 1e-12:
        return np.zeros(3)
    return q[1:] / s * 2.0 * np.arctan2(s, q[0])


def pose(pos, quat) -> np.ndarray:
    """[4, 4] from a position [3] and a quaternion [4] wxyz."""
    T = np.eye(4)
    T[:3, :3] = quat_to_mat(quat)
    T[:3, 3] = np.asarray(pos, np.float64)
    return T


def from_rt(R, t) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = np.asarray(R, np.float64)
    T[:3, 3] = np.asarray(t, np.float64).reshape(3)
    return T


def inv(T) -> np.ndarray:
    """Inverse of a rigid transform."""
    T = np.asarray(T, np.float64)
    out = np.eye(4)
    out[:3, :3] = T[:3, :3].T
    out[:3, 3] = -T[:3, :3].T @ T[:3, 3]
    return out


def angle_deg(R) -> float:
    """Rotation angle of a rotation matrix, degrees."""
    c = (np.trace(np.asarray(R, np.float64)) - 1.0) / 2.0
    return float(np.degrees(np.arccos(np.clip(c, -1.0, 1.0))))


def pose_error(T_est, T_true) -> tuple[float, float]:
    """(translation error m, rotation error deg) between two poses of the same frame."""
    T_est, T_true = np.asarray(T_est, np.float64), np.asarray(T_true, np.float64)
    return (float(np.linalg.norm(T_est[:3, 3] - T_true[:3, 3])),
            angle_deg(T_est[:3, :3].T @ T_true[:3, :3]))
