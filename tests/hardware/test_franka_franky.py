"""FrankyArm against a fake of franky (tests/mocks/fake_franky.py), plus checks that the fake
and the driver's calls match the real franky when it is installed."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import types

import numpy as np
import pytest

from hardware.base import DeviceError, NotConnectedError
from hardware.franka_franky import FRANKA_READY_Q, FrankyArm
from tests.mocks import fake_franky

HAS_REAL_FRANKY = importlib.util.find_spec("franky") is not None


def make_arm(module=fake_franky, **kw) -> FrankyArm:
    kw.setdefault("fci_ip", "172.16.0.2")
    return FrankyArm(franky_module=module, **kw)


@pytest.fixture
def arm():
    a = make_arm(dynamics_factor=0.2)
    a.connect()
    yield a
    a.disconnect()


def moves(robot) -> list:
    return [c for c in robot.calls if c[0] == "move"]


def quat_wxyz_about_z(angle: float) -> np.ndarray:
    return np.array([np.cos(angle / 2), 0.0, 0.0, np.sin(angle / 2)])


# --------------------------------------------------------------------------------------------
# lifecycle and errors
# --------------------------------------------------------------------------------------------


def test_not_connected_errors():
    a = make_arm()
    assert a.describe()["num_joints"] == 7  # descriptions work while disconnected
    with pytest.raises(NotConnectedError):
        a.read_state()
    with pytest.raises(NotConnectedError):
        a.command_ee_pose(np.zeros(3), np.array([1.0, 0, 0, 0]))
    with pytest.raises(NotConnectedError):
        a.command_joint_positions(np.zeros(7))
    with pytest.raises(NotConnectedError):
        a.reset()
    a.hold()  # never raises, even disconnected


def test_connect_sets_dynamics_factor_and_reads_gripper(arm):
    assert ("relative_dynamics_factor", 0.2) in arm._robot.calls
    assert arm._robot.fci_ip == "172.16.0.2"
    assert arm._max_width == pytest.approx(0.08)


def test_constructor_validates():
    with pytest.raises(ValueError, match="fci_ip"):
        FrankyArm(fci_ip="", franky_module=fake_franky)
    with pytest.raises(ValueError, match="dynamics_factor"):
        make_arm(dynamics_factor=1.5)
    with pytest.raises(ValueError, match="model"):
        make_arm(model="ur5")
    with pytest.raises(ValueError, match="home_q"):
        make_arm(home_q=[0.0] * 6)


def test_missing_franky_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "franky", None)  # makes `import franky` raise ImportError
    a = FrankyArm(fci_ip="172.16.0.2")
    with pytest.raises(DeviceError, match=r"pip install 'vla-stack\[franka\]'"):
        a.connect()
    assert not a.is_connected


def test_connection_failure_is_device_error_with_original_message():
    a = make_arm(fci_ip="unreachable")
    with pytest.raises(DeviceError, match="NetworkException: libfranka: Connection to FCI refused") as ei:
        a.connect()
    assert isinstance(ei.value.__cause__, fake_franky.NetworkException)
    assert not a.is_connected


def test_motion_exception_becomes_device_error(arm):
    arm._robot.fail_next = fake_franky.ControlException("Motion aborted by reflex! [cartesian_reflex]")
    with pytest.raises(DeviceError, match=r"ControlException: Motion aborted by reflex! \[cartesian_reflex\]"):
        arm.command_ee_pose(np.array([0.4, 0.0, 0.3]), np.array([0.0, 1.0, 0.0, 0.0]))


def test_ungripped_home_is_refused():
    class UnhomedGripper(fake_franky.Gripper):
        @property
        def max_width(self):
            return 0.0

    module = types.SimpleNamespace(**{**vars(fake_franky), "Gripper": UnhomedGripper})
    a = make_arm(module)
    with pytest.raises(DeviceError, match="home it"):
        a.connect()


def test_gripper_failure_surfaces_on_next_command(arm):
    arm._gripper.fail_next = fake_franky.GripperException("command failed")
    arm.command_joint_positions(np.array(FRANKA_READY_Q), gripper=0.5)
    assert arm.wait_gripper(2.0)
    with pytest.raises(DeviceError, match="GripperException: command failed"):
        arm.command_joint_positions(np.array(FRANKA_READY_Q), gripper=0.0)


# --------------------------------------------------------------------------------------------
# command mapping
# --------------------------------------------------------------------------------------------


def test_ee_pose_maps_to_absolute_async_cartesian_motion_in_xyzw(arm):
    pos = np.array([0.45, -0.1, 0.25])
    quat_wxyz = np.array([0.1, 0.9, -0.3, 0.2])  # deliberately not unit: the driver normalises
    arm.command_ee_pose(pos, quat_wxyz)
    _, motion, asynchronous = moves(arm._robot)[-1]
    assert isinstance(motion, fake_franky.CartesianMotion) and asynchronous is True
    assert motion.reference_type == fake_franky.ReferenceType.Absolute
    assert motion.fake_return_when_finished is False  # keep holding the target until the next command
    affine = motion.target.pose.end_effector_pose
    np.testing.assert_allclose(affine.translation, pos)
    unit = quat_wxyz / np.linalg.norm(quat_wxyz)
    np.testing.assert_allclose(affine.quaternion, [unit[1], unit[2], unit[3], unit[0]])  # franky: x, y, z, w
    # and read_state converts back to (w, x, y, z)
    st = arm.read_state()
    np.testing.assert_allclose(st.ee_pos, pos)
    np.testing.assert_allclose(st.ee_quat, unit)


def test_joint_command_maps_to_joint_motion_and_clips_to_limits(arm):
    q = np.array([0.1, -0.5, 0.2, -2.0, 0.3, 1.8, 0.9])
    arm.command_joint_positions(q)
    _, motion, asynchronous = moves(arm._robot)[-1]
    assert isinstance(motion, fake_franky.JointMotion) and asynchronous is True
    assert motion.reference_type == fake_franky.ReferenceType.Absolute
    np.testing.assert_allclose(motion.target.position, q)
    np.testing.assert_allclose(arm.read_state().q, q)
    over = q.copy()
    over[0] = 5.0  # past the Panda's +2.8973 rad
    arm.command_joint_positions(over)
    assert moves(arm._robot)[-1][1].target.position[0] == pytest.approx(arm.joint_limits.upper[0])
    with pytest.raises(ValueError, match="7 finite"):
        arm.command_joint_positions(np.zeros(6))


def test_switching_control_type_stops_the_running_motion_first(arm):
    # The fake, like franky, raises InvalidMotionTypeException on a type change mid-motion.
    arm.command_ee_pose(np.array([0.4, 0.0, 0.3]), quat_wxyz_about_z(0.0))
    arm.command_joint_positions(np.array(FRANKA_READY_Q))
    kinds = [(type(m).__name__, a) for _, m, a in moves(arm._robot)]
    assert kinds == [("CartesianMotion", True), ("CartesianStopMotion", False), ("JointMotion", True)]


def test_gripper_opening_maps_to_width_with_deadband(arm):
    q = np.array(FRANKA_READY_Q)
    arm.command_joint_positions(q, gripper=1.0)
    arm.wait_gripper(2.0)
    arm.command_joint_positions(q, gripper=0.98)  # within the 5 % deadband: nothing sent
    arm.wait_gripper(2.0)
    arm.command_joint_positions(q, gripper=0.25)  # closing: a grasp with the configured force
    arm.wait_gripper(2.0)
    arm.command_joint_positions(q, gripper=0.75)  # opening: a move
    arm.wait_gripper(2.0)
    arm.command_joint_positions(q, gripper=None)  # None leaves the gripper alone
    arm.wait_gripper(2.0)
    calls = arm._gripper.calls
    assert [c[0] for c in calls] == ["move", "grasp", "move"]
    assert calls[0][1] == pytest.approx(0.08) and calls[0][2] == pytest.approx(arm.gripper_speed)
    assert calls[1][1] == pytest.approx(0.02) and calls[1][3] == pytest.approx(arm.gripper_force)
    assert calls[2][1] == pytest.approx(0.06)
    assert arm.read_state().gripper == pytest.approx(0.75)


def test_gripper_command_does_not_block(arm):
    import threading

    release = threading.Event()
    original = arm._gripper.move

    def slow_move(width, speed):
        release.wait(5.0)
        return original(width, speed)

    arm._gripper.move = slow_move
    arm.command_joint_positions(np.array(FRANKA_READY_Q), gripper=1.0)  # returns although the gripper is busy
    assert not arm.wait_gripper(0.05)
    release.set()
    assert arm.wait_gripper(2.0)


# --------------------------------------------------------------------------------------------
# hold and reset
# --------------------------------------------------------------------------------------------


def test_hold_stops_sets_safe_and_next_command_clears_it(arm):
    arm.command_ee_pose(np.array([0.4, 0.0, 0.3]), quat_wxyz_about_z(0.3))
    assert arm.read_state().safe is False
    arm.hold()
    _, motion, asynchronous = moves(arm._robot)[-1]
    assert isinstance(motion, fake_franky.CartesianStopMotion) and asynchronous is True
    assert arm.read_state().safe is True
    n = len(arm._robot.calls)
    arm.hold()  # repeated watchdog holds send nothing new
    assert len(arm._robot.calls) == n
    arm.command_ee_pose(np.array([0.4, 0.0, 0.3]), quat_wxyz_about_z(0.3))
    assert arm.read_state().safe is False


def test_hold_never_raises_and_falls_back_to_robot_stop(arm, caplog):
    arm.command_joint_positions(np.array(FRANKA_READY_Q))
    arm._robot.fail_next = fake_franky.ControlException("communication_constraints_violation")
    arm.hold()  # the stop motion fails -> robot.stop(), logged, not raised
    assert arm._robot.calls[-1] == ("stop",)
    assert arm.read_state().safe is True
    assert "communication_constraints_violation" in caplog.text


def test_reset_moves_home_recovers_errors_and_opens_gripper(arm):
    arm.command_joint_positions(np.zeros(7) + 0.1)
    arm._robot.has_errors_flag = True
    st = arm.reset()
    assert ("recover_from_errors",) in arm._robot.calls
    home = [m for _, m, _ in moves(arm._robot) if isinstance(m, fake_franky.JointMotion)][-1]
    np.testing.assert_allclose(home.target.position, FRANKA_READY_Q)
    assert home.fake_return_when_finished is True
    np.testing.assert_allclose(st.q, FRANKA_READY_Q)
    assert st.gripper == pytest.approx(1.0)
    assert st.safe is False


def test_reset_fails_loudly_when_recovery_fails(arm):
    arm._robot.has_errors_flag = True
    arm._robot.recover_ok = False
    with pytest.raises(DeviceError, match="recovery failed"):
        arm.reset()


def test_reset_is_interrupted_by_hold(arm):
    import threading

    # The watchdog fires from its own thread once the move home is under way (not on a timer,
    # which under load could fire before the move starts and so test nothing).
    fired: list[threading.Thread] = []

    def watchdog() -> None:
        if not fired:
            fired.append(threading.Thread(target=arm.hold))
            fired[0].start()
            fired[0].join()

    arm._robot.join_finishes = False
    arm._robot.on_join_timeout = watchdog
    with pytest.raises(DeviceError, match="interrupted by hold"):
        arm.reset()
    assert isinstance(moves(arm._robot)[-1][1], fake_franky.JointStopMotion)


def test_custom_home(arm):
    home = np.array([0.2, -0.5, 0.0, -2.2, 0.0, 1.7, 0.8])
    a = make_arm(home_q=home, use_gripper=False)
    with a:
        np.testing.assert_allclose(a.reset().q, home)
        assert a.read_state().gripper == 0.0


# --------------------------------------------------------------------------------------------
# the fake must not drift from the real franky
# --------------------------------------------------------------------------------------------

_FAKE_ONLY_CTORS = {"RobotState"}  # the fake builds RobotState itself; franky never exposes a constructor


@pytest.mark.skipif(not HAS_REAL_FRANKY, reason="the real franky is not installed")
def test_fake_names_and_parameters_exist_in_real_franky():
    import franky

    for name in fake_franky.__all__:
        assert hasattr(franky, name), f"fake_franky.{name} does not exist in the real franky"
        fake_cls, real_cls = getattr(fake_franky, name), getattr(franky, name)
        if issubclass(fake_cls, BaseException):
            assert issubclass(real_cls, BaseException), name
            continue
        for attr, value in vars(fake_cls).items():
            if attr.startswith("_") and attr != "__init__":
                continue
            if attr == "__init__" and name in _FAKE_ONLY_CTORS:
                continue
            assert hasattr(real_cls, attr), f"franky.{name} has no attribute {attr!r} (the fake has)"
            if callable(value):  # every parameter the fake accepts must appear in the real signature text
                doc = getattr(real_cls, attr).__doc__ or ""
                for p in list(inspect.signature(value).parameters)[1:]:
                    assert f"{p}:" in doc, f"franky.{name}.{attr} has no parameter {p!r}: {doc[:300]}"


@pytest.mark.skipif(not HAS_REAL_FRANKY, reason="the real franky is not installed")
def test_driver_builds_real_franky_motions():
    """Real franky value and motion classes, fake Robot / Gripper: the driver's constructor calls
    (argument types, keyword names, quaternion order) are checked by the real bindings."""
    import franky

    module = types.SimpleNamespace(**{**vars(franky), "Robot": fake_franky.Robot, "Gripper": fake_franky.Gripper})
    a = make_arm(module)
    with a:
        pos, quat = np.array([0.5, 0.1, 0.2]), quat_wxyz_about_z(np.pi / 3)
        a.command_ee_pose(pos, quat, gripper=0.5)
        motion = moves(a._robot)[-1][1]
        assert isinstance(motion, franky.CartesianMotion)
        assert motion.reference_type == franky.ReferenceType.Absolute
        affine = motion.target.pose.end_effector_pose
        np.testing.assert_allclose(np.asarray(affine.translation).ravel(), pos)
        np.testing.assert_allclose(np.asarray(affine.quaternion).ravel(), [0, 0, np.sin(np.pi / 6), np.cos(np.pi / 6)],
                                   atol=1e-12)
        np.testing.assert_allclose(a.read_state().ee_quat, quat, atol=1e-12)
        a.command_joint_positions(np.array(FRANKA_READY_Q))
        kinds = [type(m) for _, m, _ in moves(a._robot)]
        assert kinds == [franky.CartesianMotion, franky.CartesianStopMotion, franky.JointMotion]
        np.testing.assert_allclose(np.asarray(moves(a._robot)[-1][1].target.position).ravel(), FRANKA_READY_Q)
        a.hold()
        assert isinstance(moves(a._robot)[-1][1], franky.JointStopMotion)
        st = a.reset()
        np.testing.assert_allclose(st.q, FRANKA_READY_Q)
