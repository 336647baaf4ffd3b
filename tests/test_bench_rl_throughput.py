"""bench/rl_throughput.py --quick runs residual RL and DSRL-NA sessions in lockstep and with asynchronous updates
(learner + actor processes) and reports ticks/s with learning from the run directories."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_rl_throughput_quick(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, "-m", "bench.rl_throughput", "--quick", "--checkpoint",
                        str(tmp_path / "ckpt"), "--task", "pick_red_cube", "--methods", "residual",
                        "--out", str(tmp_path / "res"), "--work", str(tmp_path / "work")],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "rl_throughput.json").read_text())
    rows = {x["mode"]: x for x in res["rows"]}
    assert set(rows) == {"lockstep", "async"}
    for mode, row in rows.items():
        assert row["ticks"] >= 160 and row["vla_weights_unchanged"] and row["ticks_per_s"] > 0
        assert row["critic_steps_per_s"] > 0 and 0 < row["update_rounds_per_step"] <= 1.0
        assert row["update_rounds"] <= row["steps"] - 4 + 1  # never more rounds than lockstep
    assert rows["lockstep"]["update_rounds"] == rows["lockstep"]["steps"] - 4 + 1
    cfg = json.loads((tmp_path / "work" / "residual-async" / "rl_config.json").read_text())
    assert cfg["updates"] == "async" and cfg["method"] == "residual"
    assert (tmp_path / "res" / "rl_throughput.png").stat().st_size > 10_000
    assert str(tmp_path) not in (tmp_path / "res" / "rl_throughput.json").read_text()  # no machine paths
