"""Potential-based reward shaping: policy invariance on a tabular MDP, Bradley-Terry potentials from
pairwise judgements, the privileged sub-goal comparator, the gymnasium wrapper, save / load."""

import json
import math
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from hardware.sim_tasks import CUBE_HALF, OBJECT_NAMES
from rewards.shaping import (JudgeComparator, PotentialNet, PotentialShaping, ShapedRewardWrapper,
                             SubgoalProgressComparator, fit_potential, load_potential, load_shaping,
                             preference_pairs, save_potential)

# -- policy invariance on a small deterministic MDP --------------------------------------------
# A chain 0 .. 5: actions left / stay / right; entering 5 gives reward 1 and terminates. Start
# anywhere in 0 .. 4. State 1 is "tempting": a potential that is high there pays a naive bonus
# for staying next to it forever.
N_STATES, GOAL, TEMPTING, GAMMA = 6, 5, 1, 0.9
MOVES = (-1, 0, +1)


def chain_mdp():
    """next_state[s, a], raw reward[s, a], terminated[s, a] for the non-terminal states 0 .. GOAL-1."""
    nxt = np.array([[min(max(s + d, 0), GOAL) for d in MOVES] for s in range(GOAL)])
    done = nxt == GOAL
    return nxt, done.astype(float), done


def value_iteration(reward, nxt, done, gamma=GAMMA, iters=600):
    q = np.zeros(reward.shape)
    for _ in range(iters):
        v = np.concatenate([q.max(1), [0.0]])  # the goal is terminal: no value after it
        q = reward + gamma * (1.0 - done) * v[nxt]
    return q


def shaped_rewards(shaping, reward, nxt, done):
    return np.array([[shaping.shape(reward[s, a], s, nxt[s, a], done[s, a]) for a in range(len(MOVES))]
                     for s in range(GOAL)])


def test_pbrs_keeps_the_optimal_policy_where_a_naive_bonus_changes_it():
    nxt, r, done = chain_mdp()
    q_raw = value_iteration(r, nxt, done)
    pi_raw = q_raw.argmax(1)
    top2 = np.sort(q_raw, 1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0] > 1e-3).all(), "the raw optimal action must be unique in every state"
    assert (pi_raw == 2).all()  # go right, to the goal

    tempting = np.zeros(N_STATES)
    tempting[TEMPTING] = 1.0
    potentials = [np.random.default_rng(seed).normal(0, 5, N_STATES) for seed in range(5)] + [tempting]
    for pot in potentials:
        shaping = PotentialShaping(lambda s, pot=pot: pot[s], GAMMA)
        q_shaped = value_iteration(shaped_rewards(shaping, r, nxt, done), nxt, done)
        np.testing.assert_array_equal(q_shaped.argmax(1), pi_raw)
        # Q'(s, a) = Q(s, a) - Phi(s); the goal's own potential never enters (terminal: 0)
        np.testing.assert_allclose(q_shaped, q_raw - pot[:GOAL, None], atol=1e-9)

    naive = r + tempting[nxt]  # r + Phi(s'): harvested by staying at the tempting state
    pi_naive = value_iteration(naive, nxt, done).argmax(1)
    assert (pi_naive != pi_raw).any()
    assert pi_naive[TEMPTING] == 1  # it stays at the tempting state forever


# -- Bradley-Terry recovers a hidden progress ---------------------------------------------------
D = 6


def true_progress(x):
    return x[..., 0] + 0.6 * np.sin(2 * x[..., 1]) + 0.4 * x[..., 2] * x[..., 3]


class NoisyOracle:
    """Labels by the hidden progress: "same" below a margin, else right with probability 0.9."""

    def __init__(self, rng, margin=0.1, flip=0.1):
        self.rng, self.margin, self.flip = rng, margin, flip

    def compare(self, a, b):
        d = true_progress(b) - true_progress(a)
        if abs(d) < self.margin:
            return "same"
        right = "second" if d > 0 else "first"
        return right if self.rng.random() > self.flip else {"first": "second", "second": "first"}[right]


def test_bradley_terry_recovers_the_hidden_ordering():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, D)).astype(np.float32)
    pairs = preference_pairs(list(x), NoisyOracle(rng), n_pairs=4000, rng=rng)
    assert set(np.unique(pairs.prefs)) == {0.0, 0.5, 1.0} and (pairs.idx_a != pairs.idx_b).all()
    net, rep = fit_potential(x[pairs.idx_a], x[pairs.idx_b], pairs.prefs, epochs=40, lr=3e-3, seed=0)
    assert rep["n_val"] == 800 and rep["n_same"] > 0
    assert rep["val_acc"] >= 0.8, rep  # against noisy labels (10 % flipped)
    phi_x = net.potential(x)
    assert abs(phi_x.mean()) < 0.02 * phi_x.std()  # centred (exactly on the states of its training pairs)

    # fresh states, clean labels
    xt = rng.normal(size=(300, D)).astype(np.float32)
    phi, g = net.potential(xt), true_progress(xt)
    i, j = rng.integers(0, 300, 3000), rng.integers(0, 300, 3000)
    decisive = np.abs(g[j] - g[i]) > 0.1
    acc = float(((phi[j] - phi[i] > 0) == (g[j] - g[i] > 0))[decisive].mean())
    rho = spearmanr(phi, g).statistic
    assert acc >= 0.9 and rho >= 0.9, (acc, rho)


