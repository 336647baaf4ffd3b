"""bench/export_success.py: torch vs fp32 vs int8 success in sim on the same seeds.

The quick test checks the comparison the bench reports (rates, paired counts over identical seeds,
the McNemar p-value) on generated per-seed outcomes, and the plot; the end-to-end smoke run (export
+ three `vla eval` processes over a sim bridge, ~2-4 min on 2 cores) is marked slow."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.net import free_port_block

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_export_success_quick_end_to_end(tmp_path):
    port = free_port_block(20)
    r = subprocess.run([sys.executable, "-m", "bench.export_success", "--quick", "--port", str(port),
                        "--work", str(tmp_path / "w"), "--out", str(tmp_path / "res")],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "export_success.json").read_text())
    assert res["quick"] and res["export"]["parity_fp32"]["max_abs_diff"] < 1e-4
    row = res["summary"]["pick_red_cube"]
    assert {v: row[v]["episodes"] for v in ("torch", "fp32", "int8")} == {"torch": 1, "fp32": 1, "int8": 1}
    assert not res["settings"]["checkpoint"].startswith("/")
    assert (tmp_path / "res" / "export_success.png").stat().st_size > 5_000
