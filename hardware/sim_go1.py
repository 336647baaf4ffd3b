"""A MuJoCo simulation of the Unitree Go1 quadruped on flat ground.

The robot model is the Go1 shipped inside the ``mjlab`` package (``pip install --no-deps mjlab``;
only its asset files are used: ``mjlab/asset_zoo/robots/unitree_go1/xmls/go1.xml``, found with
``importlib.util.find_spec`` without importing mjlab, whose dependencies are not installed). The
XML has the kinematics, meshes and IMU sensors (gyro, accelerometer on the ``imu`` site) but no
actuators and no floor; :func:`build_model` adds, with ``mujoco.MjSpec``:

* a floor plane (z = 0) with a light;
* 12 position actuators ``<joint>_motor`` (a PD per joint, as the Go1 motor controller): torque =
  kp (ctrl - q) - kd dq, clipped to the Go1 torque limits (23.7 N m hip / thigh, 35.55 N m calf),
  with the reflected rotor inertia as joint armature (the mjlab values). kp and kd are set per
  command (model ``actuator_gainprm`` / ``actuator_biasprm``; the model belongs to this device);
* a ``framequat`` sensor on the ``imu`` site (the IMU's orientation), and mjlab's collision
  set-up: feet with friction 1 and condim 6, the other collision geoms frictionless.

Control. A controller tick runs at ``control_hz`` (default 100 Hz) and turns the current mode
(``LeggedState.mode``) into joint targets and gains (``hardware.go1_control``):

* ``joint``: the client's targets and gains (``command_joint_positions``);
* ``velocity``: :class:`~hardware.go1_control.TrotGait` (phase-oscillator trot + leg IK, trunk
  levelled against roll / pitch) at the commanded (vx, vy, yaw_rate);
* ``stand``: :class:`~hardware.go1_control.RecoveryController` (tuck, rise, stabilise; then holds);
* ``sit``: smooth interpolation to ``SIT_Q``; ``damp``: kp = 0, kd = ``damp_kd``;
* ``safe`` (``damp_and_sit``, the watchdog's safe state): ``damp_s`` of damping, then sit.

Fall detection (``LeggedState.fallen``): the trunk tilts more than ``fall_tilt_rad``, or its
height drops below ``fall_height_m``, or the trunk / head touches the floor. ``extras["falls"]``
counts falls (rising edges) since construction.

Time. ``physics_hz`` (default 500). ``realtime=True``: a daemon thread steps physics paced to the
wall clock (as ``SimFranka``). ``realtime=False`` (training, as fast as possible): physics advances
only in :meth:`step` (default one control period ``control_dt`` = ``control_substeps`` physics
steps, 0.02 s) -- the bridge's ``LeggedService`` calls it after every motion command.

``reset(seed)`` puts the robot standing at the origin (seeded yaw and small joint noise) and
settles ``settle_s``; ``reset(seed, pose="sit")`` puts it sitting. ``set_base(pos, quat, lin_vel,
ang_vel)`` teleports / pushes the trunk (tests, perturbations).

Speed (2-core build machine): ~20-30x real time in fast mode.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pathlib
import threading
import time
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from hardware import go1_control as gc  # noqa: E402
from hardware.base import DeviceError, JointLimits, Legged, LeggedState  # noqa: E402
from hardware.realtime_physics import RealtimePhysics  # noqa: E402

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install --no-deps mjlab"
ARMATURE = np.tile([0.000111842 * 6 ** 2, 0.000111842 * 6 ** 2, 0.000111842 * 9 ** 2], 4)
"""Reflected rotor inertia per joint (kg m^2): rotor 1.118e-4 times the gear ratio squared (6; 9 for
the calf), as in mjlab's Go1 constants."""
FOOT_GEOMS = tuple(f"{leg}_foot_collision" for leg in gc.LEGS)
BODY_GEOMS = ("trunk_collision", "head_collision")


def go1_xml_path() -> pathlib.Path:
    """The ``go1.xml`` inside the installed ``mjlab`` package (located without importing it)."""
    spec = importlib.util.find_spec("mjlab")
    if spec is None or not spec.submodule_search_locations:
        raise DeviceError(f"SimGo1 needs the Unitree Go1 model from the 'mjlab' package, which is not installed: "
                          f"run `{INSTALL_HINT}`")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "asset_zoo" / "robots" / "unitree_go1" / "xmls" \
        / "go1.xml"
    if not path.is_file():
        raise DeviceError(f"the 'mjlab' package has no Go1 model at {path}: reinstall it with `{INSTALL_HINT}`")
    return path


