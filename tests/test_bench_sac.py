"""bench/sac.py --quick runs and writes what the full benchmark writes."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_sac_quick(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "bench.sac", "--quick", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "sac.json"))
    assert res["mode"] == "quick" and res["config"]["threads"] == 1
    rows = {row["label"]: row for row in res["results"]}
    assert {"reference CleanRL, 2 Q MLPs", "reference CleanRL + LayerNorm", "ours, 2 critics",
            "ours, 2 critics + LayerNorm", "ours, 10 critics + LayerNorm (RLPD default)"} <= set(rows)
    for row in rows.values():
        assert row["critic_updates_per_s"] > 0
        assert abs(row["critic_updates_per_s"] - row["utd"] * row["rounds_per_s"]) < 1e-6 * row["critic_updates_per_s"]
    for goal in ("ours_vs_reference_layernorm", "ours_vs_reference_cleanrl"):
        g = res["goals"][goal]
        assert g["measured"] > 0 and isinstance(g["met"], bool)
    assert set(res["replay"]) == {"state 64-d", "2 cams 64x64 + state 8-d"}
    assert (tmp_path / "sac.png").stat().st_size > 10_000
