"""bench/residual.py --quick runs residual RL and its baselines through `vla rl` and writes the report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_residual_quick(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, "-m", "bench.residual", "--quick", "--checkpoint",
                        str(tmp_path / "ckpt"), "--task", "pick_red_cube", "--methods", "residual", "sac-raw",
                        "--jobs", "1", "--out", str(tmp_path / "res"), "--work", str(tmp_path / "work")],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "residual.json").read_text())
    assert [x["method"] for x in res["runs"]] == ["residual", "sac-raw"]
    for run in res["runs"]:
        assert run["ticks"] == 100 and 0 <= run["final"] <= 1 and run["vla_weights_unchanged"]
        assert run["ticks_per_s"] > 0 and set(run["first_ticks"]) == {"50%", "80%", "90%"}
    cfg = json.loads((tmp_path / "work" / "pick_red_cube-residual-s0" / "rl_config.json").read_text())
    assert cfg["method"] == "residual" and cfg["agent"]["exec_steps"] == 4
    assert res["goals"]["pick_red_cube/residual"]["met"] is False  # one seed and 96 ticks cannot meet it
    assert (tmp_path / "res" / "residual.png").stat().st_size > 10_000
    assert str(tmp_path) not in (tmp_path / "res" / "residual.json").read_text()  # no machine paths
