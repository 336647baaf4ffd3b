"""bench/autosafe.py --quick runs and writes what the full benchmark writes."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_autosafe_quick(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "autosafe.py"), "--quick", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "autosafe.json"))
    assert res["mode"] == "quick" and res["config"]["threads"] == 1
    assert set(res["summary"]) == {"sac", "autosafe", "sac+simplex"}
    # the safety layers hold from the first step, even untrained (AutoSafe's blend; Simplex's exact model)
    assert res["summary"]["autosafe"]["violation_steps"] == 0
    assert res["summary"]["sac+simplex"]["violation_steps"] == 0
    assert res["goals"]["autosafe_zero_violations"]["met"] is True
    for name in ("autosafe_return_vs_sac", "inference_hz"):
        assert res["goals"][name]["measured"] > 0 and isinstance(res["goals"][name]["met"], bool)
    auto = next(run for run in res["runs"] if run["arm"] == "autosafe")
    assert auto["inference"]["hz_median"] > 0 and 0 < auto["sharpness_final"]["mean"] <= 2.0
    assert (tmp_path / "autosafe.png").stat().st_size > 10_000