def test_random_labels_give_chance_accuracy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, D)).astype(np.float32)
    i, j = rng.integers(0, 400, 2500), rng.integers(0, 400, 2500)
    prefs = rng.integers(0, 2, 2500).astype(np.float32)
    _, rep = fit_potential(x[i], x[j], prefs, epochs=30, lr=3e-3, seed=0)
    assert 0.4 <= rep["val_acc"] <= 0.6, rep


def test_fit_potential_names_the_bad_argument():
    a, b, p = np.zeros((10, 3)), np.ones((10, 3)), np.ones(10)
    with pytest.raises(ValueError, match="feats_b"):
        fit_potential(a, np.ones((10, 4)), p)
    with pytest.raises(ValueError, match="feats_a"):
        fit_potential(np.full((10, 3), np.nan), b, p)
    with pytest.raises(ValueError, match="feats_a"):
        fit_potential(np.zeros(10), b, p)
    with pytest.raises(ValueError, match="prefs"):
        fit_potential(a, b, np.ones(9))
    with pytest.raises(ValueError, match="prefs"):
        fit_potential(a, b, np.full(10, 2.0))
    with pytest.raises(ValueError, match="val_frac"):
        fit_potential(a, b, p, val_frac=1.0)


# -- pair sources --------------------------------------------------------------------------------
from tests.hardware.test_sim_tasks import FAR, pose, scene  # noqa: E402  (hand-made simulator states)


def test_subgoal_comparator_orders_a_lifted_cube_above_one_on_the_table():
    cmp = SubgoalProgressComparator("pick_red_cube")
    on_table = (scene(), FAR, 1.0)
    reached = (scene(), scene()["red_cube"][:3] + [0, 0, -0.003], 1.0)  # at the cube, fingers open
    held = scene(red_cube=pose(0.45, 0.10, 0.12))
    lifted = {"objects": np.stack([held[n] for n in OBJECT_NAMES]), "ee_pos": np.array([0.45, 0.10, 0.122]),
              "gripper": np.array([0.55])}  # a state message's arrays
    assert [cmp.progress(s) for s in (on_table, reached, lifted)] == [0, 1, 4]
    assert cmp.compare(on_table, lifted) == "second" and cmp.compare(lifted, on_table) == "first"
    assert cmp.compare(reached, lifted) == "second" and cmp.compare(on_table, on_table) == "same"

    # success counts as every sub-goal: a cube let go in the bowl beats one carried over it
    place = SubgoalProgressComparator("place_cube_in_bowl")
    over_bowl = (scene(red_cube=pose(0.45, -0.15, 0.12)), np.array([0.45, -0.15, 0.12]), 0.56)
    released = (scene(red_cube=pose(0.45, -0.15, 0.0045 + 0.0085 + CUBE_HALF)), FAR, 1.0)
    assert place.compare(over_bowl, released) == "second"

    pairs = preference_pairs([on_table, reached, lifted], cmp, 50, np.random.default_rng(0))
    expect = np.sign(pairs.idx_b - pairs.idx_a) * 0.5 + 0.5  # the states are listed in order of progress
    np.testing.assert_array_equal(pairs.prefs, expect)
    with pytest.raises(ValueError, match="ee_pos"):
        cmp.progress({"objects": held, "gripper": 1.0})


def test_judge_comparator_adapts_a_vlm_judge():
    calls = []

    class FakeJudge:
        def __init__(self, answer):
            self.answer = answer

        def compare(self, frame_a, frame_b, instruction):
            calls.append((frame_a, frame_b, instruction))
            return self.answer

    cmp = JudgeComparator(FakeJudge("second"), "pick up the red cube", frame_fn=lambda s: s["images"]["wrist"])
    assert cmp.compare({"images": {"wrist": "A"}}, {"images": {"wrist": "B"}}) == "second"
    assert calls == [("A", "B", "pick up the red cube")]
    pairs = preference_pairs([{"images": {"wrist": k}} for k in "xyz"], cmp, 5, np.random.default_rng(0))
    assert (pairs.prefs == 1.0).all()
    with pytest.raises(ValueError, match="FakeJudge answered 'b'"):
        JudgeComparator(FakeJudge("b"), "x").compare(1, 2)
    with pytest.raises(TypeError, match="compare"):
        JudgeComparator(object(), "x")


