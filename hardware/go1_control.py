"""Unitree Go1 kinematics and the deterministic controllers shared by the simulator and the real
low-level driver: a trot gait for body-velocity commands, pose interpolation (stand, sit) and a
recovery (stand-up + stabilise) controller. numpy only: no MuJoCo, no SDK, no torch.

Joint order everywhere (the Unitree SDK's motor order, and the order of the MuJoCo model):
``FR, FL, RR, RL`` legs, each ``(hip, thigh, calf)``. Angles follow the Unitree / MuJoCo model
conventions: hip rolls about the trunk x axis, thigh and calf pitch about y; with thigh ``t`` and
calf ``c`` the foot sits, in the thigh-pitch plane of its hip, at
``x = -L (sin t + sin(t + c))``, ``z = -L (cos t + cos(t + c))`` (``L`` = 0.213 m each link).

Every controller here maps (its own phase clock, the measured :class:`~hardware.base.LeggedState`
fields it needs) to a :class:`JointCommand` (joint targets + PD gains). Nothing is random: the same
states give the same commands, which SafeExplorer needs of its recovery policy.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

LEGS = ("FR", "FL", "RR", "RL")
JOINT_NAMES = tuple(f"{leg}_{j}_joint" for leg in LEGS for j in ("hip", "thigh", "calf"))
NUM_JOINTS = 12
LINK = 0.213  # thigh and calf length, m
FOOT_RADIUS = 0.023
HIP_XY = np.array([[0.1881, -0.04675], [0.1881, 0.04675], [-0.1881, -0.04675], [-0.1881, 0.04675]])
"""Hip (roll) joint positions in the trunk frame, m, per leg."""
THIGH_Y = np.array([-0.08, 0.08, -0.08, 0.08])
"""Lateral offset of the thigh (pitch) joint from its hip joint, m."""
JOINT_LOWER = np.tile([-0.863, -0.686, -2.818], 4)
JOINT_UPPER = np.tile([0.863, 4.501, -0.888], 4)
"""Joint ranges of the Go1 model (rad), per joint in ``JOINT_NAMES`` order."""
JOINT_VELOCITY = np.tile([30.1, 30.1, 20.06], 4)
TORQUE_LIMIT = np.tile([23.7, 23.7, 35.55], 4)
"""Motor velocity (rad/s) and torque (N m) limits (Unitree datasheet values, as in mjlab)."""

STAND_HEIGHT = 0.27
"""Hip-to-foot-centre height of the stand pose, m (the trunk stands at ~0.29 m)."""
SIT_Q = np.tile([0.0, 1.25, -2.7], 4)
"""The sitting (lying) posture: legs folded under the trunk, which rests ~0.11 m above the floor."""


@dataclasses.dataclass(frozen=True)
class JointCommand:
    """Joint position targets with the PD gains to track them (torque = kp (q - q_meas) - kd dq)."""

    q: np.ndarray  # [12] rad
    kp: np.ndarray  # [12] N m / rad
    kd: np.ndarray  # [12] N m s / rad


def gains(kp: float | np.ndarray, kd: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.broadcast_to(np.asarray(kp, np.float64), (12,)).copy(), \
        np.broadcast_to(np.asarray(kd, np.float64), (12,)).copy()


# ------------------------------------------------------------------------------------------------
# kinematics
# ------------------------------------------------------------------------------------------------


def leg_fk(q3: np.ndarray, leg: int) -> np.ndarray:
    """Foot centre of one leg relative to its hip joint (trunk frame, m) from (hip, thigh, calf)."""
    h, t, c = (float(v) for v in q3)
    x = -LINK * (math.sin(t) + math.sin(t + c))
    zp = -LINK * (math.cos(t) + math.cos(t + c))
    d = float(THIGH_Y[leg])
    return np.array([x, d * math.cos(h) - zp * math.sin(h), d * math.sin(h) + zp * math.cos(h)])


def leg_ik(foot: np.ndarray, leg: int) -> np.ndarray:
    """(hip, thigh, calf) placing the foot centre at ``foot`` relative to the hip joint (trunk
    frame). Unreachable points are pulled onto the workspace; the result is clipped to the joint
    ranges."""
    x, y, z = (float(v) for v in foot)
    d = float(THIGH_Y[leg])
    # hip roll: (y, z) is (d, zp) rotated by the hip angle about x
    r_yz = max(math.hypot(y, z), abs(d) + 1e-6)
    zp = -math.sqrt(r_yz * r_yz - d * d)
    hip = math.atan2(z, y) - math.atan2(zp, d)
    hip = (hip + math.pi) % (2 * math.pi) - math.pi
    # planar two-link leg in the thigh-pitch plane: foot at (x, zp)
    r = min(max(math.hypot(x, zp), 0.05), 2 * LINK - 1e-4)
    calf = -math.acos(min(max(r * r / (2 * LINK * LINK) - 1.0, -1.0), 1.0))
    alpha = math.atan2(-x, -zp)
    thigh = alpha - calf / 2
    q = np.array([hip, thigh, calf])
    return np.clip(q, JOINT_LOWER[:3], JOINT_UPPER[:3])


def nominal_feet(height: float = STAND_HEIGHT) -> np.ndarray:
    """[4, 3] foot positions relative to each hip for standing at ``height``."""
    return np.array([[0.0, THIGH_Y[i], -height] for i in range(4)])


def feet_ik(feet: np.ndarray) -> np.ndarray:
    """[4, 3] feet relative to their hips -> [12] joint angles."""
    return np.concatenate([leg_ik(feet[i], i) for i in range(4)])


STAND_Q = feet_ik(nominal_feet())
"""The stand posture (feet under the hips at ``STAND_HEIGHT``): hip 0, thigh ~0.89, calf ~-1.79."""


# ------------------------------------------------------------------------------------------------
# orientation helpers
# ------------------------------------------------------------------------------------------------


def quat_to_rpy(quat: np.ndarray) -> np.ndarray:
    """(w, x, y, z) -> roll, pitch, yaw (rad, ZYX convention)."""
    w, x, y, z = (float(v) for v in quat)
    roll = math.atan2(2 * (w * x + y * z), 1 - 2 * (x * x + y * y))
    pitch = math.asin(min(max(2 * (w * y - z * x), -1.0), 1.0))
    yaw = math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
    return np.array([roll, pitch, yaw])


def tilt_from_quat(quat: np.ndarray) -> float:
    """Angle between the trunk's up axis and the world's up axis (rad): 0 level, pi upside down."""
    w, x, y, z = (float(v) for v in quat)
    n = w * w + x * x + y * y + z * z
    up_z = 1 - 2 * (x * x + y * y) / n  # world z component of the trunk z axis
    return math.acos(min(max(up_z, -1.0), 1.0))


# ------------------------------------------------------------------------------------------------
# pose interpolation (stand, sit)
# ------------------------------------------------------------------------------------------------


class PoseInterpolator:
    """Move the joint targets from a start posture to ``goal`` along a smoothstep in ``duration_s``,
    then hold ``goal``."""

    def __init__(self, q_start: np.ndarray, goal: np.ndarray, duration_s: float, kp: float, kd: float) -> None:
        self.q0, self.goal = np.asarray(q_start, np.float64).copy(), np.asarray(goal, np.float64).copy()
        self.duration_s = max(float(duration_s), 1e-6)
        self.kp, self.kd = gains(kp, kd)
        self.t = 0.0

    @property
    def done(self) -> bool:
        return self.t >= self.duration_s

    def step(self, dt: float) -> JointCommand:
        self.t += dt
        s = min(self.t / self.duration_s, 1.0)
        s = s * s * (3 - 2 * s)
        return JointCommand(self.q0 + s * (self.goal - self.q0), self.kp, self.kd)


# ------------------------------------------------------------------------------------------------
# trot gait for body-velocity commands
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GaitConfig:
    frequency_hz: float = 2.5
    """Steps per second of each diagonal pair (one gait cycle = one stance + one swing)."""
    step_height: float = 0.07
    """Peak foot lift during swing, m."""
    height: float = STAND_HEIGHT
    """Hip-to-foot height kept in stance, m."""
    kp: float = 100.0
    kd: float = 2.0
    attitude_gain: float = 0.5
    """Leg-length correction per radian of roll / pitch (m/rad): stance legs on the low side
    extend, on the high side shorten, so the trunk stays level."""
    velocity_gain: float = 0.15
    """Velocity feedback (s): every foot target shifts by this times the (low-passed) measured
    minus commanded velocity, so a robot lagging its command leans into it."""
    velocity_integral_gain: float = 0.3
    """Integral of that velocity error (m per (m/s) s), clamped to +-``max_integral_shift``: removes
    the steady drift the gait's tracking lag would otherwise leave."""
    max_integral_shift: float = 0.06
    x_offset: float = 0.0
    """Forward shift of the nominal foot positions under the hips, m (trims the trunk's pitch)."""
    velocity_filter_s: float = 0.2
    """Time constant of the low-pass filter on the measured velocity, s."""


