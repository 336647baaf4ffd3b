"""UnitreeGo1 against a fake of the Unitree legged SDK's robot_interface (tests/mocks/fake_unitree_sdk.py):
commands map onto LowCmd / HighCmd, state maps from LowState / HighState, the SDK's safety guards run
on every low-level packet, the safe state damps then sits."""

from __future__ import annotations

import importlib.util
import time

import numpy as np
import pytest

from hardware import go1_control as gc
from hardware.base import DeviceError, NotConnectedError
from hardware.go1_unitree import HIGH_MODE, HIGHLEVEL, LOWLEVEL, POS_STOP_F, UnitreeGo1
from tests.mocks import fake_unitree_sdk as sdk

FAST = dict(loop_hz=200.0, damp_s=0.05, sit_s=0.1, stand_s=0.05)


def wait_for(pred, timeout=2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.005)
    return False


@pytest.fixture
def low():
    g = UnitreeGo1("192.168.123.10", level="low", sdk_module=sdk, **FAST)
    g.connect()
    yield g, sdk.UDP.last
    g.disconnect()


@pytest.fixture
def high():
    g = UnitreeGo1("192.168.123.161", level="high", sdk_module=sdk, **FAST)
    g.connect()
    yield g, sdk.UDP.last
    g.disconnect()


def test_lifecycle_and_parameters():
    g = UnitreeGo1("192.168.123.10", sdk_module=sdk)
    assert g.describe()["num_joints"] == 12 and g.describe()["level"] == "low"
    with pytest.raises(NotConnectedError):
        g.read_state()
    with pytest.raises(NotConnectedError):
        g.command_joint_positions(gc.STAND_Q, 20.0, 1.0)
    g.damp_and_sit()  # never raises, even disconnected
    for bad in (dict(ip=""), dict(ip="x", level="mid"), dict(ip="x", power_level=11)):
        with pytest.raises(ValueError):
            UnitreeGo1(sdk_module=sdk, **bad)


@pytest.mark.skipif(importlib.util.find_spec("robot_interface") is not None, reason="the real SDK is installed")
def test_missing_sdk_is_a_device_error_with_a_hint():
    with pytest.raises(DeviceError, match="robot_interface"):
        UnitreeGo1("192.168.123.10").connect()


def test_low_level_link_starts_damped(low):
    g, udp = low
    assert (udp.level, udp.target_ip, udp.target_port, udp.local_port) == (LOWLEVEL, "192.168.123.10", 8007, 8080)
    assert wait_for(lambda: len(udp.sent) > 3)
    m = udp.sent[-1].motorCmd
    assert all(m[i].Kp == 0.0 and m[i].Kd == g.damp_kd and m[i].q == POS_STOP_F for i in range(12))


def test_joint_targets_map_to_low_cmd(low):
    g, udp = low
    q = gc.STAND_Q + np.linspace(-0.1, 0.1, 12)
    kp, kd = np.linspace(20, 31, 12), np.full(12, 1.5)
    g.command_joint_positions(q, kp, kd)
    n = len(udp.sent)
    assert wait_for(lambda: len(udp.sent) > n + 2)
    m = udp.sent[-1].motorCmd
    np.testing.assert_allclose([m[i].q for i in range(12)], q)
    np.testing.assert_allclose([m[i].Kp for i in range(12)], kp)
    np.testing.assert_allclose([m[i].Kd for i in range(12)], kd)
    assert all(m[i].dq == 0.0 and m[i].tau == 0.0 for i in range(12))
    assert all(m[i].Kp == 0.0 for i in range(12, 20))  # the SDK's spare motor slots stay untouched
    safety_calls = g._safety.calls
    assert "PositionLimit" in safety_calls and ("PowerProtect", 1) in safety_calls
    assert wait_for(lambda: np.allclose(g.read_state().q, q, atol=1e-3))  # the fake's joints followed
    assert g.read_state().mode == "joint"
    with pytest.raises(DeviceError, match="level='high'"):
        g.command_body_velocity(0.2, 0.0, 0.0)


