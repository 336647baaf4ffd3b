"""bench/residual_critic.py and bench/residual_qtruth.py on a tiny residual run: the offline critic fits read the
session's replay; the Monte-Carlo truth branches, replays exactly, scores zero, random and the policy's residual."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def test_auc_ranks_and_is_undefined_for_one_class():
    from residual_critic import auc

    assert auc(np.array([0.9, 0.8, 0.1, 0.2]), np.array([True, True, False, False])) == pytest.approx(1.0)
    assert auc(np.array([0.1, 0.2, 0.9, 0.8]), np.array([True, True, False, False])) == pytest.approx(0.0)
    assert auc(np.array([0.5, 0.5]), np.array([True, False])) == pytest.approx(0.5)
    assert auc(np.array([0.5, 0.4]), np.array([True, True])) is None


@pytest.fixture(scope="module")
def tiny_residual_run(tmp_path_factory):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    tmp = tmp_path_factory.mktemp("residual_run")
    save_tiny_vla(str(tmp / "ckpt"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    r = subprocess.run([sys.executable, "-m", "vla.cli", "rl", "--method", "residual", "--checkpoint", str(tmp / "ckpt"),
                        "--task", "pick_red_cube", "--out", str(tmp / "run"), "--total-ticks", "96",
                        "--max-episode-ticks", "16", "--warmup-steps", "2", "--utd", "1", "--batch-size", "8",
                        "--num-critics", "2", "--hidden", "32", "--critic-warmup", "2", "--eval-every", "0",
                        "--eval-episodes", "1", "--videos", "0", "--threads", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return tmp / "run", env


def test_bench_residual_critic_quick(tiny_residual_run, tmp_path):
    run, env = tiny_residual_run
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "residual_critic.py"), "--run", str(run), "--steps", "5",
                        "--out", str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "res" / "residual_critic.json").read_text())
    assert res["run"]["transitions"] == 24 and res["run"]["episodes"] == 6  # 96 ticks, 4-tick macro-steps
    assert set(res["variants"]) == {"td1", "td3", "td1_mean", "mc"}
    assert (tmp_path / "res" / "residual_critic.png").stat().st_size > 10_000


def test_bench_residual_qtruth_quick(tiny_residual_run, tmp_path):
    run, env = tiny_residual_run
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "residual_qtruth.py"), "--run", str(run),
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
