"""bench/lfh.py --quick runs GRPO and LfH (simulation judge) through `vla rl` and writes the report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_lfh_quick(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla
    from tests.net import free_port_block

    port = free_port_block(20)
    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, "-m", "bench.lfh", "--quick", "--checkpoint",
                        str(tmp_path / "ckpt"), "--task", "pick_blue_cube", "--arms", "grpo", "lfh", "--jobs", "1",
                        "--port0", str(port), "--out", str(tmp_path / "res"), "--work", str(tmp_path / "work")],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "lfh.json").read_text())
    assert sorted(x["arm"] for x in res["runs"]) == ["grpo", "lfh"]
    cell = res["summary"]["pick_blue_cube"]
    for arm in ("grpo", "lfh"):
        assert 0 <= cell[arm]["rate"] <= 1 and len(cell[arm]["ci95"]) == 2
        assert len(cell[arm]["train_success_first_last"]) == 1  # one update of one group of 2
    for run in res["runs"]:
        assert run["vla_weights_unchanged"] and run["agent"]["updates"] == 1 and run["episodes"] == 2
        assert (tmp_path / "work" / f"pick_blue_cube-{run['arm']}-s0" / "policy" / "model.safetensors").is_file()
    lfh = next(x for x in res["runs"] if x["arm"] == "lfh")
    assert lfh["agent"]["judge"]["name"] == "sim" and lfh["agent"]["judge"]["privileged"] is True
    cfg = json.loads((tmp_path / "work" / "pick_blue_cube-lfh-s0" / "rl_config.json").read_text())
    assert cfg["method"] == "lfh" and cfg["agent"]["hindsight"] == "lfh" and cfg["total_episodes"] == 2
    assert res["goals"]["pick_blue_cube"]["grpo_lift_points"]["met"] in (True, False)
    assert (tmp_path / "res" / "lfh.png").stat().st_size > 10_000
    assert str(tmp_path) not in (tmp_path / "res" / "lfh.json").read_text()  # no machine paths
