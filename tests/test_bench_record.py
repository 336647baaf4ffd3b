"""bench/record.py --quick runs and writes what the full benchmark writes."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_record_quick(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.record", "--quick", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "record.json"))
    (row,) = res["results"]
    assert row["label"].startswith("2 cams 224x224")
    ep = row["episodes"][0]
    assert ep["frames"] == 60 and ep["achieved_hz"] > 20 and ep["save_episode_s"] > 0
    assert "keeps_up_30fps_2cams_224" in res["goals"]
    assert (tmp_path / "record.png").stat().st_size > 10_000
