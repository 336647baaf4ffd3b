"""The watchdog measures the owner's silence up to the last message that ARRIVED, not the last one
the server got round to: a server thread that was starved of CPU or busy in a slow call must not
trip while the owner's heartbeats wait in its queue; a truly silent owner still trips on time."""

import heapq
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import zmq

from robot_io.client import DeviceClient
from robot_io.server import ArmService, DeviceServer
from robot_io.wire import decode
from tests.mocks.fake_arm import KinematicArm

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_MS = 200
STILL = {"action": np.array([0.0, 0, 0, 0, 0, 0, 1], np.float32)}


class SlowDescribeArm(KinematicArm):
    """describe() takes ``slow_s`` once armed: a slow driver call in the command thread."""

    slow_s = 0.0

    def describe(self):
        time.sleep(self.slow_s)
        return super().describe()


def test_owner_heartbeats_queued_behind_a_slow_command_do_not_trip_the_watchdog(client_for):
    arm = SlowDescribeArm()
    srv = DeviceServer(ArmService("arm", arm), "tcp://127.0.0.1:*", command_timeout_ms=TIMEOUT_MS).start()
    try:
        owner = client_for(srv, heartbeat_hz=50)
        other = client_for(srv, timeout_s=5.0)
        owner.request("ee_delta", STILL)
        arm.slow_s = 2 * TIMEOUT_MS / 1e3  # the command thread is busy for twice the timeout...
        for _ in range(3):
            other.describe()  # ... while the owner's heartbeats queue up, every 20 ms
            time.sleep(0.05)
        arm.slow_s = 0.0
        assert srv.stats["watchdog_trips"] == 0, "tripped although the owner's heartbeats had arrived"
        owner.request("ee_delta", STILL)  # still active, not latched
        # ... and once the owner is silent for real, the watchdog fires
        owner.stop_heartbeat()
        time.sleep(2.5 * TIMEOUT_MS / 1e3)
        assert srv.stats["watchdog_trips"] == 1
    finally:
        srv.stop()


class ReplyDelayProxy:
    """Between clients and a server: requests pass at once, replies arrive ``delay_s`` late (a
    loaded machine, where a round trip takes several scheduler wake-ups). One DEALER towards the
    server per client connection, so the server still tells the clients apart."""

    def __init__(self, server_endpoint: str, delay_s: float) -> None:
        self.server_endpoint, self.delay_s = server_endpoint, delay_s
        self.front = zmq.Context.instance().socket(zmq.ROUTER)
        self.front.setsockopt(zmq.LINGER, 0)
        self.front.bind("tcp://127.0.0.1:*")
        self.endpoint = self.front.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        backs: dict[bytes, zmq.Socket] = {}
        due: list = []  # (time to deliver, n, client id, frames)
        n = 0
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                for sock, _ in poller.poll(2):
                    if sock is self.front:
                        ident, *frames = self.front.recv_multipart()
                        if ident not in backs:
                            backs[ident] = zmq.Context.instance().socket(zmq.DEALER)
                            backs[ident].setsockopt(zmq.LINGER, 0)
                            backs[ident].connect(self.server_endpoint)
                            poller.register(backs[ident], zmq.POLLIN)
                        backs[ident].send_multipart(frames)
                    else:
                        ident = next(i for i, b in backs.items() if b is sock)
                        n += 1
                        heapq.heappush(due, (time.monotonic() + self.delay_s, n, ident, sock.recv_multipart()))
                while due and due[0][0] <= time.monotonic():
                    _, _, ident, frames = heapq.heappop(due)
                    self.front.send_multipart([ident, *frames])
        finally:
            for b in backs.values():
                b.close(linger=0)
            self.front.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)


def test_heartbeats_keep_their_cadence_when_replies_are_slow(kin_server):
    """The client's heartbeats must not wait for the previous reply: with replies 1.5x the
    timeout late, a heartbeat thread that did would leave gaps longer than the timeout."""
    from robot_io.client import DeviceClient

    srv, arm = kin_server
    proxy = ReplyDelayProxy(srv.command_endpoint, 1.5 * TIMEOUT_MS / 1e3)
    c = DeviceClient(proxy.endpoint, "arm", timeout_s=3.0, heartbeat_hz=50)
    try:
        c.request("ee_delta", STILL)
        time.sleep(1.0)
        assert srv.stats["watchdog_trips"] == 0, "slow replies throttled the heartbeats below the timeout"
        assert srv.active
        c.request("ee_delta", STILL)  # not latched
    finally:
        c.close()
        proxy.close()


