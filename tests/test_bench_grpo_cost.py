"""bench/grpo_cost.py --quick times a GRPO update with and without the trunk cache through `vla rl` and writes the
report (the summary layout, the projection labelled as one, the plot, no machine paths)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_grpo_cost_quick(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, "-m", "bench.grpo_cost", "--quick", "--checkpoint", str(tmp_path / "ckpt"),
                        "--out", str(tmp_path / "res"), "--work", str(tmp_path / "work")],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "grpo_cost.json").read_text())
    cell = res["summary"]["pick_blue_cube"]
    for arm in ("recompute", "cached"):
        assert cell[arm]["updates"] == 1 and cell[arm]["rollouts_s"] > 0 and cell[arm]["s_per_eval_episode"] > 0
        assert cell[arm]["per_update_s"] >= cell[arm]["rollouts_s"]
        run_cfg = json.loads((tmp_path / "work" / f"pick_blue_cube-{arm}" / "rl_config.json").read_text())
        assert run_cfg["agent"]["cache_features"] is (arm == "cached")
    assert set(cell["speedup"]) == {"update", "per_update"}
    assert res["projection"]["what"].startswith("PROJECTION") and res["projection"]["sessions"] == 18
    assert res["provenance"]["bench"] == "grpo_cost" and res["provenance"]["quick"] is True
    assert (tmp_path / "res" / "grpo_cost.png").stat().st_size > 10_000
    assert str(tmp_path) not in (tmp_path / "res" / "grpo_cost.json").read_text()  # no machine paths
