"""SimGo1 (MuJoCo, mjlab's go1.xml) and the Go1 controllers of hardware.go1_control: the robot
stands, the recovery controller stands it up from sitting and from a drop, a fall is detected, the
trot follows small body-velocity commands without falling, the safe state damps then sits."""

import numpy as np
import pytest

from hardware import go1_control as gc
from hardware.base import NotConnectedError
from hardware.sim_go1 import SimGo1


@pytest.fixture(scope="module")
def go1():
    g = SimGo1(realtime=False)
    g.connect()
    yield g
    g.disconnect()


def test_leg_kinematics_round_trip():
    rng = np.random.default_rng(0)
    for _ in range(50):
        leg = int(rng.integers(4))
        q = rng.uniform([-0.4, 0.3, -2.6], [0.4, 1.5, -1.0])
        np.testing.assert_allclose(gc.leg_ik(gc.leg_fk(q, leg), leg), q, atol=1e-7)
    # the stand posture puts each foot STAND_HEIGHT under its thigh joint
    for i in range(4):
        np.testing.assert_allclose(gc.leg_fk(gc.STAND_Q[3 * i:3 * i + 3], i), [0, gc.THIGH_Y[i], -gc.STAND_HEIGHT],
                                   atol=1e-9)


def test_not_connected_and_describe():
    g = SimGo1(realtime=False)
    d = g.describe()
    assert d["kind"] == "legged" and d["num_joints"] == 12 and len(d["joint_names"]) == 12
    with pytest.raises(NotConnectedError):
        g.read_state()
    with pytest.raises(NotConnectedError):
        g.command_body_velocity(0.1, 0, 0)
    g.damp_and_sit()  # the safe state never raises


def test_stands_still(go1):
    s = go1.reset(seed=0)
    assert s.mode == "stand" and not s.fallen
    go1.advance(1.0)
    s = go1.read_state()
    assert 0.25 < s.base_height < 0.30, s.base_height
    assert s.tilt < 0.05 and np.abs(s.dq).max() < 0.05 and not s.fallen
    assert go1.recovery.done
    assert (s.foot_force > 10).all(), s.foot_force  # standing on four feet
    np.testing.assert_allclose(np.linalg.norm(s.quat), 1.0, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(s.accel), 9.81, atol=0.3)  # IMU: gravity at rest


def test_recovery_stands_up_from_sitting(go1):
    s = go1.reset(seed=1, pose="sit")
    assert s.base_height < 0.12 and s.mode == "sit"
    go1.stand()
    phases = set()
    for _ in range(100):  # 2 s
        go1.step()
        phases.add(go1.recovery.phase)
    s = go1.read_state()
    assert {"rise", "stabilise"} <= phases
    assert go1.recovery.done and s.base_height > 0.25 and s.tilt < 0.05 and not s.fallen


def test_recovery_from_a_tilted_drop(go1):
    go1.reset(seed=2)
    go1.set_base(pos=[0, 0, 0.35], quat=[np.cos(0.2), np.sin(0.2), 0, 0])  # rolled 0.4 rad, in the air
    go1.damp()
    go1.advance(0.6)
    go1.stand()
    go1.advance(3.0)
    s = go1.read_state()
    assert go1.recovery.done and s.base_height > 0.25 and s.tilt < 0.05, (s.base_height, s.tilt)


def test_recovery_controller_is_deterministic():
    q, dq, quat = gc.SIT_Q + 0.05, np.zeros(12), np.array([0.99, 0.1, 0.0, 0.0])
    a, b = gc.RecoveryController(), gc.RecoveryController()
    for _ in range(5):
        ca, cb = a.step(0.01, q, dq, quat), b.step(0.01, q, dq, quat)
        np.testing.assert_array_equal(ca.q, cb.q)
    assert a.phase == "rise"  # near the sit posture: no tuck
    c = gc.RecoveryController()
    c.start(gc.STAND_Q)
    assert c.phase == "stabilise"  # already standing: only levels the trunk


def test_fall_is_detected(go1):
    go1.reset(seed=3)
    falls = int(go1.read_state().extras["falls"][0])
    go1.set_base(pos=[0, 0, 0.4], quat=[np.cos(0.9), np.sin(0.9), 0, 0])  # rolled 1.8 rad: onto its side / back
    go1.damp()
    go1.advance(1.0)
    s = go1.read_state()
    assert s.fallen and s.tilt > 1.0
    assert int(s.extras["falls"][0]) == falls + 1
    rc = gc.RecoveryController()
    rc.step(0.01, s.q, s.dq, s.quat)
    assert not rc.recoverable  # on its back: the recovery does not try


@pytest.mark.parametrize("cmd, axis", [((0.3, 0.0, 0.0), 0), ((0.0, 0.15, 0.0), 1), ((0.0, 0.0, 0.5), 2)])
def test_trot_follows_small_velocity_commands(go1, cmd, axis):
    go1.reset(seed=0)
    go1.command_body_velocity(*cmd)
    go1.advance(1.0)
    s1 = go1.read_state()
    go1.advance(2.0)
    s2 = go1.read_state()
    assert not s2.fallen and s2.base_height > 0.22 and s2.tilt < 0.2 and s2.mode == "velocity"
    yaw1, yaw2 = gc.quat_to_rpy(s1.quat)[2], gc.quat_to_rpy(s2.quat)[2]
    c, s = np.cos(yaw1), np.sin(yaw1)
    dx, dy = (s2.extras["base_pos"] - s1.extras["base_pos"])[:2]
    measured = np.array([c * dx + s * dy, -s * dx + c * dy, yaw2 - yaw1]) / 2.0
    # roughly the commanded velocity on its axis (within 50%), and the right sign
    assert 0.5 * cmd[axis] < measured[axis] < 1.5 * cmd[axis], measured


def test_safe_state_damps_then_sits(go1):
    go1.reset(seed=5)
    go1.command_body_velocity(0.3, 0.0, 0.0)
    go1.advance(1.0)
    go1.damp_and_sit()
    s = go1.read_state()
    assert s.safe and s.mode == "safe"
    go1.advance(0.2)
    assert np.all(go1.model.actuator_gainprm[:12, 0] == 0)  # damping: no position control
    go1.advance(2.0)
    s = go1.read_state()
    assert s.safe and s.base_height < 0.12 and np.abs(s.dq).max() < 0.1
    np.testing.assert_allclose(s.q, gc.SIT_Q, atol=0.15)
