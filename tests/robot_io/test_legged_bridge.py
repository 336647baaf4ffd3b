"""The legged device kind over the bridge with the simulated Go1: a client killed with SIGKILL
mid-walk leaves the robot in its safe state (damp, then sit) within 2x command_timeout_ms,
measured; malformed legged messages are refused without moving it; limits are enforced in the
server; LeggedEnv drives it."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from hardware.sim_go1 import SimGo1
from robot_io.client import CommandError, DeviceClient, StreamReader
from robot_io.legged_env import STATE_DIM, LeggedEnv
from robot_io.limits import LeggedLimits
from robot_io.server import SERVICES, DeviceServer, LeggedService
from robot_io.wire import Message, encode

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_MS = 200


@pytest.fixture(scope="module")
def rt_server():
    srv = DeviceServer(LeggedService("go1", SimGo1("go1", realtime=True)), "tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
                       command_timeout_ms=TIMEOUT_MS)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def fast_server():
    srv = DeviceServer(LeggedService("go1", SimGo1("go1", realtime=False)), "tcp://127.0.0.1:*", None,
                       command_timeout_ms=5000)
    srv.start()
    yield srv
    srv.stop()


CLIENT = textwrap.dedent("""
    import sys, time
    import numpy as np
    from robot_io.client import DeviceClient
    c = DeviceClient(sys.argv[1], "go1", timeout_s=5.0, heartbeat_hz=20)
    c.request("reset", seed=0, timeout_s=10)
    i = 0
    while True:  # walk forward at 20 Hz until killed
        c.request("body_velocity", {"velocity": np.array([0.3, 0.0, 0.0], np.float32)})
        i += 1
        if i == 20:
            print("MOVING", flush=True)
        time.sleep(0.05)
