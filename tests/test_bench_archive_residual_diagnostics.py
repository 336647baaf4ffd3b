"""bench/archive/residual_critic.py and bench/archive/residual_qtruth.py (archived probes, run as
``python -m bench.archive.<name>``) on a tiny residual run: the offline critic fits read the session's replay; the
Monte-Carlo truth branches, replays exactly, scores zero, random and the policy's residual. One file for both: they
share the run. Each sim bridge on leased ports; the AUC helper is tested in bench/tests/test_archive_residual_critic.py."""

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


@pytest.fixture(scope="module")
def tiny_residual_run(tmp_path_factory):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    tmp = tmp_path_factory.mktemp("residual_run")
    save_tiny_vla(str(tmp / "ckpt"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    r = subprocess.run([sys.executable, "-m", "vla.cli", "rl", "--method", "residual", "--checkpoint", str(tmp / "ckpt"),
                        "--task", "pick_red_cube", "--out", str(tmp / "run"), "--robot", leased_site(tmp / "site.yaml"),
                        "--total-ticks", "96",
                        "--max-episode-ticks", "16", "--warmup-steps", "2", "--utd", "1", "--batch-size", "8",
                        "--num-critics", "2", "--hidden", "32", "--critic-warmup", "2", "--eval-every", "0",
                        "--eval-episodes", "1", "--videos", "0", "--threads", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return tmp / "run", env


def test_bench_residual_critic_quick(tiny_residual_run, tmp_path):
    run, env = tiny_residual_run
    r = subprocess.run([sys.executable, "-m", "bench.archive.residual_critic", "--run", str(run), "--steps", "5",
                        "--out", str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "residual_critic.json").read_text())
    assert res["run"]["transitions"] == 24 and res["run"]["episodes"] == 6  # 96 ticks, 4-tick macro-steps
    assert set(res["variants"]) == {"td1", "td3", "td1_mean", "mc"}
    assert (tmp_path / "res" / "residual_critic.png").stat().st_size > 10_000


def test_bench_residual_qtruth_quick(tiny_residual_run, tmp_path):
    run, env = tiny_residual_run
    r = subprocess.run([sys.executable, "-m", "bench.archive.residual_qtruth", "--run", str(run),
                        "--robot", leased_site(tmp_path / "site.yaml"),
                        "--scenes", "1", "--branch-steps", "0", "1", "--residuals", "2", "--continuations", "1",
                        "--out", str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "residual_qtruth.json").read_text())
    assert res["config"]["max_ticks"] == 16
    rows = res["branches"]
    assert [x["branch_step"] for x in rows] == [0, 1] and rows[1]["branch_tick"] == res["config"]["exec_steps"]
    for x in rows:
        assert len(x["p"]) == len(x["qw"]) == 4 and np.array(x["success"]).shape == (4, 1)  # 2 random, 0, policy
        assert x["replay_state_error"] < 1e-9
        assert np.isfinite(x["qw"]).all() and 0 <= x["policy_residual_rms_of_bound"] <= 1
    assert str(tmp_path) not in (tmp_path / "res" / "residual_qtruth.json").read_text()
