"""bench/rig.py --quick: host, camera, MCU and agent as separate processes; a random agent plays Pong
through them for a few seconds; the JSON and PNG the full benchmark writes come out."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_rig_quick(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "bench.rig", "--quick", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    res = json.load(open(tmp_path / "rig.json"))
    assert res["mode"] == "quick" and res["processes"] == ["host", "camera", "mcu", "agent"]
    rig = res["rig"]
    assert rig["ack_clock"] == "mcu"  # the MCU's own ack stamps, unwrapped (one clock on one machine)
    assert rig["key_commands"] >= 10 and 0 < rig["frame_to_key_ms_p50"] <= rig["frame_to_key_ms_p99"] < 1000
    assert 5 < rig["decision_hz"] < 20 and rig["frames_seen"] > 40  # 30 fps camera, 2 frames per decision
    assert res["host_screen"]["hid_reports"] >= 10  # the keys reached the game through the MCU's HID link
    assert res["camera_params"]["latency_ms"] == 50.0 and isinstance(res["goals"]["frame_to_key_p50_ms"]["met"], bool)
    assert (tmp_path / "rig.png").stat().st_size > 10_000
