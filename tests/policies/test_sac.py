"""SAC with the RLPD pieces: batched critic ensemble, tanh-Gaussian log-probs, random-subset TD target,
learning a 1-step bandit, bit-exact resume, the shared encoder; the small image encoder."""

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.distributions import AffineTransform, Independent, Normal, TanhTransform, TransformedDistribution

from policies.common.encoders import SmallImageStateEncoder, count_parameters, random_shift, shift_observations
from policies.common.replay import ReplayBuffer
from policies.common.sac import SAC, EnsembleCritic, SACConfig, TanhGaussianActor

torch.set_num_threads(1)


def test_ensemble_critic_equals_a_loop_over_members():
    torch.manual_seed(0)
    critic = EnsembleCritic(6, 2, num_critics=4, hidden=(16, 8), layer_norm=True)
    with torch.no_grad():  # non-trivial LayerNorm affine, different per member
        for w, b in zip(critic.ln_weights, critic.ln_biases):
            w.uniform_(0.5, 1.5)
            b.uniform_(-0.5, 0.5)
    obs, act = torch.randn(5, 6), torch.randn(5, 2)
    q = critic(obs, act)
    assert q.shape == (4, 5)
    x = torch.cat([obs, act], -1)
    for i in range(4):
        h = x
        for l in range(3):
            h = F.linear(h, critic.weights[l][i].T, critic.biases[l][i, 0])
            if l < 2:
                h = F.layer_norm(h, h.shape[-1:], critic.ln_weights[l][i, 0], critic.ln_biases[l][i, 0])
                h = F.relu(h)
        torch.testing.assert_close(q[i], h.squeeze(-1), rtol=1e-5, atol=1e-6)
    members = torch.tensor([3, 1])
    torch.testing.assert_close(critic(obs, act, members=members), q[members])
    # the members are different networks
    assert (q[0] - q[1]).abs().max() > 1e-3


