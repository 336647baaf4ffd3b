"""The benches' own bodies: AutoSafe's arm reach on the simulated Franka and SafeExplorer's Go1 region and
recovery."""

import numpy as np


def test_go1_region_is_one_the_recovery_returns_from():
    """SafeExplorer hands control to the recovery when the Go1 leaves R: R must be a set it can return
    from. 20 exits driven by random joint targets (std 1 action unit) at the curriculum's start and at R's
    full size (it re-entered 56 / 60 at both in bench/safeexplorer.py's Go1 body's measurement); without the tip-rate
    bound 47 / 60 at full size, and the first R (0.6 rad tilt) 5 / 30."""
    from bench.safeexplorer import recovery_rate

    start, full = recovery_rate(0.4, 1.0, trials=20, seed=100), recovery_rate(1.0, 1.0, trials=20, seed=100)
    assert start["reentered"] >= 18 and full["reentered"] >= 18, (start, full)
    assert start["never_left"] == full["never_left"] == 0  # every trial tested the recovery


def test_arm_reach_goals_fill_the_middle_of_the_box_and_the_reward_peaks_there():
    from bench import autosafe as ar  # the arm body

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
