"""Real Unitree Go1 over the Unitree legged SDK's Python API (``robot_interface`` from
``unitree_legged_sdk`` v3.8: the optional extra ``go1``, or built from source), behind
the same ``Legged`` interface as the simulator.

The SDK talks UDP to the robot at one of two levels, chosen at construction (``level``) because the
robot must be switched into that level with its remote first:

* ``level="low"`` (``LOWLEVEL`` 0xff, robot port 8007): 12 joint commands per packet
  (``LowCmd.motorCmd[i].q / dq / Kp / Kd / tau``, the SDK's motor order FR, FL, RR, RL x hip,
  thigh, calf = ours). A background thread runs the SDK loop at ``loop_hz`` (500 Hz): ``Recv`` /
  ``GetRecv(LowState)``, the current mode -> joint targets (the client's, or the deterministic
  controllers of ``hardware.go1_control``: stand = recovery controller, sit = interpolation to
  ``SIT_Q``), ``Safety.PositionLimit`` and ``Safety.PowerProtect(cmd, state, power_level)`` (the
  SDK's own guards), ``SetSend`` / ``Send``. Damping = ``q = PosStopF``, ``dq = VelStopF``
  (no position / velocity target), ``Kp = 0``, ``Kd = damp_kd``. Body velocity is refused at this
  level (the Go1's own gait runs at the high level).
* ``level="high"`` (``HIGHLEVEL`` 0xee, robot port 8082): the Go1's firmware gait.
  ``command_body_velocity`` -> ``HighCmd.mode = 2`` (walk), ``gaitType = 1`` (trot),
  ``velocity = [vx, vy]``, ``yawSpeed``; ``stand`` -> mode 6 (position stand up) for ``stand_s``,
  then mode 1 (force stand); ``sit`` -> mode 5 (position stand down); ``damp`` -> mode 7. Joint
  targets are refused at this level. The safe state is mode 5 then mode 7 (stand down, then
  damping): the firmware cannot stand down from damping, so the order of "damp and sit" is
  reversed here; at the low level it is damping first, then the sit posture, as in the sim.

State: ``motorState[i].q / dq / tauEst``, ``imu.quaternion`` (w, x, y, z), ``imu.gyroscope``,
``imu.accelerometer``, ``footForce`` (the SDK's raw foot sensor values, not newtons).
``base_height`` is NaN at the low level and ``HighState.bodyHeight`` at the high level. ``fallen``
is a tilt above ``fall_tilt_rad`` (the robot cannot measure its height above the floor).

``robot_interface`` is imported inside ``connect()`` (so this module imports without it); a test
passes a fake as ``sdk_module=``. The robot's address comes from the site file (``ip``).
"""

from __future__ import annotations

import importlib
import logging
import math
import threading
import time
from types import ModuleType
from typing import Any

import numpy as np

from hardware import go1_control as gc
from hardware.base import DeviceError, JointLimits, Legged, LeggedState

log = logging.getLogger(__name__)

LOWLEVEL, HIGHLEVEL = 0xFF, 0xEE
"""The SDK's level flags (as in its examples)."""
ROBOT_PORTS = {"low": 8007, "high": 8082}
POS_STOP_F = 2.146e9
VEL_STOP_F = 16000.0
"""The SDK's "no position / no velocity target" values (``PosStopF`` / ``VelStopF``)."""
HIGH_MODE = {"idle": 0, "force_stand": 1, "walk": 2, "stand_down": 5, "stand_up": 6, "damping": 7}
INSTALL_HINT = ("pip install 'vla-stack[go1]', or build unitree_legged_sdk v3.8 with its Python bindings and put "
                "robot_interface on PYTHONPATH (see the 'go1' extra in pyproject.toml)")


