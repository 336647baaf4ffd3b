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
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "dsrl.py"), "--quick", "--checkpoint", str(tmp_path / "ckpt"),
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

    # bench/dsrl_episodes.py reads the same sessions' own episode logs
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "dsrl_episodes.py"), "--work", str(tmp_path / "work"),
                        "--out", str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ep = json.loads((tmp_path / "res" / "dsrl_episodes.json").read_text())
    assert {s["method"] for s in ep["sessions"]} == {"dsrl-na", "sac-raw"}
    for s in ep["sessions"]:
        logged = [json.loads(x)["success"] for x in
                  (tmp_path / "work" / s["session"] / "episodes.jsonl").read_text().splitlines() if x.strip()]
        assert s["success"] == [int(x) for x in logged] and s["episodes"] == len(logged)
        assert (s["noise"] is None) == (s["method"] == "sac-raw")  # noise statistics for DSRL sessions only
    png = tmp_path / "res" / "dsrl_episodes.png"
    assert png.stat().st_size > 10_000
    assert not (tmp_path / "res" / "sessions").exists()  # the sessions' logs are not copied into the results
    # no machine paths in the results: absolute paths are recorded as their last two parts
    for name in ("dsrl.json", "dsrl_episodes.json"):
        assert str(tmp_path) not in (tmp_path / "res" / name).read_text(), name
    # the report alone re-makes its plot (what is committed is the JSON and the PNG)
    png.unlink()
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "dsrl_episodes.py"), "--out", str(tmp_path / "res")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert png.stat().st_size > 10_000
    assert json.loads((tmp_path / "res" / "dsrl_episodes.json").read_text()) == ep