class TrotGait:
    """A trot from a phase oscillator, realised by foot trajectories and leg IK.

    Diagonal pairs (FR + RL, FL + RR) alternate, duty factor 0.5. Each foot's target (relative to
    its hip, trunk frame) moves backwards in stance at the commanded ground velocity of that foot
    (``v + yaw_rate x hip``) and swings forwards along a half-sine arc, landing half a stance
    stride ahead of the hip (plus a Raibert correction for the measured velocity error). Stance
    legs are lengthened or shortened against the measured roll and pitch. No model of the
    dynamics: slow and rough, but it walks at small speeds on flat ground without falling.
    """

    PHASE_OFFSET = np.array([0.0, 0.5, 0.5, 0.0])  # FR, FL, RR, RL

    def __init__(self, config: GaitConfig = GaitConfig()) -> None:
        self.cfg = config
        self.phase = 0.0
        self.kp, self.kd = gains(config.kp, config.kd)
        self.v_filt = np.zeros(2)
        self.integral = np.zeros(2)

    def reset(self) -> None:
        self.phase = 0.0
        self.v_filt = np.zeros(2)
        self.integral = np.zeros(2)

    def step(self, dt: float, cmd: np.ndarray, rpy: np.ndarray | None = None,
             velocity: np.ndarray | None = None) -> JointCommand:
        """One control tick: ``cmd`` = (vx, vy, yaw_rate) in the trunk frame; ``rpy`` the measured
        orientation (roll/pitch used), ``velocity`` the measured trunk-frame (vx, vy) if known."""
        c = self.cfg
        vx, vy, wz = (float(v) for v in cmd)
        self.phase = (self.phase + dt * c.frequency_hz) % 1.0
        t_stance = 0.5 / c.frequency_hz
        feet = nominal_feet(c.height)
        roll, pitch = (0.0, 0.0) if rpy is None else (float(rpy[0]), float(rpy[1]))
        shift = np.array([c.x_offset, 0.0])
        if velocity is not None:
            a = min(dt / c.velocity_filter_s, 1.0)
            self.v_filt += a * (np.asarray(velocity[:2], np.float64) - self.v_filt)
            err = self.v_filt - np.array([vx, vy])
            m = c.max_integral_shift
            self.integral = np.clip(self.integral + c.velocity_integral_gain * err * dt, -m, m)
            shift = shift + c.velocity_gain * err + self.integral
        for i in range(4):
            hx, hy = HIP_XY[i]
            fv = np.array([vx - wz * hy, vy + wz * hx])  # the foot's ground speed under the hip
            half = fv * t_stance / 2
            p = (self.phase + self.PHASE_OFFSET[i]) % 1.0
            if p < 0.5:  # stance: from +half to -half
                s = p / 0.5
                xy = half * (1 - 2 * s)
                # roll > 0 lowers the right side (y < 0); pitch > 0 lowers the front (x > 0)
                z = -c.height - c.attitude_gain * (pitch * hx - roll * hy)
            else:  # swing: from -half to +half along an arc
                s = (p - 0.5) / 0.5
                xy = half * (2 * s - 1)
                z = -c.height + c.step_height * math.sin(math.pi * s)
            feet[i, 0] += xy[0] + shift[0]
            feet[i, 1] += xy[1] + shift[1]
            feet[i, 2] = z
        return JointCommand(feet_ik(feet), self.kp, self.kd)


