"""bench/edge.py --quick runs end to end: export with parity, ONNX vs torch chunk latency, the edge
runner and the torch loop at 10 / 30 / 50 Hz over the sim bridge; writes edge.json and edge.png.

The figures are not asserted against the goals (a busy machine would make that flaky); the bench
records met / not met itself. This checks that it ran and measured what it says it measured."""

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("onnx")
pytest.importorskip("mujoco")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_bench_edge_quick(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.edge", "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Goals:" in proc.stdout
    assert (tmp_path / "edge.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = json.loads((tmp_path / "edge.json").read_text())
    assert res["mode"] == "quick" and res["export"]["parity"]["max_abs_diff"] < 1e-4
    c = res["chunk_latency"]
    for side in ("onnx", "torch"):
        assert c[side]["n"] == 10 and 0 < c[side]["min_ms"] <= c[side]["p50_ms"] <= c[side]["p99_ms"]
    assert c["speedup_p50"] == pytest.approx(c["torch"]["p50_ms"] / c["onnx"]["p50_ms"])
    assert [r["target_hz"] for r in res["loop"]] == [10, 30, 50]
    for row in res["loop"]:
        for side in ("onnx", "torch"):
            s = row[side]
            assert s["target_hz"] == row["target_hz"] and s["ticks"] >= 1 and s["chunks"] >= 1
            assert 0 <= s["deadline_misses"] <= s["ticks"]
    assert set(res["goals"]) == {"zero_misses_at_10hz", "onnx_chunk_1.5x_faster", "no_torch_in_edge_python"}
    assert res["goals"]["zero_misses_at_10hz"]["met"] == (res["loop"][0]["onnx"]["deadline_misses"] == 0)
