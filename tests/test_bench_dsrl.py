"""bench/dsrl.py --quick runs sessions through `vla rl` in parallel and writes the full report."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_dsrl_quick(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, "-m", "bench.dsrl", "--quick", "--checkpoint", str(tmp_path / "ckpt"),
                        "--task", "pick_red_cube", "--methods", "dsrl-na", "sac-raw", "--jobs", "1", "--out", str(tmp_path / "res"),
                        "--work", str(tmp_path / "work")], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "dsrl.json").read_text())
    assert {x["method"] for x in res["runs"]} == {"dsrl-na", "sac-raw"}
    for run in res["runs"]:
        # a session stops at the first episode boundary past the budget (one 100-tick episode here)
        assert run["ticks"] == 100 and 0 <= run["final"] <= 1 and run["vla_weights_unchanged"]
        assert run["curve"][0][0] == 0 and run["curve"][-1][0] == 100
    assert set(res["summary"]["pick_red_cube"]) == {"dsrl-na", "sac-raw"}
    # one session at a time: the second reuses the first one's base evaluation (same checkpoint and seeds)
    first, second = res["runs"]
    assert first["base_from"] is None and second["base_from"] == os.path.basename(first["out"])
    assert second["base"] == first["base"]
    assert res["goals"]["pick_red_cube/dsrl-na"]["met"] is False  # 96 ticks and one seed cannot meet it
    assert (tmp_path / "res" / "dsrl.png").stat().st_size > 10_000

    # no machine paths in the results, and where they came from (the provenance block)
    text = (tmp_path / "res" / "dsrl.json").read_text()
    assert str(tmp_path) not in text
    prov = json.loads(text)["provenance"]
    assert prov["bench"] == "dsrl" and prov["quick"] is True and prov["argv"][:3] == ["python", "-m", "bench.dsrl"]
