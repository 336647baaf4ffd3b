"""wait_for_bridge / bridge_is_up against a bridge that is alive but busy.

A bridge still starting on a loaded machine can leave a ping queued past its deadline; it then answers
``deadline_exceeded``. That is an answer from a live bridge: the waiters ask again instead of failing the
command that started the bridge (CI once failed `vla eval` this way)."""

import threading
import types

import pytest
import zmq

from robot_io.bridge_process import bridge_is_up
from robot_io.client import CommandError
from robot_io.robot import wait_for_bridge
from robot_io.wire import Message, decode, encode, error_message


class _BusyThenReady:
    """A ROUTER that answers the first ``late`` pings with deadline_exceeded (or ``code``), then pings normally."""

    def __init__(self, late: int, code: str = "deadline_exceeded") -> None:
        self.late, self.code, self.pings = late, code, 0
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(20):
                continue
            ident, *frames = self.sock.recv_multipart()
            msg = decode(frames)
            self.pings += 1
            if self.pings <= self.late:
                reply = error_message("arm", msg["req_id"], self.code, "command arrived 2.0 ms after its deadline")
            else:
                reply = Message("reply", "arm", {}, {"req_id": msg["req_id"]})
            self.sock.send_multipart([ident, *encode(reply)])

    def site(self):
        return types.SimpleNamespace(name="busy", devices={"arm": types.SimpleNamespace(command=self.endpoint)},
                                     security=None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close(linger=0)


@pytest.fixture
def busy():
    made = []

    def make(late, code="deadline_exceeded"):
        made.append(_BusyThenReady(late, code))
        return made[-1]

    yield make
    for b in made:
        b.close()


def test_late_pings_are_asked_again_until_one_is_answered_in_time(busy):
    b = busy(late=3)
    wait_for_bridge(b.site(), timeout_s=10)
    assert b.pings == 4


def test_a_bridge_that_only_answers_late_times_out_naming_the_device(busy):
    b = busy(late=10**9)
    with pytest.raises(TimeoutError, match="'arm'.*after its deadline"):
        wait_for_bridge(b.site(), timeout_s=0.3)
    assert b.pings >= 2


def test_other_refusals_are_not_swallowed(busy):
    b = busy(late=1, code="not_owner")
    with pytest.raises(CommandError) as e:
        wait_for_bridge(b.site(), timeout_s=10)
    assert e.value.code == "not_owner" and b.pings == 1


def test_bridge_is_up_counts_a_late_answer_as_up(busy):
    assert bridge_is_up(busy(late=1).site())
