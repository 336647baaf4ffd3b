"""SafeExplorer (policies.safety.safeexplorer) on its pieces, and the balance-cart body (policies.safety.balance)."""

import numpy as np
import pytest
import torch

from policies.safety.balance import OMEGA_R, THETA_R, BalanceCartEnv, Recovery, in_region, recovery_spec
from policies.safety.config import SAFEEXPLORER_VARIANTS, SafeExplorerConfig
from policies.safety.safeexplorer import (RecoverySpec, SafeExplorer, compat_loss, gae, masked_pg_loss,
                                          outcome_gate, recovery_values)

torch.set_num_threads(1)


def test_masked_gradient_equals_learner_only_terms():
    g = torch.Generator().manual_seed(0)
    T, eps = 64, 0.2
    w = torch.randn(T, generator=g, requires_grad=True)  # new log-probs as a function of parameters w
    feats = torch.randn(T, T, generator=g)
    old = (feats @ w.detach()) + 0.4 * torch.randn(T, generator=g)  # many ratios outside [1 - eps, 1 + eps]
    adv = torch.randn(T, generator=g)
    mask = torch.rand(T, generator=g) < 0.6
    old_nan, adv_nan = old.clone(), adv.clone()
    old_nan[~mask], adv_nan[~mask] = float("nan"), float("nan")  # recovery steps: undefined, must not leak

    loss = masked_pg_loss(feats @ w, old_nan, adv_nan, mask, eps)
    (grad,) = torch.autograd.grad(loss, w)
    # the explicit sum over the learner's timesteps
    new = feats @ w
    terms = []
    for t in range(T):
        if mask[t]:
            rho = torch.exp(new[t] - old[t])
            terms.append(torch.min(rho * adv[t], torch.clamp(rho, 1 - eps, 1 + eps) * adv[t]))
    explicit = -torch.stack(terms).sum() / len(terms)
    (grad_explicit,) = torch.autograd.grad(explicit, w)
    rho = torch.exp(new - old).detach()[mask]
    assert ((rho < 1 - eps) | (rho > 1 + eps)).any() and ((rho > 1 - eps) & (rho < 1 + eps)).any()
    assert torch.allclose(loss, explicit, atol=1e-6) and torch.isfinite(grad).all()
    assert torch.allclose(grad, grad_explicit, atol=1e-6)
    # and it is not the unmasked loss
    full = masked_pg_loss(feats @ w, old, adv, torch.ones(T, dtype=torch.bool), eps)
    assert not torch.allclose(full, loss)
    assert masked_pg_loss(feats @ w, old, adv, torch.zeros(T, dtype=torch.bool), eps).item() == 0.0


def test_gae_and_analytic_value_on_a_hand_computed_mixed_trajectory():
    # one episode of 4 steps, then one of 2 that ends in a fall: L R R L | L R(fall)
    r = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    v = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])  # critic values V(s_t)
    learner = np.array([1, 0, 0, 1, 1, 0], bool)
    term = np.array([0, 0, 0, 0, 0, 1], bool)
    ends = np.array([0, 0, 0, 1, 0, 1], bool)  # step 3: truncated, last state's critic value 7
    nv = np.array([20.0, 30.0, 40.0, 7.0, 60.0, 0.0])
    g, lam = 0.5, 0.5
    # GAE by hand: deltas d_t = r + g (1 - term) V' - V
    d = [1 + 0.5 * 20 - 10, 2 + 0.5 * 30 - 20, 3 + 0.5 * 40 - 30, 4 + 0.5 * 7 - 40, 5 + 0.5 * 60 - 50, 6 - 60]
    A3, A5 = d[3], d[5]
    A2 = d[2] + 0.25 * A3
    A1 = d[1] + 0.25 * A2
    A0 = d[0] + 0.25 * A1
    A4 = d[4] + 0.25 * A5
    np.testing.assert_allclose(gae(r, v, nv, term, ends, g, lam), [A0, A1, A2, A3, A4, A5])
    # analytic values of the recovery states: V_R(s_2) = 3 + 0.5 V(s_3) = 3 + 20 = 23 (learner acts at 3),
    # V_R(s_1) = 2 + 0.5 * 23 = 13.5; V_R(s_5) = 6 (the recovery fell: no bootstrap)
    va, nva = recovery_values(r, v, nv, term, ends, learner, g)
    np.testing.assert_allclose(va, [10, 13.5, 23, 40, 50, 6])
    np.testing.assert_allclose(nva, [13.5, 23, 40, 7, 6, 0])
    # the unrolled formula: V_R(s_1) = r_1 + g r_2 + g^2 V(s_3)
    assert va[1] == pytest.approx(2 + 0.5 * 3 + 0.25 * 40)
    # inside a recovery segment the TD errors vanish with the analytic values
    delta = r + g * (1 - term) * nva - va
    np.testing.assert_allclose(delta[~learner], 0.0, atol=1e-12)
    adv = gae(r, va, nva, term, ends, g, lam)
    # the step that left R sees the recovery's exact value, and the learner's later advantage through the segment
    assert adv[0] == pytest.approx((1 + 0.5 * 13.5 - 10) + 0.25 ** 3 * (4 + 0.5 * 7 - 40))


