import pytest
import zmq

from robot_io.client import DeviceClient
from robot_io.server import ArmService, DeviceServer
from tests.mocks.fake_arm import KinematicArm


@pytest.fixture
def kin_server():
    """A kinematic arm served on ephemeral loopback ports (fast protocol tests)."""
    arm = KinematicArm()
    srv = DeviceServer(ArmService("arm", arm), "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", command_timeout_ms=200)
    srv.start()
    yield srv, arm
    srv.stop()


@pytest.fixture
def raw_dealer():
    socks = []

    def make(endpoint):
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        socks.append(s)
        return s

    yield make
    for s in socks:
        s.close(linger=0)


@pytest.fixture
def client_for():
    clients = []

    def make(srv, **kw):
        c = DeviceClient(srv.command_endpoint, srv.name, **{"timeout_s": 2.0, **kw})
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()
