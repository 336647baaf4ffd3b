"""bench/safeexplorer.py --quick runs and writes what the full benchmark writes."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_safeexplorer_quick(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "bench.safeexplorer", "--quick", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "safeexplorer.json"))
    assert res["mode"] == "quick" and res["config"]["threads"] == 1 and res["config"]["body"] == "balance"
    assert set(res["summary"]) == {"ppo", "masked", "masked+value", "safeexplorer"}
    assert len(res["runs"]) == 4 and all(run["curve"] for run in res["runs"])
    # an untrained Gaussian policy falls without a recovery; with the LQR recovery it does not (from R_1)
    assert res["summary"]["ppo"]["falls_total_mean"] > 0
    for v in ("masked", "masked+value", "safeexplorer"):
        assert res["summary"][v]["falls_total_mean"] == 0 and res["summary"][v]["recoveries_ok_mean"] > 0
    assert set(res["goals"]) == {"falls_vs_ppo", "final_return_vs_ppo"}
    assert all(isinstance(g["met"], bool) for g in res["goals"].values())
    assert (tmp_path / "safeexplorer.png").stat().st_size > 10_000


def test_bench_safeexplorer_go1_quick_writes_its_own_file(tmp_path):
    """The Go1 body runs end to end and writes safeexplorer_go1.* (never over the balance body's results)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "bench.safeexplorer", "--quick", "--body", "go1",
                        "--variants", "ppo,safeexplorer", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (tmp_path / "safeexplorer.json").exists()
    res = json.load(open(tmp_path / "safeexplorer_go1.json"))
    assert res["config"]["body"] == "go1" and set(res["summary"]) == {"ppo", "safeexplorer"}
    se = res["summary"]["safeexplorer"]
    assert se["recoveries_ok_mean"] + se["recoveries_failed_mean"] > 0
    assert (tmp_path / "safeexplorer_go1.png").stat().st_size > 10_000
