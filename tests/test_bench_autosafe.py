"""bench/autosafe.py --quick runs and writes what the full benchmark writes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("body,stem", [("cartpole", "autosafe"), ("arm", "autosafe_arm")])
def test_bench_autosafe_quick(tmp_path, body, stem):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "autosafe.py"), "--env", body, "--quick", "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / f"{stem}.json"))
    assert res["mode"] == "quick" and res["config"]["threads"] == 1 and res["env"] == body
    assert set(res["summary"]) == {"sac", "autosafe", "sac+simplex"}
    # the safety layers hold from the first step, even untrained (AutoSafe's blend; Simplex's exact model)
    assert res["summary"]["autosafe"]["violation_steps"] == 0
    assert res["summary"]["sac+simplex"]["violation_steps"] == 0
    assert res["goals"]["autosafe_zero_violations"]["met"] is True
    for name in ("autosafe_return_vs_sac", "inference_hz"):
        assert res["goals"][name]["measured"] > 0 and isinstance(res["goals"][name]["met"], bool)
    auto = next(run for run in res["runs"] if run["arm"] == "autosafe")
    assert auto["inference"]["hz_median"] > 0
    assert 0 < auto["sharpness_final"]["mean"] <= res["config"]["autosafe"]["sharpness_max"]
    assert (tmp_path / f"{stem}.png").stat().st_size > 10_000
    if body == "arm":  # the arm's measured error about the displacement model the layers certify on
        err = auto["model_error"]
        assert err["steps"] == 150 and 0 < err["mean_m"] <= err["max_m"]
        assert res["config"]["safe_set"]["certified_sharpness"] >= res["config"]["autosafe"]["sharpness_max"]


def test_arm_reach_goals_fill_the_middle_of_the_box_and_the_reward_peaks_there():
    from bench import arm_reach as ar

    rng = np.random.default_rng(0)
    lo, hi = np.array(ar.WORKSPACE_LOW), np.array(ar.WORKSPACE_HIGH)
    c, h = (lo + hi) / 2, (hi - lo) / 2
    goals = np.stack([ar.sample_goal(rng) for _ in range(300)])
    assert np.all(np.abs(goals - c) <= ar.GOAL_FRACTION * h + 1e-12)
    assert np.all(goals.max(0) - goals.min(0) > 1.6 * ar.GOAL_FRACTION * h)  # spread over the middle, every axis
    glo, ghi = ar.guard_box()
    assert np.all(np.array(glo) > lo) and np.all(np.array(ghi) < hi)
    assert np.all(goals >= np.array(glo)) and np.all(goals <= np.array(ghi))  # every goal is reachable safely
    env = ar.ArmReachEnv(max_steps=30, seed=1)
    try:
        obs, info = env.reset(seed=3)
        assert obs.shape == (ar.OBS_DIM,) and info["safe"]
        np.testing.assert_allclose(obs[6:9], obs[3:6] - obs[:3], atol=1e-6)
        rewards = []
        for _ in range(30):  # a proportional reach to the goal
            obs, r, term, trunc, info = env.step(np.clip(obs[6:9] / ar.STEP, -1, 1))
            rewards.append(r)
            assert info["safe"] and not term
        assert trunc and info["dist"] < 0.01 and rewards[-1] > 0.8 > rewards[0]
        outside = np.array(ar.WORKSPACE_HIGH) + 0.05
        assert not ar.inside_workspace(outside) and ar.inside_workspace((lo + hi) / 2)
    finally:
        env.close()


def test_bench_autosafe_append_adds_seeds_and_refuses_other_settings(tmp_path):
    """--append --seed-start 1 adds seed 1 to an existing results file; other settings are refused, naming the
    field, and the file is left as it was."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, str(ROOT / "bench" / "autosafe.py"), "--env", "cartpole", "--quick", "--out", str(tmp_path)]
    run = lambda *extra: subprocess.run(base + list(extra), cwd=ROOT, capture_output=True, text=True,  # noqa: E731
                                        timeout=180, env=env)
    r = run("--append")
    assert r.returncode != 0 and "does not exist" in r.stderr
    assert run().returncode == 0
    r = run("--append", "--seed-start", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "autosafe.json"))
    assert res["config"]["seeds"] == [0, 1]
    assert sorted((x["seed"], x["arm"]) for x in res["runs"]) == sorted(
        (s, a) for s in (0, 1) for a in ("sac", "autosafe", "sac+simplex"))
    before = (tmp_path / "autosafe.json").read_text()
    r = run("--append", "--seed-start", "2", "--max-steps", "50")
    assert r.returncode != 0 and "'max_steps'" in r.stderr
    assert (tmp_path / "autosafe.json").read_text() == before
