"""Who owns a device: only the client that commands it feeds its watchdog; other clients may
read (ping, describe, capture, heartbeat) and e-stop, but not move, reset or release it."""

import threading
import time

import msgpack
import numpy as np
import pytest

from robot_io.client import CommandError
from robot_io.wire import PROTOCOL_VERSION, decode

TIMEOUT_MS = 200  # the kin_server fixture's command_timeout_ms
STILL = np.array([0.0, 0, 0, 0, 0, 0, 1], np.float32)


def _ee(action=STILL):
    return {"action": np.asarray(action, np.float32)}


def _pester(client, stop: threading.Event, hz: float = 20.0) -> None:
    """Another client: pings, describes, captures and heartbeats at ``hz`` until told to stop."""
    i = 0
    while not stop.wait(1.0 / hz):
        client.request(("ping", "capture", "heartbeat", "describe")[i % 4])
        i += 1


def test_another_clients_pings_do_not_keep_a_silent_owners_arm_active(kin_server, client_for):
    """The incident: a second client pinging at 20 Hz kept a silent operator's arm out of its safe
    state for 2 s. The owner's silence must trip the watchdog on time whatever others send."""
    srv, arm = kin_server
    owner, other = client_for(srv), client_for(srv)
    stop = threading.Event()
    pester = threading.Thread(target=_pester, args=(other, stop), daemon=True)
    pester.start()
    try:
        time.sleep(0.1)
        t_sent = time.monotonic_ns()
        owner.request("ee_delta", _ee())  # the owner's last word
        deadline = time.monotonic() + 1.0
        while srv.stats["watchdog_trips"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        hb = other.request("heartbeat")
    finally:
        stop.set()
        pester.join(2)
    assert srv.stats["watchdog_trips"] == 1, "another client's pings kept the silent owner's arm active"
    trip_ms = (srv.last_trip_ns - t_sent) / 1e6
    print(f"silent owner -> safe state {trip_ms:.0f} ms after its last command (timeout {TIMEOUT_MS} ms)")
    assert trip_ms > TIMEOUT_MS, "tripped before the owner had been silent for the timeout"
    assert trip_ms <= 2 * TIMEOUT_MS
    assert ("hold",) in arm.calls and arm.read_state().safe
    assert hb["owner"] is False and hb["tripped"] is True


def test_a_second_client_cannot_move_reset_or_release_an_owned_arm_but_can_stop_it(kin_server, client_for):
    srv, arm = kin_server
    owner = client_for(srv, heartbeat_hz=50)
    other = client_for(srv)
    owner.request("ee_delta", _ee([0.01, 0, 0, 0, 0, 0, 1]))
    for mtype, arrays in [("ee_delta", _ee([0.05, 0, 0, 0, 0, 0, 1])),
                          ("joint_position", {"q": np.full(7, 0.1, np.float32)}),
                          ("reset", None), ("release", None)]:
        with pytest.raises(CommandError) as e:
            other.request(mtype, arrays)
        assert (e.value.code, e.value.field) == ("not_owner", "client"), mtype
    assert len(arm.motion_calls()) == 1 and not any(c[0] in ("reset", "hold") for c in arm.calls)
    # reads are fine, and the owner keeps commanding
    other.request("capture")
    assert other.request("heartbeat")["owner"] is False
    assert owner.request("heartbeat")["owner"] is True
    owner.request("ee_delta", _ee([0.01, 0, 0, 0, 0, 0, 1]))
    assert len(arm.motion_calls()) == 2
    # the software e-stop is obeyed from anyone, and frees the arm
    other.request("stop")
    assert ("hold",) in arm.calls and srv.owner is None and srv.tripped
    assert srv.stats["watchdog_trips"] == 0


def test_ownership_passes_on_release_close_trip_and_stop(kin_server, client_for):
    srv, arm = kin_server
    a, b = client_for(srv, heartbeat_hz=50), client_for(srv)
    a.request("ee_delta", _ee())
    with pytest.raises(CommandError, match="not_owner"):
        b.request("ee_delta", _ee())
    # release: the arm holds, is not latched, and the next commanding client takes it
    assert a.release() is True
    assert arm.read_state().safe and not srv.tripped and srv.owner is None
    b.request("ee_delta", _ee())
    with pytest.raises(CommandError, match="not_owner"):
        a.request("ee_delta", _ee())
    # close() hands it back too
    b.close()
    a.request("ee_delta", _ee())
    # the watchdog trip frees it (latched: reset first), from any client
    a.stop_heartbeat()
    time.sleep(2.5 * TIMEOUT_MS / 1e3)
    assert srv.stats["watchdog_trips"] == 1 and srv.owner is None
    c = client_for(srv)
    c.request("reset", seed=1)
    c.request("ee_delta", _ee())
    with pytest.raises(CommandError, match="not_owner"):
        a.request("ee_delta", _ee())
    # stop frees it
    c.request("stop")
    a.request("reset")
    a.request("ee_delta", _ee())
    assert srv.owner is not None and srv.stats["watchdog_trips"] == 1


def _raw(sock, mtype, arrays=(), **meta):
    header = {"v": PROTOCOL_VERSION, "type": mtype, "device": "arm", "seq": 1, "t_mono_ns": 1, "t_wall_ns": 1,
              "arrays": [{"name": n, "dtype": "float32", "shape": [7]} for n, _ in arrays],
              "req_id": "r", "deadline_ns": 2**62, **meta}
    sock.send_multipart([msgpack.packb(header), *[a.tobytes() for _, a in arrays]])
    assert sock.poll(2000)
    return decode(sock.recv_multipart())


def test_clients_without_a_client_id_are_told_apart_by_their_routing_id(kin_server, raw_dealer):
    srv, arm = kin_server
    s1, s2 = raw_dealer(srv.command_endpoint), raw_dealer(srv.command_endpoint)
    assert _raw(s1, "ee_delta", [("action", STILL)]).type == "reply"
    r = _raw(s2, "ee_delta", [("action", STILL)])
    assert r.type == "error" and (r["code"], r["field"]) == ("not_owner", "client")
    # s2's heartbeats do not feed s1's watchdog
    t0 = time.monotonic()
    while srv.stats["watchdog_trips"] == 0 and time.monotonic() - t0 < 1.0:
        _raw(s2, "heartbeat")
        time.sleep(0.02)
    assert srv.stats["watchdog_trips"] == 1
    assert len(arm.motion_calls()) == 1