CLIENT = textwrap.dedent("""
    import sys, time
    import numpy as np
    from robot_io.client import CommandError, DeviceClient
    still = {"action": np.array([0, 0, 0, 0, 0, 0, 1], np.float32)}
    c = DeviceClient(sys.argv[1], "arm", timeout_s=5.0, heartbeat_hz=50)
    c.request("reset", timeout_s=10)
    c.request("ee_delta", still)
    print("GO", flush=True)
    while True:  # an operator holding still: heartbeats at 50 Hz, a command now and then
        time.sleep(0.5)
        try:
            c.request("ee_delta", still)
        except CommandError:  # latched by a trip: re-arm and carry on, the server counts trips
            c.request("reset", timeout_s=10)
            c.request("ee_delta", still)
""")

HOG = "import time\nt = time.monotonic() + {s}\nwhile time.monotonic() < t:\n    pass\n"
TRANSPORT_MS = 100
"""A message the owner sent this long before a trip should have reached the server by then."""


def test_heartbeating_owner_never_trips_under_cpu_hog_and_a_killed_one_does(capsys):
    """Busy-loop processes load the machine (3 per core, for a bounded time) while a client
    heartbeats at 50 Hz for a few seconds: no false trip. Then the client is SIGKILLed under the
    same load: the arm reaches its safe state within the timeout plus a margin.

    False: a trip although the owner had sent a message (its header's ``t_mono_ns``, same host
    clock) between ``TIMEOUT_MS`` and ``TRANSPORT_MS`` before it. A trip after the owner itself
    sent nothing for the timeout (its process starved on a machine shared with other work) is
    the watchdog doing its job; on a quiet machine at a load of ~6 there is none either.
    ``VLA_HOG_SECONDS`` / ``VLA_HOGS_PER_CPU`` make it a longer or harder stress run."""
    hold_s = float(os.environ.get("VLA_HOG_SECONDS", "6"))
    n_hogs = int(os.environ.get("VLA_HOGS_PER_CPU", "3")) * (os.cpu_count() or 2)
    srv = DeviceServer(ArmService("arm", KinematicArm()), "tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
                       command_timeout_ms=TIMEOUT_MS).start()
    trips: list[int] = []
    safe_state = srv.service.safe_state
    srv.service.safe_state = lambda: (trips.append(time.monotonic_ns()), safe_state())
    sent: list[int] = []  # send stamps of every message the server handled (all the owner's here)
    handle = srv._handle_frames

    def recording(frames, *peer):
        reply = handle(frames, *peer)
        sent.append(decode(frames).t_mono_ns)
        return reply

    srv._handle_frames = recording
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, srv.command_endpoint], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    hogs = []
    try:
        assert proc.stdout.readline().strip() == "GO"
        hogs = [subprocess.Popen([sys.executable, "-c", HOG.format(s=hold_s + 3)]) for _ in range(n_hogs)]
        time.sleep(hold_s)
        load = os.getloadavg()[0]
        trips_alive, n_sent = list(trips), len(sent)
        t_kill = time.monotonic_ns()
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        deadline = time.monotonic() + 2.0
        while len(trips) == len(trips_alive) and time.monotonic() < deadline:
            time.sleep(0.005)
        latency_ms = (trips[-1] - t_kill) / 1e6 if len(trips) > len(trips_alive) else float("inf")
    finally:
        for p in [proc, *hogs]:
            if p.poll() is None:
                p.kill()
            p.wait(5)
        srv.stop()
    window, transport = TIMEOUT_MS * 1_000_000, TRANSPORT_MS * 1_000_000
    false = [t for t in trips_alive if any(t - window < s <= t - transport for s in sent)]
    gaps = np.diff(sorted(sent[:n_sent])) / 1e6
    with capsys.disabled():
        print(f"\n{n_hogs} hogs, load {load:.1f}: {n_sent} owner messages in {hold_s:.0f} s (longest send gap "
              f"{gaps.max():.0f} ms), {len(trips_alive)} trip(s), {len(false)} false; "
              f"SIGKILL -> safe state {latency_ms:.0f} ms")
    assert not false, f"{len(false)} false watchdog trip(s): the owner's messages had been sent in time"
    assert latency_ms <= 2 * TIMEOUT_MS + 200, "a killed owner must still trip the watchdog under load"