""")


def test_legged_kind_is_registered():
    assert SERVICES["legged"] is LeggedService


def test_sigkill_client_puts_go1_in_safe_state_within_2x_timeout(rt_server):
    srv = rt_server
    trips_before = srv.stats["watchdog_trips"]
    with StreamReader(srv.stream_endpoint, "record") as states:
        proc = subprocess.Popen([sys.executable, "-c", CLIENT, srv.command_endpoint], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "MOVING"
            m = states.latest(2.0)
            assert m["mode"] == "velocity" and np.abs(m.arrays["dq"]).max() > 0.2, "the Go1 should be walking"
            t_kill = time.monotonic_ns()
            proc.kill()  # SIGKILL: no goodbye, heartbeats stop mid-stream
            proc.wait(5)
        finally:
            if proc.poll() is None:
                proc.kill()
        t_safe = None
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            m = states.next(0.5)
            if m is not None and m.t_mono_ns > t_kill and m["safe"]:
                t_safe = m.t_mono_ns
                break
    assert t_safe is not None, "the Go1 never reported its safe state after the client was killed"
    latency_ms = (t_safe - t_kill) / 1e6
    print(f"client SIGKILL -> Go1 safe state: {latency_ms:.1f} ms (timeout {TIMEOUT_MS} ms)")
    assert latency_ms <= 2 * TIMEOUT_MS
    assert m["mode"] == "safe"
    assert srv.stats["watchdog_trips"] == trips_before + 1
    # safe state = damp, then sit: after damp_s + sit_s the robot rests in the sit posture
    time.sleep(2.2)
    with StreamReader(srv.stream_endpoint, "latest") as r:
        s = r.latest(1.0, newer_than_ns=time.monotonic_ns())
    assert s["safe"] and s["mode"] == "safe"
    assert s.arrays["base_height"][0] < 0.12 and np.abs(s.arrays["dq"]).max() < 0.2
    # motion stays refused until a reset re-arms it
    with DeviceClient(srv.command_endpoint, "go1", 5.0) as c:
        with pytest.raises(CommandError) as e:
            c.request("body_velocity", {"velocity": np.zeros(3, np.float32)})
        assert e.value.code == "safe_state"
        c.request("reset", seed=0, timeout_s=10)


def test_malformed_legged_messages_do_not_move_the_go1(fast_server, raw_dealer):
    srv = fast_server
    with DeviceClient(srv.command_endpoint, "go1", 10.0) as c:
        c.request("reset", seed=1)
        c.request("stand")
        before = c.request("capture")
        q = np.asarray(before.arrays["q"], np.float32)
        g = np.full(12, 40.0, np.float32)
        bad = [
            ("legged_joints", {"q": np.where(np.arange(12) == 3, np.nan, q).astype(np.float32), "kp": g, "kd": g}, "q"),
            ("legged_joints", {"q": q.astype(np.float64), "kp": g, "kd": g}, "q"),
            ("legged_joints", {"q": q[:11], "kp": g, "kd": g}, "q"),
            ("legged_joints", {"q": q, "kd": g}, "kp"),
            ("legged_joints", {"q": q, "kp": g, "kd": np.full(12, np.inf, np.float32)}, "kd"),
            ("body_velocity", {"velocity": np.array([0.2, 0, 0], np.float64)}, "velocity"),
            ("body_velocity", {"velocity": np.array([0.2, np.nan, 0], np.float32)}, "velocity"),
            ("body_velocity", {}, "velocity"),
            ("reset", {"__pose": None}, "pose"),
        ]
        for mtype, arrays, field in bad:
            meta = {}
            if "__pose" in arrays:
                arrays, meta = {}, {"pose": "handstand"}
            with pytest.raises(CommandError) as e:
                c.request(mtype, arrays, **meta)
            assert e.value.field == field, (mtype, e.value)
        s = raw_dealer(srv.command_endpoint)
        s.send_multipart([b"\x93random"])
        s.send_multipart(encode(Message("body_velocity", "go1", {"velocity": np.full(3, 0.2, np.float32)},
                                        {"req_id": "t", "deadline_ns": 2**62}))[:1])  # array frame missing
        s.send_multipart(encode(Message("legged_joints", "go1", {"q": q, "kp": g, "kd": g},
                                        {"req_id": "late", "deadline_ns": 1})))  # deadline long past
        for _ in range(3):
            assert s.poll(2000) and s.recv_multipart()
        after = c.request("capture")
        # fast mode: physics only advances on an applied command, so nothing moved at all
        np.testing.assert_array_equal(after.arrays["sim_time"], before.arrays["sim_time"])
        np.testing.assert_array_equal(after.arrays["q"], before.arrays["q"])
        assert after["mode"] == "stand"
        assert c.ping() < 1.0  # still serving


def test_limits_are_enforced_in_the_server(fast_server):
    srv = fast_server
    lim = LeggedLimits()
    with DeviceClient(srv.command_endpoint, "go1", 10.0) as c:
        c.request("reset", seed=2)
        r = c.request("body_velocity", {"velocity": np.array([5.0, -5.0, 0.1], np.float32)})
        np.testing.assert_allclose(r.arrays["applied"], [lim.max_velocity[0], -lim.max_velocity[1], 0.1], rtol=1e-6)
        assert r["clipped"] == ["velocity:vx", "velocity:vy"]
        c.request("reset", seed=2, pose="sit")  # calves folded near their range's end
        q = c.request("capture").arrays["q"]
        target = q.copy()
        target[1] += 2.0  # far beyond the per-command step
        target[2] = -5.0  # beyond the calf's range (and the step)
        r = c.request("legged_joints", {"q": target, "kp": np.full(12, 500.0, np.float32),
                                        "kd": np.full(12, -1.0, np.float32)})
        assert set(r["clipped"]) == {"q:max_step", "q:joint_limits", "kp:range", "kd:range"}
        assert r.arrays["applied"][1] <= q[1] + lim.max_joint_step_rad + 1e-6
        assert r.arrays["applied"][2] >= -2.818 + lim.joint_margin_rad - 1e-6
        assert r.arrays["kp"].max() == lim.max_kp and r.arrays["kd"].min() == 0.0
        c.request("reset", seed=2)


def test_legged_env_walks_in_the_fast_sim(fast_server):
    srv = fast_server
    env = LeggedEnv(DeviceClient(srv.command_endpoint, "go1", 10.0), action="velocity", max_episode_steps=5)
    try:
        assert env.sync and env.action_space.shape == (3,)
        obs, _ = env.reset(seed=0)
        assert obs["state"].shape == (STATE_DIM,) and obs["state"].dtype == np.float32 and obs["images"] == {}
        assert env.observation_space.contains(obs)
        x0 = env.last_state.arrays["base_pos"][:2].copy()
        done, steps = False, 0
        while not done:
            obs, r, term, trunc, info = env.step(np.tile([0.3, 0.0, 0.0], (10, 1)).astype(np.float32))  # a chunk
            steps += 1
            done = term or trunc
            assert not info["fallen"] and info["applied"].shape == (10, 3)
        assert steps == 5 and trunc and not term
        assert np.linalg.norm(env.last_state.arrays["base_pos"][:2] - x0) > 0.1  # 1 s of walking moved it
        with pytest.raises(ValueError):
            env.step(np.zeros(12, np.float32))
    finally:
        env.close()
    jenv = LeggedEnv(DeviceClient(srv.command_endpoint, "go1", 10.0), action="joints")
    try:
        obs, _ = jenv.reset(seed=0)
        q = obs["state"][:12]
        obs, *_ = jenv.step(q)
        assert jenv.last_state["mode"] == "joint"
        np.testing.assert_allclose(obs["state"][:12], q, atol=0.05)
    finally:
        jenv.close()


def test_sim_go1_site_builds_a_legged_server_and_refuses_arm_limits():
    import hardware
    from robot_io.site import SiteError, build_servers, load_site, parse_site

    site = load_site("sim-go1")
    (srv,) = build_servers(site, hardware.load_driver)
    assert isinstance(srv.service, LeggedService) and srv.service.limits.max_velocity == (0.5, 0.3, 1.0)
    raw = {"devices": {"go1": {"driver": "sim_go1", "command": "tcp://127.0.0.1:5580",
                               "params": {"realtime": False}, "limits": {"max_step_m": 0.02}}}}
    with pytest.raises(SiteError, match="devices.go1.limits.*unknown legged limit"):
        build_servers(parse_site(raw), hardware.load_driver)
    with pytest.raises(SiteError, match="devices.go1.limits"):
        parse_site({"devices": {"go1": {"driver": "sim_go1", "command": "tcp://127.0.0.1:5580",
                                        "limits": {"max_velocity": [1.0, 2.0]}}}})
