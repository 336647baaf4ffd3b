"""Small typed device interfaces shared by real drivers and simulators.

Every device has an explicit lifecycle (LeRobot / deoxys style): construct -> ``connect()``
-> use -> ``disconnect()``, or use it as a context manager. Calling a method that needs the
device while it is disconnected raises :class:`NotConnectedError`. Descriptions
(``num_joints``, image sizes, limits) are usable while disconnected.

Nothing in ``hardware/`` imports torch. Safety limits (workspace box, max step) are enforced
by the bridge server in ``robot_io`` right next to these drivers; the drivers enforce only
what the hardware itself needs (joint ranges).
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import Any

import numpy as np


class DeviceError(RuntimeError):
    """A device failed or refused an operation; the message says which and why."""


class NotConnectedError(DeviceError):
    """A method that needs the device was called before ``connect()`` or after ``disconnect()``."""


class Device(abc.ABC):
    """Base class: lifecycle and context manager."""

    kind: str = "device"

    def __init__(self, name: str = "") -> None:
        self.name = name or type(self).__name__
        self._connected = False

    @property
    def is_connected(self) -> bool:
        return self._connected

    def connect(self) -> None:
        if self._connected:
            return
        self._connect()
        self._connected = True

    def disconnect(self) -> None:
        if not self._connected:
            return
        try:
            self._disconnect()
        finally:
            self._connected = False

    def _require_connected(self) -> None:
        if not self._connected:
            raise NotConnectedError(f"{self.kind} {self.name!r} is not connected: call connect() first")

    @abc.abstractmethod
    def _connect(self) -> None: ...

    @abc.abstractmethod
    def _disconnect(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        """A msgpack-able description of the device (works while disconnected)."""
        return {"kind": self.kind, "name": self.name, "driver": type(self).__name__}

    def __enter__(self):
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.disconnect()


# --------------------------------------------------------------------------------------------
# Arm
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ArmState:
    """Measured state of an arm. Quaternions are (w, x, y, z); positions in metres, base frame."""

    q: np.ndarray  # [J] float64 joint positions, rad
    dq: np.ndarray  # [J] float64 joint velocities, rad/s
    ee_pos: np.ndarray  # [3] end-effector (TCP) position
    ee_quat: np.ndarray  # [4] end-effector orientation (w, x, y, z)
    gripper: float  # opening in [0, 1]: 0 closed, 1 fully open
    t_mono_ns: int  # time.monotonic_ns() when the state was measured
    safe: bool = False  # True while the device is in its safe state (holding after a watchdog trip / stop)
    extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """Optional extra arrays (a simulator adds privileged object poses here, e.g. ``objects`` [N, 7])."""


@dataclasses.dataclass(frozen=True)
class JointLimits:
    lower: np.ndarray  # [J] rad
    upper: np.ndarray  # [J] rad
    velocity: np.ndarray  # [J] rad/s


class Arm(Device):
    """A position-controlled arm with a parallel gripper.

    Commands set *targets*; the driver's own controller tracks them (franky / libfranka on the
    real arm, an IK + joint-position controller in simulation). A target is held until the next
    command. ``hold()`` is the safe state: stop where you are and keep the current pose.
    """

    kind = "arm"
    num_joints: int = 7

    @property
    @abc.abstractmethod
    def joint_limits(self) -> JointLimits: ...

    @abc.abstractmethod
    def read_state(self) -> ArmState: ...

    @abc.abstractmethod
    def command_ee_pose(self, pos: np.ndarray, quat: np.ndarray, gripper: float | None = None) -> None:
        """Move the end effector towards the absolute pose (pos [3], quat [4] wxyz, base frame)."""

    @abc.abstractmethod
    def command_joint_positions(self, q: np.ndarray, gripper: float | None = None) -> None:
        """Move the joints towards ``q`` [J] (already inside joint limits)."""

    @abc.abstractmethod
    def hold(self) -> None:
        """Safe state: stop motion and hold the current pose. Must be fast and must not raise on a
        healthy device; it is called from the watchdog."""

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> ArmState:
        """Go to the home pose (a simulator also re-randomises its scene from ``seed``)."""

    def describe(self) -> dict[str, Any]:
        lim = self.joint_limits
        return {
            **super().describe(),
            "num_joints": self.num_joints,
            "joint_lower": lim.lower.tolist(),
            "joint_upper": lim.upper.tolist(),
            "joint_velocity": lim.velocity.tolist(),
        }


# --------------------------------------------------------------------------------------------
# Legged (quadruped)
# --------------------------------------------------------------------------------------------


LEGGED_MODES = ("joint", "velocity", "stand", "sit", "damp", "safe")
"""What a legged robot's own controller is doing (``LeggedState.mode``): tracking the client's
joint targets, walking at the client's body velocity, standing up / holding the stand posture
(the recovery controller), sitting down, damping (no position control, joints resist motion), or
its safe state (damping, then the sit posture)."""


@dataclasses.dataclass
class LeggedState:
    """Measured state of a quadruped. Joints in the Unitree order FR, FL, RR, RL x (hip, thigh,
    calf). IMU quantities in the trunk (IMU) frame; the quaternion is (w, x, y, z), world from trunk."""

    q: np.ndarray  # [12] float64 joint positions, rad
    dq: np.ndarray  # [12] float64 joint velocities, rad/s
    tau: np.ndarray  # [12] float64 estimated joint torques, N m
    quat: np.ndarray  # [4] trunk orientation (w, x, y, z)
    gyro: np.ndarray  # [3] angular velocity, rad/s, trunk frame
    accel: np.ndarray  # [3] linear acceleration (specific force, gravity included), m/s^2, trunk frame
    foot_force: np.ndarray  # [4] foot contact force, N (FR, FL, RR, RL)
    base_height: float  # trunk height above the floor, m (NaN where the robot cannot measure it)
    tilt: float  # angle between the trunk's up axis and the vertical, rad (from quat)
    fallen: bool  # a fall is detected (tilt / height limits; in simulation also trunk-floor contact)
    mode: str  # one of LEGGED_MODES
    t_mono_ns: int  # time.monotonic_ns() when the state was measured
    safe: bool = False  # True while in the safe state (after a watchdog trip / stop) until the next command
    extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """Optional extra arrays (a simulator adds privileged ones: ``base_pos``, ``base_lin_vel``, ``sim_time``)."""


class Legged(Device):
    """A quadruped with 12 position-controlled joints (Unitree Go1 class).

    Commands set *targets* that the robot's own control loop tracks until the next command:

    * ``command_joint_positions(q, kp, kd)``: joint targets [12] with PD gains (scalars or [12]):
      torque = kp (q - q_meas) - kd dq_meas, clipped to the motors' torque limits.
    * ``command_body_velocity(vx, vy, yaw_rate)``: walk (m/s forward, m/s left, rad/s
      counter-clockwise, trunk frame) with the robot's gait controller.
    * ``stand()``: the deterministic recovery / stand-up controller, then hold the stand posture.
    * ``sit()``: lower into the sit posture. ``damp()``: damping mode (kp = 0, joints resist motion).
    * ``damp_and_sit()`` is the safe state: damping first (a walking robot settles without a jolt),
      then the sit posture. It must be fast and must not raise on a healthy device; the watchdog
      calls it.
    """

    kind = "legged"
    num_joints: int = 12
    joint_names: tuple[str, ...] = ()
    max_body_velocity: tuple[float, float, float] = (1.0, 0.5, 1.5)
    """Largest |vx| (m/s), |vy| (m/s), |yaw_rate| (rad/s) the gait accepts."""
    max_gains: tuple[float, float] = (100.0, 5.0)
    """Largest kp (N m / rad) and kd (N m s / rad) a joint command may ask for."""

    @property
    @abc.abstractmethod
    def joint_limits(self) -> JointLimits: ...

    @abc.abstractmethod
    def read_state(self) -> LeggedState: ...

    @abc.abstractmethod
    def command_joint_positions(self, q: np.ndarray, kp, kd) -> None:
        """Track joint targets ``q`` [12] (already inside the joint ranges) with gains ``kp``, ``kd``."""

    @abc.abstractmethod
    def command_body_velocity(self, vx: float, vy: float, yaw_rate: float) -> None:
        """Walk at this body velocity (already inside ``max_body_velocity``)."""

    @abc.abstractmethod
    def stand(self) -> None:
        """Stand up (from sitting or a mildly perturbed stance) and hold the stand posture."""

    @abc.abstractmethod
    def sit(self) -> None:
        """Lower into the sit posture and hold it."""

    @abc.abstractmethod
    def damp(self) -> None:
        """Damping mode: no position control, every joint resists motion."""

    @abc.abstractmethod
    def damp_and_sit(self) -> None:
        """Safe state: damp, then sit. Fast; never raises on a healthy device."""

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> LeggedState:
        """Stand at the start pose (a simulator also resets its world, randomised from ``seed``)."""

    def describe(self) -> dict[str, Any]:
        lim = self.joint_limits
        return {
            **super().describe(),
            "num_joints": self.num_joints,
            "joint_names": list(self.joint_names),
            "joint_lower": lim.lower.tolist(),
            "joint_upper": lim.upper.tolist(),
            "joint_velocity": lim.velocity.tolist(),
            "max_body_velocity": list(self.max_body_velocity),
            "max_gains": list(self.max_gains),
            "modes": list(LEGGED_MODES),
        }


# --------------------------------------------------------------------------------------------
# Camera
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class CameraFrame:
    rgb: np.ndarray  # [H, W, 3] uint8
    t_mono_ns: int  # capture time, time.monotonic_ns() clock
    index: int  # frame counter since connect()
    depth: np.ndarray | None = None  # [H, W] float32 metres, or None


class Camera(Device):
    """A camera producing RGB (and optionally depth) frames at a nominal rate."""

    kind = "camera"

    def __init__(self, name: str = "", width: int = 640, height: int = 480, fps: float = 30.0,
                 depth: bool = False) -> None:
        super().__init__(name)
        if width <= 0 or height <= 0:
            raise ValueError(f"camera {name!r}: width and height must be positive, got {width}x{height}")
        if fps <= 0:
            raise ValueError(f"camera {name!r}: fps must be positive, got {fps}")
        self.width, self.height, self.fps, self.has_depth = int(width), int(height), float(fps), bool(depth)
        self._next_t = time.monotonic()
        self._K: np.ndarray | None = None
        self._dist: np.ndarray | None = None

    # -- calibration ----------------------------------------------------------------------------
    def set_intrinsics(self, K, dist, image_size: tuple[int, int]) -> None:
        """Load this camera's calibration (``vla calibrate intrinsics``; the bridge does it from the
        site's ``calibration`` file): ``K`` [3, 3], OpenCV distortion ``dist`` [4..14], made at
        ``image_size`` (width, height), which must be the size this camera delivers."""
        K = np.asarray(K, np.float64)
        dist = np.asarray(dist, np.float64).reshape(-1)
        if K.shape != (3, 3) or not np.all(np.isfinite(K)) or not (K[0, 0] > 0 and K[1, 1] > 0):
            raise ValueError(f"camera {self.name!r}: K must be a finite 3x3 matrix with fx, fy > 0")
        if dist.size not in (4, 5, 8, 12, 14) or not np.all(np.isfinite(dist)):
            raise ValueError(f"camera {self.name!r}: dist must hold 4, 5, 8, 12 or 14 finite numbers, got {dist.size}")
        w, h = (int(v) for v in image_size)
        if (w, h) != (self.width, self.height):
            raise ValueError(f"camera {self.name!r}: the calibration was made at {w}x{h} but the camera delivers "
                             f"{self.width}x{self.height}; calibrate it at this size (`vla calibrate intrinsics`)")
        self._K, self._dist = K, dist

    @property
    def K(self) -> np.ndarray | None:
        """The calibrated pinhole matrix [3, 3], or None before ``set_intrinsics``."""
        return None if self._K is None else self._K.copy()

    @property
    def dist(self) -> np.ndarray | None:
        """The calibrated OpenCV distortion coefficients, or None before ``set_intrinsics``."""
        return None if self._dist is None else self._dist.copy()

    def _restart_pacing(self) -> None:
        """The next ``_pace()`` returns at once (call on connect / restart of playback)."""
        self._next_t = time.monotonic()

    def _pace(self, timeout_s: float, detail: str = "") -> None:
        """Sleep until the next frame time on a fixed ``fps`` schedule. A reader that fell behind
        by more than a period skips ahead (frames are dropped, as a real camera drops them) rather
        than bursting to catch up. Raises DeviceError when the next frame is further than
        ``timeout_s`` away."""
        wait = self._next_t - time.monotonic()
        if wait > timeout_s:
            raise DeviceError(f"camera {self.name!r}: no frame within {timeout_s:.3f} s{detail}")
        if wait > 0:
            time.sleep(wait)
        period = 1.0 / self.fps
        self._next_t = max(self._next_t + period, time.monotonic() - period)

    @abc.abstractmethod
    def read(self, timeout_s: float = 1.0) -> CameraFrame:
        """Block until the next frame (paced at ``fps``) and return it; raise DeviceError on timeout."""

    def describe(self) -> dict[str, Any]:
        d = {**super().describe(), "width": self.width, "height": self.height, "fps": self.fps,
             "depth": self.has_depth}
        if self._K is not None:
            d["intrinsics"] = {"K": self._K.tolist(), "dist": self._dist.tolist()}
        return d


# --------------------------------------------------------------------------------------------
# KeyPresser (the keyboard rig's microcontroller)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KeyAck:
    """The microcontroller's answer to one command."""

    seq: int  # the command's sequence number
    mcu_t_us: int  # the microcontroller's clock (microseconds, wrapping at 2**32) when it applied the command
    rtt_ns: int  # host send -> ack received, time.monotonic_ns() clock
    held: int  # how many keys the microcontroller holds afterwards


