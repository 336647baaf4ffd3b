"""bench/scale.py --quick: `vla eval --workers 1 / 2` and `vla rl --actors 1 / 2` on Ray (a local cluster per
command), one command at a time: the JSON (rates, ratios, metadata) and the PNG come out, and two evaluation
workers gave one worker's per-episode outcomes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_bench_scale_quick(tmp_path):
    pytest.importorskip("ray")
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, "-m", "bench.scale", "--quick", "--checkpoint",
                        str(tmp_path / "ckpt"), "--out", str(tmp_path / "res"), "--work", str(tmp_path / "work")],
                       cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "res" / "scale.json").read_text())
    assert res["quick"] and res["eval_same_outcomes"] is True
    assert {"host", "cpu_count", "load_average_at_start", "threads_per_worker", "ray"} <= set(res["machine"])
    rows = {(x["kind"], x["n"]): x for x in res["rows"]}
    assert set(rows) == {("eval", 1), ("eval", 2), ("rl", 1), ("rl", 2)}
    for (kind, n), row in rows.items():
        assert row["returncode"] == 0 and row["rate"] > 0 and row["rate_wall"] > 0
        assert row["speedup"] == pytest.approx(row["rate"] / rows[(kind, 1)]["rate"])
    assert rows[("eval", 2)]["episodes"] == 4 and rows[("rl", 2)]["ticks"] >= 64
    assert sum(rows[("rl", 2)]["ticks_per_actor"].values()) == rows[("rl", 2)]["ticks"]
    assert (tmp_path / "res" / "scale.png").stat().st_size > 10_000
    assert str(tmp_path) not in (tmp_path / "res" / "scale.json").read_text()  # no machine paths
