"""A fake of the part of ``robot_interface`` (unitree_legged_sdk v3.8's Python bindings) that
``hardware.go1_unitree`` uses. Pass the module itself as ``UnitreeGo1(..., sdk_module=fake_unitree_sdk)``.

Names and fields mirror the SDK: ``UDP(level, localPort, targetIP, targetPort)`` with
``InitCmdData`` / ``Recv`` / ``GetRecv`` / ``SetSend`` / ``Send``; ``LowCmd.motorCmd[20]`` of
``MotorCmd(q, dq, Kp, Kd, tau)``; ``LowState.motorState[20]`` of ``MotorState(q, dq, tauEst)``,
``imu`` (``quaternion`` w x y z, ``gyroscope``, ``accelerometer``, ``rpy``), ``footForce[4]``;
``HighCmd`` (``mode``, ``gaitType``, ``velocity[2]``, ``yawSpeed``, ...), ``HighState`` (+ ``bodyHeight``);
``Safety(LeggedType.Go1)`` with ``PositionLimit(cmd)`` and ``PowerProtect(cmd, state, level)``.

The fake robot: every ``Send`` is recorded in ``udp.sent`` (a copy of the command); at the low
level each motor with Kp > 0 moves its ``q`` half way to the target per ``Send`` (a crude PD), so
a test can see commands reach the joints. Test controls are instance attributes (``sent``,
``state_to_return``, ``fail_recv``) and never look like API. The last UDP made is ``UDP.last``.
"""

from __future__ import annotations

import copy
import enum

import numpy as np

GO1_STAND_Q = np.tile([0.0, 0.9, -1.8], 4)


class LeggedType(enum.Enum):
    Aliengo = 1
    A1 = 2
    Go1 = 3


class MotorCmd:
    def __init__(self) -> None:
        self.mode, self.q, self.dq, self.tau, self.Kp, self.Kd = 0, 0.0, 0.0, 0.0, 0.0, 0.0


class MotorState:
    def __init__(self) -> None:
        self.mode, self.q, self.dq, self.ddq, self.tauEst, self.temperature = 0, 0.0, 0.0, 0.0, 0.0, 30


class IMU:
    def __init__(self) -> None:
        self.quaternion = [1.0, 0.0, 0.0, 0.0]
        self.gyroscope = [0.0, 0.0, 0.0]
        self.accelerometer = [0.0, 0.0, 9.81]
        self.rpy = [0.0, 0.0, 0.0]
        self.temperature = 30


class LowCmd:
    def __init__(self) -> None:
        self.levelFlag = 0
        self.motorCmd = [MotorCmd() for _ in range(20)]


class LowState:
    def __init__(self) -> None:
        self.levelFlag = 0
        self.imu = IMU()
        self.motorState = [MotorState() for _ in range(20)]
        self.footForce = [0, 0, 0, 0]
        self.tick = 0


class HighCmd:
    def __init__(self) -> None:
        self.levelFlag = 0
        self.mode = 0
        self.gaitType = 0
        self.speedLevel = 0
        self.footRaiseHeight = 0.0
        self.bodyHeight = 0.0
        self.euler = [0.0, 0.0, 0.0]
        self.velocity = [0.0, 0.0]
        self.yawSpeed = 0.0
        self.reserve = 0


class HighState:
    def __init__(self) -> None:
        self.levelFlag = 0
        self.mode = 0
        self.imu = IMU()
        self.motorState = [MotorState() for _ in range(20)]
        self.footForce = [0, 0, 0, 0]
        self.bodyHeight = 0.28
        self.position = [0.0, 0.0, 0.0]
        self.velocity = [0.0, 0.0, 0.0]
        self.yawSpeed = 0.0


class UDP:
    last: "UDP | None" = None

    def __init__(self, level: int, localPort: int, targetIP: str, targetPort: int) -> None:  # noqa: N803
        self.level, self.local_port, self.target_ip, self.target_port = level, localPort, targetIP, targetPort
        self.sent: list = []
        self.recv_count = 0
        self.fail_recv = False
        self.robot = LowState() if level == 0xFF else HighState()
        for i, q in enumerate(GO1_STAND_Q):
            self.robot.motorState[i].q = float(q)
        self._pending = None
        UDP.last = self

    def InitCmdData(self, cmd) -> None:  # noqa: N802
        cmd.levelFlag = self.level

    def Recv(self) -> int:  # noqa: N802
        if self.fail_recv:
            raise RuntimeError("fake: UDP receive failed")
        self.recv_count += 1
        return 0

    def GetRecv(self, state) -> None:  # noqa: N802
        for k, v in vars(copy.deepcopy(self.robot)).items():
            setattr(state, k, v)

    def SetSend(self, cmd) -> None:  # noqa: N802
        self._pending = copy.deepcopy(cmd)

    def Send(self) -> int:  # noqa: N802
        cmd = self._pending
        self.sent.append(cmd)
        if isinstance(cmd, LowCmd):
            for i in range(12):
                m, s = cmd.motorCmd[i], self.robot.motorState[i]
                if m.Kp > 0 and abs(m.q) < 1e8:  # position control: the joint moves, the motor works
                    s.q += 0.5 * (m.q - s.q)
                    s.tauEst = m.Kp * 0.01
        else:
            self.robot.mode = cmd.mode
        return 0


class Safety:
    def __init__(self, legged_type: LeggedType) -> None:
        self.legged_type = legged_type
        self.calls: list = []

    def PositionLimit(self, cmd) -> None:  # noqa: N802
        self.calls.append("PositionLimit")

    def PowerProtect(self, cmd, state, factor: int) -> int:  # noqa: N802
        self.calls.append(("PowerProtect", factor))
        return 0
