"""SimFranka: scene, IK tracking, joint mode, gripper, hold, seeded resets, real-time pacing."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import time  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from hardware.base import DeviceError, NotConnectedError  # noqa: E402
from hardware.sim_franka import HOME_Q, OBJECT_NAMES, VELOCITY_LIMITS, SimFranka, _quat_err  # noqa: E402


def run_until(sim, seconds, cond=None):
    """Advance in control periods; return the states seen."""
    states = []
    for _ in range(int(round(seconds / sim.control_dt))):
        sim.step()
        states.append(sim.read_state())
        if cond is not None and cond(states[-1]):
            break
    return states


def test_describe_and_not_connected():
    s = SimFranka(realtime=False)
    d = s.describe()
    assert d["objects"] == list(OBJECT_NAMES) and d["num_joints"] == 7
    lim = s.joint_limits
    assert lim.lower.shape == lim.upper.shape == (7,) and np.all(lim.lower < lim.upper)
    np.testing.assert_allclose(lim.velocity, [2.175] * 4 + [2.61] * 3)
    assert lim.lower[3] == pytest.approx(-3.0718) and lim.upper[5] == pytest.approx(3.7525)
    assert s.control_dt == pytest.approx(0.1)
    with pytest.raises(NotConnectedError):
        s.read_state()
    with pytest.raises(NotConnectedError):
        s.command_joint_positions(HOME_Q)
    with pytest.raises(NotConnectedError):
        s.step()
    s.connect()
    assert s.read_state().q.shape == (7,)
    s.disconnect()
    with pytest.raises(NotConnectedError):
        s.hold()


def test_missing_model_package_is_a_clear_error(monkeypatch):
    import importlib.util

    from hardware import sim_franka

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(DeviceError, match="pip install --no-deps genesis-world"):
        sim_franka.panda_model_dir()


def test_reset_is_seeded_and_objects_are_on_the_table(sim):
    a = sim.reset(seed=7).extras["objects"].copy()
    b = sim.reset(seed=7).extras["objects"].copy()
    c = sim.reset(seed=8).extras["objects"].copy()
    assert a.shape == (len(OBJECT_NAMES), 7) and a.dtype == np.float64
    np.testing.assert_allclose(a, b, atol=1e-9)
    assert np.abs(a[:, :2] - c[:, :2]).max() > 0.02
    for objs in (a, c):
        assert np.all((objs[:, 0] > 0.3) & (objs[:, 0] < 0.7) & (np.abs(objs[:, 1]) < 0.3))
        assert np.all((objs[:, 2] > -0.005) & (objs[:, 2] < 0.03)), objs[:, 2]  # resting on the table top z=0
        np.testing.assert_allclose(np.linalg.norm(objs[:, 3:], axis=1), 1.0, atol=1e-6)
        xy = objs[:, :2]
        dist = np.linalg.norm(xy[:, None] - xy[None], axis=-1) + np.eye(len(xy))
        assert dist.min() > 0.06  # no two footprints overlap
    s = sim.reset(seed=7)
    np.testing.assert_allclose(s.q, HOME_Q, atol=0.01)
    assert s.gripper > 0.95 and not s.safe
    assert np.linalg.norm(s.ee_quat) == pytest.approx(1.0)
    assert abs(abs(s.ee_quat[1]) - 0.7071) < 0.01  # home: fingers pointing down


def test_ee_target_10cm_away_converges(sim):
    s0 = sim.reset(seed=1)
    target = s0.ee_pos + np.array([0.06, -0.05, -0.06])
    assert np.linalg.norm(target - s0.ee_pos) > 0.095
    sim.command_ee_pose(target, s0.ee_quat)
    states = run_until(sim, 2.0, lambda s: np.linalg.norm(s.ee_pos - target) < 0.002)
    final = states[-1]
    assert np.linalg.norm(final.ee_pos - target) < 0.01, f"converged to {final.ee_pos}, target {target}"
    assert len(states) * sim.control_dt <= 2.0
    assert np.linalg.norm(_quat_err(s0.ee_quat, final.ee_quat)) < 0.03
    # the joint velocity limits hold while moving there
    assert max(np.max(np.abs(s.dq) / VELOCITY_LIMITS) for s in states) < 1.1


def test_small_delta_tracking_like_a_policy(sim):
    """1 cm per 0.1 s tick, as a 10 Hz policy commands: the arm keeps up."""
    s0 = sim.reset(seed=2)
    target = s0.ee_pos.copy()
    errs = []
    for i in range(15):
        target = target + np.array([0.0, 0.01, -0.005 if i < 8 else 0.0])
        sim.command_ee_pose(target, s0.ee_quat)
        sim.step()
        errs.append(np.linalg.norm(sim.read_state().ee_pos - target))
    assert max(errs) < 0.01, errs
    sim.advance(0.3)
    assert np.linalg.norm(sim.read_state().ee_pos - target) < 0.002


def test_joint_mode_reaches_goal(sim):
    sim.reset(seed=3)
    goal = HOME_Q + np.array([0.3, -0.2, 0.2, 0.3, 0.0, 0.2, 0.4])
    sim.command_joint_positions(goal)
    states = run_until(sim, 2.0)
    np.testing.assert_allclose(states[-1].q, goal, atol=0.01)
    assert max(np.max(np.abs(s.dq) / VELOCITY_LIMITS) for s in states) < 1.1
    # out-of-range goals are clipped to the joint limits, not followed past them
    lim = sim.joint_limits
    sim.command_joint_positions(np.where(np.arange(7) == 3, lim.upper[3] + 1.0, HOME_Q))
    states = run_until(sim, 2.0)
    assert states[-1].q[3] <= lim.upper[3] + 0.01


def test_gripper_opens_and_closes(sim):
    s0 = sim.reset(seed=4)
    assert s0.gripper > 0.95
    sim.command_ee_pose(s0.ee_pos, s0.ee_quat, gripper=0.0)
    sim.advance(1.0)
    assert sim.read_state().gripper < 0.05
    sim.command_joint_positions(s0.q, gripper=1.0)
    sim.advance(1.0)
    assert sim.read_state().gripper > 0.95
    sim.command_joint_positions(s0.q, gripper=0.5)
    sim.advance(1.0)
    assert abs(sim.read_state().gripper - 0.5) < 0.05


def test_hold_freezes_the_arm_and_next_command_clears_safe(sim):
    s0 = sim.reset(seed=5)
    sim.command_joint_positions(HOME_Q + 0.5 * np.array([1, -1, 1, 1, 1, 1, 1]))
    sim.advance(0.15)
    moving = sim.read_state()
    assert np.abs(moving.dq).max() > 0.5 and not moving.safe
    sim.hold()
    assert sim.read_state().safe
    # Stopping from ~2 rad/s is limited by the joint torque limits: it overshoots by ~0.1 rad and
    # springs back to the hold pose within about a second.
    sim.advance(1.0)
    held = sim.read_state()
    assert held.safe
    assert np.abs(held.dq).max() < 0.01
    assert np.abs(held.q - moving.q).max() < 0.02  # back where hold() was called
    sim.advance(0.5)
    assert np.abs(sim.read_state().q - held.q).max() < 1e-3  # and stays there
    sim.command_ee_pose(s0.ee_pos, s0.ee_quat)
    assert not sim.read_state().safe


def test_bad_commands_are_refused(sim):
    sim.reset(seed=6)
    with pytest.raises(ValueError):
        sim.command_ee_pose(np.array([np.nan, 0, 0.3]), np.array([0, 1, 0, 0]))
    with pytest.raises(ValueError):
        sim.command_ee_pose(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError):
        sim.command_joint_positions(np.zeros(6))
    sim.hold()
    with pytest.raises(ValueError):
        sim.command_joint_positions(HOME_Q, gripper=float("nan"))
    assert sim.read_state().safe  # a refused command changes nothing


def test_snapshot_is_a_copy(sim):
    sim.reset(seed=0)
    qpos, qvel, t = sim.snapshot_qpos()
    assert qpos.shape == (sim.model.nq,) and qvel.shape == (sim.model.nv,)
    sim.command_joint_positions(HOME_Q + 0.2)
    sim.advance(0.3)
    qpos2, _, t2 = sim.snapshot_qpos()
    assert t2 == pytest.approx(t + 0.3) and np.abs(qpos2[:7] - qpos[:7]).max() > 0.05


def test_realtime_thread_keeps_pace_with_the_wall_clock():
    s = SimFranka(realtime=True, seed=0)
    with s:
        with pytest.raises(DeviceError):
            s.step()
        st = s.reset(seed=0)
        time.sleep(0.1)
        t0_sim, t0_wall = s.sim_time, time.monotonic()
        target = st.ee_pos + np.array([0.0, 0.05, -0.05])
        s.command_ee_pose(target, st.ee_quat)
        for _ in range(10):  # concurrent readers while the thread steps
            time.sleep(0.1)
            s.read_state()
        d_sim, d_wall = s.sim_time - t0_sim, time.monotonic() - t0_wall
        assert abs(d_sim - d_wall) < 0.05, (d_sim, d_wall, s.realtime_stats)
        assert np.linalg.norm(s.read_state().ee_pos - target) < 0.01
        assert s.realtime_stats["running"]
    assert not s.realtime_stats["running"]
    t_after = s.sim_time
    time.sleep(0.05)
    assert s.sim_time == t_after  # the thread stopped on disconnect


def _slide_after_hold(sim, seed, ticks=60):
    """How far (m) the red cube of pick_red_cube, picked and lifted by the scripted expert, slid down the shut
    fingers while the arm held still for ``ticks`` ticks (bench/archive/sim_grip.py's two stages)."""
    from tests.hardware.expert_driver import grasp_and_lift, hold

    assert grasp_and_lift(sim, seed), f"the expert did not lift the red cube in scene {seed}"
    return hold(sim, 0.0, ticks)[0][-1]


def test_the_shut_gripper_holds_a_lifted_cube_where_mujocos_default_contacts_let_it_creep():
    """Elliptic friction cones with impratio 10 (the default): a cube held still for 6 s stays put in the fingers
    (under 2 mm). MuJoCo's defaults (pyramidal, impratio 1) let the same grasp creep several mm, as a real Franka
    Hand does not (bench/archive/results/sim_grip.json)."""
    firm = SimFranka(realtime=False)
    firm.connect()
    soft = SimFranka(realtime=False, cone="pyramidal", impratio=1.0)
    soft.connect()
    try:
        assert firm.describe()["contact"] == {"cone": "elliptic", "impratio": 10.0}
        for seed in (0, 1):
            assert abs(_slide_after_hold(firm, seed)) < 0.002
            assert _slide_after_hold(soft, seed) > 0.004
    finally:
        firm.disconnect()
        soft.disconnect()


def test_bad_contact_settings_are_refused():
    with pytest.raises(ValueError, match="cone must be one of"):
        SimFranka(realtime=False, cone="round")
    for bad in (0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="impratio must be"):
            SimFranka(realtime=False, impratio=bad)
