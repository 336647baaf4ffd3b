"""A fake of the part of the ``franky`` API that ``hardware.franka_franky`` uses.

Pass the module itself as ``FrankyArm(..., franky_module=fake_franky)``. The fake records every
motion and gripper call and moves its state straight to the last target, so a test can check the
mapping from our commands to franky's calls. Names mirror the real franky 2.x (a test checks that
every public name here exists on the real module when it is installed); test controls are
instance attributes (``calls``, ``fail_next``, ...) so they never look like API.

Real franky behaviours imitated: ``Affine`` takes quaternions in (x, y, z, w) order; a motion of a
different control type while an asynchronous one runs raises ``InvalidMotionTypeException``;
errors of a running motion surface from the next ``move`` / ``poll_motion`` / ``join_motion``.
"""

from __future__ import annotations

import builtins
import time
from typing import Any

import numpy as np

READY_Q = np.array([0.0, -np.pi / 4, 0.0, -3 * np.pi / 4, 0.0, np.pi / 2, np.pi / 4])


# ------------------------------------------------------------------------------------------------
# exceptions (same names and hierarchy as franky: libfranka's under ``Exception``)
# ------------------------------------------------------------------------------------------------


class Exception(builtins.Exception):  # noqa: A001 -- franky's own name for libfranka's base exception
    pass


class ControlException(Exception):
    pass


class CommandException(Exception):
    pass


class NetworkException(Exception):
    pass


class InvalidMotionTypeException(builtins.Exception):
    pass


class GripperException(builtins.Exception):
    pass


# ------------------------------------------------------------------------------------------------
# value types
# ------------------------------------------------------------------------------------------------


class Affine:
    """translation [3] m, quaternion [4] in franky's (x, y, z, w) order."""

    def __init__(self, translation=(0.0, 0.0, 0.0), quaternion=(0.0, 0.0, 0.0, 1.0)) -> None:
        self._t = np.asarray(translation, dtype=np.float64).reshape(3).copy()
        self._q = np.asarray(quaternion, dtype=np.float64).reshape(4).copy()

    @property
    def translation(self) -> np.ndarray:
        return self._t.copy()

    @property
    def quaternion(self) -> np.ndarray:
        return self._q.copy()


class ReferenceType:
    Absolute: ReferenceType
    Relative: ReferenceType

    def __init__(self, value: int) -> None:
        self._value = int(value)

    @property
    def value(self) -> int:
        return self._value

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ReferenceType) and other._value == self._value

    def __hash__(self) -> int:
        return self._value

    def __repr__(self) -> str:
        return "ReferenceType.Absolute" if self._value == 0 else "ReferenceType.Relative"


ReferenceType.Absolute = ReferenceType(0)
ReferenceType.Relative = ReferenceType(1)


class JointState:
    def __init__(self, position, velocity=None) -> None:
        self._p = np.asarray(position, dtype=np.float64).reshape(7).copy()
        self._v = np.zeros(7) if velocity is None else np.asarray(velocity, dtype=np.float64).reshape(7).copy()

    @property
    def position(self) -> np.ndarray:
        return self._p.copy()

    @property
    def velocity(self) -> np.ndarray:
        return self._v.copy()


class RobotPose:
    def __init__(self, end_effector_pose: Affine) -> None:
        self._ee = end_effector_pose

    @property
    def end_effector_pose(self) -> Affine:
        return self._ee


class CartesianState:
    def __init__(self, pose: RobotPose | Affine) -> None:
        self._pose = pose if isinstance(pose, RobotPose) else RobotPose(pose)

    @property
    def pose(self) -> RobotPose:
        return self._pose


class RobotState:
    """The fields of franky's RobotState the driver reads."""

    def __init__(self, q: np.ndarray, dq: np.ndarray, O_T_EE: Affine) -> None:  # noqa: N803 -- franky's name
        self._q, self._dq, self._ee = q.copy(), dq.copy(), O_T_EE

    @property
    def q(self) -> np.ndarray:
        return self._q.copy()

    @property
    def dq(self) -> np.ndarray:
        return self._dq.copy()

    @property
    def O_T_EE(self) -> Affine:  # noqa: N802
        return self._ee


# ------------------------------------------------------------------------------------------------
# motions
# ------------------------------------------------------------------------------------------------


class CartesianMotion:
    def __init__(self, target: CartesianState | RobotPose | Affine,
                 reference_type: ReferenceType = ReferenceType.Absolute, relative_dynamics_factor: float = 1.0,
                 return_when_finished: bool = True, ee_frame=None) -> None:
        self._target = target if isinstance(target, CartesianState) else CartesianState(target)
        self._reference_type = reference_type
        self.fake_return_when_finished = return_when_finished

    @property
    def target(self) -> CartesianState:
        return self._target

    @property
    def reference_type(self) -> ReferenceType:
        return self._reference_type


class JointMotion:
    def __init__(self, target: JointState | np.ndarray, reference_type: ReferenceType = ReferenceType.Absolute,
                 relative_dynamics_factor: float = 1.0, return_when_finished: bool = True) -> None:
        if isinstance(target, list):  # like the real binding: a plain list is refused, use JointState / ndarray
            raise TypeError("JointMotion(): incompatible constructor arguments (list)")
        self._target = target if isinstance(target, JointState) else JointState(target)
        self._reference_type = reference_type
        self.fake_return_when_finished = return_when_finished

    @property
    def target(self) -> JointState:
        return self._target

    @property
    def reference_type(self) -> ReferenceType:
        return self._reference_type


