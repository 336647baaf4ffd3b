"""CurveZMQ: a server bound off loopback refuses to start without keys and refuses clients
without the right keys. Traffic stays on this machine: the server binds 0.0.0.0 (off loopback),
clients connect to 127.0.0.1."""

import socket

import numpy as np
import pytest

from robot_io.client import BridgeTimeout, DeviceClient
from robot_io.security import CurveKeys, SecurityError, is_local_endpoint, make_keys
from robot_io.server import ArmService, DeviceServer
from tests.mocks.fake_arm import KinematicArm


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


@pytest.mark.parametrize("ep, local", [("tcp://127.0.0.1:5", True), ("tcp://localhost:5", True),
                                        ("tcp://[::1]:5", True), ("ipc:///tmp/x", True), ("inproc://x", True),
                                        ("tcp://0.0.0.0:5", False), ("tcp://*:5", False),
                                        ("tcp://192.168.1.20:5", False), ("tcp://eth0:5", False)])
def test_is_local_endpoint(ep, local):
    assert is_local_endpoint(ep) is local


def test_refuses_to_bind_off_loopback_without_keys():
    srv = DeviceServer(ArmService("arm", KinematicArm()), f"tcp://0.0.0.0:{_free_port()}")
    with pytest.raises(SecurityError, match="--insecure"):
        srv.start()


def test_insecure_flag_allows_it_explicitly():
    srv = DeviceServer(ArmService("arm", KinematicArm()), f"tcp://0.0.0.0:{_free_port()}", insecure=True)
    srv.start()
    try:
        port = srv.command_endpoint.rsplit(":", 1)[1]
        with DeviceClient(f"tcp://127.0.0.1:{port}", "arm", 1.0) as c:
            assert c.ping() < 1.0
    finally:
        srv.stop()


def test_client_without_keys_is_refused_client_with_keys_served(tmp_path):
    k = make_keys(str(tmp_path / "keys"), ("operator", "intruder"))
    # the intruder has a key pair, but its public key is not in authorized_clients
    import os
    os.remove(os.path.join(k["authorized_clients"], "intruder.key"))
    server_keys = CurveKeys(server_secret=k["server_secret"], authorized_clients=k["authorized_clients"])
    arm = KinematicArm()
    srv = DeviceServer(ArmService("arm", arm), f"tcp://0.0.0.0:{_free_port()}", keys=server_keys)
    srv.start()
    ep = "tcp://127.0.0.1:" + srv.command_endpoint.rsplit(":", 1)[1]
    try:
        with DeviceClient(ep, "arm", 0.5) as plain:
            with pytest.raises(BridgeTimeout, match="keys"):
                plain.request("ee_delta", {"action": np.full(7, 0.01, np.float32)})
        bad = CurveKeys(client_secret=k["intruder_secret"], server_public=k["server_public"])
        with DeviceClient(ep, "arm", 0.5, keys=bad) as c:
            with pytest.raises(BridgeTimeout):
                c.ping()
        assert arm.motion_calls() == []
        good = CurveKeys(client_secret=k["operator_secret"], server_public=k["server_public"])
        with DeviceClient(ep, "arm", 2.0, keys=good) as c:
            c.request("ee_delta", {"action": np.full(7, 0.01, np.float32)})
        assert len(arm.motion_calls()) == 1
    finally:
        srv.stop()


def test_two_servers_in_one_process_each_admit_their_own_clients(tmp_path):
    """One ZAP handler serves every server socket of a context: each server's folder of authorised
    clients must count for that server only (a second server once inherited the first one's)."""
    servers, keysets = [], []
    try:
        for name in ("lab_a", "lab_b"):
            k = make_keys(str(tmp_path / name), ("operator",))
            srv = DeviceServer(ArmService("arm", KinematicArm()), f"tcp://0.0.0.0:{_free_port()}",
                               keys=CurveKeys(server_secret=k["server_secret"], authorized_clients=k["authorized_clients"]))
            srv.start()
            servers.append(srv)
            keysets.append(k)
        for srv, k, other in zip(servers, keysets, reversed(keysets)):
            ep = "tcp://127.0.0.1:" + srv.command_endpoint.rsplit(":", 1)[1]
            good = CurveKeys(client_secret=k["operator_secret"], server_public=k["server_public"])
            with DeviceClient(ep, "arm", 2.0, keys=good) as c:
                c.ping()
            stranger = CurveKeys(client_secret=other["operator_secret"], server_public=k["server_public"])
            with DeviceClient(ep, "arm", 0.5, keys=stranger) as c:
                with pytest.raises(BridgeTimeout):
                    c.ping()
    finally:
        for srv in servers:
            srv.stop()


def test_a_request_with_no_connection_to_send_on_times_out(monkeypatch):
    """A DEALER socket with no live connection (ZMQ_IMMEDIATE here; a refused CurveZMQ handshake in the field) blocks
    in send: the request's deadline must cover the send, not only the reply (the security test above once hung 300 s
    in ``ping`` under load)."""
    import threading

    import zmq

    from robot_io.client import DeviceClient as Client

    make = Client._make_socket

    def immediate(self):
        s = make(self)
        s.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing until a connection is up, as after a failed handshake
        s.disconnect(self.endpoint)
        s.connect(self.endpoint)
        return s

    monkeypatch.setattr(Client, "_make_socket", immediate)
    result = {}

    def call():
        try:
            with Client(f"tcp://127.0.0.1:{_free_port()}", "arm", 0.3) as c:  # nobody listens
                c.ping()
        except BridgeTimeout as e:
            result["error"] = str(e)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(5.0)
    assert not t.is_alive(), "the request blocked past its deadline"
    assert "could not send 'ping'" in result["error"]