def build_model(physics_hz: float = 500.0) -> mujoco.MjModel:
    """Compile the Go1 + floor + actuators + IMU orientation sensor."""
    spec = mujoco.MjSpec.from_file(str(go1_xml_path()))
    spec.option.timestep = 1.0 / physics_hz
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST  # stable joint damping (kd) at 500 Hz
    spec.visual.quality.offsamples = 0
    world = spec.worldbody
    world.add_geom(name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 0.05], rgba=[0.5, 0.55, 0.6, 1],
                   friction=[1.0, 0.005, 0.0001])
    world.add_light(name="sun", pos=[0, 0, 3], dir=[0, 0, -1])
    for g in spec.geoms:  # mjlab's FULL_COLLISION: feet grip, the rest is frictionless
        if g.name in FOOT_GEOMS:
            g.condim, g.priority, g.friction = 6, 1, [1.0, 5e-3, 5e-4]
        elif g.name.endswith(tuple(f"_collision{s}" for s in ("", "1", "2", "3"))):
            g.condim = 1
            g.solref = [0.01, 1.0]
    for name, arm in zip(gc.JOINT_NAMES, ARMATURE):
        spec.joint(name).armature = float(arm)
        spec.joint(name).damping = [0.01, 0.0, 0.0]  # MuJoCo 4: polynomial damping coefficients
    for name, tau in zip(gc.JOINT_NAMES, gc.TORQUE_LIMIT):
        act = spec.add_actuator(name=name.replace("_joint", "_motor"), target=name,
                                trntype=mujoco.mjtTrn.mjTRN_JOINT)
        act.set_to_position(kp=40.0, kv=1.0)
        act.forcelimited = True
        act.forcerange = [-float(tau), float(tau)]
        act.ctrllimited = False
    spec.add_sensor(name="imu_quat", type=mujoco.mjtSensor.mjSENS_FRAMEQUAT, objtype=mujoco.mjtObj.mjOBJ_SITE,
                    objname="imu")
    for key in list(spec.keys):
        spec.delete(key)
    return spec.compile()