class UnitreeGo1(Legged):
    """A Unitree Go1 over ``robot_interface`` (see the module docstring for the command mapping).

    Args:
        ip: The robot's address on its network (site file; low level: the motor controller,
            e.g. the MCU at .10; high level: the Raspberry Pi at .161).
        level: ``"low"`` (joint targets, our controllers) or ``"high"`` (the firmware's gait).
        local_port / robot_port: UDP ports (defaults: 8080, and 8007 low / 8082 high).
        loop_hz: SDK loop rate (500 Hz low, 100 Hz high are the SDK examples').
        power_level: ``Safety.PowerProtect`` level 1..10 (the SDK's power limit).
        damp_kd / damp_s / sit_s / stand_s: damping gain, damping time of the safe state, sit and
            stand durations (s).
        fall_tilt_rad: tilt reported as a fall.
        sdk_module: use this module instead of importing ``robot_interface`` (tests pass a fake).
    """

    joint_names = gc.JOINT_NAMES
    max_body_velocity = (1.0, 0.4, 1.5)

    def __init__(self, ip: str, name: str = "go1", level: str = "low", local_port: int = 8080,
                 robot_port: int | None = None, loop_hz: float | None = None, power_level: int = 1,
                 damp_kd: float = 2.0, damp_s: float = 0.5, sit_s: float = 1.5, stand_s: float = 1.5,
                 fall_tilt_rad: float = 1.0, sdk_module: ModuleType | Any | None = None) -> None:
        super().__init__(name)
        if not ip or not isinstance(ip, str):
            raise ValueError(f"go1 {name!r}: ip must be the robot's address from the site file, got {ip!r}")
        if level not in ROBOT_PORTS:
            raise ValueError(f"go1 {name!r}: level must be 'low' or 'high', got {level!r}")
        if not 1 <= int(power_level) <= 10:
            raise ValueError(f"go1 {name!r}: power_level must be in 1..10, got {power_level}")
        self.ip, self.level = ip, level
        self.local_port = int(local_port)
        self.robot_port = int(robot_port or ROBOT_PORTS[level])
        self.loop_hz = float(loop_hz or (500.0 if level == "low" else 100.0))
        self.power_level = int(power_level)
        self.damp_kd, self.damp_s, self.sit_s, self.stand_s = float(damp_kd), float(damp_s), float(sit_s), float(stand_s)
        self.fall_tilt_rad = float(fall_tilt_rad)
        self._sdk_module = sdk_module
        self._limits = JointLimits(gc.JOINT_LOWER.copy(), gc.JOINT_UPPER.copy(), gc.JOINT_VELOCITY.copy())
        self._lock = threading.RLock()
        self._sdk: Any = None
        self._udp = self._safety = self._cmd = self._state = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._mode = "damp"
        self._mode_t = 0.0
        self._joint_cmd = gc.JointCommand(gc.SIT_Q.copy(), *gc.gains(0.0, damp_kd))
        self._vel = np.zeros(3)
        self._interp: gc.PoseInterpolator | None = None
        self._recovery = gc.RecoveryController()
        self._safe = False
        self._t_state = 0
        self.loop_error: BaseException | None = None

    @property
    def joint_limits(self) -> JointLimits:
        return self._limits

    # -- lifecycle ----------------------------------------------------------------------------
    def _connect(self) -> None:
        sdk = self._sdk_module
        if sdk is None:
            try:
                sdk = importlib.import_module("robot_interface")
            except ImportError as e:
                raise DeviceError(f"go1 {self.name!r}: the Unitree SDK's robot_interface is not importable ({e}); "
                                  f"{INSTALL_HINT}") from None
        self._sdk = sdk
        try:
            low = self.level == "low"
            self._udp = sdk.UDP(LOWLEVEL if low else HIGHLEVEL, self.local_port, self.ip, self.robot_port)
            self._safety = sdk.Safety(sdk.LeggedType.Go1)
            self._cmd = sdk.LowCmd() if low else sdk.HighCmd()
            self._state = sdk.LowState() if low else sdk.HighState()
            self._udp.InitCmdData(self._cmd)
            self._udp.Recv()
            self._udp.GetRecv(self._state)
        except Exception as e:
            raise DeviceError(f"go1 {self.name!r}: could not open the SDK link to {self.ip}:{self.robot_port}: "
                              f"{type(e).__name__}: {e}") from e
        self._t_state = time.monotonic_ns()
        # start passive: damping at the low level, idle stand at the high level (no jump on connect)
        self._mode, self._mode_t, self._safe = "damp", 0.0, False
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"go1-sdk-{self.name}", daemon=True)
        self._thread.start()

    def _disconnect(self) -> None:
        self.damp_and_sit()
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=2.0)
            self._thread = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sim": False, "level": self.level, "ip": self.ip,
                "supports": (["legged_joints", "stand", "sit", "damp"] if self.level == "low"
                             else ["body_velocity", "stand", "sit", "damp"])}

    # -- commands -----------------------------------------------------------------------------
    def command_joint_positions(self, q: np.ndarray, kp, kd) -> None:
        self._require_connected()
        if self.level != "low":
            raise DeviceError(f"go1 {self.name!r}: joint targets need level='low' (this link is high level)")
        q = np.asarray(q, np.float64).reshape(-1)
        if q.shape != (12,) or not np.all(np.isfinite(q)):
            raise ValueError(f"command_joint_positions needs finite q [12], got shape {q.shape}")
        kp_, kd_ = gc.gains(kp, kd)
        with self._lock:
            self._set_mode("joint")
            self._joint_cmd = gc.JointCommand(np.clip(q, self._limits.lower, self._limits.upper), kp_, kd_)

    def command_body_velocity(self, vx: float, vy: float, yaw_rate: float) -> None:
        self._require_connected()
        if self.level != "high":
            raise DeviceError(f"go1 {self.name!r}: body velocity needs level='high' (the Go1's own gait)")
        v = np.array([vx, vy, yaw_rate], np.float64)
        if not np.all(np.isfinite(v)):
            raise ValueError(f"command_body_velocity needs finite values, got {v.tolist()}")
        with self._lock:
            self._set_mode("velocity")
            self._vel = np.clip(v, -np.array(self.max_body_velocity), np.array(self.max_body_velocity))

    def stand(self) -> None:
        self._require_connected()
        with self._lock:
            if self._mode != "stand":
                self._recovery = gc.RecoveryController()
                self._recovery.start(self._q())
            self._set_mode("stand")

    def sit(self) -> None:
        self._require_connected()
        with self._lock:
            if self._mode != "sit":
                self._interp = gc.PoseInterpolator(self._q(), gc.SIT_Q, self.sit_s, 30.0, 2.0)
            self._set_mode("sit")

    def damp(self) -> None:
        self._require_connected()
        with self._lock:
            self._set_mode("damp")

    def damp_and_sit(self) -> None:
        with self._lock:
            if self._mode != "safe":
                self._set_mode("safe")
                self._interp = None
            self._safe = True
        if self._connected and self._udp is not None:
            try:
                self._send_once()  # the first safe packet goes out now, not at the next loop tick
            except Exception:  # never raise from the safe state; the loop keeps sending it
                log.exception("go1 %s: sending the safe state failed", self.name)

    def reset(self, seed: int | None = None, pose: str = "stand") -> LeggedState:
        """Stand up (``pose="stand"``) or sit (``"sit"``) and wait for it (``seed`` is ignored)."""
        self._require_connected()
        if pose == "sit":
            self.sit()
            wait = self.sit_s
        else:
            self.stand()
            wait = self.stand_s + (self.recovery_wait_s if self.level == "low" else 0.0)
        deadline = time.monotonic() + wait + 0.5
        while time.monotonic() < deadline:
            if pose != "sit" and self.level == "low" and self._recovery.done:
                break
            time.sleep(0.01)
        return self.read_state()

    recovery_wait_s = 3.0

    def read_state(self) -> LeggedState:
        self._require_connected()
        with self._lock:
            st = self._state
            q = np.array([st.motorState[i].q for i in range(12)], np.float64)
            dq = np.array([st.motorState[i].dq for i in range(12)], np.float64)
            tau = np.array([st.motorState[i].tauEst for i in range(12)], np.float64)
            quat = np.array(st.imu.quaternion, np.float64)
            tilt = gc.tilt_from_quat(quat)
            height = float(st.bodyHeight) if self.level == "high" else math.nan
            return LeggedState(q=q, dq=dq, tau=tau, quat=quat, gyro=np.array(st.imu.gyroscope, np.float64),
                               accel=np.array(st.imu.accelerometer, np.float64),
                               foot_force=np.array(st.footForce, np.float64), base_height=height, tilt=tilt,
                               fallen=tilt > self.fall_tilt_rad, mode=self._mode, t_mono_ns=self._t_state,
                               safe=self._safe, extras={})

    # -- the SDK loop -------------------------------------------------------------------------
    def _q(self) -> np.ndarray:
        return np.array([self._state.motorState[i].q for i in range(12)], np.float64)

    def _set_mode(self, mode: str) -> None:
        if mode != self._mode:
            self._mode, self._mode_t = mode, 0.0
        self._safe = False

    def _fill_low(self, dt: float) -> None:
        """The current mode -> LowCmd (lock held)."""
        st, mode = self._state, self._mode
        q = self._q()
        damping = mode == "damp" or (mode == "safe" and self._mode_t < self.damp_s)
        if damping:
            for i in range(12):
                m = self._cmd.motorCmd[i]
                m.q, m.dq, m.Kp, m.Kd, m.tau = POS_STOP_F, VEL_STOP_F, 0.0, self.damp_kd, 0.0
            return
        if mode == "stand":
            dq = np.array([st.motorState[i].dq for i in range(12)], np.float64)
            jc = self._recovery.step(dt, q, dq, np.array(st.imu.quaternion, np.float64))
        elif mode in ("sit", "safe"):
            if self._interp is None:
                self._interp = gc.PoseInterpolator(q, gc.SIT_Q, self.sit_s, 30.0, 2.0)
            jc = self._interp.step(dt)
        else:  # joint
            jc = self._joint_cmd
        for i in range(12):
            m = self._cmd.motorCmd[i]
            m.q, m.dq, m.Kp, m.Kd, m.tau = float(jc.q[i]), 0.0, float(jc.kp[i]), float(jc.kd[i]), 0.0

    def _fill_high(self) -> None:
        c, mode = self._cmd, self._mode
        c.velocity, c.yawSpeed, c.gaitType = [0.0, 0.0], 0.0, 0
        if mode == "velocity":
            c.mode, c.gaitType = HIGH_MODE["walk"], 1
            c.velocity, c.yawSpeed = [float(self._vel[0]), float(self._vel[1])], float(self._vel[2])
        elif mode == "stand":
            c.mode = HIGH_MODE["stand_up"] if self._mode_t < self.stand_s else HIGH_MODE["force_stand"]
        elif mode == "sit":
            c.mode = HIGH_MODE["stand_down"]
        elif mode == "damp":
            c.mode = HIGH_MODE["damping"]
        elif mode == "safe":  # stand down first, then damping (the firmware cannot stand down from damping)
            c.mode = HIGH_MODE["stand_down"] if self._mode_t < self.sit_s else HIGH_MODE["damping"]
        else:
            c.mode = HIGH_MODE["idle"]

    def _send_once(self, dt: float = 0.0) -> None:
        with self._lock:
            if self.level == "low":
                self._fill_low(dt)
                self._safety.PositionLimit(self._cmd)
                self._safety.PowerProtect(self._cmd, self._state, self.power_level)
            else:
                self._fill_high()
            self._udp.SetSend(self._cmd)
            self._udp.Send()

    def _run(self) -> None:
        period = 1.0 / self.loop_hz
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                with self._lock:
                    self._udp.Recv()
                    self._udp.GetRecv(self._state)
                    self._t_state = time.monotonic_ns()
                    self._send_once(period)
                    self._mode_t += period
            except Exception as e:  # surfaced by loop_error and the log; the robot's own timeout damps it
                self.loop_error = e
                log.exception("go1 %s: SDK loop failed", self.name)
                return
            next_t += period
            wait = next_t - time.monotonic()
            if wait > 0:
                self._stop.wait(wait)
            else:
                next_t = time.monotonic()