def test_outcome_gate_and_compat_loss():
    #        L  R  R  L  R  R(fall) | R  R(trunc) | L  R  R (open at the end)
    learner = np.array([1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0], bool)
    term = np.array([0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0], bool)
    ends = np.array([0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0], bool)
    gate = outcome_gate(learner, term, ends)
    np.testing.assert_array_equal(gate, [0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0])
    mean = torch.zeros(11, 2, requires_grad=True)
    target = torch.ones(11, 2)
    loss = compat_loss(mean, target, torch.from_numpy(gate))
    assert loss.item() == pytest.approx(1.0)
    (grad,) = torch.autograd.grad(loss, mean)
    assert (grad[torch.from_numpy(~gate)] == 0).all() and (grad[torch.from_numpy(gate)] != 0).all()
    none = compat_loss(mean, target, torch.zeros(11, dtype=torch.bool))
    assert none.item() == 0.0


def test_curriculum_grows_the_region():
    cfg = SafeExplorerConfig.variant("safeexplorer", d0=0.3, dmax=0.9, curriculum_steps=1000)
    env = BalanceCartEnv()
    agent = SafeExplorer(3, 1, cfg, recovery_spec(env))
    levels = [agent.level(s) for s in (0, 250, 500, 1000, 5000)]
    assert levels == pytest.approx([0.3, 0.45, 0.6, 0.9, 0.9])
    assert all(a <= b for a, b in zip(levels, levels[1:]))
    obs = np.array([0.0, 0.5 * THETA_R, 0.0])  # outside R_0.3, inside R_0.9
    assert not in_region(obs, levels[0]) and in_region(obs, levels[-1])
    # off: R = R_dmax throughout
    flat = SafeExplorer(3, 1, SafeExplorerConfig.variant("masked", dmax=0.9), recovery_spec(env))
    assert flat.level(0) == flat.level(10**6) == 0.9
    with pytest.raises(ValueError, match="did you mean 'safeexplorer'"):
        SafeExplorerConfig.variant("safexplorer")
    with pytest.raises(ValueError, match="use_recovery"):
        SafeExplorerConfig(use_recovery=False)


def test_recovery_takes_over_outside_the_region():
    env = BalanceCartEnv(max_steps=100)
    rec = Recovery(env)
    cfg = SafeExplorerConfig.variant("safeexplorer", num_steps=256, num_minibatches=4, update_epochs=1,
                                     norm_obs=False, d0=0.3, curriculum_steps=10**6, init_log_std=1.0)
    agent = SafeExplorer(3, 1, cfg, recovery_spec(env), seed=0)
    batch = agent.collect(env)
    obs, learner = batch["obs"], batch["learner"]
    assert learner.any() and (~learner).any(), "the rollout should mix learner and recovery steps"
    for t in range(len(obs)):
        assert learner[t] == in_region(obs[t], agent.level())
        if not learner[t]:
            np.testing.assert_allclose(batch["actions"][t], rec(obs[t]), atol=1e-6)
    assert batch["gate"].any() and not batch["gate"][learner].any()
    logs = agent.update(batch)
    assert np.isfinite(list(logs.values())).all() and logs["losses/compat_loss"] > 0
    # plain PPO never hands over
    ppo = SafeExplorer(3, 1, SafeExplorerConfig.variant("ppo", num_steps=128, norm_obs=False), None, seed=0)
    assert ppo.collect(BalanceCartEnv())["learner"].all()
    with pytest.raises(ValueError, match="RecoverySpec"):
        SafeExplorer(3, 1, SafeExplorerConfig.variant("masked"), None)


