"""Bridge server on loopback: commands, clipping, refusals, watchdog, deadlines."""

import os
import time

import msgpack
import numpy as np
import pytest

from robot_io.client import BridgeTimeout, CommandError, DeviceClient, StreamReader
from robot_io.wire import PROTOCOL_VERSION, Message, decode, encode


FAR = 2**62  # a deadline that never passes


def _ee(action):
    return {"action": np.asarray(action, np.float32)}


def test_ee_delta_applies_and_replies(kin_server, client_for):
    srv, arm = kin_server
    c = client_for(srv)
    r = c.request("ee_delta", _ee([0.01, 0, -0.02, 0, 0, 0, 0.5]))
    assert r.type == "reply" and r["clipped"] == []
    np.testing.assert_allclose(r.arrays["applied"], [0.01, 0, -0.02, 0, 0, 0, 0.5], atol=1e-6)
    np.testing.assert_allclose(arm.pos, [0.51, 0.0, 0.38], atol=1e-6)
    assert arm.grip == 0.5


def test_command_outside_limits_is_clipped_and_reply_says_so(kin_server, client_for):
    srv, arm = kin_server
    c = client_for(srv)
    lim = srv.service.limits
    r = c.request("ee_delta", _ee([0.5, 0, 0, 0, 0, 2.0, 1.7]))
    assert set(r["clipped"]) == {"dpos:max_step", "drot:max_step", "gripper:range"}
    applied = r.arrays["applied"]
    assert applied[0] == pytest.approx(lim.max_step_m)
    assert np.linalg.norm(applied[3:6]) == pytest.approx(lim.max_step_rad, rel=1e-5)
    assert applied[6] == 1.0
    # walk into the workspace ceiling
    for _ in range(20):
        r = c.request("ee_delta", _ee([0, 0, 0.05, 0, 0, 0, 1]))
    assert "dpos:workspace" in r["clipped"]
    assert arm.pos[2] == pytest.approx(lim.workspace_max[2])
    # joint targets past the joint range and the max step
    r = c.request("joint_position", {"q": np.full(7, 3.5, np.float32)})
    assert "q:max_step" in r["clipped"]
    assert np.allclose(r.arrays["applied"], lim.max_joint_step_rad)


BAD = {
    "nan action": lambda: encode(Message("ee_delta", "arm", _ee([0, np.nan, 0, 0, 0, 0, 1]),
                                         {"req_id": "b", "deadline_ns": FAR})),
    "inf action": lambda: encode(Message("ee_delta", "arm", _ee([0, 0, np.inf, 0, 0, 0, 1]),
                                         {"req_id": "b", "deadline_ns": FAR})),
    "wrong dtype": lambda: encode(Message("ee_delta", "arm", {"action": np.zeros(7, np.float64) + 0.01},
                                          {"req_id": "b", "deadline_ns": FAR})),
    "wrong shape": lambda: encode(Message("ee_delta", "arm", {"action": np.full(6, 0.01, np.float32)},
                                          {"req_id": "b", "deadline_ns": FAR})),
    "unknown type": lambda: [msgpack.packb({"v": PROTOCOL_VERSION, "type": "teleport", "device": "arm", "seq": 1,
                                            "t_mono_ns": 1, "t_wall_ns": 1, "arrays": [], "req_id": "b"})],
    "unknown version": lambda: [msgpack.packb({"v": 7, "type": "ee_delta", "device": "arm", "seq": 1,
                                               "t_mono_ns": 1, "t_wall_ns": 1, "arrays": [], "req_id": "b"})],
    "truncated multipart": lambda: encode(Message("ee_delta", "arm", _ee([0.01] * 7),
                                                  {"req_id": "b", "deadline_ns": FAR}))[:1],
    "random bytes": lambda: [os.urandom(64)],
    "stream type as command": lambda: encode(Message("state", "arm", {}, {})),
    "deadline passed": lambda: encode(Message("ee_delta", "arm", _ee([0.01] * 7), {"req_id": "b", "deadline_ns": 1})),
}
EXPECTED = {"nan action": ("non_finite", "action"), "inf action": ("non_finite", "action"),
            "wrong dtype": ("bad_dtype", "action"), "wrong shape": ("bad_shape", "action"),
            "unknown type": ("unknown_type", "type"), "unknown version": ("bad_version", "v"),
            "truncated multipart": ("truncated", "arrays"), "random bytes": ("bad_header", "header"),
            "stream type as command": ("unknown_type", "type"), "deadline passed": ("deadline_exceeded", "deadline_ns")}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_is_refused_device_still_and_server_keeps_serving(case, kin_server, raw_dealer, client_for):
    srv, arm = kin_server
    before = arm.read_state()
    sock = raw_dealer(srv.command_endpoint)
    sock.send_multipart(BAD[case]())
    assert sock.poll(2000), "no reply to a malformed message"
    reply = decode(sock.recv_multipart())
    code, field = EXPECTED[case]
    assert reply.type == "error" and reply["code"] == code, reply.meta
    assert reply["field"] == field
    assert reply["message"]  # a sentence naming the problem
    assert arm.motion_calls() == [], "the device moved on a refused message"
    np.testing.assert_array_equal(arm.read_state().ee_pos, before.ee_pos)
    # ... and the server still serves
    c = client_for(srv)
    assert c.ping() < 1.0
    c.request("ee_delta", _ee([0.01, 0, 0, 0, 0, 0, 1]))
    assert len(arm.motion_calls()) == 1


