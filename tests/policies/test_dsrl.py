"""DSRL agent on a toy noise -> action map: both variants learn which noise gives the rewarded chunk."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
import torch

from policies.common.replay import STEP_EXTRAS, ReplayBuffer
from policies.common.sac import SACConfig
from policies.dsrl import DSRLAgent, DSRLConfig


class ToyVLA(torch.nn.Module):
    """noise [B, 2, 2] -> chunk = tanh(noise + bias) (normalised units), a stand-in for a frozen
    flow sampler. A different noise gives a different chunk, the same noise the same chunk."""

    noise_shape = (2, 2)
    action_shape = (2, 2)

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.full((2, 2), -0.8))
        self.cfg = type("C", (), {"cond_dim": 4})()

    def sample_actions_from_embedding(self, emb, noise=None, token=None, num_steps=None, normalized=False):
        return torch.tanh(noise + self.bias)

    def unnormalize_actions(self, x):
        return x


def run_bandit(variant: str, updates: int = 250) -> float:
    torch.manual_seed(0)
    vla = ToyVLA().requires_grad_(False)
    cfg = DSRLConfig(variant=variant, noise_bound=2.0, distill_steps=2,
                     sac=SACConfig(utd=2, batch_size=64, num_critics=2, hidden=(64, 64), init_temperature=0.01,
                                   backup_entropy=False, gamma=0.0))
    agent = DSRLAgent(vla, cfg, seed=0)
    buf = ReplayBuffer(10_000, {"feat": ((4,), np.float32)}, agent.noise_dim, {"chunk": ((2, 2), np.float32), **STEP_EXTRAS})
    rng = np.random.default_rng(0)
    feat = torch.ones(1, 4)
    target = torch.tensor([[0.5, 0.5], [0.5, 0.5]])  # the base VLA (noise ~ N(0, I)) sits near -0.6
    for i in range(updates):
        w = agent.act(feat, rng, warmup=i < 50)
        chunk = agent.chunk(feat, w, normalized=True)[0]
        r = float(-((chunk - target) ** 2).sum())
        buf.add({"feat": feat[0].numpy()}, w[0].numpy(), r, {"feat": feat[0].numpy()}, True, chunk=chunk.numpy())
        if i >= 50:
            agent.update(buf, None, rng)
    w = agent.act(feat, rng, warmup=False, deterministic=True)
    return float(((agent.chunk(feat, w, normalized=True)[0] - target) ** 2).sum())


@pytest.mark.parametrize("variant", ["sac", "na", "action"])
def test_dsrl_learns_the_noise_that_gives_the_rewarded_chunk(variant):
    torch.set_num_threads(1)
    base = float(((torch.tanh(torch.full((2, 2), -0.8)) - 0.5) ** 2).sum())  # zero noise: 4 x 1.35^2
    err = run_bandit(variant)
    assert err < 0.25 * base, (variant, err, base)


def test_the_action_baseline_acts_within_action_bound_in_the_vlas_own_units():
    """Variant ``action``: the agent's chunk is its action, in [-action_bound, action_bound] of the VLA's
    normalised units, not clipped to [-1, 1] (a LeRobot backbone's mean / std units reach beyond)."""
    agent = DSRLAgent(ToyVLA(), DSRLConfig(variant="action", action_bound=3.0, sac=SACConfig(num_critics=2, hidden=(16,))),
                      seed=0)
    feat = torch.ones(64, 4)
    for warmup in (True, False):
        w = agent.act(feat, np.random.default_rng(0), warmup=warmup)
        chunk = agent.chunk(feat, w, normalized=True)
        assert torch.equal(chunk, agent.w_to_noise(w))
        assert 1.0 < float(chunk.abs().max()) <= 3.0, (warmup, float(chunk.abs().max()))
    with pytest.raises(ValueError, match="action_bound must be positive"):
        DSRLConfig(variant="action", action_bound=0.0)


def test_noise_mapping_full_and_tiled():
    vla = ToyVLA()
    full = DSRLAgent(vla, DSRLConfig(sac=SACConfig(num_critics=2)), seed=0)
    assert full.noise_dim == 4
    w = torch.arange(4.0).reshape(1, 4)
    assert torch.equal(full.w_to_noise(w), torch.tensor([[[0.0, 1.0], [2.0, 3.0]]]))
    tiled = DSRLAgent(vla, DSRLConfig(noise_dims=2, sac=SACConfig(num_critics=2)), seed=0)
    assert tiled.noise_dim == 2
    assert torch.equal(tiled.w_to_noise(torch.tensor([[1.0, 2.0]])), torch.tensor([[[1.0, 2.0], [1.0, 2.0]]]))
    with pytest.raises(ValueError, match="noise_dims must be"):
        DSRLAgent(vla, DSRLConfig(noise_dims=3), seed=0)
    with pytest.raises(ValueError, match="noise_subspace must be one of"):
        DSRLConfig(noise_subspace="rows")


class WideVLA(ToyVLA):
    noise_shape = action_shape = (8, 3)


@pytest.mark.parametrize("subspace", ["tile", "mean"])
def test_a_row_of_noise_places_w_and_only_mean_keeps_the_vlas_noise_distribution(subspace):
    """Subspace ``mean``: w is each action dim's coordinate along the rows' all-ones direction, the rest
    is fresh i.i.d. noise, so w ~ N(0, I) gives the VLA's own N(0, I) noise; ``tile`` does not."""
    agent = DSRLAgent(WideVLA(), DSRLConfig(noise_dims=3, noise_subspace=subspace, sac=SACConfig(num_critics=2)),
                      seed=0)
    h = 8
    w = torch.randn(20_000, 3, generator=torch.Generator().manual_seed(0))
    noise = agent.w_to_noise(w, torch.Generator().manual_seed(1))
    assert noise.shape == (20_000, h, 3)
    torch.testing.assert_close(noise.mean(dim=1), w / h ** 0.5 if subspace == "mean" else w)
    cov = torch.cov(noise.reshape(len(w), -1).T)
    identity_error = float((cov - torch.eye(h * 3)).abs().max())
    if subspace == "mean":
        assert identity_error < 0.06, identity_error
        again = agent.w_to_noise(w[:4], torch.Generator().manual_seed(1))  # the remainder is the generator's
        torch.testing.assert_close(again, agent.w_to_noise(w[:4], torch.Generator().manual_seed(1)))
        assert not torch.allclose(again, agent.w_to_noise(w[:4], torch.Generator().manual_seed(2)))
    else:
        assert identity_error > 0.9  # every row the same draw: correlation 1 across the chunk
    with pytest.raises(ValueError, match="variant must be one of"):
        DSRLConfig(variant="ppo")


def test_agent_state_round_trip_gives_identical_updates():
    vla = ToyVLA().requires_grad_(False)
    cfg = DSRLConfig(variant="na", distill_steps=1,
                     sac=SACConfig(utd=1, batch_size=8, num_critics=2, hidden=(16,)))
    a = DSRLAgent(vla, cfg, seed=1)
    buf = ReplayBuffer(100, {"feat": ((4,), np.float32)}, 4, {"chunk": ((2, 2), np.float32), **STEP_EXTRAS})
    rng = np.random.default_rng(0)
    for i in range(20):
        buf.add({"feat": np.ones(4, np.float32)}, rng.normal(size=4).astype(np.float32), float(i % 2),
                {"feat": np.ones(4, np.float32)}, False, chunk=rng.normal(size=(2, 2)).astype(np.float32))
    a.update(buf, None, np.random.default_rng(5))
    b = DSRLAgent(vla, cfg, seed=99)
    import io

    f = io.BytesIO()  # through bytes, as a checkpoint on disk (optimiser states must not be shared)
    torch.save(a.state_dict(), f)
    f.seek(0)
    b.load_state_dict(torch.load(f, weights_only=False))
    ia = a.update(buf, None, np.random.default_rng(7))
    ib = b.update(buf, None, np.random.default_rng(7))
    assert ia == ib


# -- encoder "cnn": the agent reads camera frames + state through a small CNN ---------------------
def _scene(ctx: int, size: int = 16) -> np.ndarray:
    """A synthetic camera frame: a bright block on the left (context 0) or on the right (context 1)."""
    img = np.full((size, size, 3), 20, np.uint8)
    half = size // 2
    img[2:-2, 1:half - 1] = 230 if ctx == 0 else 20
    img[2:-2, half + 1:-1] = 230 if ctx == 1 else 20
    return img


CNN_TARGETS = (0.5, -0.95)  # the rewarded chunk (every entry) in context 0 / 1; the base VLA sits near -0.66


def _cnn_obs(ctx: int, agent: DSRLAgent) -> dict:
    o = {"front": _scene(ctx, agent.cfg.image_size), "state": np.zeros(2, np.float32)}
    if "feat" in agent.obs_spec:
        o["feat"] = np.ones(4, np.float32)  # the same VLA embedding in both contexts: only the image tells them apart
    return o


def _batch(o: dict) -> dict:
    return {k: torch.from_numpy(v)[None] for k, v in o.items()}


def _cnn_agent(variant: str, seed: int = 0, **sac) -> DSRLAgent:
    # critic_lr faster than the default: a short test. The actor keeps the default 3e-4: with the per-step
    # schedule it steps utd times per update, and at 1e-3 NA's actor outran its critics (1 seed of 3 passed)
    sac_cfg = dict(utd=2, batch_size=64, num_critics=2, hidden=(64, 64), init_temperature=0.01, backup_entropy=False,
                   gamma=0.0, critic_lr=1e-3)
    sac_cfg.update(sac)
    cfg = DSRLConfig(variant=variant, encoder="cnn", image_size=16, image_pad=2, noise_bound=2.0,
                     distill_steps=2, sac=SACConfig(**sac_cfg))
    return DSRLAgent(ToyVLA().requires_grad_(False), cfg, seed=seed, cameras=["front"], state_dim=2)


def _cnn_transition(agent: DSRLAgent, ctx: int, w: torch.Tensor) -> dict:
    chunk = agent.chunk(torch.ones(1, 4), w, normalized=True)[0]
    r = float(-((chunk - CNN_TARGETS[ctx]) ** 2).sum())
    o = _cnn_obs(ctx, agent)
    return dict(obs=o, action=w[0].numpy(), reward=r, next_obs=o, done=True, chunk=chunk.numpy())


@pytest.mark.parametrize("variant", ["na", "sac"])
def test_cnn_encoder_learns_which_noise_the_image_rewards(variant):
    """Two contexts that only the camera frame tells apart, each rewarding a different chunk: the
    agent must read the image (through the CNN) to pick the right noise in each."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    agent = _cnn_agent(variant)
    n = agent.parameter_counts()
    print(f"cnn {variant}: parameters {n}")
    assert n["total"] < 1_000_000 and n["encoder"] > 0 and n["total"] == sum(v for k, v in n.items() if k != "total")
    buf = ReplayBuffer(10_000, agent.obs_spec, agent.noise_dim, {"chunk": ((2, 2), np.float32), **STEP_EXTRAS})
    rng = np.random.default_rng(0)
    for i in range(200):
        ctx = i % 2
        w = agent.act(_batch(_cnn_obs(ctx, agent)), rng, warmup=i < 60)
        buf.add(**_cnn_transition(agent, ctx, w))
        if i >= 60:
            info = agent.update(buf, None, rng)
    assert all(np.isfinite(v) for v in info.values())
    for ctx, target in enumerate(CNN_TARGETS):
        w = agent.act(_batch(_cnn_obs(ctx, agent)), rng, warmup=False, deterministic=True)
        err = float(((agent.chunk(torch.ones(1, 4), w, normalized=True)[0] - target) ** 2).sum())
        base = float(((torch.tanh(torch.full((2, 2), -0.8)) - target) ** 2).sum())  # zero noise
        assert err < 0.25 * base, (variant, ctx, err, base)


def _opt_params(opt) -> set[int]:
    return {id(p) for g in opt.param_groups for p in g["params"]}


def test_cnn_layout_parameter_counts_and_which_loss_trains_the_encoder():
    class Pi0LikeVLA(ToyVLA):  # chunks of 8 x 7 and a 256-d embedding
        noise_shape = action_shape = (8, 7)

    vla = Pi0LikeVLA()
    vla.cfg.cond_dim = 256
    # DSRL on pi0: 2 cameras at 64 x 64, an 8-d state, a 7-d noise tiled over the chunk, 3 x 128 MLPs
    cfg = DSRLConfig(encoder="cnn", noise_dims=7, sac=SACConfig(num_critics=2, hidden=(128, 128, 128)))
    na = DSRLAgent(vla, cfg, cameras=["front", "wrist"], state_dim=8)
    sac = DSRLAgent(vla, dataclasses.replace(cfg, variant="sac"), cameras=["front", "wrist"], state_dim=8)
    print("cnn na:", na.parameter_counts(), "\ncnn sac:", sac.parameter_counts())
    assert na.parameter_counts() == {"encoder": 276_544, "actor": 67_726, "critic_w": 135_426, "critic_a": 147_970,
                                     "total": 627_666}
    assert sac.parameter_counts()["total"] == 479_696
    # what one transition's observation holds: uint8 frames + state (+ the VLA embedding NA re-generates chunks from)
    frames = {"front": ((64, 64, 3), np.uint8), "wrist": ((64, 64, 3), np.uint8), "state": ((8,), np.float32)}
    assert na.obs_spec == {**frames, "feat": ((256,), np.float32)} and sac.obs_spec == frames
    assert DSRLAgent(vla, DSRLConfig(sac=SACConfig(num_critics=2))).obs_spec == {"feat": ((256,), np.float32)}
    # the shared encoder learns from the critic's TD loss only: NA's Q^A optimiser (not Q^W's distillation,
    # not the actor); SAC's critic optimiser
    enc = {id(p) for p in na.sac.encoder.parameters()}
    assert enc <= _opt_params(na.qa_opt) and not enc & (_opt_params(na.sac.critic_opt) | _opt_params(na.sac.actor_opt))
    enc = {id(p) for p in sac.sac.encoder.parameters()}
    assert enc <= _opt_params(sac.sac.critic_opt) and not enc & _opt_params(sac.sac.actor_opt)
    with pytest.raises(ValueError, match="needs cameras"):
        DSRLAgent(vla, cfg)
    with pytest.raises(ValueError, match="clash"):
        DSRLAgent(vla, cfg, cameras=["state"], state_dim=8)
    with pytest.raises(ValueError, match="encoder must be one of"):
        DSRLConfig(encoder="resnet")
    with pytest.raises(ValueError, match="image_size"):
        DSRLConfig(encoder="cnn", image_size=40)


def _cnn_buffer(agent: DSRLAgent, n: int = 24, capacity: int = 100) -> ReplayBuffer:
    buf = ReplayBuffer(capacity, agent.obs_spec, agent.noise_dim, {"chunk": ((2, 2), np.float32), **STEP_EXTRAS})
    rng = np.random.default_rng(3)

    def obs() -> dict:  # random frames: every pixel matters for an exact round trip
        o = {"front": rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), "state": rng.normal(size=2).astype(np.float32)}
        if "feat" in agent.obs_spec:
            o["feat"] = rng.normal(size=4).astype(np.float32)
        return o

    for i in range(n):
        buf.add(obs(), rng.uniform(-1, 1, agent.noise_dim).astype(np.float32), float(i % 3), obs(), i % 5 == 4,
                chunk=rng.uniform(-1, 1, (2, 2)).astype(np.float32), intervention=i % 4 == 0)
    return buf


def test_cnn_replay_shift_augments_frames_only():
    agent = _cnn_agent("na")
    b = _cnn_buffer(agent).sample(64, np.random.default_rng(0))
    shifted = agent._augment(b)
    assert shifted["obs"]["front"].dtype == torch.uint8 and shifted["obs"]["front"].shape == (64, 16, 16, 3)
    assert not torch.equal(shifted["obs"]["front"], b["obs"]["front"])
    for k in ("state", "feat"):
        assert torch.equal(shifted["obs"][k], b["obs"][k]) and torch.equal(shifted["next_obs"][k], b["next_obs"][k])
    assert torch.equal(shifted["chunk"], b["chunk"]) and torch.equal(shifted["action"], b["action"])
    plain = DSRLAgent(ToyVLA(), dataclasses.replace(agent.cfg, image_pad=0), cameras=["front"], state_dim=2)
    assert plain._augment(b) is b


@pytest.mark.parametrize("variant", ["na", "sac"])
def test_cnn_agent_and_replay_round_trip_through_bytes_give_identical_updates(variant, tmp_path):
    """Agent state (encoder, its optimiser moments, the generator the image shifts draw from) and the
    image replay buffer, saved and loaded: the next updates are bit-identical."""
    torch.set_num_threads(1)
    a = _cnn_agent(variant, seed=1, utd=2, batch_size=8, hidden=(16,))
    buf = _cnn_buffer(a, n=130, capacity=100)  # wrapped ring
    a.update(buf, buf, np.random.default_rng(5))
    f = io.BytesIO()  # through bytes, as a checkpoint on disk (optimiser states must not be shared)
    torch.save(a.state_dict(), f)
    f.seek(0)
    b = _cnn_agent(variant, seed=99, utd=2, batch_size=8, hidden=(16,))
    b.load_state_dict(torch.load(f, weights_only=False))
    buf.save(tmp_path / "online.npz")
    back = ReplayBuffer.load(tmp_path / "online.npz")
    assert (back.ptr, back.size) == (buf.ptr, buf.size) == (30, 100) and back.obs_spec == buf.obs_spec
    for k in buf.obs_spec:
        assert back.obs[k].dtype == buf.obs[k].dtype
        np.testing.assert_array_equal(back.obs[k], buf.obs[k])
        np.testing.assert_array_equal(back.next_obs[k], buf.next_obs[k])
    for name in ("action", "reward", "done"):
        np.testing.assert_array_equal(getattr(back, name), getattr(buf, name))
    np.testing.assert_array_equal(back.extras["chunk"], buf.extras["chunk"])
    for _ in range(2):
        ia = a.update(buf, buf, np.random.default_rng(7))
        ib = b.update(back, back, np.random.default_rng(7))
        assert ia == ib
    for pa, pb in zip(a.sac.encoder.parameters(), b.sac.encoder.parameters()):
        assert torch.equal(pa, pb)
    obs = {k: torch.from_numpy(v[:3]) for k, v in buf.obs.items()}
    assert torch.equal(a.act(obs, None, warmup=False, deterministic=True),
                       b.act(obs, None, warmup=False, deterministic=True))
    with pytest.raises(ValueError, match="encoder 'cnn'"):
        DSRLAgent(ToyVLA(), dataclasses.replace(a.cfg, encoder="vla")).load_state_dict(a.state_dict())


def _oracle_agent(variant: str, privileged_dim: int = 3) -> DSRLAgent:
    cfg = DSRLConfig(variant=variant, encoder="oracle", noise_bound=2.0, distill_steps=2,
                     sac=SACConfig(utd=2, batch_size=64, num_critics=2, hidden=(64, 64), init_temperature=0.01,
                                   backup_entropy=False, gamma=0.0, critic_lr=1e-3))
    return DSRLAgent(ToyVLA().requires_grad_(False), cfg, seed=0, privileged_dim=privileged_dim)


def _oracle_error(variant: str, privileged: dict[int, np.ndarray]) -> list[float]:
    """Two contexts with the same VLA features, each rewarding a different chunk; ``privileged[ctx]`` is
    all the oracle encoder sees of the context. -> each context's squared error of the greedy chunk."""
    torch.manual_seed(0)
    agent = _oracle_agent(variant)
    buf = ReplayBuffer(10_000, agent.obs_spec, agent.noise_dim, {"chunk": ((2, 2), np.float32), **STEP_EXTRAS})
    rng = np.random.default_rng(0)

    def obs(ctx: int) -> dict:
        return {"feat": np.ones(4, np.float32), "privileged": privileged[ctx]}

    for i in range(200):
        ctx = i % 2
        o = obs(ctx)
        w = agent.act(_batch(o), rng, warmup=i < 60)
        chunk = agent.chunk(torch.ones(1, 4), w, normalized=True)[0]
        r = float(-((chunk - CNN_TARGETS[ctx]) ** 2).sum())
        buf.add(o, w[0].numpy(), r, o, True, chunk=chunk.numpy())
        if i >= 60:
            agent.update(buf, None, rng)
    errs = []
    for ctx, target in enumerate(CNN_TARGETS):
        w = agent.act(_batch(obs(ctx)), rng, warmup=False, deterministic=True)
        errs.append(float(((agent.chunk(torch.ones(1, 4), w, normalized=True)[0] - target) ** 2).sum()))
    return errs


@pytest.mark.parametrize("variant", ["sac", "na"])
def test_oracle_encoder_reads_the_privileged_state(variant):
    """The contexts differ only in the privileged vector: with it the agent finds each context's noise;
    with the vector blanked (the same in both contexts) it cannot serve both targets at once."""
    torch.set_num_threads(1)
    base = float(((torch.tanh(torch.full((2, 2), -0.8)) - CNN_TARGETS[0]) ** 2).sum())  # zero noise, context 0
    seen = _oracle_error(variant, {0: np.array([1, 0, 0], np.float32), 1: np.array([0, 1, 0], np.float32)})
    assert max(seen) < 0.1 * base, (variant, seen, base)
    if variant == "sac":  # the encoder is the same for both variants: one blind run shows the vector is the cue
        blind = _oracle_error(variant, {0: np.zeros(3, np.float32), 1: np.zeros(3, np.float32)})
        assert max(blind) > 0.3 * base, (variant, blind, base)


def test_oracle_encoder_layout_and_refusals():
    agent = _oracle_agent("na", privileged_dim=25)
    assert agent.obs_spec == {"privileged": ((25,), np.float32), "feat": ((4,), np.float32)}
    assert agent.sac.obs_dim == 4 + 25
    with pytest.raises(ValueError, match="privileged_dim"):
        DSRLAgent(ToyVLA(), DSRLConfig(encoder="oracle"))
    with pytest.raises(ValueError, match="no `privileged` field"):
        agent.observe_with({"images": {}, "state": np.zeros(8, np.float32)}, torch.ones(1, 4))
    with pytest.raises(ValueError, match="oracle"):
        agent.demo_transitions(["nowhere"], "pick")
    import gymnasium as gym

    from policies.dsrl.agent import _camera_layout

    space = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (8,))})
    with pytest.raises(ValueError, match="has none"):
        _camera_layout(DSRLConfig(encoder="oracle"), space)
    space.spaces["privileged"] = gym.spaces.Box(-1, 1, (25,))
    assert _camera_layout(DSRLConfig(encoder="oracle"), space) == {"privileged_dim": 25}


def test_the_oracle_reads_object_offsets_in_units_of_2_cm():
    """Issue 61: the privileged object-to-gripper offsets enter the critic scaled to the features' size (1 unit =
    2 cm), quaternions and the opening as they are, the end-effector position in 10 cm; another layout unscaled."""
    import torch

    from policies.common.vla_features import SelectPrivileged, privileged_scale

    sc = privileged_scale(7 * 2 + 4)
    assert torch.equal(sc[:6], torch.full((6,), 50.0)) and torch.equal(sc[6:14], torch.ones(8))
    assert torch.equal(sc[14:17], torch.full((3,), 10.0)) and float(sc[17]) == 1.0
    assert torch.equal(privileged_scale(3), torch.ones(3))
    enc = SelectPrivileged(2, 18)
    priv = torch.zeros(1, 18)
    priv[0, 0] = 0.02
    out = enc({"feat": torch.ones(1, 4), "privileged": priv})
    assert out.shape == (1, 20) and float(out[0, 2]) == pytest.approx(1.0)