class SimGo1(RealtimePhysics, Legged):
    """Simulated Unitree Go1 (see the module docstring for the model, the controller and timing)."""

    joint_names = gc.JOINT_NAMES
    max_body_velocity = (0.6, 0.3, 1.0)

    def __init__(self, name: str = "go1", realtime: bool = True, physics_hz: float = 500.0,
                 control_hz: float = 100.0, control_substeps: int = 10, seed: int = 0, settle_s: float = 0.3,
                 max_lag_s: float = 0.1, damp_kd: float = 2.0, damp_s: float = 0.5, sit_s: float = 1.0,
                 fall_tilt_rad: float = 1.0, fall_height_m: float = 0.06,
                 gait: gc.GaitConfig | dict | None = None, recovery: gc.RecoveryConfig | dict | None = None) -> None:
        super().__init__(name)
        every = physics_hz / control_hz if physics_hz > 0 and control_hz > 0 else 0.0
        if abs(every - round(every)) > 1e-9 or round(every) < 1:
            raise ValueError(f"physics_hz ({physics_hz}) must be a positive whole multiple of control_hz ({control_hz})")
        if control_substeps < 1:
            raise ValueError(f"control_substeps must be >= 1, got {control_substeps}")
        if not (fall_tilt_rad > 0 and fall_height_m >= 0 and damp_kd >= 0 and damp_s >= 0 and sit_s > 0):
            raise ValueError("fall_tilt_rad and sit_s must be positive; fall_height_m, damp_kd and damp_s >= 0")
        self.realtime = bool(realtime)
        self.physics_hz, self.control_hz = float(physics_hz), float(control_hz)
        self.control_substeps = int(control_substeps)
        self.settle_s, self.max_lag_s = float(settle_s), float(max_lag_s)
        self.damp_kd, self.damp_s, self.sit_s = float(damp_kd), float(damp_s), float(sit_s)
        self.fall_tilt_rad, self.fall_height_m = float(fall_tilt_rad), float(fall_height_m)
        self.gait_config = gait if isinstance(gait, gc.GaitConfig) else gc.GaitConfig(**(gait or {}))
        self.recovery_config = recovery if isinstance(recovery, gc.RecoveryConfig) else \
            gc.RecoveryConfig(**(recovery or {}))
        self._every = int(round(every))
        self._ctrl_dt = self._every / self.physics_hz

        self.model = build_model(self.physics_hz)
        m = self.model
        self._data = mujoco.MjData(m)
        jid = [mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, j) for j in gc.JOINT_NAMES]
        self._qadr = np.array([m.jnt_qposadr[j] for j in jid])
        self._vadr = np.array([m.jnt_dofadr[j] for j in jid])
        self._limits = JointLimits(lower=m.jnt_range[jid, 0].copy(), upper=m.jnt_range[jid, 1].copy(),
                                   velocity=gc.JOINT_VELOCITY.copy())

        def sensor(n):
            i = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SENSOR, n)
            return slice(m.sensor_adr[i], m.sensor_adr[i] + m.sensor_dim[i])

        self._s_gyro, self._s_acc, self._s_quat = sensor("imu_ang_vel"), sensor("imu_lin_acc"), sensor("imu_quat")
        geom = lambda n: mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, n)  # noqa: E731
        self._floor = geom("floor")
        self._foot_geoms = np.array([geom(n) for n in FOOT_GEOMS])
        self._body_geoms = frozenset(geom(n) for n in BODY_GEOMS)
        self._trunk = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, "trunk")

        self._lock = threading.Lock()
        self._rng = np.random.default_rng(seed)
        self._gait = gc.TrotGait(self.gait_config)
        self._recovery = gc.RecoveryController(self.recovery_config)
        self._interp: gc.PoseInterpolator | None = None
        self._mode = "stand"
        self._mode_t = 0.0  # seconds in the current mode
        self._cmd = gc.JointCommand(gc.STAND_Q.copy(), *gc.gains(40.0, 1.0))
        self._vel_cmd = np.zeros(3)
        self._safe = False
        self._fallen = False
        self._falls = 0
        self._substep = 0
        self._init_realtime()
        with self._lock:
            self._reset_locked(self._rng, "stand")

    # -- properties ---------------------------------------------------------------------------
    @property
    def joint_limits(self) -> JointLimits:
        return self._limits

    @property
    def control_dt(self) -> float:
        """Seconds of simulated time one command is held for in fast mode (``step()`` advances this)."""
        return self.control_substeps / self.physics_hz

    @property
    def timestep(self) -> float:
        return self.model.opt.timestep

    @property
    def sim_time(self) -> float:
        with self._lock:
            return float(self._data.time)

    @property
    def recovery(self) -> gc.RecoveryController:
        """The recovery controller of the ``stand`` mode (its ``phase`` / ``done`` / ``recoverable``)."""
        return self._recovery

    @property
    def _tick_steps(self) -> int:
        """Physics steps per control tick (the real-time thread steps whole ticks)."""
        return self._every

    # -- lifecycle ----------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sim": True, "physics_hz": self.physics_hz, "control_hz": self.control_hz,
                "control_dt": self.control_dt, "realtime": self.realtime, "fall_tilt_rad": self.fall_tilt_rad,
                "fall_height_m": self.fall_height_m, "stand_q": gc.STAND_Q.tolist(), "sit_q": gc.SIT_Q.tolist()}

    # -- commands -----------------------------------------------------------------------------
    def command_joint_positions(self, q: np.ndarray, kp, kd) -> None:
        self._require_connected()
        q = np.asarray(q, np.float64).reshape(-1)
        if q.shape != (12,) or not np.all(np.isfinite(q)):
            raise ValueError(f"command_joint_positions needs finite q [12], got shape {q.shape}")
        kp_, kd_ = gc.gains(kp, kd)
        if not (np.all(np.isfinite(kp_)) and np.all(np.isfinite(kd_)) and (kp_ >= 0).all() and (kd_ >= 0).all()):
            raise ValueError("command_joint_positions needs finite, non-negative kp and kd")
        with self._lock:
            self._set_mode_locked("joint")
            self._cmd = gc.JointCommand(np.clip(q, self._limits.lower, self._limits.upper), kp_, kd_)

    def command_body_velocity(self, vx: float, vy: float, yaw_rate: float) -> None:
        self._require_connected()
        v = np.array([vx, vy, yaw_rate], np.float64)
        if not np.all(np.isfinite(v)):
            raise ValueError(f"command_body_velocity needs finite values, got {v.tolist()}")
        with self._lock:
            if self._mode != "velocity":
                self._gait.reset()
            self._set_mode_locked("velocity")
            self._vel_cmd = np.clip(v, -np.array(self.max_body_velocity), np.array(self.max_body_velocity))

    def stand(self) -> None:
        self._require_connected()
        with self._lock:
            if self._mode != "stand":
                self._recovery = gc.RecoveryController(self.recovery_config)
                self._recovery.start(self._data.qpos[self._qadr])
            self._set_mode_locked("stand")

    def sit(self) -> None:
        self._require_connected()
        with self._lock:
            if self._mode != "sit":
                self._interp = gc.PoseInterpolator(self._cmd.q, gc.SIT_Q, self.sit_s, 30.0, 2.0)
            self._set_mode_locked("sit")

    def damp(self) -> None:
        self._require_connected()
        with self._lock:
            self._set_mode_locked("damp")

    def damp_and_sit(self) -> None:
        with self._lock:
            if self._mode != "safe":
                self._set_mode_locked("safe")
                self._interp = None
            self._safe = True
            self._apply_mode_locked()  # damping now, not at the next controller tick

    def reset(self, seed: int | None = None, pose: str = "stand") -> LeggedState:
        """Standing (``pose="stand"``) or sitting (``"sit"``) at the origin; seeded yaw and joint noise."""
        self._require_connected()
        if pose not in ("stand", "sit"):
            raise DeviceError(f"SimGo1 reset pose must be 'stand' or 'sit', got {pose!r}")
        rng = self._rng if seed is None else np.random.default_rng(seed)
        with self._lock:
            self._reset_locked(rng, pose)
            self._reanchor = True
        return self.read_state()

    def read_state(self) -> LeggedState:
        self._require_connected()
        with self._lock:
            return self._state_locked()

    # -- stepping and test hooks --------------------------------------------------------------
    def step(self, n_steps: int | None = None) -> None:
        """Fast mode only: advance physics by ``n_steps`` (default ``control_substeps``, one control period)."""
        self._require_connected()
        if self.realtime:
            raise DeviceError(f"SimGo1 {self.name!r} runs in real time: its physics thread owns stepping")
        n = self.control_substeps if n_steps is None else int(n_steps)
        if n < 0:
            raise ValueError(f"n_steps must be >= 0, got {n}")
        with self._lock:
            self._step_locked(n)

    def advance(self, seconds: float) -> None:
        """Fast mode only: advance physics by ``seconds`` of simulated time (whole steps)."""
        self.step(int(round(seconds * self.physics_hz)))

    def set_base(self, pos=None, quat=None, lin_vel=None, ang_vel=None) -> None:
        """Teleport the trunk (``pos`` [3], ``quat`` [4] wxyz) and / or set its world-frame velocity
        (``lin_vel`` [3] m/s, ``ang_vel`` [3] rad/s): perturbations for tests."""
        self._require_connected()
        with self._lock:
            d = self._data
            if pos is not None:
                d.qpos[:3] = np.asarray(pos, np.float64)
            if quat is not None:
                q = np.asarray(quat, np.float64)
                d.qpos[3:7] = q / np.linalg.norm(q)
            if lin_vel is not None:
                d.qvel[:3] = np.asarray(lin_vel, np.float64)
            if ang_vel is not None:  # the free joint's angular velocity is in the body frame
                R = d.xmat[self._trunk].reshape(3, 3)
                d.qvel[3:6] = R.T @ np.asarray(ang_vel, np.float64)
            mujoco.mj_forward(self.model, d)

    # -- internals (call with the lock held) --------------------------------------------------
    def _set_mode_locked(self, mode: str) -> None:
        if mode != self._mode:
            self._mode, self._mode_t = mode, 0.0
        self._safe = False

    def _apply_mode_locked(self) -> None:
        """One controller tick: the current mode -> actuator targets and gains."""
        d, dt = self._data, self._ctrl_dt
        q, dq = d.qpos[self._qadr], d.qvel[self._vadr]
        mode = self._mode
        if mode == "velocity":
            quat = d.sensordata[self._s_quat]
            R = d.xmat[self._trunk].reshape(3, 3)
            v_body = R.T @ d.qvel[:3]
            self._cmd = self._gait.step(dt, self._vel_cmd, gc.quat_to_rpy(quat), v_body)
        elif mode == "stand":
            self._cmd = self._recovery.step(dt, q, dq, d.sensordata[self._s_quat])
        elif mode == "sit":
            if self._interp is None:
                self._interp = gc.PoseInterpolator(q, gc.SIT_Q, self.sit_s, 30.0, 2.0)
            self._cmd = self._interp.step(dt)
        elif mode == "damp" or (mode == "safe" and self._mode_t < self.damp_s):
            self._cmd = gc.JointCommand(q.copy(), *gc.gains(0.0, self.damp_kd))
        elif mode == "safe":  # damped long enough: fold into the sit posture
            if self._interp is None:
                self._interp = gc.PoseInterpolator(q, gc.SIT_Q, self.sit_s, 30.0, 2.0)
            self._cmd = self._interp.step(dt)
        self._mode_t += dt
        m = self.model
        m.actuator_gainprm[:12, 0] = self._cmd.kp
        m.actuator_biasprm[:12, 1] = -self._cmd.kp
        m.actuator_biasprm[:12, 2] = -self._cmd.kd
        d.ctrl[:12] = self._cmd.q

    def _contacts_locked(self) -> tuple[np.ndarray, bool]:
        """Foot normal forces [4] (N) and whether the trunk or head touches the floor."""
        d, m = self._data, self.model
        force = np.zeros(4)
        body_hit = False
        f6 = np.zeros(6)
        for i in range(d.ncon):
            c = d.contact[i]
            g1, g2 = int(c.geom1), int(c.geom2)
            if self._floor not in (g1, g2):
                continue
            other = g2 if g1 == self._floor else g1
            if other in self._body_geoms:
                body_hit = True
            hit = np.flatnonzero(self._foot_geoms == other)
            if hit.size:
                mujoco.mj_contactForce(m, d, i, f6)
                force[hit[0]] += abs(f6[0])
        return force, body_hit

    def _state_locked(self) -> LeggedState:
        d = self._data
        quat = d.sensordata[self._s_quat].copy()
        tilt = gc.tilt_from_quat(quat)
        height = float(d.qpos[2])
        foot_force, body_hit = self._contacts_locked()
        R = d.xmat[self._trunk].reshape(3, 3)
        return LeggedState(
            q=d.qpos[self._qadr].copy(), dq=d.qvel[self._vadr].copy(), tau=d.actuator_force[:12].copy(),
            quat=quat, gyro=d.sensordata[self._s_gyro].copy(), accel=d.sensordata[self._s_acc].copy(),
            foot_force=foot_force, base_height=height, tilt=tilt, fallen=self._fallen, mode=self._mode,
            t_mono_ns=time.monotonic_ns(), safe=self._safe,
            extras={"base_pos": d.qpos[:3].copy(), "base_lin_vel": R.T @ d.qvel[:3],
                    "sim_time": np.array([float(d.time)]), "falls": np.array([self._falls], np.int64),
                    "recovered": np.array([self._recovery.done])})

    def _check_fall_locked(self) -> None:
        d = self._data
        tilt = gc.tilt_from_quat(d.sensordata[self._s_quat])
        _, body_hit = self._contacts_locked()
        fallen = tilt > self.fall_tilt_rad or float(d.qpos[2]) < self.fall_height_m or body_hit
        if fallen and not self._fallen:
            self._falls += 1
            log.info("SimGo1 %r: fall detected (tilt %.2f rad, height %.3f m, trunk contact %s)", self.name, tilt,
                     float(d.qpos[2]), body_hit)
        self._fallen = fallen

    def _reset_locked(self, rng: np.random.Generator, pose: str) -> None:
        m, d = self.model, self._data
        mujoco.mj_resetData(m, d)
        yaw = rng.uniform(-np.pi, np.pi)
        q0 = (gc.STAND_Q if pose == "stand" else gc.SIT_Q) + rng.uniform(-0.02, 0.02, 12)
        d.qpos[self._qadr] = q0
        d.qpos[3:7] = [np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)]
        # trunk height from the lowest foot so the robot starts touching the ground
        feet = [gc.leg_fk(q0[3 * i:3 * i + 3], i)[2] for i in range(4)]
        d.qpos[2] = -min(feet) + gc.FOOT_RADIUS + 0.002
        mujoco.mj_forward(m, d)
        self._gait.reset()
        self._recovery = gc.RecoveryController(self.recovery_config)
        if pose == "stand":
            self._recovery.start(q0)
            self._mode = "stand"
        else:
            self._mode, self._interp = "sit", gc.PoseInterpolator(q0, gc.SIT_Q, 1e-3, 30.0, 2.0)
        self._mode_t, self._safe, self._vel_cmd = 0.0, False, np.zeros(3)
        self._fallen = False
        self._substep = 0
        self._step_locked(int(round(self.settle_s * self.physics_hz)))

    def _step_locked(self, n: int) -> None:
        m, d = self.model, self._data
        while n > 0:
            phase = self._substep % self._every
            if phase == 0:
                self._apply_mode_locked()
            k = min(n, self._every - phase)
            mujoco.mj_step(m, d, nstep=k)
            self._substep += k
            n -= k
            if self._substep % self._every == 0:
                self._check_fall_locked()
