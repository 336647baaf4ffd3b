"""A kinematic arm for bridge tests: targets are reached instantly, every call is recorded.

It implements hardware.base.Arm (so the bridge sees exactly the interface real drivers have)
without physics, so protocol tests are fast and can assert precisely what the device was told.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from hardware.base import Arm, ArmState, JointLimits


class KinematicArm(Arm):
    def __init__(self, name: str = "arm") -> None:
        super().__init__(name)
        self.calls: list[tuple] = []
        self._lock = threading.Lock()
        self._home_pos = np.array([0.5, 0.0, 0.4])
        self._reset_state()

    def _reset_state(self) -> None:
        self.q = np.zeros(7)
        self.pos = self._home_pos.copy()
        self.quat = np.array([0.0, 1.0, 0.0, 0.0])
        self.grip = 1.0
        self.safe = False

    @property
    def joint_limits(self) -> JointLimits:
        return JointLimits(lower=np.full(7, -2.8), upper=np.full(7, 2.8), velocity=np.full(7, 2.0))

    def _connect(self) -> None:
        self.calls.append(("connect",))

    def _disconnect(self) -> None:
        self.calls.append(("disconnect",))

    def read_state(self) -> ArmState:
        self._require_connected()
        with self._lock:
            return ArmState(q=self.q.copy(), dq=np.zeros(7), ee_pos=self.pos.copy(), ee_quat=self.quat.copy(),
                            gripper=self.grip, t_mono_ns=time.monotonic_ns(), safe=self.safe)

    def command_ee_pose(self, pos, quat, gripper=None) -> None:
        self._require_connected()
        with self._lock:
            self.calls.append(("ee_pose", np.array(pos), np.array(quat), gripper))
            self.pos, self.quat, self.safe = np.array(pos, float), np.array(quat, float), False
            if gripper is not None:
                self.grip = float(gripper)

    def command_joint_positions(self, q, gripper=None) -> None:
        self._require_connected()
        with self._lock:
            self.calls.append(("joints", np.array(q), gripper))
            self.q, self.safe = np.array(q, float), False

    def hold(self) -> None:
        with self._lock:
            self.calls.append(("hold",))
            self.safe = True

    def reset(self, seed=None) -> ArmState:
        with self._lock:
            self.calls.append(("reset", seed))
            self._reset_state()
        return self.read_state()

    def motion_calls(self) -> list[tuple]:
        return [c for c in self.calls if c[0] in ("ee_pose", "joints")]