# -- the wrapper -----------------------------------------------------------------------------------
class Chain(gym.Env):
    """Position 0 .. 4 on a line; action 1 steps right, 0 stays; reaching 4 pays 1 and terminates."""

    observation_space = gym.spaces.Box(0.0, 4.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([self.pos], np.float32), {}

    def step(self, action):
        self.pos += int(action)
        done = self.pos == 4
        return np.array([self.pos], np.float32), float(done), done, False, {}


def phi(f):
    return math.sin(float(f[0])) + 0.5  # arbitrary, non-zero at the start


def test_wrapper_keeps_the_raw_reward_and_its_shaping_telescopes():
    g = 0.95
    shaping = PotentialShaping(phi, g)

    def run(env, actions):
        env.reset(seed=0)
        out = [env.step(a) for a in actions]
        return [o[1] for o in out], [o[4] for o in out], out[-1]

    # terminated: sum_t g^t F_t = -Phi(s0) (the terminal state's potential is 0)
    actions = [1, 0, 1, 1, 1]
    raw, _, _ = run(Chain(), actions)
    shaped, infos, last = run(ShapedRewardWrapper(Chain(), shaping, lambda o: o), actions)
    assert last[2] and [i["raw_reward"] for i in infos] == raw
    np.testing.assert_allclose(shaped, [i["raw_reward"] + i["shaping"] for i in infos])
    disc = g ** np.arange(len(actions))
    np.testing.assert_allclose(disc @ [i["shaping"] for i in infos], -phi([0.0]), atol=1e-12)
    np.testing.assert_allclose(disc @ shaped, disc @ raw - phi([0.0]), atol=1e-12)

    # truncated after 3 steps: the last state bootstraps, + g^3 Phi(s3)
    env = ShapedRewardWrapper(gym.wrappers.TimeLimit(Chain(), max_episode_steps=3), shaping, lambda o: o)
    _, infos, last = run(env, [1, 1, 1])
    assert last[3] and not last[2]
    np.testing.assert_allclose(g ** np.arange(3) @ [i["shaping"] for i in infos],
                               -phi([0.0]) + g ** 3 * phi([3.0]), atol=1e-12)

    with pytest.raises(RuntimeError, match="before reset"):
        ShapedRewardWrapper(Chain(), shaping, lambda o: o).step(1)
    with pytest.raises(ValueError, match="gamma"):
        PotentialShaping(phi, 1.5)


# -- save / load -----------------------------------------------------------------------------------
def test_save_and_load_a_potential(tmp_path):
    torch.manual_seed(0)
    net = PotentialNet(5, hidden=16)
    net.feat_mean.fill_(0.3)
    net.feat_std.fill_(2.0)
    x = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
    save_potential(str(tmp_path), net, gamma=0.97, scale=0.5, extra={"report": {"val_acc": 0.9}})
    assert sorted(os.listdir(tmp_path)) == ["potential.json", "potential.safetensors"]  # no tmp left behind
    meta = json.loads((tmp_path / "potential.json").read_text())
    assert (meta["in_dim"], meta["hidden"], meta["gamma"], meta["scale"]) == (5, 16, 0.97, 0.5)

    loaded, _ = load_potential(str(tmp_path))
    np.testing.assert_allclose(loaded.potential(x), net.potential(x), rtol=1e-6)
    sh = load_shaping(str(tmp_path))
    assert sh.gamma == 0.97
    np.testing.assert_allclose(sh.term(x[0], x[1], False), 0.97 * 0.5 * net.potential(x[1]) - 0.5 * net.potential(x[0]),
                               rtol=1e-5)

    other = tmp_path / "other"
    save_potential(str(other), PotentialNet(5, hidden=16), gamma=0.97)
    os.replace(other / "potential.safetensors", tmp_path / "potential.safetensors")  # a mismatched pair
    with pytest.raises(ValueError, match="sha256"):
        load_potential(str(tmp_path))
    with pytest.raises(ValueError, match="features must be"):
        net.potential(np.zeros(4))


def test_a_session_env_gets_the_shaped_reward_with_success_read_raw(tmp_path):
    """``vla rl --shaping DIR``: the session's env (here an ``--env``) is wrapped; its reward is shaped, success still
    comes from the raw reward, and a potential of another state size is refused before anything runs."""
    import dataclasses

    from rewards.shaping import save_potential
    from session.config import RLConfig
    from vla.commands.rl import make_env

    net = PotentialNet(1, hidden=8)
    save_potential(str(tmp_path / "phi"), net, gamma=0.9)
    cfg = RLConfig(checkpoint="stub", out=str(tmp_path / "run"), task="", env="tests.policies.test_grpo:make_env",
                   shaping=str(tmp_path / "phi"), instruction="choose an arm")
    env = make_env(cfg)
    assert env.max_ticks == 1
    obs, _ = env.reset(seed=0)
    best = np.array([-0.5, 0.5], np.float32)  # the bandit's best arm: raw reward 1
    _, r, term, _, info = env.step(best)
    assert term and info["raw_reward"] == 1.0 and info["success"] is True
    assert r == pytest.approx(1.0 - net.potential(np.zeros(1, np.float32)))  # terminal: gamma Phi(s') dropped
    save_potential(str(tmp_path / "phi3"), PotentialNet(3, hidden=8), gamma=0.9)
    with pytest.raises(ValueError, match="3 state dims.*has 1"):
        make_env(dataclasses.replace(cfg, shaping=str(tmp_path / "phi3")))