def test_balance_recovery_reenters_from_the_largest_region():
    env = BalanceCartEnv()
    rec = Recovery(env)
    rng = np.random.default_rng(0)
    for _ in range(40):
        o = env.set_state(rng.uniform(-1, 3), rng.uniform(-1, 1) * THETA_R, rng.uniform(-1, 1) * OMEGA_R)
        for _ in range(150):
            o, _, fell, _, _ = env.step(rec(o))
            assert not fell
            if in_region(o, 0.3):
                break
        else:
            pytest.fail(f"the recovery did not re-enter R_0.3 from {o}")


def test_spec_start_hook_and_variants_train():
    starts, current = [], {}
    env = BalanceCartEnv(max_steps=64)
    base = recovery_spec(env)
    spec = RecoverySpec(in_region=base.in_region, recovery=base.recovery,
                        start=lambda o: starts.append((o.copy(), current["agent"].level())))
    for name in SAFEEXPLORER_VARIANTS:
        cfg = SafeExplorerConfig.variant(name, num_steps=128, num_minibatches=4, update_epochs=2)
        agent = current["agent"] = SafeExplorer(3, 1, cfg, spec if cfg.use_recovery else None, seed=1)
        agent.train(env, 256)
        assert agent.global_step == 256 and agent.episodes
    # the hook sees the first state of every segment, which lies outside R at the level of the moment
    assert starts and all(not in_region(s, level) for s, level in starts)


@pytest.mark.parametrize("hold", [0, 12])
def test_recovery_keeps_control_until_it_has_settled(hold):
    """With ``RecoverySpec.settled`` a segment hands back only in R *and* settled (here: after ``hold``
    recovery steps); segments that re-enter R earlier keep the recovery acting, in collect() and act()."""
    env = BalanceCartEnv(max_steps=200)
    base = recovery_spec(env)
    count = {"n": 0}

    def start(o):
        count["n"] = 0

    def recovery(o):
        count["n"] += 1
        return base.recovery(o)

    spec = RecoverySpec(in_region=base.in_region, recovery=recovery, start=start,
                        settled=lambda: count["n"] >= hold)
    cfg = SafeExplorerConfig.variant("masked", num_steps=512, num_minibatches=4, update_epochs=1, norm_obs=False,
                                     init_log_std=1.0)
    agent = SafeExplorer(3, 1, cfg, spec, seed=0)
    batch = agent.collect(env)
    learner, obs, ends = batch["learner"], batch["obs"], batch["ends"]
    assert (~learner).any() and learner.any()
    seg_len, early_inside = 0, 0
    for t in range(len(learner)):
        if not learner[t]:
            seg_len += 1
            early_inside += int(seg_len > 1 and in_region(obs[t], agent.level()))
        else:
            if seg_len:  # a hand-back: in R, after at least `hold` recovery steps
                assert in_region(obs[t], agent.level()) and seg_len >= hold, (t, seg_len)
            seg_len = 0
        if ends[t]:
            seg_len = 0
    if hold:
        assert early_inside > 0, "no segment passed through R before settling: the test did not test the rule"
    # act() follows the same rule and restarts its segment through the hook
    agent.reset_act()
    o = env.set_state(0.0, 1.2 * THETA_R, 0.0)
    assert not in_region(o, agent.level())
    acted = []
    for _ in range(60):
        a = agent.act(o)
        acted.append(agent._act_recovering)
        o, *_ = env.step(a)
    first_learner = acted.index(False)
    assert first_learner >= hold
