"""RobotClient + RobotEnv over real sockets: a kinematic arm and two synthetic cameras."""

import time

import numpy as np
import pytest

from hardware.synthetic_camera import SyntheticCamera
from robot_io.env import LoopClock, RobotEnv
from robot_io.robot import RobotClient
from robot_io.server import ArmService, CameraService, DeviceServer
from robot_io.site import parse_site
from tests.mocks.fake_arm import KinematicArm


@pytest.fixture
def cell():
    arm = KinematicArm()
    servers = [DeviceServer(ArmService("arm", arm), "tcp://127.0.0.1:*", "tcp://127.0.0.1:*")]
    for cam in ("front", "wrist"):
        servers.append(DeviceServer(CameraService(cam, SyntheticCamera(cam, 64, 48, fps=30)),
                                    "tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
    for s in servers:
        s.start()
    site = parse_site({"name": "test", "robot": {"arm": "arm", "cameras": ["front", "wrist"]},
                       "devices": {s.name: {"driver": "synthetic_camera", "command": s.command_endpoint,
                                            "stream": s.stream_endpoint} for s in servers}})
    yield site, arm, servers
    for s in servers:
        s.stop()


def test_observation_composed_from_streams(cell):
    site, arm, _ = cell
    with RobotClient(site) as rc:
        obs = rc.observe("pick the red cube")
    assert set(obs["images"]) == {"front", "wrist"}
    assert obs["images"]["front"].shape == (48, 64, 3) and obs["images"]["front"].dtype == np.uint8
    assert obs["state"].shape == (8,) and obs["state"].dtype == np.float32
    np.testing.assert_allclose(obs["state"][:3], arm.pos, atol=1e-6)
    assert obs["instruction"] == "pick the red cube"
    assert set(obs["t"]) == {"arm", "front", "wrist"}
    now = time.monotonic_ns()
    assert all(0 <= now - t < 0.5e9 for t in obs["t"].values())


def test_env_runs_chunks_at_control_rate_and_measures_jitter(cell):
    site, arm, _ = cell
    env = RobotEnv(RobotClient(site), instruction="go", control_hz=20.0, max_episode_steps=3)
    obs, _ = env.reset(seed=1)
    assert env.observation_space["state"].contains(obs["state"])
    chunk = np.tile(np.array([0.01, 0, 0, 0, 0, 0, 1], np.float32), (5, 1))
    t0 = time.perf_counter()
    obs, r, term, trunc, info = env.step(chunk)
    dt = time.perf_counter() - t0
    assert info["applied"].shape == (5, 7)
    # five commands on a 20 Hz clock: each row acts for one period, so the chunk takes 5 periods
    assert 5 / 20 * 0.9 <= dt < 5 / 20 + 0.2
    np.testing.assert_allclose(arm.pos[0], 0.5 + 0.05, atol=1e-6)
    for _ in range(2):
        obs, r, term, trunc, info = env.step(chunk[0])
    assert trunc
    stats = env.loop_stats()
    assert stats["n"] == 7 and 15 < stats["achieved_hz"] < 25 and stats["late_ms_p99"] < 50
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((2, 6), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.full(7, np.nan, np.float32))
    env.close()


def test_loop_clock_reanchors_after_a_stall():
    c = LoopClock(100.0)
    c.wait()
    time.sleep(0.05)  # a 50 ms stall = 5 periods
    late = c.wait()
    assert late > 0.03
    t0 = time.perf_counter()
    c.wait()
    assert time.perf_counter() - t0 > 0.005  # no burst of catch-up ticks


def test_tick_callback_sees_every_intermediate_tick_and_is_off_by_default(cell):
    site, arm, _ = cell
    env = RobotEnv(RobotClient(site), instruction="go", control_hz=50.0)
    assert env.tick_callback is None
    env.reset(seed=1)
    chunk = np.tile(np.array([0.01, 0, 0, 0, 0, 0, 1], np.float32), (4, 1))
    seen: list[float] = []
    env.tick_callback = lambda o: seen.append(float(o["state"][0]))
    obs, *_ = env.step(chunk)
    # rows 1..3 show the arm after each of them; row 4's observation is the one step returns
    assert len(seen) == 3
    np.testing.assert_allclose(seen, [0.51, 0.52, 0.53], atol=1e-6)
    np.testing.assert_allclose(obs["state"][0], 0.54, atol=1e-6)
    env.tick_callback = None
    env.step(chunk)
    assert len(seen) == 3
    env.close()


@pytest.mark.parametrize("mode, want", [("raw", [0.49, 0.5, 0.2]), ("binary", [0.0, 1.0, 0.0])])
def test_a_binary_env_snaps_the_opening_it_sends(cell, mode, want):
    """RobotEnv(gripper="binary") (`vla rl --gripper`): each row's opening goes out shut or open, as a gripper
    controller would; the motion columns are sent unchanged."""
    site, arm, _ = cell
    env = RobotEnv(RobotClient(site), instruction="go", control_hz=50.0, gripper=mode)
    env.reset(seed=1)
    arm.calls.clear()
    chunk = np.zeros((3, 7), np.float32)
    chunk[:, 0], chunk[:, 6] = 0.01, [0.49, 0.5, 0.2]
    env.step(chunk)
    sent = [c[3] for c in arm.motion_calls() if c[0] == "ee_pose"]
    assert sent == pytest.approx(want)
    np.testing.assert_allclose(arm.pos[0], 0.5 + 0.03, atol=1e-6)
    env.close()
    with pytest.raises(ValueError, match="gripper 'auto'"):
        RobotEnv(RobotClient(site), gripper="auto")
