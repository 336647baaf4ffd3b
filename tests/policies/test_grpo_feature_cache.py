"""GRPO's update reuses the frozen trunk's maps from the rollout (``VLA.frozen_features``, issue 64's cost per
update): on a compact VLA (random weights) the cached and the recomputed log-probabilities agree, the update with the
cache never runs the trunk and moves the weights as the update without it does, and the cache is refused where the
trunk trains (LoRA) or the maps do not fit the observation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.grpo.agent import GRPOAgent
from policies.grpo.config import GRPOConfig


def tiny_vla():
    from vla.models.compact import CompactVLA, CompactVLAConfig

    torch.manual_seed(0)
    m = CompactVLA(CompactVLAConfig(cameras=("front", "wrist"), image_size=32, state_dim=3, action_dim=2, horizon=4,
                                    hidden=32, cond_dim=32, keypoints=4, pretrained=False, num_steps=4))
    m.set_normalization(np.zeros(3), np.ones(3), -np.ones(2), np.ones(2))
    m.set_mode("frozen")
    return m.eval()


def obs_batch(rng: np.random.Generator, b: int) -> dict:
    return {"images": {c: rng.integers(0, 256, (b, 32, 32, 3), dtype=np.uint8) for c in ("front", "wrist")},
            "state": rng.normal(size=(b, 3)).astype(np.float32), "instruction": ["pick up the red cube"] * b}


def count_trunk_calls(vla) -> list[int]:
    calls: list[int] = []
    forward = vla.trunk.forward
    vla.trunk.forward = lambda x: (calls.append(len(x)), forward(x))[1]
    return calls


def test_cached_features_give_the_recomputed_log_probabilities_and_are_checked():
    vla = tiny_vla()
    obs = obs_batch(np.random.default_rng(0), 5)
    s = vla.sample_actions_stochastic(obs, sigma=0.1, generator=torch.Generator().manual_seed(1))
    feats = vla.frozen_features(obs)
    assert feats is not None and set(feats) >= {"front", "wrist"}
    calls = count_trunk_calls(vla)
    cached = vla.chain_logprob(obs, s.chain, sigma=0.1, features=feats)
    assert calls == []  # the trunk did not run
    torch.testing.assert_close(cached, vla.chain_logprob(obs, s.chain, sigma=0.1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cached, s.logprob, atol=1e-5, rtol=1e-5)  # the sampler's own log-probabilities
    with pytest.raises(ValueError, match="lack the trunk maps"):
        vla.chain_logprob(obs, s.chain, features={"front": feats["front"]})
    with pytest.raises(ValueError, match="batch 5, the observation 2"):
        vla.chain_logprob(obs_batch(np.random.default_rng(1), 2), s.chain[:2], features=feats)


def test_a_trainable_trunk_has_nothing_to_cache_and_refuses_features():
    pytest.importorskip("peft")
    vla = tiny_vla()
    obs = obs_batch(np.random.default_rng(0), 2)
    feats = vla.frozen_features(obs)
    s = vla.sample_actions_stochastic(obs, sigma=0.1)
    vla.set_mode("lora", lora_rank=2, lora_alpha=4)
    assert vla.frozen_features(obs) is None
    with pytest.raises(ValueError, match="trunk is trainable"):
        vla.chain_logprob(obs, s.chain, features=feats)


def play_groups(agent, seed: int) -> dict:
    """One update's groups of two-chunk episodes on fixed random frames, the rewards alternating (every group
    usable). -> the update's diagnostics."""
    rng = np.random.default_rng(seed)
    info: dict = {}
    for e in range(agent.cfg.group_size * agent.cfg.groups_per_update):
        frames = [obs_batch(rng, 1) for _ in range(2)]
        obs = [{"images": {c: f["images"][c][0] for c in f["images"]}, "state": f["state"][0],
                "instruction": "pick up the red cube"} for f in frames]
        agent.begin_episode(obs[0], {}, learn=True)
        for o in obs:
            agent.act_chunk(agent.observe(o), rng, warmup=False)
            agent.after_chunk(o, {})
        info = agent.end_episode({"success": e % 2 == 0}) or info
    return info


@pytest.mark.parametrize("train", ["policy", "head"])
def test_the_update_with_cached_maps_never_runs_the_trunk_and_moves_the_weights_as_without(train):
    runs = {}
    for cached in (True, False):
        cfg = GRPOConfig(group_size=2, groups_per_update=2, epochs=2, minibatch=3, lr=1e-3, train=train, seed=0,
                         cache_features=cached)
        vla = tiny_vla()
        agent = GRPOAgent(vla, cfg, seed=0)
        before = {k: v.clone() for k, v in agent._trainable_state().items()}
        calls = count_trunk_calls(agent.policy)
        ref_calls = count_trunk_calls(vla)
        # the update runs inside the last end_episode: count the trunk's calls from the last episode's acting on
        orig_update = agent._update

        def update(orig=orig_update, calls=calls, ref_calls=ref_calls):
            n, nr = len(calls), len(ref_calls)
            out = orig()
            out["trunk_calls_in_update"] = len(calls) - n + len(ref_calls) - nr
            return out

        agent._update = update
        info = play_groups(agent, seed=3)
        assert info["charts/usable_groups"] == 1.0 and info["diag/macro_steps"] == 8
        assert info["time/update_s"] > 0 and 0 < info["time/sampling_s"] <= info["time/rollouts_s"]  # its cost
        runs[cached] = (info, {k: v - before[k] for k, v in agent._trainable_state().items()})
    (info_c, delta_c), (info_u, delta_u) = runs[True], runs[False]
    assert info_c["trunk_calls_in_update"] == 0
    assert info_u["trunk_calls_in_update"] == 3 * 2 + 3  # ceil(8 / 3) minibatches x 2 epochs + the reference once
    assert any(float(d.abs().max()) > 0 for d in delta_c.values())  # the update moved the weights
    for k in delta_c:
        torch.testing.assert_close(delta_c[k], delta_u[k], atol=2e-5, rtol=1e-3)
