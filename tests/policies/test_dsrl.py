"""DSRL agent on a toy noise -> action map: both variants learn which noise gives the rewarded chunk."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.common.replay import ReplayBuffer
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
    cfg = DSRLConfig(variant=variant, noise_bound=2.0, warmup_steps=0, distill_steps=2,
                     sac=SACConfig(utd=2, batch_size=64, num_critics=2, hidden=(64, 64), init_temperature=0.01,
                                   backup_entropy=False, gamma=0.0))
    agent = DSRLAgent(vla, cfg, seed=0)
    buf = ReplayBuffer(10_000, {"feat": ((4,), np.float32)}, agent.noise_dim, {"chunk": ((2, 2), np.float32)})
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
    with pytest.raises(ValueError, match="variant must be one of"):
        DSRLConfig(variant="ppo")


def test_agent_state_round_trip_gives_identical_updates():
    vla = ToyVLA().requires_grad_(False)
    cfg = DSRLConfig(variant="na", warmup_steps=0, distill_steps=1,
                     sac=SACConfig(utd=1, batch_size=8, num_critics=2, hidden=(16,)))
    a = DSRLAgent(vla, cfg, seed=1)
    buf = ReplayBuffer(100, {"feat": ((4,), np.float32)}, 4, {"chunk": ((2, 2), np.float32)})
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
