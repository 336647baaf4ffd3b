"""bench/dsrl_qtruth.py on a tiny DSRL run: branch, replay exactly, score the candidates, read the critic."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def test_spearman_ranks_and_refuses_constant_sides():
    from dsrl_qtruth import spearman

    assert spearman(np.array([0.0, 0.5, 1.0]), np.array([1.0, 2.0, 9.0])) == pytest.approx(1.0)
    assert spearman(np.array([0.0, 0.5, 1.0]), np.array([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    assert spearman(np.zeros(4), np.arange(4.0)) is None and spearman(np.arange(4.0), np.ones(4)) is None


def test_noise_effect_separates_a_noise_that_matters_from_binomial_scatter():
    from dsrl_qtruth import noise_effect

    one_works = np.zeros((8, 4), bool)
    one_works[3] = True  # one noise always succeeds, the others never
    sd, p = noise_effect(one_works)
    assert p < 0.01 and sd > 0.3
    assert noise_effect(np.zeros((8, 4), bool)) == (0.0, 1.0)
    rng = np.random.default_rng(0)  # every noise the same 25%: the scatter is binomial, not the noise's
    ps = [noise_effect(rng.random((8, 4)) < 0.25, perms=500)[1] for _ in range(40)]
    assert np.mean(np.array(ps) < 0.05) <= 0.15


def test_bench_dsrl_qtruth_quick(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    r = subprocess.run([sys.executable, "-m", "vla.cli", "rl", "--checkpoint", str(tmp_path / "ckpt"), "--task", "pick_red_cube", "--out",
                                  str(tmp_path / "run"), "--total-ticks", "16", "--max-episode-ticks", "16",
                                  "--warmup-steps", "1", "--utd", "1", "--batch-size", "8", "--hidden", "32",
                                  "--eval-every", "0", "--eval-episodes", "1", "--videos", "0", "--threads", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "dsrl_qtruth.py"), "--run", str(tmp_path / "run"),
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
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "dsrl_qtruth.py"), "--reanalyse", "--out",
                        str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads((tmp_path / "res" / "dsrl_qtruth.json").read_text())
    assert again["summary"] == res["summary"] and "reanalysed" in again
    # a run directory of another kind is refused by name
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "dsrl_qtruth.py"), "--run", str(tmp_path / "ckpt")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode != 0 and "no rl_config.json" in r.stderr
