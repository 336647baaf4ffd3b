"""bench/archive/dsrl_qtruth.py (an archived probe, run as ``python -m bench.archive.dsrl_qtruth``) on a tiny DSRL
run: branch, replay exactly, score the candidates, read the critic. Each sim bridge on leased ports. The probe's
pieces (spearman, noise_effect) are tested in bench/tests/test_archive_dsrl_qtruth.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def leased_site(path: Path) -> str:
    """A copy of the sim-franka-fast preset on leased loopback ports (the suite may run other bridges)."""
    from robot_io.ports import PortLease
    from robot_io.site import load_site, relocate_site, site_ports

    base = load_site("sim-franka-fast")
    with PortLease(len(site_ports(base))) as lease:
        return relocate_site(base, lease.ports, str(path)).path


def test_bench_dsrl_qtruth_quick(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    r = subprocess.run([sys.executable, "-m", "vla.cli", "rl", "--checkpoint", str(tmp_path / "ckpt"), "--task", "pick_red_cube", "--out",
                                  str(tmp_path / "run"), "--robot", leased_site(tmp_path / "site_rl.yaml"),
                                  "--total-ticks", "16", "--max-episode-ticks", "16",
                                  "--warmup-steps", "1", "--utd", "1", "--batch-size", "8", "--hidden", "32",
                                  "--eval-every", "0", "--eval-episodes", "1", "--videos", "0", "--threads", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "bench.archive.dsrl_qtruth", "--run", str(tmp_path / "run"),
                        "--robot", leased_site(tmp_path / "site_q.yaml"),
                        "--scenes", "1", "--branch-steps", "0", "1", "--noises", "2", "--continuations", "1",
                        "--out", str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "dsrl_qtruth.json").read_text())
    assert res["config"]["max_ticks"] == 16 and res["variant"] == "na"  # the default variant
    rows = res["branches"]
    assert [x["branch_step"] for x in rows] == [0, 1] and rows[1]["branch_tick"] == res["config"]["exec_steps"]
    for x in rows:
        assert len(x["p"]) == len(x["qw"]) == 3 and np.array(x["success"]).shape == (3, 1)  # 2 noises + the policy's
        assert x["replay_state_error"] < 1e-9  # the replayed prefix lands on the same state
        assert x["p"] == [float(np.mean(s)) for s in x["success"]] and np.isfinite(x["qw"]).all()
        assert len(x["qa"]) == 3  # NA: its action critic on the candidates' chunks too
    assert res["summary"]["branches"] == 2 and (tmp_path / "res" / "dsrl_qtruth.png").stat().st_size > 10_000
    assert all(0 < x["perm_p"] <= 1 and x["between_sd"] >= 0 for x in rows)
    # --reanalyse recomputes the figures from the outcomes, without a run
    r = subprocess.run([sys.executable, "-m", "bench.archive.dsrl_qtruth", "--reanalyse", "--out",
                        str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads((tmp_path / "res" / "dsrl_qtruth.json").read_text())
    assert again["summary"] == res["summary"] and "reanalysed" in again
    # a run directory of another kind is refused by name
    r = subprocess.run([sys.executable, "-m", "bench.archive.dsrl_qtruth", "--run", str(tmp_path / "ckpt")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode != 0 and "no rl_config.json" in r.stderr
