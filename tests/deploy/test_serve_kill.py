"""Issue 16, acceptance 3: killing the policy server (SIGKILL, at a random moment) puts the simulated
arm in its safe state within 2x the client's deadline. The arm's safe state is read where it
happens: the ``safe`` flag of the sim arm's own state stream, stamped by the simulator."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("mujoco")

from robot_io.client import StreamReader  # noqa: E402
from tests.net import free_ports  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 1.0  # the bound is 2x this; 0.5 s left too little room for a saturated 2-core CI machine


@pytest.fixture(scope="module")
def sim_arm(tmp_path_factory):
    """The simulated Franka (real time, no cameras) served by a bridge process on free ports."""
    from robot_io.bridge_process import running_bridge
    from robot_io.site import load_site

    d = tmp_path_factory.mktemp("serve_kill")
    ports = free_ports(2)
    site = d / "site.yaml"
    site.write_text(textwrap.dedent(f"""\
        name: serve-kill-test
        robot: {{arm: arm, cameras: []}}
        devices:
          arm:
            driver: sim_franka
            command: tcp://127.0.0.1:{ports[0]}
            stream: tcp://127.0.0.1:{ports[1]}
            command_timeout_ms: 3000
            state_hz: 100
            params: {{realtime: true, seed: 0}}
        """))
    with running_bridge(load_site(str(site)), str(d / "bridge.log"), start="always"):
        yield site, f"tcp://127.0.0.1:{ports[1]}"


def _wait_state(reader: StreamReader, safe: bool, after_ns: int, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    last = after_ns
    while time.monotonic() < deadline:
        msg = reader.latest(timeout_s, newer_than_ns=last)
        if bool(msg["safe"]) == safe:
            return msg
        last = msg.t_mono_ns
    raise AssertionError(f"the arm's state did not become safe={safe} within {timeout_s} s")


def test_killing_the_server_puts_the_sim_arm_in_its_safe_state_within_two_deadlines(sim_arm):
    site, stream = sim_arm
    port = free_ports(1)[0]
    server = subprocess.Popen([sys.executable, "-m", "tests.deploy.fake_policy", f"tcp://127.0.0.1:{port}", "0.03"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    client = None
    try:
        assert server.stdout.readline().startswith("tcp://"), "the fake policy server did not start"
        client = subprocess.Popen(
            [sys.executable, "-m", "deploy.runtime", "client", "--server", f"tcp://127.0.0.1:{port}", "--site", str(site),
             "--instruction", "test", "--hz", "10", "--seconds", "0", "--deadline", str(DEADLINE_S), "--reset", "0",
             "--timeout", "20"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert client.stdout.readline().startswith("vla-client: "), client.stderr.read()[-2000:]
        with StreamReader(stream, "latest") as reader:
            _wait_state(reader, safe=False, after_ns=0, timeout_s=60)  # the client drives the arm
            delay = random.uniform(0.5, 1.5)  # any moment: a chunk in flight, or the client idle between calls
            time.sleep(delay)
            assert client.poll() is None, client.stderr.read()[-2000:]
            t_kill = time.monotonic_ns()
            server.kill()
            safe = _wait_state(reader, safe=True, after_ns=t_kill, timeout_s=30)
        elapsed = (safe.t_mono_ns - t_kill) / 1e9
        print(f"killed {delay:.2f} s into the run; arm safe {elapsed * 1e3:.0f} ms later "
              f"(deadline {DEADLINE_S * 1e3:.0f} ms)")
        rc = client.wait(30)
        err = client.stderr.read()
        assert rc == 3, err[-2000:]
        assert "is gone" in err and "safe state" in err and "Traceback" not in err, err[-2000:]
        assert elapsed < 2 * DEADLINE_S, f"safe state {elapsed:.3f} s after the kill (bound {2 * DEADLINE_S} s)"
    finally:
        for p in (server, client):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