class KeyPresser(Device):
    """A keyboard that software presses: a microcontroller that is a USB keyboard to another host.

    Keys are named (``key_names``: "A", "SPACE", "LEFT_ARROW", ...). Each command returns the
    microcontroller's :class:`KeyAck`. ``release_all()`` is the safe state: it must be fast and
    must not raise on a healthy device; the microcontroller also releases every key by itself
    when the host's heartbeats stop.
    """

    kind = "keyboard"
    key_names: tuple[str, ...] = ()
    max_keys: int = 6  # keys held at once (a HID boot keyboard reports 6)

    @abc.abstractmethod
    def press(self, keys) -> KeyAck:
        """Press and hold ``keys`` (a name or a list of names) until released."""

    @abc.abstractmethod
    def release(self, keys) -> KeyAck:
        """Release ``keys``."""

    @abc.abstractmethod
    def tap(self, keys, hold_ms: int = 30) -> KeyAck:
        """Press ``keys`` and release them ``hold_ms`` later (timed by the microcontroller)."""

    @abc.abstractmethod
    def release_all(self) -> KeyAck:
        """Release every key (the safe state)."""

    @property
    @abc.abstractmethod
    def pressed(self) -> frozenset[str]:
        """The keys held by ``press`` and not released, as acknowledged by the microcontroller."""

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "keys": list(self.key_names), "max_keys": self.max_keys}


