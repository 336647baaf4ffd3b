"""Real Franka Panda / FR3 arm over franky (libfranka), behind the same ``Arm`` interface as the sim.

Command mapping (the same commands the simulator takes):

- ``command_ee_pose(pos, quat_wxyz, gripper)`` -> an *asynchronous* absolute ``CartesianMotion``
  to ``Affine(pos, quat_xyzw)``. franky's ``Affine`` takes and returns quaternions in
  **(x, y, z, w)** order; our interface uses (w, x, y, z), so we reorder on the way in and out.
  The pose is that of franky's configured end-effector frame (the TCP set in Desk, e.g. the
  Franka Hand's fingertip centre), in the robot base frame.
- ``command_joint_positions(q, gripper)`` -> an asynchronous absolute ``JointMotion``.
- Both motions use ``return_when_finished=False``: the robot keeps tracking the last target until
  the next command replaces it (franky pre-empts a running asynchronous motion of the same
  control type). Switching between Cartesian and joint commands first brings the running motion
  to rest with a stop motion, because franky refuses a new motion of a different control type
  while one runs.
- ``gripper`` opening in [0, 1] -> width ``opening * max_width`` metres, only when it differs from
  the last sent width by more than ``gripper_deadband`` (a fraction of the full range). The
  blocking gripper calls run on a small gripper thread, one at a time, latest target wins, so a
  command never waits for the fingers: ``move`` when opening, ``grasp`` with ``gripper_force``
  when closing (an object in the way is then held instead of failing the move). A failed gripper
  call is logged and raised as DeviceError by the next command.
- ``hold()`` (the watchdog's safe state) -> a stop motion of the running control type (smooth,
  dynamics-limited deceleration), falling back to ``robot.stop()``; the arm then rests where it
  stopped. The gripper is left as it is (an object in hand stays held). Never raises.
- ``reset()`` -> recover from errors if the robot reports any, then a joint motion to ``home_q``,
  waited for (interruptible by ``hold()``).

franky is imported inside ``connect()``, so this module imports without it; a test can pass a fake
module as ``franky_module=``. Every franky exception is re-raised as :class:`DeviceError` carrying
the original message.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from types import ModuleType
from typing import Any

import numpy as np

from hardware.base import Arm, ArmState, DeviceError, JointLimits

log = logging.getLogger(__name__)

FRANKA_READY_Q = (0.0, -np.pi / 4, 0.0, -3 * np.pi / 4, 0.0, np.pi / 2, np.pi / 4)
"""The standard Franka "ready" pose (the libfranka examples' home), rad."""

# Joint position / velocity limits from the Franka datasheets (rad, rad/s).
_LIMITS = {
    "panda": JointLimits(
        lower=np.array([-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973]),
        upper=np.array([2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973]),
        velocity=np.array([2.1750, 2.1750, 2.1750, 2.1750, 2.6100, 2.6100, 2.6100]),
    ),
    "fr3": JointLimits(
        lower=np.array([-2.7437, -1.7837, -2.9007, -3.0421, -2.8065, 0.5445, -3.0159]),
        upper=np.array([2.7437, 1.7837, 2.9007, -0.1518, 2.8065, 4.5169, 3.0159]),
        velocity=np.array([2.62, 2.62, 2.62, 2.62, 5.26, 4.18, 5.26]),
    ),
}

INSTALL_HINT = "pip install 'vla-stack[franka]'"


class FrankyArm(Arm):
    """A Franka Panda / FR3 with a Franka Hand, driven through franky.

    Args:
        fci_ip: The robot's FCI address (from the site file; never hard-coded).
        name: Device name used in messages and ``describe()``.
        model: ``"panda"`` or ``"fr3"``; selects the joint limits.
        dynamics_factor: franky's global relative dynamics factor in (0, 1]: scales the maximum
            velocity, acceleration and jerk of every motion. Start low (0.05-0.2) on a new setup.
        gripper_speed: Finger speed, m/s.
        gripper_force: Grasping force when closing, N.
        gripper_deadband: Minimum change of the commanded opening (fraction of the full range)
            before a new gripper command is sent.
        home_q: Joint positions ``reset()`` moves to (rad); default the Franka ready pose.
        use_gripper: False for an arm without a Franka Hand (gripper reads as 0, commands ignored).
        home_gripper_on_connect: Run the gripper's homing (calibrates ``max_width``) on connect.
        reset_timeout_s: Longest ``reset()`` waits for the home motion.
        franky_module: Use this module instead of importing ``franky`` (tests pass a fake).
    """

    num_joints = 7

    def __init__(self, fci_ip: str, name: str = "franka", model: str = "panda", dynamics_factor: float = 0.1,
                 gripper_speed: float = 0.1, gripper_force: float = 20.0, gripper_deadband: float = 0.05,
                 home_q: np.ndarray | list[float] | tuple[float, ...] = FRANKA_READY_Q, use_gripper: bool = True,
                 home_gripper_on_connect: bool = False, reset_timeout_s: float = 30.0,
                 franky_module: ModuleType | Any | None = None) -> None:
        super().__init__(name)
        if not fci_ip or not isinstance(fci_ip, str):
            raise ValueError(f"arm {name!r}: fci_ip must be the robot's FCI address from the site file, got {fci_ip!r}")
        if model not in _LIMITS:
            raise ValueError(f"arm {name!r}: model must be one of {sorted(_LIMITS)}, got {model!r}")
        if not 0.0 < dynamics_factor <= 1.0:
            raise ValueError(f"arm {name!r}: dynamics_factor must be in (0, 1], got {dynamics_factor}")
        if gripper_speed <= 0 or gripper_force <= 0:
            raise ValueError(f"arm {name!r}: gripper_speed and gripper_force must be positive, "
                             f"got {gripper_speed} m/s and {gripper_force} N")
        if not 0.0 <= gripper_deadband < 1.0:
            raise ValueError(f"arm {name!r}: gripper_deadband must be in [0, 1), got {gripper_deadband}")
        home = np.asarray(home_q, dtype=np.float64)
        lim = _LIMITS[model]
        if home.shape != (7,) or not np.all(np.isfinite(home)):
            raise ValueError(f"arm {name!r}: home_q must be 7 finite joint positions, got {home_q!r}")
        if np.any(home < lim.lower) or np.any(home > lim.upper):
            raise ValueError(f"arm {name!r}: home_q {home.tolist()} is outside the {model} joint limits")
        self.fci_ip = fci_ip
        self.model = model
        self.dynamics_factor = float(dynamics_factor)
        self.gripper_speed = float(gripper_speed)
        self.gripper_force = float(gripper_force)
        self.gripper_deadband = float(gripper_deadband)
        self.home_q = home
        self.use_gripper = bool(use_gripper)
        self.home_gripper_on_connect = bool(home_gripper_on_connect)
        self.reset_timeout_s = float(reset_timeout_s)
        self._franky_module = franky_module

        self._fr: Any = None  # the franky module in use
        self._errors: tuple[type[BaseException], ...] = ()
        self._robot: Any = None
        self._gripper: Any = None
        self._max_width = 0.0
        self._last_width: float | None = None  # last gripper width sent, m
        self._motion_kind: str | None = None  # "cartesian" | "joint": control type of the last motion sent
        self._safe = False
        self._lock = threading.RLock()
        # gripper thread: a latest-only target slot guarded by a condition variable
        self._gripper_cv = threading.Condition()
        self._gripper_target: tuple[float, bool] | None = None  # (width m, grasp?)
        self._gripper_busy = False
        self._gripper_quit = False
        self._gripper_error: BaseException | None = None
        self._gripper_thread: threading.Thread | None = None

    # ----------------------------------------------------------------------------------------
    # lifecycle
    # ----------------------------------------------------------------------------------------

    @property
    def joint_limits(self) -> JointLimits:
        return _LIMITS[self.model]

    def _connect(self) -> None:
        fr = self._franky_module
        if fr is None:
            try:
                fr = importlib.import_module("franky")
            except ImportError as e:
                raise DeviceError(f"arm {self.name!r}: the franky library is not installed ({e}); "
                                  f"install it with: {INSTALL_HINT}") from e
        self._fr = fr
        self._errors = tuple(v for v in vars(fr).values() if isinstance(v, type) and issubclass(v, BaseException))
        with self._franky_errors("connect to the robot"):
            robot = fr.Robot(self.fci_ip)
            robot.relative_dynamics_factor = self.dynamics_factor
            if robot.has_errors:
                log.warning("arm %r: robot reports errors on connect; running automatic recovery", self.name)
                robot.recover_from_errors()
        gripper, max_width = None, 0.0
        if self.use_gripper:
            with self._franky_errors("connect to the gripper"):
                gripper = fr.Gripper(self.fci_ip)
                if self.home_gripper_on_connect:
                    gripper.homing()
                max_width = float(gripper.max_width)
            if not max_width > 0:
                raise DeviceError(f"arm {self.name!r}: the gripper reports max_width={max_width} m; home it "
                                  f"(home_gripper_on_connect=True, or Desk) before use")
        self._robot, self._gripper, self._max_width = robot, gripper, max_width
        self._last_width = None
        self._motion_kind = None
        self._safe = False
        if gripper is not None:
            self._gripper_target, self._gripper_busy, self._gripper_quit, self._gripper_error = None, False, False, None
            self._gripper_thread = threading.Thread(target=self._gripper_loop, args=(gripper,),
                                                    name=f"{self.name}-gripper", daemon=True)
            self._gripper_thread.start()

    def _disconnect(self) -> None:
        self.hold()
        if self._gripper_thread is not None:
            with self._gripper_cv:
                self._gripper_quit = True
                self._gripper_target = None
                self._gripper_cv.notify_all()
            self._gripper_thread.join(timeout=5.0)  # a running gripper call finishes first
            if self._gripper_thread.is_alive():
                log.warning("arm %r: the gripper thread is still in a gripper call; leaving it", self.name)
            self._gripper_thread = None
        self._robot = None  # franky closes the connections when the objects go
        self._gripper = None

    # ----------------------------------------------------------------------------------------
    # state
    # ----------------------------------------------------------------------------------------

    def read_state(self) -> ArmState:
        self._require_connected()
        with self._franky_errors("read the robot state"):
            st = self._robot.state  # one consistent snapshot of q, dq and O_T_EE
            q = np.asarray(st.q, dtype=np.float64).reshape(7)
            dq = np.asarray(st.dq, dtype=np.float64).reshape(7)
            ee = st.O_T_EE
            pos = np.asarray(ee.translation, dtype=np.float64).reshape(3)
            xyzw = np.asarray(ee.quaternion, dtype=np.float64).reshape(4)
            opening = 0.0
            if self._gripper is not None:
                opening = float(np.clip(float(self._gripper.width) / self._max_width, 0.0, 1.0))
        t = time.monotonic_ns()
        return ArmState(q=q, dq=dq, ee_pos=pos, ee_quat=xyzw[[3, 0, 1, 2]].copy(), gripper=opening,
                        t_mono_ns=t, safe=self._safe)

    # ----------------------------------------------------------------------------------------
    # commands
    # ----------------------------------------------------------------------------------------

    def command_ee_pose(self, pos: np.ndarray, quat: np.ndarray, gripper: float | None = None) -> None:
        self._require_connected()
        pos = np.asarray(pos, dtype=np.float64).reshape(-1)
        quat = np.asarray(quat, dtype=np.float64).reshape(-1)
        if pos.shape != (3,) or not np.all(np.isfinite(pos)):
            raise ValueError(f"arm {self.name!r}: pos must be 3 finite numbers, got {pos.tolist()}")
        norm = float(np.linalg.norm(quat)) if quat.shape == (4,) else 0.0
        if not np.isfinite(norm) or norm < 1e-6:
            raise ValueError(f"arm {self.name!r}: quat must be 4 finite numbers (w, x, y, z) with a non-zero norm, "
                             f"got {quat.tolist()}")
        xyzw = (quat / norm)[[1, 2, 3, 0]]  # ours (w, x, y, z) -> franky (x, y, z, w)
        fr = self._fr
        with self._lock, self._franky_errors("start a Cartesian motion"):
            motion = fr.CartesianMotion(fr.Affine(pos, xyzw), fr.ReferenceType.Absolute,
                                        return_when_finished=False)
            self._start_motion("cartesian", motion)
            self._command_gripper(gripper)

    def command_joint_positions(self, q: np.ndarray, gripper: float | None = None) -> None:
        self._require_connected()
        q = np.asarray(q, dtype=np.float64).reshape(-1)
        if q.shape != (7,) or not np.all(np.isfinite(q)):
            raise ValueError(f"arm {self.name!r}: q must be 7 finite joint positions, got {q.tolist()}")
        lim = self.joint_limits
        q = np.clip(q, lim.lower, lim.upper)  # the hardware's own joint ranges (a reflex otherwise)
        fr = self._fr
        with self._lock, self._franky_errors("start a joint motion"):
            motion = fr.JointMotion(fr.JointState(q), fr.ReferenceType.Absolute, return_when_finished=False)
            self._start_motion("joint", motion)
            self._command_gripper(gripper)

    def hold(self) -> None:
        if not self._connected or self._robot is None:
            self._safe = True
            return
        # The lock is held briefly: commands only start motions (a control-type switch waits for one
        # stop motion); reset() waits for its motion outside it.
        with self._lock:
            was_safe, self._safe = self._safe, True  # a reset() waiting on its motion sees this and gives up
            kind = self._motion_kind
            if kind is None or was_safe:
                return  # nothing of ours running, or already stopped and nothing commanded since
            try:
                self._robot.move(self._stop_motion(kind), asynchronous=True)
                return
            except Exception as e:  # noqa: BLE001 -- hold() must not raise; fall back to a hard stop
                log.error("arm %r: stop motion failed during hold(): %s: %s; calling robot.stop()",
                          self.name, type(e).__name__, e)
            try:
                self._robot.stop()
            except Exception as e:  # noqa: BLE001
                log.error("arm %r: robot.stop() failed during hold(): %s: %s", self.name, type(e).__name__, e)

    def reset(self, seed: int | None = None) -> ArmState:
        """Recover from errors if any, then move to ``home_q`` and wait; ``seed`` is unused on hardware."""
        self._require_connected()
        fr = self._fr
        with self._lock, self._franky_errors("start the move home"):
            if self._robot.has_errors:
                log.warning("arm %r: robot reports errors; running automatic recovery before reset", self.name)
                if not self._robot.recover_from_errors():
                    raise DeviceError(f"arm {self.name!r}: automatic error recovery failed; check the robot "
                                      f"(Desk, user stop) and reset again")
            self._gripper_error = None  # reset is the recovery path: a stale gripper failure was logged already
            motion = fr.JointMotion(fr.JointState(self.home_q), fr.ReferenceType.Absolute,
                                    return_when_finished=True)
            self._start_motion("joint", motion)
            self._command_gripper(1.0)  # open, as the simulator's reset does
        # Wait outside the lock so the watchdog's hold() can interrupt the move home.
        deadline = time.monotonic() + self.reset_timeout_s
        while True:
            if self._safe:
                raise DeviceError(f"arm {self.name!r}: reset interrupted by hold()")
            with self._franky_errors("move home"):
                if self._robot.join_motion(0.05):
                    break
            if time.monotonic() > deadline:
                self.hold()
                raise DeviceError(f"arm {self.name!r}: the move home did not finish within {self.reset_timeout_s} s")
        with self._lock:
            self._motion_kind = None  # finished: nothing running any more
        if not self.wait_gripper(5.0):
            log.warning("arm %r: the gripper did not finish opening within 5 s of reaching home", self.name)
        return self.read_state()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "fci_ip": self.fci_ip, "model": self.model,
                "dynamics_factor": self.dynamics_factor, "gripper": self.use_gripper,
                "home_q": self.home_q.tolist()}

    # ----------------------------------------------------------------------------------------
    # helpers
    # ----------------------------------------------------------------------------------------

    def _start_motion(self, kind: str, motion: Any) -> None:
        """Send ``motion`` asynchronously; bring a running motion of the other control type to rest first."""
        if self._motion_kind is not None and self._motion_kind != kind and self._robot.poll_motion():
            self._robot.move(self._stop_motion(self._motion_kind), asynchronous=False)
        self._robot.move(motion, asynchronous=True)
        self._motion_kind = kind
        self._safe = False

    def _stop_motion(self, kind: str) -> Any:
        return self._fr.CartesianStopMotion() if kind == "cartesian" else self._fr.JointStopMotion()

    def _command_gripper(self, opening: float | None) -> None:
        """Queue a gripper target for the gripper thread (latest wins); never blocks on the gripper."""
        if opening is None or self._gripper is None:
            return
        opening = float(opening)
        if not np.isfinite(opening):
            raise ValueError(f"arm {self.name!r}: gripper opening must be finite, got {opening}")
        err, self._gripper_error = self._gripper_error, None
        if err is not None:
            raise DeviceError(f"arm {self.name!r}: the last gripper command failed: "
                              f"{type(err).__name__}: {err}") from err
        width = float(np.clip(opening, 0.0, 1.0)) * self._max_width
        last = self._last_width
        if last is not None and abs(width - last) <= self.gripper_deadband * self._max_width:
            return
        # Closing grasps, so an object in the way is held with gripper_force instead of failing a move.
        grasp = last is not None and width < last
        with self._gripper_cv:
            self._gripper_target = (width, grasp)
            self._gripper_cv.notify()
        self._last_width = width

    def wait_gripper(self, timeout_s: float = 5.0) -> bool:
        """Wait until the gripper thread has finished every queued command; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._gripper_cv:
            while self._gripper_target is not None or self._gripper_busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._gripper_cv.wait(left)
        return True

    def _gripper_loop(self, gripper: Any) -> None:
        """Runs the blocking gripper calls one at a time, always the latest target, off the control path."""
        while True:
            with self._gripper_cv:
                while self._gripper_target is None and not self._gripper_quit:
                    self._gripper_cv.wait()
                if self._gripper_quit:
                    return
                (width, grasp), self._gripper_target = self._gripper_target, None
                self._gripper_busy = True
            try:
                if grasp:
                    gripper.grasp(width, self.gripper_speed, self.gripper_force, epsilon_inner=1.0, epsilon_outer=1.0)
                else:
                    gripper.move(width, self.gripper_speed)
            except Exception as e:  # noqa: BLE001 -- kept and raised (as DeviceError) by the next command
                log.error("arm %r: gripper command to %.4f m failed: %s: %s", self.name, width, type(e).__name__, e)
                self._gripper_error = e
            finally:
                with self._gripper_cv:
                    self._gripper_busy = False
                    self._gripper_cv.notify_all()

    def _franky_errors(self, what: str):
        return _Translate(self, what)


class _Translate:
    """Context manager: a franky exception becomes a DeviceError naming the arm, the step and the message."""

    def __init__(self, arm: FrankyArm, what: str) -> None:
        self.arm, self.what = arm, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and self.arm._errors and isinstance(exc, self.arm._errors):
            raise DeviceError(f"arm {self.arm.name!r} ({self.arm.fci_ip}): could not {self.what}: "
                              f"{exc_type.__name__}: {exc}") from exc
        return False
