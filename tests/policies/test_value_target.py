"""The value target on a small MDP with a time limit (issue 61), no simulator.

At the start state s0 a one-dimensional action chooses between two behaviours:

* A (a < 0): success at once with probability P_A (terminal, reward 1), else a dead state D that never succeeds
  (absorbing, not terminal: the episode runs on until the time limit);
* B (a >= 0): a retry state R that succeeds with probability P_R per step.

Episodes last at most T macro-steps (then truncated). The truth, the Monte-Carlo success within the episode:
Q(s0, A) = P_A = 0.6 and Q(s0, B) = 1 - (1 - P_R)^(T-1) = 0.34: A is better. A target that bootstraps through the
time limit sees R as a state that succeeds eventually (V(R) = P_R / (1 - gamma (1 - P_R)) = 0.92 at gamma 0.99):
the failure that ran out of time looks like a delayed success, and B is ranked above A. A -1 per-step reward with
a bootstrapped limit does not help (D costs -1 forever; R less). Ending the target at the time limit does.

The critic is the shared SAC ensemble trained by its own TD update (``SAC.update``) on batches the session's
``ReplayBuffer`` draws with each setting's ``ValueTargetConfig``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from policies.common.replay import STEP_EXTRAS as EXTRAS, ReplayBuffer
from policies.common.sac import SAC
from policies.common.sac_config import SACConfig, ValueTargetConfig
from policies.dsrl.config import DSRLConfig
from policies.residual.config import ResidualConfig

P_A, P_R, T = 0.6, 0.1, 5
S0, R, D = 0, 1, 2


def one_hot(i: int) -> np.ndarray:
    x = np.zeros(3, np.float32)
    x[i] = 1.0
    return x


def fill(episodes: int, seed: int) -> tuple[ReplayBuffer, dict[str, float]]:
    """Episodes of a uniformly random action at s0, stored as a session stores them (done = terminated, truncated
    at the time limit, rows = 4 ticks per macro-step). -> (the buffer, the success rate of its episodes after A and
    after B: the sample's own Monte-Carlo truth)."""
    rng = np.random.default_rng(seed)
    buf = ReplayBuffer(episodes * T, {"x": ((3,), np.float32)}, 1, EXTRAS)
    outcomes: dict[str, list[bool]] = {"A": [], "B": []}
    for _ in range(episodes):
        s, first, won = S0, None, False
        for t in range(T):
            a = rng.uniform(-1, 1)
            first = ("A" if a < 0 else "B") if first is None else first
            if s == S0:
                win = a < 0 and rng.random() < P_A
                s2 = S0 if win else (D if a < 0 else R)  # a success ends the episode (its next state unused)
            elif s == R:
                win, s2 = rng.random() < P_R, R
            else:
                win, s2 = False, D
            last = t == T - 1
            buf.add({"x": one_hot(s)}, np.array([a], np.float32), float(win), {"x": one_hot(s2)}, bool(win),
                    rows=np.asarray(4, np.int32), truncated=bool(last and not win))
            if win:
                won = True
                break
            s = s2
        outcomes[first].append(won)
    return buf, {k: float(np.mean(v)) for k, v in outcomes.items()}


def ranks_a_above_b(value: ValueTargetConfig, gamma: float = 0.99, steps: int = 1500, seed: int = 0,
                    truth: dict | None = None) -> tuple[float, float]:
    """Train the critic with this value target; -> (Q(s0, A), Q(s0, B)), ensemble means. ``truth``: filled with
    the sample's Monte-Carlo success after A and after B."""
    torch.manual_seed(seed)
    cfg = SACConfig(gamma=gamma, num_critics=4, critic_subset=2, hidden=(64, 64), batch_size=128, tau=0.02,
                    critic_lr=1e-3, backup_entropy=False, value=value)
    sac = SAC(3, 1, cfg, seed=seed)
    buf, mc = fill(400, seed)
    if truth is not None:
        truth.update(mc)
    rng = np.random.default_rng(seed)
    kw = value.sample_kwargs(cfg.gamma, cfg.n_step)
    for _ in range(steps):
        b = buf.sample(cfg.batch_size, rng, **kw)
        b["obs"], b["next_obs"] = b["obs"]["x"], b["next_obs"]["x"]  # the critic reads the one-hot state itself
        sac.update(b, update_actor=False)
    with torch.no_grad():
        x = torch.from_numpy(np.stack([one_hot(S0)] * 2))
        q = sac.critic(x, torch.tensor([[-0.5], [0.5]])).mean(0)
    return float(q[0]), float(q[1])


LEGACY = ValueTargetConfig()  # this project's target before issue 61: 0 / 1 reward, bootstrapped limit, min of 2


def test_the_legacy_target_ranks_the_delayed_failure_first() -> None:
    """The MDP tells the targets apart: the bootstrapped 0 / 1 target prefers B, whose truth is 0.34 against 0.6."""
    qa, qb = ranks_a_above_b(LEGACY)
    assert qb > qa + 0.1, (qa, qb)
    qa, qb = ranks_a_above_b(dataclasses.replace(LEGACY, reward_offset=1.0))  # a step cost alone does not fix it
    assert qb > qa, (qa, qb)


@pytest.mark.parametrize("method", ["dsrl", "residual"])
def test_the_default_target_ranks_the_actions_as_the_truth_does(method: str) -> None:
    """The methods' default value targets rank A (0.6) above B (0.34); this fails on the pre-issue-61 defaults."""
    if method == "dsrl":
        cfg = DSRLConfig().sac
        value, gamma = cfg.value, cfg.gamma
    else:
        cfg = ResidualConfig()
        value, gamma = cfg.value, cfg.gamma
    qa, qb = ranks_a_above_b(value, gamma=gamma)
    assert qa > qb + 0.1, (qa, qb)


def test_terminal_time_limit_values_are_the_episode_returns() -> None:
    """With the limit terminal and a 0 / 1 reward at gamma 1, Q(s0, .) is the Monte-Carlo success within the episode
    (that of the sampled episodes: 400 of them put it within a few points of P_A and 1 - (1 - P_R)^(T-1))."""
    mc: dict = {}
    qa, qb = ranks_a_above_b(ValueTargetConfig(time_limit="terminal", target_ensemble="mean"), gamma=1.0, steps=2500,
                             truth=mc)
    assert mc["A"] == pytest.approx(P_A, abs=0.1) and mc["B"] == pytest.approx(1 - (1 - P_R) ** (T - 1), abs=0.1)
    assert qa == pytest.approx(mc["A"], abs=0.06)
    assert qb == pytest.approx(mc["B"], abs=0.06)


def test_per_tick_discount_and_the_time_limit_in_n_step_returns() -> None:
    """n_step_gather: gamma_per_tick ** rows per step, the reward offset per step, a truncated step ends the return
    (terminal) or not (bootstrap); a buffer without the extras is refused, naming the missing one."""
    buf = ReplayBuffer(8, {"x": ((1,), np.float32)}, 1, EXTRAS)
    x = lambda v: {"x": np.array([v], np.float32)}  # noqa: E731
    rows = [4, 4, 2]
    for t in range(3):
        buf.add(x(t), np.zeros(1, np.float32), 0.0, x(t + 1), False, rows=np.asarray(rows[t], np.int32),
                truncated=t == 2)
    g = 0.9
    b = buf.n_step_gather(np.array([0]), 3, g, per_tick=True, reward_offset=1.0, time_limit="terminal")
    assert float(b["reward"][0]) == pytest.approx(-(1 + g ** 4 + g ** 8))
    assert float(b["discount"][0]) == pytest.approx(g ** 10)
    assert float(b["done"][0]) == 1.0
    b = buf.n_step_gather(np.array([2]), 1, g, time_limit="bootstrap")
    assert float(b["done"][0]) == 0.0 and float(b["discount"][0]) == pytest.approx(g)
    plain = ReplayBuffer(4, {"x": ((1,), np.float32)}, 1)
    plain.add(x(0), np.zeros(1, np.float32), 0.0, x(1), False)
    with pytest.raises(ValueError, match="'truncated'"):
        plain.n_step_gather(np.array([0]), 1, g, time_limit="terminal")
    with pytest.raises(ValueError, match="'rows'"):
        plain.n_step_gather(np.array([0]), 1, g, per_tick=True)


@pytest.mark.parametrize("field,value,match", [("time_limit", "forever", "time_limit"),
                                               ("target_ensemble", "max", "target_ensemble"),
                                               ("gamma_per_tick", 1.5, "gamma_per_tick"),
                                               ("target_std_k", -1.0, "target_std_k"),
                                               ("reward_offset", float("nan"), "reward_offset")])
def test_bad_value_target_settings_are_refused_naming_the_field(field: str, value, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ValueTargetConfig(**{field: value})
