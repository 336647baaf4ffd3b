"""AutoSafe: the blend weight's range and limits, gradients through the blend, the blended log-prob
against a change of variables computed numerically, the cart-pole's LQR and safe set, and that the
blend (and the Simplex filter) is what keeps a random actor inside the safe set."""

import math

import numpy as np
import pytest
import torch

from policies.common.replay import ReplayBuffer
from policies.common.sac import TanhGaussianActor
from policies.safety.autosafe import AutoSafeActor, AutoSafeSAC, SafetySpec, SimplexFilter, blend_weight
from policies.safety.cartpole import ContinuousCartPoleEnv, lqr, safety_spec, step_dynamics
from policies.safety.config import AutoSafeConfig

torch.set_num_threads(1)


def _reference_lambda(p: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The paper's formula as written, in float64 (fine for moderate p)."""
    return (np.exp(p * (1 - d)) - 1) / (np.exp(p) - 1)


# -- the blend weight ------------------------------------------------------------------------------
def test_lambda_stays_in_unit_interval_is_one_at_the_boundary_and_vanishes_deep_inside():
    g = torch.Generator().manual_seed(0)
    n = 200_000
    p = 10 ** (torch.rand(n, generator=g) * 12 - 9)  # 1e-9 .. 1e3, log-uniform
    d = torch.rand(n, generator=g)
    d[: n // 10] = 0.0
    d[n // 10: n // 5] = 1.0
    for dtype in (torch.float32, torch.float64):
        lam, one_minus = blend_weight(p.to(dtype), d.to(dtype))
        assert torch.isfinite(lam).all() and torch.isfinite(one_minus).all()
        assert (lam >= 0).all() and (lam <= 1).all() and (one_minus >= 0).all() and (one_minus <= 1).all()
        torch.testing.assert_close(lam + one_minus, torch.ones_like(lam), atol=2e-6, rtol=0)
        assert (lam[d == 0] == 1).all() and (one_minus[d == 0] == 0).all()  # at the boundary: the safe action only
        assert (lam[d == 1] == 0).all()  # deepest inside: the learner only
    # equals the formula where it can be evaluated directly
    pm, dm = p.double().clamp(1e-3, 50).numpy(), d.double().numpy()
    lam64 = blend_weight(torch.from_numpy(pm), torch.from_numpy(dm))[0].numpy()
    np.testing.assert_allclose(lam64, _reference_lambda(pm, dm), rtol=1e-9, atol=1e-12)
    # p -> 0: the linear blend 1 - Delta, continuously across the series / exact switch
    dd = torch.linspace(0, 1, 101, dtype=torch.float64)
    for pp in (0.0, 1e-9, 0.99e-4, 1.01e-4, 1e-3):
        lam_small = blend_weight(torch.full_like(dd, pp), dd)[0]
        # lambda - (1 - D) = -p D (1 - D) / 2 + O(p^2)
        assert ((lam_small - (1 - dd)).abs() <= pp / 8 + 1e-12).all()
        torch.testing.assert_close(lam_small, (1 - dd) * (1 - pp * dd / 2), atol=pp ** 2 + 1e-15, rtol=0)
    # large p: the learner keeps control until close to the boundary
    lam_big = blend_weight(torch.tensor([50.0, 200.0, 1000.0]), torch.tensor([0.5, 0.2, 0.05]))[0]
    assert (lam_big < 1e-10).all()
    # decreasing in Delta and in p
    grid_p, grid_d = torch.meshgrid(torch.logspace(-3, 2, 60, dtype=torch.float64), dd, indexing="ij")
    lam_grid = blend_weight(grid_p, grid_d)[0]
    assert (lam_grid.diff(dim=1) <= 1e-12).all() and (lam_grid.diff(dim=0) <= 1e-12).all()


def test_blend_weight_gradient_matches_finite_differences():
    p = torch.tensor([1e-3, 0.3, 1.0, 5.0, 40.0], dtype=torch.float64, requires_grad=True)
    d = torch.tensor([0.9, 0.5, 0.1, 0.7, 0.02], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda p, d: blend_weight(p, d)[0], (p, d))
    assert torch.autograd.gradcheck(lambda p, d: blend_weight(p, d)[1], (p, d))


# -- the layer: gradients and log-probs ------------------------------------------------------------
def _toy_spec(action_dim: int = 2, b: float = 1.0) -> SafetySpec:
    """a_safe = -b/2 tanh(first A dims of obs), Delta = clip(1 - |obs|^2 / 4, 0, 1)."""
    return SafetySpec(safe_action=lambda o: -0.5 * b * torch.tanh(o[:, :action_dim]),
                      margin=lambda o: (1 - o.pow(2).sum(-1) / 4).clamp(0, 1))


def _actor(obs_dim=4, action_dim=2, b=1.0, cfg=AutoSafeConfig(sharpness_max=5.0), dtype=torch.float32):
    torch.manual_seed(0)
    base = TanhGaussianActor(obs_dim, action_dim, hidden=(16, 16), action_scale=b)
    return AutoSafeActor(base, _toy_spec(action_dim, b), cfg).to(dtype)


def test_gradients_reach_the_actor_and_the_sharpness_head_through_the_blend():
    actor = _actor()
    obs = torch.randn(64, 4) * 0.8
    obs[0] = 0.0  # Delta = 1: no blend
    a, log_pi = actor.sample(obs, generator=torch.Generator().manual_seed(0))
    lam = actor.blend(obs)["lambda"]
    assert ((lam > 0.05) & (lam < 0.95)).sum() > 20, "the test batch should be blended"
    # an actor loss as SAC's: alpha log pi - Q(s, a~), with a fixed smooth "critic"
    loss = (0.2 * log_pi - (a * torch.tensor([1.0, -2.0])).sum(-1)).mean()
    loss.backward()
    for name, prm in actor.named_parameters():
        assert prm.grad is not None and prm.grad.abs().sum() > 0, f"no gradient reached {name}"
    # where lambda = 1 (Delta = 0: on / outside the boundary) the learner's action has no effect at all
    actor.zero_grad()
    far = torch.full((8, 4), 3.0)
    a_far, _ = actor.sample(far, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a_far, actor.spec.safe_action(far))
    (a_far.sum()).backward()
    assert actor.base.mean.weight.grad.abs().max() == 0 and actor.sharpness.weight.grad.abs().max() == 0


def test_sample_gradient_in_the_head_matches_finite_differences():
    actor = _actor(dtype=torch.float64)
    obs = torch.randn(16, 4, dtype=torch.float64) * 0.8

    def objective():
        a, log_pi = actor.sample(obs, generator=torch.Generator().manual_seed(3))
        return (0.3 * log_pi - (a ** 2).sum(-1)).sum()

    objective().backward()
    for prm in (actor.sharpness.bias, actor.base.mean.bias):
        g = prm.grad.clone()
        for i in range(prm.numel()):
            with torch.no_grad():
                prm.view(-1)[i] += 1e-6
                up = objective()
                prm.view(-1)[i] -= 2e-6
                down = objective()
                prm.view(-1)[i] += 1e-6
            assert abs((up - down).item() / 2e-6 - g.view(-1)[i].item()) < 1e-5 * (1 + abs(g.view(-1)[i].item()))


def test_blended_log_prob_is_the_change_of_variables_of_the_blend():
    """log pi~(a~|s) = log N(u; mu, sigma) - log |det d a~ / d u|, with the Jacobian of
    u -> a~ = a_safe + (1 - lambda)(b tanh(u) - a_safe) taken by central finite differences."""
    b = 1.5
    actor = _actor(b=b, dtype=torch.float64)
    obs = torch.randn(32, 4, dtype=torch.float64) * 0.7
    a, log_pi = actor.sample(obs, generator=torch.Generator().manual_seed(1))
    mean, log_std = actor(obs)
    info = actor.blend(obs)
    lam, a_safe = info["lambda"], info["a_safe"]
    a_theta = a_safe + (a - a_safe) / (1 - lam).unsqueeze(-1)  # invert the blend
    rows = ((lam > 0.05) & (lam < 0.95) & (a_theta.abs() < 0.99 * b).all(-1)).nonzero()[:, 0]
    assert len(rows) > 8
    u = torch.atanh(a_theta / b)  # invert the squash

    def blended(uu, i):
        return a_safe[i] + (1 - lam[i]) * (b * torch.tanh(uu) - a_safe[i])

    for i in rows.tolist():
        h = 1e-6
        jac = torch.stack([(blended(u[i] + h * e, i) - blended(u[i] - h * e, i)) / (2 * h)
                           for e in torch.eye(2, dtype=torch.float64)], 1)
        log_n = torch.distributions.Normal(mean[i], log_std[i].exp()).log_prob(u[i]).sum()
        expected = log_n - torch.linalg.slogdet(jac)[1]
        assert abs(log_pi[i].item() - expected.item()) < 1e-5, (i, log_pi[i].item(), expected.item())
    # log_prob of given blended actions agrees with sample's, and the density integrates to 1 (1-d)
    torch.testing.assert_close(actor.log_prob(obs, a)[rows], log_pi[rows], rtol=1e-6, atol=1e-6)
    actor1 = _actor(obs_dim=2, action_dim=1, b=b, dtype=torch.float64)
    o = torch.tensor([[0.6, -1.1]], dtype=torch.float64)
    lam1 = actor1.blend(o)["lambda"].item()
    assert 0.2 < lam1 < 0.9
    grid = torch.linspace(-b, b, 400_001, dtype=torch.float64)[1:-1, None]
    dens = actor1.log_prob(o.expand(len(grid), 2), grid).exp()
    assert abs(torch.trapezoid(dens, grid[:, 0]).item() - 1.0) < 2e-3
    # the blended distribution: mean moved toward a_safe, spread shrunk by (1 - lambda)
    many = o.expand(200_000, 2)
    a_b, _ = actor1.sample(many, generator=torch.Generator().manual_seed(2))
    a_t, _ = actor1.base.sample(many, generator=torch.Generator().manual_seed(2))
    a_s = actor1.blend(o)["a_safe"].item()
    assert abs(a_b.mean().item() - ((1 - lam1) * a_t.mean().item() + lam1 * a_s)) < 1e-9
    assert abs(a_b.std().item() - (1 - lam1) * a_t.std().item()) < 1e-9


# -- the cart-pole, its LQR and safe set -----------------------------------------------------------
def test_lqr_keeps_the_cartpole_inside_the_safe_set():
    ctrl = lqr()
    rng = np.random.default_rng(0)
    x = ctrl.sample_inside(rng, 4000)
    # the set lies inside gymnasium's termination bounds
    ext = np.sqrt(ctrl.c * np.diag(np.linalg.inv(ctrl.P)))
    assert ext[0] <= 2.0 + 1e-9 and ext[2] <= 0.8 * 12 * math.pi / 180 + 1e-9
    worst = 0.0
    for _ in range(400):
        x = step_dynamics(x, 10.0 * ctrl.action(x)[:, 0])
        worst = max(worst, float((ctrl.value(x) / ctrl.c).max()))
    assert worst <= 1.0, worst
    assert (ctrl.value(x) / ctrl.c).max() < 0.05  # and brings it back towards upright rest
    env = ContinuousCartPoleEnv(safe_set=ctrl, max_steps=300)
    obs, info = env.reset(seed=0)
    ret = 0.0
    for _ in range(300):
        obs, r, term, trunc, info = env.step(ctrl.action(info["state"]))
        assert info["safe"] and not term
        ret += r
    assert trunc and ret > 0.7 * 300  # x_goal 0: LQR earns near-full reward


def _rollout_random_actor(safety: str, steps: int = 1000, envs: int = 200, seed: int = 0) -> float:
    """Worst V / c over ``steps`` of ``envs`` cart-poles driven by an untrained, high-variance actor:
    ``none`` as it is, ``autosafe`` under the AutoSafe layer with p at its cap (the least safe sharpness),
    ``simplex`` under the one-step-lookahead Simplex filter."""
    ctrl = lqr()
    spec = safety_spec(ctrl)
    cfg = AutoSafeConfig()
    torch.manual_seed(seed)
    base = TanhGaussianActor(4, 1, hidden=(16,), init_log_std=1.0)  # b tanh(N(0, e^2)): mostly +-1
    actor = AutoSafeActor(base, spec, cfg)
    with torch.no_grad():
        actor.sharpness.bias.fill_(50.0)  # p = p_max: the learner's largest authority the layer allows
    filt = SimplexFilter(spec, 0.0, predict=lambda o, a: torch.from_numpy(
        step_dynamics(o.double().numpy(), 10.0 * a.double().numpy()[:, 0])).float())
    rng = np.random.default_rng(seed)
    x = rng.uniform(-0.05, 0.05, (envs, 4))
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    with torch.no_grad():
        for _ in range(steps):
            obs = torch.from_numpy(x).float()
            if safety == "autosafe":
                assert abs(actor.blend(obs[:1])["p"].item() - cfg.sharpness_max) < 1e-3
                a, _ = actor.sample(obs, generator=g)
            else:
                a, _ = base.sample(obs, generator=g)
                if safety == "simplex":
                    a, _ = filt(obs, a)
            x = step_dynamics(x, 10.0 * a.double().numpy()[:, 0])
            x[np.abs(x[:, 2]) > math.pi / 2] = 0.0  # restart fallen poles (only the unguarded actor gets there)
            worst = max(worst, float((ctrl.value(x) / ctrl.c).max()))
    return worst


def test_the_blend_is_what_keeps_a_random_actor_inside_the_safe_set():
    assert _rollout_random_actor("none") > 1.5  # without the layer the same actor leaves the set
    assert _rollout_random_actor("autosafe") <= 1.0
    assert _rollout_random_actor("simplex") <= 1.0


def test_simplex_filter_switches_only_when_needed():
    spec = _toy_spec(1)
    filt = SimplexFilter(spec, threshold=0.25)
    obs = torch.tensor([[0.0, 0, 0, 0], [1.9, 0, 0, 0]])  # margin 1 and 0.0975
    a, switched = filt(obs, torch.tensor([[0.7], [0.7]]))
    assert switched.tolist() == [False, True]
    torch.testing.assert_close(a, torch.tensor([[0.7], [-0.5 * math.tanh(1.9)]]))
    with pytest.raises(ValueError, match="threshold > 0"):
        SimplexFilter(spec, 0.0)


# -- the layer under SAC -------------------------------------------------------------------------------
def test_autosafe_sac_update_trains_the_sharpness_head_and_resumes():
    ctrl = lqr()
    cfg = AutoSafeConfig(sac=AutoSafeConfig().sac.__class__(hidden=(32, 32), batch_size=32, num_critics=2, utd=1))
    sac = AutoSafeSAC(4, 1, safety_spec(ctrl), cfg, seed=0)
    assert isinstance(sac.actor, AutoSafeActor)
    env = ContinuousCartPoleEnv(safe_set=ctrl, max_steps=100, x_goal=0.5, x_scale=2.0)
    buf = ReplayBuffer(500, {"x": ((4,), np.float32)}, 1)
    obs, info = env.reset(seed=0)
    for _ in range(100):
        a = sac.act(torch.from_numpy(obs)[None])[0].numpy()
        nobs, r, term, trunc, info = env.step(a)
        assert info["safe"]
        buf.add({"x": obs}, a, r, {"x": nobs}, term)
        obs = nobs if not (term or trunc) else env.reset()[0]
    head0 = sac.actor.sharpness.weight.detach().clone()
    rng = np.random.default_rng(0)
    flat = lambda b: {**b, "obs": b["obs"]["x"], "next_obs": b["next_obs"]["x"]}  # noqa: E731
    info = sac.update_many(lambda: flat(buf.sample(32, rng)))
    assert {"diag/lambda_mean", "diag/sharpness_mean", "losses/actor_loss"} <= set(info)
    assert not torch.equal(head0, sac.actor.sharpness.weight)
    state = sac.state_dict()
    assert any(k.startswith("sharpness.") for k in state["actor"])
    other = AutoSafeSAC(4, 1, safety_spec(ctrl), cfg, seed=1)
    other.load_state_dict(state)
    o = torch.randn(8, 4) * 0.2
    torch.testing.assert_close(other.act(o, deterministic=True), sac.act(o, deterministic=True))


def test_config_refuses_an_impossible_sharpness():
    with pytest.raises(ValueError, match="sharpness_init"):
        AutoSafeConfig(sharpness_init=3.0, sharpness_max=2.0)
    with pytest.raises(ValueError, match="sharpness_eps"):
        AutoSafeConfig(sharpness_eps=0.0)
