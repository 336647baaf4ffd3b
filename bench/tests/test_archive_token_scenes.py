"""bench.archive.token_scenes: which behaviour token works in which crowded scene, and where each episode ended.

The localisation reads the simulator's object poses from a privileged observation; a fake env plays scripted object
trajectories so every outcome class and the finger turn are checked without a bridge. Moved from
tests/vla/test_token_scenes.py (issue 62); in the fast tier as it was."""

import json
import math

import numpy as np
import pytest

NAMES = ["red_cube", "blue_cube", "green_cube"]
HOME = np.array([0.0, 1.0, 0.0, 0.0])  # wxyz, fingers pointing down


@pytest.fixture
def ts():
    from bench.archive import token_scenes

    return token_scenes


def turned(deg: float) -> np.ndarray:
    from robot_io import limits as L

    q = L.quat_mul(L.axis_angle_to_quat(np.array([0.0, 0.0, math.radians(deg)])), HOME)
    return q / np.linalg.norm(q)


class FakeEnv:
    """Three cubes on the table; ``script(k)`` -> (object poses [3, 7], ee quat, success) after chunk k."""

    max_ticks = 40

    def __init__(self, script):
        self.script, self.k = script, 0

    def _obs(self, objs, quat):
        ee = np.array([0.5, 0.0, 0.3])
        v = np.concatenate([(objs[:, :3] - ee).ravel(), objs[:, 3:].ravel(), ee, [1.0]])
        return {"privileged": v.astype(np.float32), "state": np.concatenate([ee, quat, [1.0]]).astype(np.float32)}

    def reset(self, seed=None):
        self.k = 0
        objs, quat, _ = self.script(-1)
        return self._obs(objs, quat), {}

    def step(self, chunk):
        objs, quat, success = self.script(self.k)
        self.k += 1
        return self._obs(objs, quat), float(success), bool(success), self.k * 4 >= self.max_ticks, \
            {"success": success}


class ClosingPolicy:
    """Open for two chunks, then closes the gripper (action dim 6 < 0.5)."""

    def __init__(self):
        self.k = 0

    def reset(self, seed):
        self.k = 0

    def __call__(self, obs):
        c = np.zeros((4, 7), np.float32)
        c[:, 6] = 1.0 if self.k < 2 else 0.0
        self.k += 1
        return c


def table(**moves):
    objs = np.zeros((3, 7))
    objs[:, 0], objs[:, 2], objs[:, 3] = [0.5, 0.55, 0.4], 0.02, 1.0
    for name, (dz, tilt_deg, dx) in moves.items():
        i = NAMES.index(name)
        objs[i, 2] += dz
        objs[i, 0] += dx
        objs[i, 3:] = [math.cos(math.radians(tilt_deg) / 2), math.sin(math.radians(tilt_deg) / 2), 0, 0]
    return objs


@pytest.mark.parametrize("moves, success, outcome", [
    ({}, False, "no lift"),
    ({}, True, "success"),
    ({"red_cube": (0.08, 0, 0), "blue_cube": (0, 30, 0)}, False, "lifted, neighbour knocked"),
    ({"red_cube": (0.08, 0, 0), "blue_cube": (0, 0, 0.02)}, False, "lifted, neighbour knocked"),
    ({"red_cube": (0.08, 0, 0), "blue_cube": (0, 5, 0.005)}, False, "lifted, other"),
    ({"blue_cube": (0.08, 0, 0)}, False, "lifted another object"),
    ({"blue_cube": (0, 45, 0)}, False, "no lift, neighbour knocked"),
])
def test_rollout_says_where_an_episode_ended(ts, moves, success, outcome):
    def script(k):  # the cubes move from chunk 3 on; success (if any) at chunk 4
        return (table(**moves) if k >= 3 else table()), (turned(40) if k >= 1 else HOME), success and k >= 4

    r = ts.rollout(FakeEnv(script), ClosingPolicy(), 7, NAMES, "red_cube", "blue_cube")
    assert r["outcome"] == outcome and r["success"] is success
    assert r["turn_deg"] == pytest.approx(40, abs=0.5)


def test_the_turn_is_signed_and_read_at_the_first_close(ts):
    def script(k):  # turns 30 deg one way by the close (chunk 2), then back past home afterwards
        return table(), (turned(-30) if 0 <= k <= 2 else turned(20) if k > 2 else HOME), False

    r = ts.rollout(FakeEnv(script), ClosingPolicy(), 0, NAMES, "red_cube", "blue_cube")
    r2 = ts.rollout(FakeEnv(lambda k: (table(), turned(30) if k >= 0 else HOME, False)), ClosingPolicy(), 0, NAMES,
                    "red_cube", "blue_cube")
    assert r["turn_deg"] == pytest.approx(-r2["turn_deg"], abs=0.5) and abs(r["turn_deg"]) == pytest.approx(30, abs=0.5)


def _rec(success):
    return {"success": success, "outcome": "success" if success else "no lift", "turn_deg": 10.0}


def test_summary_credits_the_token_whose_turn_is_the_free_one(ts):
    seeds = list(range(10))
    free = {s: "ccw" if s % 3 else "cw" for s in seeds}
    modes = {1: "ccw", 2: "cw"}
    runs = {0: {s: _rec(False) for s in seeds},
            1: {s: _rec(free[s] == "ccw") for s in seeds},  # each token works exactly where its turn is free
            2: {s: _rec(free[s] == "cw") for s in seeds}}
    summary, outcomes, turns, scenes = ts.summarize(runs, None, modes, free, seeds)
    assert summary["oracle_token"]["successes"] == 10 and summary["wrong_token"]["successes"] == 0
    assert summary["token_1_ccw_matched"]["rate"] == 1.0 and summary["token_1_ccw_blocked"]["successes"] == 0
    assert summary["random_token_expected"]["rate"] == pytest.approx(0.5)
    assert summary["best_of_tokens"]["successes"] == 10 and summary["null_token"]["successes"] == 0
    assert outcomes["token 1 (ccw)"] == {"no lift": 4, "success": 6}
    # a token that ignores the scene (always works under ccw only in cw scenes) scores the other way round
    runs[1] = {s: _rec(free[s] == "cw") for s in seeds}
    summary, *_ = ts.summarize(runs, None, modes, free, seeds)
    assert summary["oracle_token"]["successes"] == 4 and summary["token_1_ccw_matched"]["successes"] == 0
    assert json.dumps(scenes)  # JSON-ready


def test_free_turns_come_from_the_layout_and_the_token_modes_from_the_purity_table(ts, tmp_path):
    from bench.archive.expert_modes import blocked_mode
    from hardware.sim_tasks import get_task

    seeds = list(range(200_000, 200_020))
    free = ts.free_turns("pick_red_cube_crowded", seeds)
    task = get_task("pick_red_cube_crowded")
    for s in seeds:
        assert free[s] != blocked_mode(task.layout(np.random.default_rng(s)))
    assert set(free.values()) == {"ccw", "cw"}  # the scene decides, both ways occur
    f = tmp_path / "tokens.json"
    f.write_text(json.dumps({"purity": {"field": "expert_mode", "table": {"1": {"ccw": 9, "cw": 1},
                                                                          "2": {"ccw": 0, "cw": 10}}}}))
    assert ts.token_modes(str(f)) == {1: "ccw", 2: "cw"}
    f.write_text(json.dumps({"purity": None}))
    with pytest.raises(ValueError, match="purity-field expert_mode"):
        ts.token_modes(str(f))