def test_error_reply_raises_command_error_with_field(kin_server, client_for):
    srv, _ = kin_server
    c = client_for(srv)
    with pytest.raises(CommandError) as e:
        c.request("ee_delta", {"action": np.zeros(3, np.float32)})
    assert e.value.code == "bad_shape" and e.value.field == "action"


def test_watchdog_latches_until_reset(kin_server, client_for):
    srv, arm = kin_server
    c = client_for(srv)
    c.request("ee_delta", _ee([0.01, 0, 0, 0, 0, 0, 1]))
    time.sleep(0.45)  # > command_timeout_ms (200) with no contact
    assert ("hold",) in arm.calls and srv.stats["watchdog_trips"] == 1
    with pytest.raises(CommandError) as e:
        c.request("ee_delta", _ee([0.01, 0, 0, 0, 0, 0, 1]))
    assert e.value.code == "safe_state"
    c.request("reset", seed=3)
    c.request("ee_delta", _ee([0.01, 0, 0, 0, 0, 0, 1]))


def test_heartbeat_keeps_watchdog_quiet(kin_server, client_for):
    srv, arm = kin_server
    c = client_for(srv, heartbeat_hz=20)
    c.request("ee_delta", _ee([0.01, 0, 0, 0, 0, 0, 1]))
    time.sleep(0.6)
    assert srv.stats["watchdog_trips"] == 0
    c.stop_heartbeat()  # silent from now on (close() would release the arm): the watchdog must fire
    time.sleep(0.45)
    assert srv.stats["watchdog_trips"] == 1


def test_stop_command_is_a_software_estop(kin_server, client_for):
    srv, arm = kin_server
    c = client_for(srv)
    c.request("stop")
    assert ("hold",) in arm.calls
    with pytest.raises(CommandError, match="safe state"):
        c.request("joint_position", {"q": np.zeros(7, np.float32)})


def test_describe_and_state_stream(kin_server, client_for):
    srv, arm = kin_server
    d = client_for(srv).describe()
    assert d["kind"] == "arm" and d["limits"]["max_step_m"] > 0 and d["command_timeout_ms"] == 200
    with StreamReader(srv.stream_endpoint, "record") as rec:
        m = rec.next(2.0)
        assert m is not None and m.type == "state"
        assert m.arrays["ee_pos"].shape == (3,) and m.arrays["q"].dtype == np.float32
        time.sleep(0.2)
        assert rec.received >= 5 and rec.lost == 0


def test_timeout_names_the_endpoint():
    c = DeviceClient("tcp://127.0.0.1:1", "nobody", timeout_s=0.2)
    with pytest.raises(BridgeTimeout, match="tcp://127.0.0.1:1"):
        c.ping()
    c.close()
