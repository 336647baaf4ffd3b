"""bench/vla.py --quick measures latency and SFT throughput and writes the report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_vla_quick(tmp_path):
    pytest.importorskip("efficientnet_lite_pytorch")
    r = subprocess.run([sys.executable, "-m", "bench.vla", "--quick", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "vla.json").read_text())
    lat = res["latency"]
    assert lat["threads"] == 1 and lat["batch"] == 1 and len(lat["samples_ms"]) == lat["calls"] == 20
    assert 0 < lat["trunk_p50_ms"] < lat["p50_ms"] <= lat["p99_ms"]
    assert [t["mode"] for t in res["throughput"]] == ["frozen", "lora", "full"]
    tp = {t["mode"]: t for t in res["throughput"]}
    assert all(t["samples_per_s"] > 0 for t in tp.values())
    # frozen trains only the neck, fusion and head; LoRA adds adapters; full trains the trunk too
    assert tp["frozen"]["parameters"]["trainable"] < tp["lora"]["parameters"]["trainable"] < tp["full"]["parameters"]["trainable"]
    assert "latency_p50_le_30ms" in res["goals"]
    assert (tmp_path / "vla.png").stat().st_size > 10_000
