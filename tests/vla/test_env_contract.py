"""The env contract shared by `vla eval --env`, `vla rl --env` and the session (``vla.envs``), checked
on a held-out-style env (``heldout_env``: its own dynamics, ONE action per step, no spec limit, it
truncates itself) as a user would bring it."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from policies import REGISTRY
from tests.vla.heldout_env import INSTRUCTION, make_env, tiny_vla
from vla.envs import DEFAULT_EPISODE_TICKS, episode_limit, step_chunk, steps_chunks

ENV = "tests.vla.heldout_env:make_env"
SMALL = {  # each method's smallest settings, so that a few ticks run in seconds; a new method runs at its defaults
    "dsrl": ["--utd", "1", "--batch-size", "4", "--num-critics", "2", "--hidden", "16", "--distill-steps", "1"],
    "residual": ["--utd", "1", "--batch-size", "4", "--num-critics", "2", "--hidden", "16"],
}


TOKENS = {"extoken"}  # methods that steer behaviour tokens: they get a token-conditioned checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_vla(tmp_path_factory.mktemp("heldout") / "ckpt")


@pytest.fixture(scope="module")
def token_ckpt(tmp_path_factory):
    return tiny_vla(tmp_path_factory.mktemp("heldout") / "ckpt_tokens", num_tokens=2)


class _CountingEnv(gym.Env):
    """One action [2] per step; records every action it was given; terminates at step ``term_at``."""

    def __init__(self, term_at: int = 99, limit: int | None = None) -> None:
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.term_at, self.seen = term_at, []
        if limit is not None:
            self.max_episode_steps = limit

    def reset(self, *, seed=None, options=None):
        self.seen = []
        return {}, {}

    def step(self, action):
        a = np.asarray(action)
        assert a.shape == (2,), a.shape
        self.seen.append(a)
        return {"k": len(self.seen)}, 0.5, len(self.seen) >= self.term_at, False, {"success": False}


def test_a_one_action_env_is_stepped_row_by_row_and_stops_at_the_first_terminated_row():
    env = _CountingEnv(term_at=3)
    chunk = np.arange(10, dtype=np.float32).reshape(5, 2)
    st = step_chunk(env, chunk)
    assert st.rows == 3 and st.terminated and st.reward == pytest.approx(1.5)  # rewards summed over the rows run
    np.testing.assert_array_equal(np.stack(env.seen), chunk[:3])
    assert st.obs == {"k": 3}


def test_a_chunk_env_gets_the_whole_chunk():
    class ChunkEnv(_CountingEnv):
        def __init__(self):
            super().__init__()
            self.action_space = gym.spaces.Box(-1, 1, (4, 2), np.float32)

        def step(self, action):
            self.seen.append(np.asarray(action))
            return {}, 1.0, False, False, {}

    env = ChunkEnv()
    assert steps_chunks(env)
    st = step_chunk(env, np.zeros((4, 2), np.float32))
    assert st.rows == 4 and env.seen[0].shape == (4, 2)
    with pytest.raises(ValueError, match="action_space"):
        steps_chunks(type("E", (), {"action_space": gym.spaces.Discrete(3)})())


def test_one_episode_limit_rule():
    """--max-episode-ticks, else the env's own limit (TimeLimit / spec / attribute), else the default."""
    from gymnasium.wrappers import TimeLimit

    assert episode_limit(_CountingEnv()) == DEFAULT_EPISODE_TICKS
    assert episode_limit(_CountingEnv(limit=17)) == 17
    assert episode_limit(TimeLimit(_CountingEnv(), 23)) == 23
    assert episode_limit(TimeLimit(_CountingEnv(), 23), requested=5) == 5
    assert episode_limit(gym.make("MountainCarContinuous-v0")) == 999  # a registered env's spec
    with pytest.raises(ValueError, match="--max-episode-ticks"):
        episode_limit(_CountingEnv(), requested=0)
    assert episode_limit(make_env()) == DEFAULT_EPISODE_TICKS  # the held-out env declares none...
    env = make_env()  # ...but truncates itself, which ends the episode
    env.reset(seed=0)
    assert step_chunk(env, np.zeros((64, 4), np.float32)).rows == 30


@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_vla_eval_and_vla_rl_run_on_a_one_action_env(ckpt, token_ckpt, tmp_path, method):
    """Every method of the registry, a few ticks through `vla rl --env`, and `vla eval --env`, on an env
    that steps one action (before the contract, `vla rl` handed it [4, 4] chunks and failed)."""
    from vla.cli import main

    out = tmp_path / "rl"
    assert main(["rl", "--method", method, "--checkpoint", token_ckpt if method in TOKENS else ckpt, "--env", ENV, "--instruction", INSTRUCTION,
                 "--out", str(out), "--total-ticks", "12", "--warmup-steps", "1", "--eval-every", "0",
                 "--eval-episodes", "2", "--videos", "0", *SMALL.get(method, [])]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ticks"] >= 12 and summary["vla_weights_unchanged"]
    eps = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert eps and all(1 <= e["ticks"] <= 30 for e in eps)  # the env's own truncation ends an episode
    ev = tmp_path / "eval"
    assert main(["eval", "--checkpoint", ckpt, "--env", ENV, "--episodes", "2", "--videos", "1",
                 "--exec-steps", "3", "--out", str(ev), "--threads", "1"]) == 0
    rows = [json.loads(x) for x in (ev / "episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(1 <= r["ticks"] <= 30 for r in rows)


def test_vla_eval_and_the_sessions_base_evaluation_agree(ckpt, tmp_path):
    """Same checkpoint, env, seeds, chunk length and episode limit: `vla eval --env --exec-steps N`
    and `vla rl --env`'s base-VLA evaluation give the same episodes (success and ticks, each)."""
    from vla.cli import main

    seeds, n, limit = 300_000, 12, 24
    ev = tmp_path / "eval"
    assert main(["eval", "--checkpoint", ckpt, "--env", ENV, "--episodes", str(n), "--seed-start", str(seeds),
                 "--exec-steps", "4", "--max-episode-ticks", str(limit), "--videos", "0", "--out", str(ev),
                 "--threads", "1"]) == 0
    rl = tmp_path / "rl"
    assert main(["rl", "--checkpoint", ckpt, "--env", ENV, "--instruction", INSTRUCTION, "--out", str(rl),
                 "--total-ticks", "4", "--warmup-steps", "1", "--eval-every", "0", "--eval-episodes", str(n),
                 "--eval-seed-start", str(seeds), "--max-episode-ticks", str(limit), "--videos", "0",
                 *SMALL["dsrl"]]) == 0
    from_eval = [(r["seed"], r["success"], r["ticks"]) for r in map(json.loads, (ev / "episodes.jsonl").open())]
    base = json.loads((rl / "base_eval.json").read_text())
    from_rl = [(r["seed"], r["success"], r["ticks"]) for r in base["per_episode"]]
    assert base["max_episode_ticks"] == limit
    assert from_rl == from_eval
    k = sum(s for _, s, _ in from_eval)
    assert 0 < k < n, "the check needs both outcomes among the episodes"
    assert {t for _, s, t in from_eval if s} - {4, 8, 12, 16, 20, 24}  # some ended mid-chunk, at the row