def test_state_maps_from_low_state(low):
    g, udp = low
    r = udp.robot
    r.imu.quaternion = [np.cos(0.6), np.sin(0.6), 0.0, 0.0]  # rolled 1.2 rad
    r.imu.gyroscope, r.imu.accelerometer = [0.1, -0.2, 0.3], [0.5, 0.0, 9.7]
    r.footForce = [10, 20, 30, 40]
    for i in range(12):
        r.motorState[i].q, r.motorState[i].dq, r.motorState[i].tauEst = 0.01 * i, -0.02 * i, 0.5 * i
    assert wait_for(lambda: g.read_state().gyro[2] == pytest.approx(0.3))
    s = g.read_state()
    np.testing.assert_allclose(s.q, 0.01 * np.arange(12), atol=1e-9)
    np.testing.assert_allclose(s.dq, -0.02 * np.arange(12))
    np.testing.assert_allclose(s.tau, 0.5 * np.arange(12))
    np.testing.assert_allclose(s.quat, [np.cos(0.6), np.sin(0.6), 0, 0])
    np.testing.assert_allclose(s.accel, [0.5, 0.0, 9.7])
    np.testing.assert_allclose(s.foot_force, [10, 20, 30, 40])
    assert s.tilt == pytest.approx(1.2) and s.fallen and np.isnan(s.base_height)


def test_low_level_safe_state_damps_then_sits(low):
    g, udp = low
    g.command_joint_positions(gc.STAND_Q, 40.0, 1.0)
    assert wait_for(lambda: udp.sent[-1].motorCmd[0].Kp == 40.0)
    n = len(udp.sent)
    g.damp_and_sit()
    first = udp.sent[n].motorCmd  # sent at once by damp_and_sit, not at the next loop tick
    assert all(first[i].Kp == 0.0 and first[i].Kd == g.damp_kd for i in range(12))
    assert g.read_state().safe and g.read_state().mode == "safe"
    # after damp_s: the sit posture, tracked with position gains
    assert wait_for(lambda: np.allclose([udp.sent[-1].motorCmd[i].q for i in range(12)], gc.SIT_Q))
    assert udp.sent[-1].motorCmd[0].Kp == 30.0


def test_low_level_stand_runs_the_recovery_controller(low):
    g, udp = low
    for i, q in enumerate(gc.SIT_Q):
        udp.robot.motorState[i].q = float(q)
    assert wait_for(lambda: np.allclose(g.read_state().q, gc.SIT_Q))
    g.stand()
    assert wait_for(lambda: np.allclose([udp.sent[-1].motorCmd[i].q for i in range(12)], gc.STAND_Q, atol=0.02),
                    timeout=3.0)
    assert g.read_state().mode == "stand"


def test_high_level_commands_map_to_high_cmd(high):
    g, udp = high
    assert (udp.level, udp.target_port) == (HIGHLEVEL, 8082)
    g.command_body_velocity(0.4, -0.1, 0.5)
    assert wait_for(lambda: udp.sent[-1].mode == HIGH_MODE["walk"])
    c = udp.sent[-1]
    assert c.gaitType == 1 and c.velocity == pytest.approx([0.4, -0.1]) and c.yawSpeed == pytest.approx(0.5)
    g.command_body_velocity(5.0, 0.0, 0.0)  # beyond the device's own limit: clipped
    assert wait_for(lambda: udp.sent[-1].velocity[0] == pytest.approx(g.max_body_velocity[0]))
    g.stand()
    assert wait_for(lambda: udp.sent[-1].mode == HIGH_MODE["stand_up"])
    assert wait_for(lambda: udp.sent[-1].mode == HIGH_MODE["force_stand"])
    assert udp.sent[-1].velocity == [0.0, 0.0]
    g.sit()
    assert wait_for(lambda: udp.sent[-1].mode == HIGH_MODE["stand_down"])
    g.damp()
    assert wait_for(lambda: udp.sent[-1].mode == HIGH_MODE["damping"])
    g.command_body_velocity(0.2, 0.0, 0.0)
    g.damp_and_sit()  # high level: stand down, then damping
    assert udp.sent[-1].mode == HIGH_MODE["stand_down"]
    assert wait_for(lambda: udp.sent[-1].mode == HIGH_MODE["damping"])
    assert g.read_state().base_height == pytest.approx(0.28)
    with pytest.raises(DeviceError, match="level='low'"):
        g.command_joint_positions(gc.STAND_Q, 20.0, 1.0)


def test_sdk_loop_failure_is_reported(low):
    g, udp = low
    udp.fail_recv = True
    assert wait_for(lambda: g.loop_error is not None)
    assert "receive failed" in str(g.loop_error)
