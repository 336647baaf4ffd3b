"""`vla eval`: episode loop, statistics, and an end-to-end run on the fast sim Franka."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vla.evaluate import EpisodeResult, run_episode, summarize, wilson_interval


@pytest.mark.parametrize("k,n,lo,hi", [(0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0),
                                        (3, 20, 0.0524, 0.3604)])
def test_wilson_interval_matches_reference_values(k, n, lo, hi):
    a, b = wilson_interval(k, n)
    assert a == pytest.approx(lo, abs=1e-4) and b == pytest.approx(hi, abs=1e-4)


class CountingEnv:
    """Succeeds once ``succeed_at`` ticks have been executed; records every chunk it got."""

    def __init__(self, succeed_at: int | None) -> None:
        self.succeed_at, self.ticks, self.chunks = succeed_at, 0, []

    def _obs(self):
        return {"images": {"front": np.zeros((8, 8, 3), np.uint8)}, "state": np.zeros(8, np.float32),
                "instruction": "x"}

    def reset(self, seed=None):
        self.ticks, self.seed = 0, seed
        return self._obs(), {}

    def step(self, chunk):
        self.chunks.append(len(chunk))
        self.ticks += len(chunk)
        ok = self.succeed_at is not None and self.ticks >= self.succeed_at
        return self._obs(), float(ok), ok, False, {"success": ok}


def test_run_episode_stops_at_success_and_respects_the_tick_budget():
    policy = lambda obs: np.zeros((4, 7), np.float32)  # noqa: E731
    env = CountingEnv(succeed_at=9)
    r = run_episode(env, policy, seed=7, max_ticks=30)
    assert r.success and r.ticks == 12 and env.chunks == [4, 4, 4] and env.seed == 7
    env = CountingEnv(succeed_at=None)
    frames: list = []
    r = run_episode(env, policy, seed=0, max_ticks=10, frames=frames)
    assert not r.success and r.ticks == 10 and env.chunks == [4, 4, 2]  # the last chunk is cut to the budget
    assert len(frames) == 4


def test_summarize_counts_per_task():
    rs = [EpisodeResult("a", i, i < 3, 10 + i, 0.1) for i in range(10)] + [EpisodeResult("b", 0, False, 5, 0.1)]
    s = summarize(rs)
    assert s["a"]["successes"] == 3 and s["a"]["episodes"] == 10 and s["a"]["success_rate"] == 0.3
    assert s["a"]["mean_ticks_success"] == 11.0 and s["b"]["mean_ticks_success"] is None
    assert s["a"]["ci95"] == pytest.approx(list(wilson_interval(3, 10)))


def test_vla_eval_end_to_end_on_the_sim(tmp_path):
    """A random (untrained) compact VLA, 2 episodes: the report, the plot and a video are written."""
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla
    from vla.cli import main

    save_tiny_vla(str(tmp_path / "ckpt"), extra={"sim_tasks": ["pick_red_cube"]})
    out = tmp_path / "eval"
    rc = main(["eval", "--checkpoint", str(tmp_path / "ckpt"), "--episodes", "2", "--videos", "1",
               "--out", str(out), "--threads", "1"])
    assert rc == 0
    rep = json.loads((out / "eval.json").read_text())
    t = rep["tasks"]["pick_red_cube"]
    assert t["episodes"] == 2 and 0 <= t["successes"] <= 2 and rep["seed_start"] == 100_000
    eps = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert [e["seed"] for e in eps] == [100_000, 100_001]
    assert all(e["ticks"] <= 100 for e in eps)
    assert (out / "success.png").stat().st_size > 5_000
    import cv2

    vids = list((out / "videos").glob("*.mp4"))
    assert len(vids) == 1
    cap = cv2.VideoCapture(str(vids[0]))
    n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    cap.release()
    assert n == eps[0]["ticks"] // 8 + 1 + (eps[0]["ticks"] % 8 > 0)
