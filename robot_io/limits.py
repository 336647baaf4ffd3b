"""Server-side safety limits for an arm and a legged robot, enforced next to the hardware (the bridge server).

Every clip is reported by name in the reply's ``clipped`` list, so a client always knows the
command that was actually applied.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class ArmLimits:
    workspace_min: tuple[float, float, float] = (0.25, -0.45, 0.0)
    """Lower corner of the end-effector workspace box (m, robot base frame)."""
    workspace_max: tuple[float, float, float] = (0.80, 0.45, 0.70)
    """Upper corner of the end-effector workspace box (m, robot base frame)."""
    max_step_m: float = 0.05
    """Largest translation one ee_delta command may ask for, per axis (m)."""
    max_step_rad: float = 0.25
    """Largest rotation one ee_delta command may ask for (rad, axis-angle norm)."""
    max_joint_step_rad: float = 0.2
    """Largest change of any joint that one joint_position command may ask for (rad)."""
    joint_margin_rad: float = 0.02
    """Joint targets stay this far inside the hardware joint range (rad)."""

    def __post_init__(self) -> None:
        lo, hi = np.asarray(self.workspace_min), np.asarray(self.workspace_max)
        if lo.shape != (3,) or hi.shape != (3,):
            raise ValueError("limits.workspace_min and limits.workspace_max must each have 3 numbers (x, y, z)")
        if not (lo < hi).all():
            raise ValueError(f"limits.workspace_min {lo.tolist()} must be below workspace_max {hi.tolist()} on every axis")
        for f in ("max_step_m", "max_step_rad", "max_joint_step_rad"):
            if not getattr(self, f) > 0:
                raise ValueError(f"limits.{f} must be positive, got {getattr(self, f)}")

    @classmethod
    def from_dict(cls, d: dict | None) -> "ArmLimits":
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown arm limit(s) {sorted(unknown)}; known: {sorted(known)}")
        for k in ("workspace_min", "workspace_max"):
            if k in d:
                d[k] = tuple(float(x) for x in d[k])
        return cls(**d)


def clip_ee_delta(lim: ArmLimits, ee_pos, dpos, drot, gripper: float):
    """Returns (target_pos, applied dpos, applied drot, gripper, clipped names), all plain floats
    in numpy arrays. Written with Python floats: on 3-vectors that is several times faster than
    numpy calls, and this runs on every command."""
    clipped = []
    m = lim.max_step_m
    d = [min(max(float(x), -m), m) for x in dpos]
    if d != [float(x) for x in dpos]:
        clipped.append("dpos:max_step")
    target = [float(p) + dx for p, dx in zip(ee_pos, d)]
    boxed = [min(max(t, lo), hi) for t, lo, hi in zip(target, lim.workspace_min, lim.workspace_max)]
    if boxed != target:
        clipped.append("dpos:workspace")
    r = [float(x) for x in drot]
    angle = math.sqrt(r[0] * r[0] + r[1] * r[1] + r[2] * r[2])
    if angle > lim.max_step_rad:
        k = lim.max_step_rad / angle
        r = [x * k for x in r]
        clipped.append("drot:max_step")
    g = min(max(float(gripper), 0.0), 1.0)
    if g != float(gripper):
        clipped.append("gripper:range")
    applied = [b - float(p) for b, p in zip(boxed, ee_pos)]
    return np.array(boxed), np.array(applied), np.array(r), g, clipped


def clip_joints(lim: ArmLimits, q_now: np.ndarray, q_target: np.ndarray, lower: np.ndarray, upper: np.ndarray):
    clipped = []
    q = np.clip(q_target, q_now - lim.max_joint_step_rad, q_now + lim.max_joint_step_rad)
    if not np.array_equal(q, q_target):
        clipped.append("q:max_step")
    q2 = np.clip(q, lower + lim.joint_margin_rad, upper - lim.joint_margin_rad)
    if not np.array_equal(q2, q):
        clipped.append("q:joint_limits")
    return q2, clipped


def axis_angle_to_quat(r) -> np.ndarray:
    x, y, z = (float(v) for v in r)
    angle = math.sqrt(x * x + y * y + z * z)
    if angle < 1e-12:
        return np.array([1.0, 0.0, 0.0, 0.0])
    k = math.sin(angle / 2) / angle
    return np.array([math.cos(angle / 2), k * x, k * y, k * z])


def quat_mul(a, b) -> np.ndarray:
    """Hamilton product of (w, x, y, z) quaternions."""
    w1, x1, y1, z1 = (float(v) for v in a)
    w2, x2, y2, z2 = (float(v) for v in b)
    return np.array([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
                     w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
                     w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2])


@dataclasses.dataclass(frozen=True)
class LeggedLimits:
    max_velocity: tuple[float, float, float] = (0.5, 0.3, 1.0)
    """Largest |vx| (m/s), |vy| (m/s) and |yaw rate| (rad/s) a body_velocity command may ask for."""
    max_joint_step_rad: float = 0.3
    """Largest distance of a legged_joints target from the measured joint position (rad)."""
    joint_margin_rad: float = 0.02
    """Joint targets stay this far inside the hardware joint range (rad)."""
    max_kp: float = 100.0
    """Largest position gain a legged_joints command may ask for (N m / rad)."""
    max_kd: float = 5.0
    """Largest damping gain a legged_joints command may ask for (N m s / rad)."""

    def __post_init__(self) -> None:
        v = np.asarray(self.max_velocity, np.float64)
        if v.shape != (3,) or not (v >= 0).all():
            raise ValueError("limits.max_velocity must be 3 non-negative numbers (vx m/s, vy m/s, yaw rate rad/s)")
        for f in ("max_joint_step_rad", "max_kp", "max_kd"):
            if not getattr(self, f) > 0:
                raise ValueError(f"limits.{f} must be positive, got {getattr(self, f)}")
        if not self.joint_margin_rad >= 0:
            raise ValueError(f"limits.joint_margin_rad must be >= 0, got {self.joint_margin_rad}")

    @classmethod
    def from_dict(cls, d: dict | None) -> "LeggedLimits":
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown legged limit(s) {sorted(unknown)}; known: {sorted(known)}")
        if "max_velocity" in d:
            d["max_velocity"] = tuple(float(x) for x in d["max_velocity"])
        return cls(**d)


LIMITS: dict[str, type] = {"arm": ArmLimits, "legged": LeggedLimits}
"""Device kind -> its limits class (a site's ``limits`` mapping is parsed by the device's kind)."""


def check_limits(d: dict | None) -> None:
    """Raise ValueError unless ``d`` parses as the limits of some device kind (the site parser does not
    know a device's kind before its driver is imported; ``Service.from_spec`` checks the kind's own)."""
    errors = []
    for cls in LIMITS.values():
        try:
            cls.from_dict(d)
            return
        except (TypeError, ValueError) as e:
            errors.append(str(e))
    raise ValueError("; or ".join(errors))


def clip_velocity(lim: LeggedLimits, v, device_max=None):
    """(applied [3] float64, clipped names) for a body_velocity command."""
    m = np.asarray(lim.max_velocity, np.float64)
    if device_max is not None:
        m = np.minimum(m, np.asarray(device_max, np.float64))
    v = np.asarray(v, np.float64)
    out = np.clip(v, -m, m)
    clipped = [f"velocity:{n}" for n, a, b in zip(("vx", "vy", "yaw_rate"), v, out) if a != b]
    return out, clipped


def clip_gains(lim: LeggedLimits, kp, kd):
    """(kp [12], kd [12], clipped names): gains clipped to [0, max]."""
    kp, kd = np.asarray(kp, np.float64), np.asarray(kd, np.float64)
    kp2, kd2 = np.clip(kp, 0.0, lim.max_kp), np.clip(kd, 0.0, lim.max_kd)
    clipped = []
    if not np.array_equal(kp2, kp):
        clipped.append("kp:range")
    if not np.array_equal(kd2, kd):
        clipped.append("kd:range")
    return kp2, kd2, clipped
