"""bench/serve.py --quick runs end to end: the sim Franka bridge, `vla serve` with the tiny compact VLA,
the thin client under each blend mode; writes serve.json and serve.png.

The figures are not asserted (a busy machine moves them); the blending itself is tested on a
deterministic source in tests/deploy/test_serve.py. This checks that the bench ran and measured
what it says it measured."""

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("mujoco")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_bench_serve_quick(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.serve", "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "boundary_jump_vs_none:" in proc.stdout and "synthetic_boundary_jump_vs_none:" in proc.stdout
    assert (tmp_path / "serve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = json.loads((tmp_path / "serve.json").read_text())
    assert res["mode"] == "quick" and [r["blend"] for r in res["runs"]] == ["none", "ensemble", "crossfade"]
    for r in res["runs"]:
        assert r["ticks"] + r["skipped_ticks"] == round(res["config"]["seconds_per_mode"] * res["config"]["hz"])
        assert r["replies"] >= 1 and r["request_ms"]["p50"] > 0
        assert set(r["jump"]) == set(r["jump_arm"]) == {"boundary", "within"}
        assert len(r["trace"]["tick"]) == r["ticks"]
    assert set(res["boundary_jump_vs_none"]) == {"none", "ensemble", "crossfade"}
    # the synthetic control: the same client against a deterministic source
    assert [r["blend"] for r in res["synthetic_runs"]] == ["none", "ensemble", "crossfade"]
    assert all(r["replies"] >= 1 for r in res["synthetic_runs"])