def test_tanh_gaussian_log_prob_matches_torch_distributions_and_integrates_to_one():
    torch.manual_seed(0)
    b = 1.5
    actor = TanhGaussianActor(4, 3, hidden=(16,), action_scale=b)
    obs = torch.randn(64, 4)
    a, logp = actor.sample(obs, generator=torch.Generator().manual_seed(1))
    assert a.shape == (64, 3) and logp.shape == (64,) and a.abs().max() < b
    mean, log_std = actor(obs)
    dist = TransformedDistribution(Independent(Normal(mean, log_std.exp()), 1),
                                   [TanhTransform(), AffineTransform(0.0, b)])
    ok = (a.abs() < 0.99 * b).all(-1)  # away from the bounds, where atanh inside log_prob is exact
    assert ok.sum() > 32
    torch.testing.assert_close(logp[ok], dist.log_prob(a)[ok], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(actor.log_prob(obs, a)[ok], logp[ok], rtol=1e-4, atol=1e-4)
    # 1-d density over (-b, b) integrates to 1 (numerical check of the log b + log(1 - tanh^2) terms)
    actor1 = TanhGaussianActor(2, 1, hidden=(8,), action_scale=b)
    grid = torch.linspace(-b, b, 200_001)[1:-1, None]
    dens = actor1.log_prob(torch.ones(len(grid), 2), grid).exp()
    assert abs(torch.trapezoid(dens, grid[:, 0]).item() - 1.0) < 2e-3
    # deterministic: the squashed mean
    a_det, _ = actor.sample(obs, deterministic=True)
    torch.testing.assert_close(a_det, b * torch.tanh(mean))


def _constant_target_critics(sac: SAC, values: list[float]) -> None:
    """Make target critic i output values[i] for every input: zero last weights, bias = value."""
    with torch.no_grad():
        sac.critic_target.weights[-1].zero_()
        sac.critic_target.biases[-1].copy_(torch.tensor(values).view(-1, 1, 1))


def test_td_target_is_min_over_a_random_subset_of_two():
    sac = SAC(3, 2, SACConfig(num_critics=10, critic_subset=2, gamma=0.5, backup_entropy=False, hidden=(8,)))
    _constant_target_critics(sac, [float(v) for v in range(10)])
    feat, reward, done = torch.randn(4, 3), torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([0.0, 0, 0, 1])
    mins = []
    for _ in range(450):
        y = sac.td_target(feat, reward, done)
        assert y[3] == 1.0  # terminal: no bootstrap
        assert torch.all(y[:3] == y[0])  # one subset per batch
        mins.append(int(round((y[0].item() - 1.0) / 0.5)))
    counts = np.bincount(mins, minlength=10)
    # min of 2 distinct members out of 0..9: P(k) = (9 - k) / 45, so 9 never, 0 most often
    assert counts[9] == 0 and counts[8] > 0
    expected = np.array([(9 - k) / 45 for k in range(10)]) * 450
    assert np.abs(counts - expected).max() < 25, counts
    # with all 10 in the subset the target is the plain min
    sac_all = SAC(3, 2, SACConfig(num_critics=10, critic_subset=10, gamma=0.5, backup_entropy=False, hidden=(8,)))
    _constant_target_critics(sac_all, [float(v) + 3 for v in range(10)])
    assert torch.allclose(sac_all.td_target(feat, reward, done)[:3], torch.tensor(1.0 + 0.5 * 3))


def test_backup_entropy_subtracts_alpha_log_pi():
    cfg = SACConfig(num_critics=2, gamma=1.0, backup_entropy=True, init_temperature=0.5, hidden=(8,))
    sac = SAC(3, 2, cfg, seed=3)
    _constant_target_critics(sac, [2.0, 2.0])
    feat = torch.randn(6, 3)
    state = sac.generator.get_state()
    y = sac.td_target(feat, torch.zeros(6), torch.zeros(6))
    sac.generator.set_state(state)
    _, log_pi = sac.actor.sample(feat, generator=sac.generator)  # the same draw td_target made
    torch.testing.assert_close(y, 2.0 - 0.5 * log_pi)


def _flat(b: dict) -> dict:
    return {**b, "obs": b["obs"]["x"], "next_obs": b["next_obs"]["x"]}


def test_sac_learns_a_one_step_bandit():
    """reward = -||a - a*||^2 from uniform random actions; the greedy action must approach a*."""
    a_star = np.array([0.5, -0.3, 0.2], np.float32)
    cfg = SACConfig(hidden=(64, 64), batch_size=64, actor_lr=3e-3, critic_lr=3e-3, alpha_lr=3e-3,
                    init_temperature=0.1)
    sac = SAC(2, 3, cfg, seed=0)
    buf = ReplayBuffer(1000, {"x": ((2,), np.float32)}, 3)
    rng = np.random.default_rng(0)
    obs = np.ones(2, np.float32)
    for a in rng.uniform(-1, 1, (500, 3)).astype(np.float32):
        buf.add({"x": obs}, a, -float(((a - a_star) ** 2).sum()), {"x": obs}, True)
    greedy = lambda: sac.act(torch.from_numpy(obs)[None], deterministic=True)[0].numpy()  # noqa: E731
    assert np.linalg.norm(greedy() - a_star) > 0.5
    for _ in range(300):
        info = sac.update(_flat(buf.sample(64, rng)))
    assert np.linalg.norm(greedy() - a_star) < 0.1, (greedy(), info)
    assert info["losses/qf_loss"] < 0.5 and 0 < info["losses/alpha"] < 0.1  # fits Q; alpha went down


def _tiny_encoder() -> SmallImageStateEncoder:
    return SmallImageStateEncoder(["front"], image_size=16, state_dim=3, out_dim=8, channels=4, convs=2,
                                  camera_dim=8, state_hidden=8)


def _image_buffer(rng: np.random.Generator) -> ReplayBuffer:
    buf = ReplayBuffer(64, {"front": ((16, 16, 3), np.uint8), "state": ((3,), np.float32)}, 2)
    for _ in range(64):
        o = {"front": rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), "state": rng.normal(size=3).astype(np.float32)}
        buf.add(o, rng.uniform(-1, 1, 2).astype(np.float32), float(rng.normal()), o, bool(rng.random() < 0.1))
    return buf


