"""The edge runner drives the simulated Franka over a real bridge (free loopback ports) with an ONNX
policy in the exported layout, without torch; any internal error puts the arm in its safe state."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("mujoco")

from deploy.runtime.edge import EdgeConfig, run_edge  # noqa: E402
from robot_io.client import StreamReader  # noqa: E402
from robot_io.robot import RobotClient  # noqa: E402
from tests.net import free_ports  # noqa: E402
from tests.test_no_torch import BLOCKER  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
INSTR = "pick up the red cube"


def write_site(path: Path, ports: list[int], cameras: bool = True) -> Path:
    cams = "[front, wrist]" if cameras else "[]"
    text = textwrap.dedent(f"""\
        name: edge-test
        description: the simulated arm and two small cameras on free ports
        robot: {{arm: arm, cameras: {cams}}}
        devices:
          arm:
            driver: sim_franka
            command: tcp://127.0.0.1:{ports[0]}
            stream: tcp://127.0.0.1:{ports[1]}
            command_timeout_ms: 300
            state_hz: 100
            params: {{realtime: true, seed: 0}}
        """)
    if cameras:
        for i, cam in enumerate(("front", "wrist")):
            text += textwrap.indent(textwrap.dedent(f"""\
                {cam}:
                  driver: sim_camera
                  command: tcp://127.0.0.1:{ports[2 + 2 * i]}
                  stream: tcp://127.0.0.1:{ports[3 + 2 * i]}
                  params: {{sim: "@arm", camera: {cam}, width: 64, height: 64, fps: 15}}
                """), "  ")
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    """(site file, arm-only site file on the same ports, a policy file with the exported layout).
    The exported compact VLA itself drives the arm in bench/edge.py (test_bench_edge.py); here a
    small graph with the same inputs and metadata keeps the test quick."""
    from robot_io.bridge_process import running_bridge
    from robot_io.site import load_site
    from tests.deploy.graphs import toy_policy

    d = tmp_path_factory.mktemp("edge")
    ports = free_ports(6)
    site = write_site(d / "site.yaml", ports)
    arm_only = write_site(d / "arm_only.yaml", ports, cameras=False)
    policy = toy_policy(str(d / "policy.onnx"), instructions=[INSTR])
    with running_bridge(load_site(str(site)), str(d / "bridge.log"), start="always"):
        yield site, arm_only, policy


def _arm_state(site: Path):
    from robot_io.site import load_site

    arm = load_site(str(site)).devices["arm"]
    with StreamReader(arm.stream, "latest") as r:
        return r.latest(3.0, newer_than_ns=time.monotonic_ns())


def test_vla_edge_drives_the_sim_arm_without_torch(bridge, tmp_path):
    site, _, policy = bridge
    stats_path = tmp_path / "stats.json"
    code = BLOCKER + textwrap.dedent(f"""
        import sys
        from deploy.runtime.cli import main
        rc = main(["--policy", {policy!r}, "--site", {str(site)!r}, "--hz", "10", "--seconds", "3",
                   "--timeout", "20", "--stats", {str(stats_path)!r}])
        assert not [m for m in sys.modules if m.split(".")[0] in ("torch", "vla")], "torch or vla was imported"
        sys.exit(rc)
    """)
    before = _arm_state(site)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    stats = json.loads(stats_path.read_text())
    print(r.stdout.strip().splitlines()[-1])
    # every tick of the 3 s schedule was either executed or counted as skipped (on a busy machine
    # many are skipped: the rate itself is bench/edge.py's business, not this test's)
    assert stats["ticks"] >= 1 and stats["chunks"] >= 1
    assert stats["gripper"] == "raw"  # --gripper auto: the toy file names no executed opening
    assert stats["ticks"] + stats["skipped_ticks"] == 30, stats
    assert stats["latency_ms"]["p50"] is not None and 0 <= stats["deadline_misses"] <= stats["ticks"]
    after = _arm_state(site)
    moved = np.linalg.norm(after.arrays["ee_pos"] - before.arrays["ee_pos"])
    assert moved > 1e-4, f"the arm did not move ({moved * 1e3:.2f} mm)"
    assert after["safe"], "the runner must leave the arm in its safe state (stop) at the end"


class _FailingPolicy:
    """Zero chunks, then ``failure`` on the third call; records whether the arm was active before."""

    def __init__(self, client, failure: str) -> None:
        self.client, self.failure, self.calls, self.was_active = client, failure, 0, None

    def __call__(self, obs, noise=None):
        self.calls += 1
        if self.calls == 3:
            self.was_active = not bool(self.client.last_state["safe"])
            if self.failure == "raise":
                raise RuntimeError("policy crashed")
            if self.failure == "nan":
                return np.full((4, 7), np.nan, np.float32)
            return np.zeros((4, 6), np.float32)
        return np.zeros((4, 7), np.float32)


@pytest.fixture
def kinematic_site(tmp_path):
    """A kinematic arm behind a real device server (instant resets), and a site file naming it."""
    from robot_io.server import ArmService, DeviceServer
    from tests.mocks.fake_arm import KinematicArm

    arm = KinematicArm()
    srv = DeviceServer(ArmService("arm", arm), "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", command_timeout_ms=500)
    srv.start()
    site = tmp_path / "kin.yaml"
    site.write_text(textwrap.dedent(f"""\
        name: kin
        robot: {{arm: arm, cameras: []}}
        devices:
          arm: {{driver: sim_franka, command: "{srv.command_endpoint}", stream: "{srv.stream_endpoint}"}}
        """))
    yield site, arm
    srv.stop()


@pytest.mark.parametrize("failure,error,match", [("raise", RuntimeError, "policy crashed"),
                                                 ("nan", ValueError, "NaN or inf"),
                                                 ("shape", ValueError, r"must be \[H, 7\], got shape \[4, 6\]")])
def test_internal_error_puts_the_arm_in_its_safe_state(kinematic_site, failure, error, match):
    from robot_io.client import CommandError

    site, arm = kinematic_site
    with RobotClient(str(site), sync=False, timeout_s=10) as client:
        client.reset(1)
        pol = _FailingPolicy(client, failure)
        with pytest.raises(error, match=match):
            run_edge(client, pol, INSTR, EdgeConfig(hz=20, seconds=20), exec_steps=2)
        assert pol.was_active, "the arm should have been active (not in its safe state) before the error"
        assert arm.safe, "the runner must send stop (the arm holds) on an internal error"
        # the safe state latches: motion is refused until a reset
        with pytest.raises(CommandError, match="safe"):
            client.ee_delta(np.zeros(7, np.float32))


def test_no_error_no_stop_until_the_end(kinematic_site):
    """The control test: the same loop without a failure keeps the arm active until it ends."""
    site, arm = kinematic_site
    active = []
    with RobotClient(str(site), sync=False, timeout_s=10) as client:
        client.reset(1)
        stats = run_edge(client, lambda obs, noise=None: np.zeros((4, 7), np.float32), INSTR,
                         EdgeConfig(hz=20, seconds=1), exec_steps=2, on_tick=lambda k, row: active.append(not arm.safe))
    # every due tick of the second is executed or skipped (a loaded machine skips some), never lost
    assert all(active) and len(active) >= 2 and stats["ticks"] + stats["skipped_ticks"] == 20
    assert stats["chunks"] == pytest.approx(len(active) / 2, abs=1)
    assert arm.safe  # stopped at the end


def test_vla_edge_refuses_what_the_site_cannot_feed(bridge, capsys):
    from deploy.runtime.cli import main

    site, arm_only, policy = bridge
    assert main(["--policy", policy, "--site", str(arm_only), "--seconds", "1"]) == 2
    err = capsys.readouterr().err
    assert "reads camera(s) ['front', 'wrist']" in err and "Traceback" not in err
    assert main(["--policy", policy, "--site", str(site), "--instruction", "stack the cubes", "--seconds", "1",
                 "--timeout", "20"]) == 2
    assert "not one of the exported instructions ['pick up the red cube']" in capsys.readouterr().err


def test_vla_edge_help_teaches():
    from deploy.runtime.cli import build_parser

    text = build_parser().format_help()
    assert "examples:" in text and "vla-edge --policy" in text and "safe state" in text


def test_sigterm_stops_the_arm(kinematic_site, tmp_path):
    """`systemctl stop` sends SIGTERM: the runner sends stop before it exits."""
    import signal

    from tests.deploy.graphs import toy_policy

    site, arm = kinematic_site
    policy = toy_policy(str(tmp_path / "p.onnx"), cameras=(), instructions=[INSTR])
    code = BLOCKER + ("import sys\nfrom deploy.runtime.cli import main\n"
                      f"sys.exit(main(['--policy', {policy!r}, '--site', {str(site)!r}, '--hz', '20', '--seconds', '0', "
                      "'--reset', '0', '--timeout', '20']))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().startswith("vla-edge: ")  # connected, about to run
        deadline = time.monotonic() + 60
        while arm.safe and time.monotonic() < deadline:  # the reset re-armed it; wait for motion
            time.sleep(0.05)
        time.sleep(0.5)
        assert not arm.safe, "the arm should be active while the runner runs"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 130, proc.stderr.read()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert arm.safe, "SIGTERM must leave the arm in its safe state"


@pytest.mark.parametrize("mode", ["raw", "binary"])
def test_the_edge_runner_snaps_the_opening_when_binary(kinematic_site, mode):
    """`vla-edge --gripper binary`: the opening sent to the arm is 0 or 1 (0.49 -> 0, 0.5 -> 1); raw sends it as is."""
    site, arm = kinematic_site
    chunk = np.zeros((4, 7), np.float32)
    chunk[:, 6] = [0.49, 0.5, 0.2, 0.8]
    sent = []
    with RobotClient(str(site), sync=False, timeout_s=10) as client:
        client.reset(1)
        run_edge(client, lambda obs, noise=None: chunk.copy(), INSTR, EdgeConfig(hz=20, seconds=0.5, gripper=mode),
                 exec_steps=4, on_tick=lambda k, row: sent.append(float(row[6])))
    want = [0.0, 1.0, 0.0, 1.0] if mode == "binary" else [0.49, 0.5, 0.2, 0.8]
    assert len(sent) >= 2 and sent == pytest.approx([want[k % 4] for k in range(len(sent))])
    with pytest.raises(ValueError, match="gripper"):
        EdgeConfig(gripper="auto")  # the CLI resolves auto from the policy file before the config