# ------------------------------------------------------------------------------------------------
# recovery: stand up and stabilise
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RecoveryConfig:
    tuck_s: float = 0.5
    """Time to fold the legs into the sit posture (feet under the trunk) first, s."""
    rise_s: float = 1.0
    """Time to extend from the sit posture to the stand posture, s."""
    kp: float = 60.0
    kd: float = 2.0
    level_gain: float = 0.6
    """Stabilise phase: leg-length correction per radian of roll / pitch (m / rad)."""
    level_tilt_rad: float = 0.08
    """Recovered once the tilt stays below this for ``settle_s`` ..."""
    settle_s: float = 0.3
    max_joint_speed: float = 0.5
    """... with every joint slower than this (rad/s)."""
    max_tilt_rad: float = 1.2
    """Beyond this tilt (on its side, on its back) the controller does not try: ``recoverable``
    is False and it holds the sit posture with soft gains."""


class RecoveryController:
    """Deterministic stand-up + stabilise for the Go1, from sitting or a mildly perturbed stance.

    Phases (``phase``): ``tuck`` (interpolate from the measured joints to :data:`SIT_Q`, so the
    feet are under the trunk whatever the legs did; skipped when already near it), ``rise``
    (interpolate to :data:`STAND_Q`), ``stabilise`` (hold the stand posture, levelling the trunk by
    changing each leg's length against roll and pitch) until the tilt and the joint speeds are
    small for ``settle_s`` -> ``done``. Beyond ``max_tilt_rad`` it reports ``recoverable = False``
    and holds a soft sit posture (a fallen robot is left for a person).
    """

    def __init__(self, config: RecoveryConfig = RecoveryConfig()) -> None:
        self.cfg = config
        self.phase = "idle"
        self.recoverable = True
        self._interp: PoseInterpolator | None = None
        self._settled = 0.0
        self.kp, self.kd = gains(config.kp, config.kd)

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def start(self, q: np.ndarray) -> None:
        """Begin a recovery from the measured joint positions ``q`` [12]."""
        q = np.asarray(q, np.float64)
        self._settled = 0.0
        self.recoverable = True
        if np.max(np.abs(q - STAND_Q)) < 0.15:
            self.phase, self._interp = "stabilise", None
        elif np.max(np.abs(q - SIT_Q)) < 0.3:
            self.phase = "rise"
            self._interp = PoseInterpolator(q, STAND_Q, self.cfg.rise_s, self.cfg.kp, self.cfg.kd)
        else:
            self.phase = "tuck"
            self._interp = PoseInterpolator(q, SIT_Q, self.cfg.tuck_s, self.cfg.kp * 0.5, self.cfg.kd)

    def step(self, dt: float, q: np.ndarray, dq: np.ndarray, quat: np.ndarray) -> JointCommand:
        """One control tick from the measured joints ``q``, ``dq`` and trunk orientation ``quat``."""
        c = self.cfg
        if self.phase == "idle":
            self.start(q)
        tilt = tilt_from_quat(quat)
        if tilt > c.max_tilt_rad and self.phase in ("tuck", "idle"):
            self.recoverable = False
            return JointCommand(SIT_Q.copy(), *gains(10.0, 1.0))
        if self.phase == "tuck":
            cmd = self._interp.step(dt)
            if self._interp.done:
                self.phase = "rise"
                self._interp = PoseInterpolator(cmd.q, STAND_Q, c.rise_s, c.kp, c.kd)
            return cmd
        if self.phase == "rise":
            cmd = self._interp.step(dt)
            if self._interp.done:
                self.phase = "stabilise"
            return cmd
        # stabilise / done: stand, levelling the trunk with the leg lengths
        rpy = quat_to_rpy(quat)
        feet = nominal_feet()
        for i in range(4):
            hx, hy = HIP_XY[i]
            # roll > 0 tips the right side (y < 0) down: extend right legs; pitch > 0 tips the nose down
            feet[i, 2] -= c.level_gain * (rpy[1] * hx - rpy[0] * hy)
        if tilt < c.level_tilt_rad and float(np.max(np.abs(dq))) < c.max_joint_speed:
            self._settled += dt
        else:
            self._settled = 0.0
        if self._settled >= c.settle_s:
            self.phase = "done"
        return JointCommand(feet_ik(feet), self.kp, self.kd)
