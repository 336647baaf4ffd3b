"""bench/archive/expert_modes.py --quick (an archived probe, run as ``python -m bench.archive.expert_modes``) runs
and writes what the full probe writes."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_expert_modes_quick(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.archive.expert_modes", "--quick", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "expert_modes.json"))
    yaw45, crowded = res["results"]
    assert yaw45["task"] == "pick_red_cube_yaw45" and crowded["gap_m"] == 0.01 and len(crowded["scenes"]) == 2
    assert yaw45["by_mode"]["ccw"]["mean_turn_deg"] > 30 and yaw45["by_mode"]["cw"]["mean_turn_deg"] < -30
    assert {"exactly_one_succeeds", "blocked_mode_succeeds", "free_is_ccw"} <= set(crowded["summary"])
    assert "verdict" in res and (tmp_path / "expert_modes.png").stat().st_size > 10_000
    assert "pick_red_cube_crowded" in r.stdout