def test_state_dict_round_trip_gives_bit_identical_updates():
    cfg = SACConfig(hidden=(16, 16), batch_size=8, num_critics=4, utd=3)
    rng = np.random.default_rng(0)
    buf = _image_buffer(rng)
    a = SAC(None, 2, cfg, encoder=_tiny_encoder(), seed=0)
    for _ in range(2):
        a.update_many(lambda: buf.sample(8, rng))
    blob = io.BytesIO()
    torch.save(a.state_dict(), blob)
    rng_state = rng.bit_generator.state

    def run(sac: SAC) -> list[dict]:
        r = np.random.default_rng()
        r.bit_generator.state = rng_state
        return [sac.update_many(lambda: shift_observations(buf.sample(8, r), 2, g)) for g in
                [torch.Generator().manual_seed(i) for i in range(3)]]

    b = SAC(None, 2, cfg, encoder=_tiny_encoder(), seed=123)  # different init, overwritten by the load
    blob.seek(0)
    b.load_state_dict(torch.load(blob, weights_only=False))
    infos_a, infos_b = run(a), run(b)
    assert infos_a == infos_b
    sa, sb = a.state_dict(), b.state_dict()
    for key in ("actor", "critic", "critic_target", "encoder"):
        for name, t in sa[key].items():
            assert torch.equal(t, sb[key][name]), f"{key}.{name}"
    assert torch.equal(sa["log_alpha"], sb["log_alpha"]) and torch.equal(sa["generator"], sb["generator"])
    assert sa["critic_opt"]["state"][0]["step"] == sb["critic_opt"]["state"][0]["step"] == 5 * 3
    assert (a.critic_updates, a.actor_updates) == (15, 15)  # per_step: an actor step with every critic step
    # and the resumed run is not trivially equal to a fresh one
    c = SAC(None, 2, cfg, encoder=_tiny_encoder(), seed=123)
    assert run(c) != infos_a


@pytest.mark.parametrize("schedule, actor_steps", [("per_step", 6), ("legacy", 2)])
def test_update_schedule_counts_actor_and_temperature_steps(schedule, actor_steps):
    """per_step: utd critic, actor and temperature steps per round (the DSRL codes); legacy: utd critic
    steps and one actor + temperature step (RLPD). The round also reports the policy diagnostics."""
    rng = np.random.default_rng(0)
    buf = _image_buffer(rng)
    sac = SAC(None, 2, SACConfig(hidden=(8,), num_critics=2, batch_size=8, utd=3, update_schedule=schedule),
              encoder=_tiny_encoder())
    for _ in range(2):
        info = sac.update_many(lambda: buf.sample(8, rng))
    assert (sac.critic_updates, sac.actor_updates) == (6, actor_steps)
    assert sac.alpha_opt.state_dict()["state"][0]["step"] == actor_steps
    assert {"diag/actor_log_std", "diag/actor_abs_mean", "diag/entropy", "diag/alpha"} <= set(info)
    with pytest.raises(ValueError, match="update_schedule must be one of"):
        SACConfig(update_schedule="rlpd")


def test_encoder_is_trained_by_the_critic_only():
    rng = np.random.default_rng(0)
    buf = _image_buffer(rng)
    sac = SAC(None, 2, SACConfig(hidden=(16,), num_critics=2), encoder=_tiny_encoder())
    enc_ids = {id(p) for p in sac.encoder.parameters()}
    assert enc_ids <= {id(p) for g in sac.critic_opt.param_groups for p in g["params"]}
    assert not enc_ids & {id(p) for g in sac.actor_opt.param_groups for p in g["params"]}
    before = [p.detach().clone() for p in sac.encoder.parameters()]
    sac.update(buf.sample(8, rng))
    assert any(not torch.equal(p0, p) for p0, p in zip(before, sac.encoder.parameters()))
    # the actor step alone leaves no gradient on the encoder (or on the critic)
    sac.critic_opt.zero_grad(set_to_none=True)
    feat = sac.features(buf.sample(8, rng)["obs"]).detach()
    sac._actor_step(feat)
    assert all(p.grad is None for p in sac.encoder.parameters())
    assert all(p.grad is None for p in sac.critic.parameters())
    a = sac.act({"front": torch.zeros(3, 16, 16, 3, dtype=torch.uint8), "state": torch.zeros(3, 3)})
    assert a.shape == (3, 2) and sac.encoder.training