# --------------------------------------------------------------------------------------------
# Screen (the keyboard rig's host: a game shown on a monitor in real time)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScreenFrame:
    """One frame the screen displayed, and the game's state when it was displayed."""

    rgb: np.ndarray  # [H, W, 3] uint8, read-only (the game's own frame, e.g. ALE's 210 x 160)
    index: int  # frames displayed since connect() (the screen ticks at ``fps`` whether or not keys change)
    t_mono_ns: int  # when it was displayed, time.monotonic_ns() clock
    game: str  # the game (or test pattern) shown
    score: int  # the episode's return so far
    reward: int  # reward of this frame
    lives: int
    episode_over: bool  # the game ended on or before this frame (it stays over until a reset)
    episode: int  # episodes started since connect() (the first is 0)
    keys: frozenset  # the keys held when this frame was computed
    action: str  # the action they mapped to (e.g. "RIGHTFIRE")


class Screen(Device):
    """A game that runs in real time on a host screen and takes keyboard input (kind ``screen``).

    The screen ticks at ``fps`` on its own thread: it never waits for whoever plays. Keys come in
    through :meth:`set_keys` (the keys held now, e.g. from a microcontroller's HID reports); each
    tick maps the held keys to a game action. ``latest()`` is the frame shown now,
    ``frame_at(t)`` the one shown at an earlier instant (what a camera with latency films),
    ``wait_frame(i)`` blocks until a frame newer than index ``i`` is shown. ``reset(seed, game)``
    restarts the game (another game, or a test pattern, when ``game`` names one).
    """

    kind = "screen"
    fps: float = 60.0
    games: tuple[str, ...] = ()

    @abc.abstractmethod
    def set_keys(self, keys) -> None:
        """The keys held now (names, as ``KeyPresser.key_names``); applied from the next tick."""

    @abc.abstractmethod
    def reset(self, seed: int | None = None, game: str | None = None) -> ScreenFrame:
        """Restart the game (``game``: switch to another of ``games`` first); returns its first frame."""

    @abc.abstractmethod
    def latest(self) -> ScreenFrame:
        """The frame displayed now."""

    @abc.abstractmethod
    def frame_at(self, t_mono_ns: int) -> ScreenFrame | None:
        """The frame that was on the screen at ``t_mono_ns`` (None before the first one, or older
        than the screen remembers)."""

    @abc.abstractmethod
    def wait_frame(self, after_index: int, timeout_s: float = 1.0) -> ScreenFrame:
        """Block until a frame with an index above ``after_index`` is displayed and return the newest;
        DeviceError on timeout."""
