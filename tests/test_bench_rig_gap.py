"""bench/rig_gap.py --quick: a tiny DQN budget in emulation, evaluated in emulation and through the
emulated rig (separate processes); human-normalised scores and the rig's noise parameters written."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_rig_gap_quick(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "rig_gap.py"), "--quick", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=150, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    res = json.load(open(tmp_path / "rig_gap.json"))
    assert res["mode"] == "quick" and res["training"]["steps"] == 200 and res["training"]["updates"] > 0
    assert res["constants"] == {"pong_random": -20.7, "pong_human": 9.3,
                                "source": "Mnih et al. 2015, Nature 518, Extended Data Table 2"}
    for side in ("emulation", "rig"):
        s = res[side]
        assert s["episodes"] == 1
        assert abs(s["human_normalised"] - 100 * (s["mean"] + 20.7) / 30.0) < 1e-9
    assert res["rig"]["latency_and_frames"]["steps"] >= 30
    assert res["rig_noise"]["latency_ms"] == 50.0 and res["rig_noise"]["noise_std"] > 0
    assert (tmp_path / "rig_gap.png").stat().st_size > 10_000