def test_config_checks():
    with pytest.raises(ValueError, match="critic_subset"):
        SACConfig(num_critics=2, critic_subset=3)
    with pytest.raises(ValueError, match="tau"):
        SACConfig(tau=0.0)
    assert SACConfig(hidden=[64, 64]).hidden == (64, 64)
    assert SAC(4, 6, SACConfig(hidden=(8,))).target_entropy == -3.0
    with pytest.raises(ValueError, match="no encoder"):
        SAC(4, 2, SACConfig(hidden=(8,))).act({"state": torch.zeros(1, 4)})


def test_small_encoder_size_shapes_and_random_shift():
    enc = SmallImageStateEncoder(["front", "wrist"], image_size=64, state_dim=8, out_dim=256)
    assert 200_000 <= count_parameters(enc) <= 500_000
    obs = {"front": torch.randint(0, 256, (2, 64, 64, 3), dtype=torch.uint8),
           "wrist": torch.randint(0, 256, (2, 64, 64, 3), dtype=torch.uint8), "state": torch.randn(2, 8)}
    out = enc(obs)
    assert out.shape == (2, 256) and out.abs().max() <= 1
    with pytest.raises(ValueError, match="wrist"):
        enc({**obs, "wrist": torch.zeros(2, 32, 32, 3, dtype=torch.uint8)})
    # random shift: a crop of the edge-padded image at an offset in [-pad, pad]
    img = torch.randint(0, 256, (16, 12, 12, 3), dtype=torch.uint8)
    assert torch.equal(random_shift(img, 0), img)
    out = random_shift(img, 2, torch.Generator().manual_seed(0))
    assert out.dtype == torch.uint8 and out.shape == img.shape
    padded = F.pad(img.permute(0, 3, 1, 2).float(), (2, 2, 2, 2), mode="replicate").permute(0, 2, 3, 1)
    for i in range(16):
        crops = [padded[i, y:y + 12, x:x + 12] for y in range(5) for x in range(5)]
        assert any(torch.equal(out[i].float(), c) for c in crops)
    assert sum(not torch.equal(out[i], img[i]) for i in range(16)) > 8


def test_init_log_std_starts_every_observation_at_mean_zero_and_that_std():
    """``init_log_std``: the first policy is (nearly) the same N(mean 0, std e^x) before the tanh for
    any observation -- for DSRL, close to the N(0, I) noise of the base VLA; None keeps the CleanRL init."""
    obs = torch.randn(64, 10) * 3
    a = SAC(10, 6, SACConfig(hidden=(32, 32), init_log_std=0.0), seed=1)
    mean, log_std = a.actor(obs)
    assert mean.abs().max() < 0.05 and (log_std - 0.0).abs().max() < 0.05
    with torch.no_grad():
        w, _ = a.actor.sample(torch.zeros(20_000, 10), generator=torch.Generator().manual_seed(0))
    expect = SACConfig().action_scale * torch.tanh(torch.randn(20_000, 6, generator=torch.Generator().manual_seed(1)))
    assert abs(float(w.std()) - float(expect.std())) < 0.02  # b tanh(N(0, 1)): std 0.63 for b = 1
    b = SAC(10, 6, SACConfig(hidden=(32, 32)), seed=1)
    mean_b, log_std_b = b.actor(obs)
    assert log_std_b.std() > 0.3 and mean_b.std() > 0.05  # the default init: mean and std vary with the observation
    with pytest.raises(ValueError, match="init_log_std"):
        SACConfig(init_log_std=3.0)
