"""A transport-only arm (driver ``null_arm``): no physics, no controller, no I/O.

For benchmarks of the bridge and the recorder: it measures the software around a robot, never
a robot. It is labelled ``transport_only`` in ``describe()`` and never stands in for a real or
simulated arm in results.
"""

from __future__ import annotations

import time

import numpy as np

from hardware.base import Arm, ArmState, JointLimits


class NullArm(Arm):
    """Transport-only arm for benchmarking the bridge: no physics, no controller, no I/O.

    Every method is instant bookkeeping (a command replaces the stored target, ``read_state``
    returns the stored pose), so a round trip through ``DeviceServer(ArmService(NullArm()))``
    measures the bridge itself: wire encode/decode, sockets, validation, limits and the reply.
    It never stands in for a real or simulated arm in results.
    """

    def __init__(self, name: str = "arm") -> None:
        super().__init__(name)
        self._limits = JointLimits(lower=np.full(7, -2.8), upper=np.full(7, 2.8), velocity=np.full(7, 2.0))
        self._zeros = np.zeros(7)
        self._home()

    def _home(self) -> None:
        self._q = np.zeros(7)
        self._pos = np.array([0.5, 0.0, 0.4])
        self._quat = np.array([0.0, 1.0, 0.0, 0.0])
        self._grip = 1.0
        self._safe = False

    @property
    def joint_limits(self) -> JointLimits:
        return self._limits

    def _connect(self) -> None:
        pass

    def _disconnect(self) -> None:
        pass

    def read_state(self) -> ArmState:
        # arrays are replaced (never mutated) by commands, so handing out references is safe
        return ArmState(q=self._q, dq=self._zeros, ee_pos=self._pos, ee_quat=self._quat, gripper=self._grip,
                        t_mono_ns=time.monotonic_ns(), safe=self._safe)

    def command_ee_pose(self, pos, quat, gripper=None) -> None:
        self._pos, self._quat, self._safe = np.asarray(pos, float), np.asarray(quat, float), False
        if gripper is not None:
            self._grip = float(gripper)

    def command_joint_positions(self, q, gripper=None) -> None:
        self._q, self._safe = np.asarray(q, float), False
        if gripper is not None:
            self._grip = float(gripper)

    def hold(self) -> None:
        self._safe = True

    def reset(self, seed=None) -> ArmState:
        self._home()
        return self.read_state()

    def describe(self):
        return {**super().describe(), "transport_only": True}