class CartesianStopMotion:
    def __init__(self, relative_dynamics_factor: float = 1.0) -> None:
        pass


class JointStopMotion:
    def __init__(self, relative_dynamics_factor: float = 1.0) -> None:
        pass


_KIND = {"CartesianMotion": "cartesian", "CartesianStopMotion": "cartesian",
         "JointMotion": "joint", "JointStopMotion": "joint"}


def motion_kind(motion: Any) -> str:
    """'cartesian' or 'joint' for fake *and* real franky motions (by class name)."""
    return _KIND[type(motion).__name__]


# ------------------------------------------------------------------------------------------------
# devices
# ------------------------------------------------------------------------------------------------


class Robot:
    """Records ``calls`` as (name, args...) tuples; the state jumps to each new target.

    Test controls: ``fail_next`` (an exception the next move raises), ``has_errors_flag``,
    ``recover_ok``, ``join_finishes`` (False: join_motion keeps timing out).
    """

    def __init__(self, fci_hostname: str, relative_dynamics_factor: float = 1.0) -> None:
        if fci_hostname == "unreachable":
            raise NetworkException("libfranka: Connection to FCI refused. Please install FCI feature or enable "
                                   "FCI mode in Desk.")
        self.fci_ip = fci_hostname
        self.calls: list[tuple] = []
        self.fail_next: builtins.Exception | None = None
        self.has_errors_flag = False
        self.recover_ok = True
        self.join_finishes = True
        self.on_join_timeout = None  # called each time join_motion times out (tests hook a watchdog here)
        self._dynamics = relative_dynamics_factor
        self._q = READY_Q.copy()
        self._ee = Affine([0.307, 0.0, 0.487], [1.0, 0.0, 0.0, 0.0])
        self._running: str | None = None  # control type of the running asynchronous motion

    @property
    def relative_dynamics_factor(self) -> float:
        return self._dynamics

    @relative_dynamics_factor.setter
    def relative_dynamics_factor(self, value: float) -> None:
        self.calls.append(("relative_dynamics_factor", value))
        self._dynamics = value

    @property
    def has_errors(self) -> bool:
        return self.has_errors_flag

    def recover_from_errors(self) -> bool:
        self.calls.append(("recover_from_errors",))
        if self.recover_ok:
            self.has_errors_flag = False
        return self.recover_ok

    def move(self, motion: Any, asynchronous: bool = False) -> None:
        self.calls.append(("move", motion, asynchronous))
        if self.fail_next is not None:
            e, self.fail_next = self.fail_next, None
            raise e
        kind = motion_kind(motion)
        if self._running is not None and self._running != kind:
            raise InvalidMotionTypeException("The type of motion cannot change during runtime. Please ensure that "
                                             "the previous motion finished before using a new control type.")
        target = getattr(motion, "target", None)
        if target is None:  # a stop motion: comes to rest where it is
            self._running = kind if asynchronous else None
            return
        if kind == "cartesian":
            self._ee = target.pose.end_effector_pose
        else:
            self._q = np.asarray(target.position, dtype=np.float64).reshape(7).copy()
        self._running = kind if asynchronous else None

    def poll_motion(self) -> bool:
        return self._running is not None

    def join_motion(self, timeout: float | None = None) -> bool:
        self.calls.append(("join_motion", timeout))
        if not self.join_finishes:
            if self.on_join_timeout is not None:
                self.on_join_timeout()
            time.sleep(timeout or 0.0)  # a real join blocks for its timeout
            return False
        self._running = None
        return True

    def stop(self) -> None:
        self.calls.append(("stop",))
        self._running = None

    @property
    def state(self) -> RobotState:
        return RobotState(self._q, np.zeros(7), self._ee)


class Gripper:
    """Records ``calls``; the width jumps to each target. Test control: ``fail_next``."""

    def __init__(self, fci_hostname: str) -> None:
        self.calls: list[tuple] = []
        self.fail_next: builtins.Exception | None = None
        self.fake_max_width = 0.08
        self._width = 0.0

    def _do(self, call: tuple, width: float) -> bool:
        self.calls.append(call)
        if self.fail_next is not None:
            e, self.fail_next = self.fail_next, None
            raise e
        self._width = min(max(float(width), 0.0), self.fake_max_width)
        return True

    def move(self, width: float, speed: float) -> bool:
        return self._do(("move", width, speed), width)

    def grasp(self, width: float, speed: float, force: float, epsilon_inner: float = 0.005,
              epsilon_outer: float = 0.005) -> bool:
        return self._do(("grasp", width, speed, force, epsilon_inner, epsilon_outer), width)

    def homing(self) -> bool:
        return self._do(("homing",), self.fake_max_width)

    @property
    def width(self) -> float:
        return self._width

    @property
    def max_width(self) -> float:
        return self.fake_max_width


__all__ = ["Affine", "CartesianMotion", "CartesianState", "CartesianStopMotion", "CommandException",
           "ControlException", "Exception", "Gripper", "GripperException", "InvalidMotionTypeException",
           "JointMotion", "JointState", "JointStopMotion", "NetworkException", "ReferenceType", "Robot",
           "RobotPose", "RobotState"]
