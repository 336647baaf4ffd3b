"""ExToken (``policies.extoken``): token exploration over GRPO and the selector p(c | s).

``TokenBanditVLA`` is test_grpo's bandit over a real flow-matching head (``vla.models.flow.FlowMatchingHead``, the
compact VLA's action expert), now token-conditioned: pre-trained by flow matching so that token k puts its one-row chunk
on arm k - 1 (the corners (+-0.5, +-0.5)) and the null token 0 on any arm. Its condition (and ``embed``) carries the
scene's kind, the observation's state: in kind 0 the arm of token 1 pays, in kind 1 the arm of token 2.

Checked: the selector learns a contextual bandit over tokens and fails when its input carries no state; stratified
exploration tries every token equally often per group; the sampler, GRPO's ratio and its KL run under the rollout's
token; ``--no-learn-policy`` trains the selector only; a token-free VLA is refused; a resume restores the selector
exactly; a ``vla rl --method extoken`` session learns to pick the right token per scene, writes its selector, resumes.
"""

from __future__ import annotations

import collections
import functools
import io
import json
import math
import zlib

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from policies.extoken.config import ExTokenConfig
from vla.models.base import StochasticSample
from vla.models.flow import FlowHeadConfig, FlowMatchingHead

K = 4
ARMS = torch.tensor([[0.5, 0.5], [0.5, -0.5], [-0.5, 0.5], [-0.5, -0.5]])
BEST_TOKEN = {0: 1, 1: 2}  # scene kind -> the token whose arm pays
TASK = "choose an arm"


class TokenBanditVLA(torch.nn.Module):
    noise_shape = action_shape = (1, 2)
    embed_dim = 8

    def __init__(self, num_tokens: int = K) -> None:
        super().__init__()
        self.num_tokens = num_tokens
        self.head = FlowMatchingHead(FlowHeadConfig(horizon=1, action_dim=2, cond_dim=8, hidden=64, depth=2,
                                                    num_tokens=num_tokens, num_steps=5))

    def _cond(self, obs) -> torch.Tensor:
        base = torch.stack([torch.randn(8, generator=torch.Generator().manual_seed(zlib.crc32(t.encode())))
                            for t in obs["instruction"]])
        kind = torch.as_tensor(np.asarray(obs["state"], np.float32)).reshape(len(base), -1)[:, :1]
        return base + 2.0 * kind * torch.linspace(-1.0, 1.0, 8)  # the scene's kind is in the features

    def embed(self, obs):
        return self._cond(obs)

    def sample_actions_from_embedding(self, emb, noise=None, token=None, num_steps=None, normalized=False):
        return self.head.sample(emb, noise=noise, token=token).clamp(-1, 1)

    def sample_actions(self, obs, noise=None, token=None, num_steps=None):
        return self.head.sample(self._cond(obs), noise=noise, token=token).clamp(-1, 1)

    def sample_actions_stochastic(self, obs, noise=None, token=None, num_steps=None, sigma=0.1, generator=None):
        x, chain, logp = self.head.sample_stochastic(self._cond(obs), noise=noise, token=token, sigma=sigma,
                                                     generator=generator)
        return StochasticSample(actions=x.clamp(-1, 1), chain=chain, logprob=logp)

    def chain_logprob(self, obs, chain, token=None, sigma=0.1):
        return self.head.chain_logprob(self._cond(obs), chain, token=token, sigma=sigma)

    def normalize_actions(self, a):
        return torch.as_tensor(a)

    def unnormalize_actions(self, a):
        return torch.as_tensor(a)

    def clip_normalized_actions(self, a):
        return torch.as_tensor(a).clamp(-1, 1)


@functools.lru_cache(maxsize=1)
def _pretrained_state() -> dict[str, torch.Tensor]:
    """Token k -> arm k - 1, the null token -> any arm, in both kinds of scene."""
    torch.manual_seed(0)
    vla = TokenBanditVLA()
    opt = torch.optim.Adam(vla.head.parameters(), lr=3e-3)
    for _ in range(500):
        tok = torch.randint(0, K + 1, (256,))
        kind = torch.randint(0, 2, (256, 1)).float()
        arm = torch.where(tok > 0, tok - 1, torch.randint(0, 4, (256,)))
        a = ARMS[arm] + 0.05 * torch.randn(256, 2)
        loss = vla.head.loss(vla._cond({"instruction": [TASK] * 256, "state": kind}), a[:, None, :], token=tok)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in vla.state_dict().items()}


def pretrained_vla() -> TokenBanditVLA:
    vla = TokenBanditVLA()
    vla.load_state_dict(_pretrained_state())
    for p in vla.parameters():
        p.requires_grad_(False)
    return vla.eval()


def arm_of(chunk) -> int:
    return int(torch.cdist(torch.as_tensor(chunk, dtype=torch.float32).reshape(1, 2), ARMS).argmin())


def obs_of(kind: int) -> dict:
    return {"images": {"front": np.zeros((4, 4, 3), np.uint8)}, "state": np.array([kind], np.float32),
            "instruction": TASK}


def cfg_of(**kw) -> ExTokenConfig:
    return ExTokenConfig(**{**dict(group_size=2 * K, groups_per_update=2, sigma=0.1, train="head", lr=3e-3, epochs=2,
                                   minibatch=64, kl_coef=0.0, exec_steps=None, selector_lr=3e-3), **kw})


def play(agent, episodes: int, kind_of=lambda e: (e // (2 * K)) % 2) -> tuple[list[dict], list[int]]:
    """Training episodes of one chunk through the agent's own path (``kind_of``: the scene kind of episode e, one
    kind per group by default); -> (the updates' diagnostics, the episodes' tokens)."""
    infos, tokens = [], []
    for e in range(episodes):
        obs = obs_of(kind_of(e))
        agent.begin_episode(obs, {}, learn=True)
        act = agent.act_chunk(agent.observe(obs), np.random.default_rng(0), warmup=False)
        tokens.append(agent.episode_log()["token"])
        info = agent.end_episode({"success": arm_of(act.chunk) == BEST_TOKEN[kind_of(e)] - 1})
        if info:
            infos.append(info)
    return infos, tokens


# -- the selector --------------------------------------------------------------------------------------------------
def _bandit_accuracy(features: str, seed: int = 0, entropy_coef: float = ExTokenConfig.entropy_coef,
                     objective: str = ExTokenConfig.selector_objective) -> float:
    """A selector trained by ``fit_selector`` on a contextual bandit over K tokens -- two kinds of state, the best
    token 1 in one kind and 2 in the other (it pays 0.9 of the time, the others 0.1) -- with groups of 2K stratified
    draws per scene, as the agent makes them, with the config's default weights. ``features``: ``state`` (the true
    embeddings), ``zero`` or ``shuffled`` (each update's embeddings permuted across its decisions). -> argmax accuracy
    on fresh states, both kinds alike (a selector blind to the state picks one token everywhere: 50%)."""
    from policies.extoken.selector import TokenSelector, fit_selector
    from policies.grpo.agent import group_advantages

    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    d = 16
    centres = torch.randn(2, d, generator=g)

    def states(kinds):
        return centres[kinds] + 0.5 * torch.randn(len(kinds), d, generator=g)

    cfg = ExTokenConfig()
    torch.manual_seed(seed)
    sel = TokenSelector(d, K, hidden=cfg.selector_hidden)
    opt = torch.optim.Adam(sel.parameters(), lr=cfg.selector_lr)
    prior = torch.full((K,), 1.0 / K)
    for _ in range(15):  # updates of 8 groups
        embs, toks, advs = [], [], []
        for _ in range(8):
            kind = int(rng.random() < 0.2)  # kind 0 in 80% of the scenes: blind, token 2 does worse than average
            tok = torch.tensor(np.tile(rng.permutation(K) + 1, 2))
            pay = torch.where(tok == BEST_TOKEN[kind], 0.9, 0.1)
            r = (torch.rand(len(tok), generator=g) < pay).float()
            embs.append(states(torch.full((len(tok),), kind)))
            toks.append(tok)
            advs.append(group_advantages(r))
        emb, tok, adv = torch.cat(embs), torch.cat(toks), torch.cat(advs)
        if features == "zero":
            emb = torch.zeros_like(emb)
        elif features == "shuffled":
            emb = emb[torch.randperm(len(emb), generator=g)]
        fit_selector(sel, opt, emb, tok, adv, torch.full((len(tok),), 1.0 / K), prior, epochs=cfg.selector_epochs,
                     entropy_coef=entropy_coef, prior_kl_coef=cfg.prior_kl_coef, max_importance=cfg.max_importance,
                     objective=objective, beta=cfg.selector_beta)
    kinds = torch.randint(0, 2, (400,), generator=g)
    test = states(kinds)
    if features == "zero":
        test = torch.zeros_like(test)
    want = torch.tensor([BEST_TOKEN[int(k)] for k in kinds])
    return float((sel.choose(test) == want).float().mean())


@pytest.mark.parametrize("objective", ["awr", "pg"])
def test_the_selector_learns_which_token_pays_in_which_state_and_fails_without_the_state(objective):
    """Acceptance: the selector's choice changes with the state; blind to the state (zeroed or shuffled features),
    the same training cannot beat picking one token for every state."""
    assert all(_bandit_accuracy("state", seed, objective=objective) >= 0.9 for seed in (0, 3))
    # seed 1: with entropy_coef 0.01 the shuffled features' selector locks into the right split by chance (100%)
    assert all(_bandit_accuracy(blind, seed, objective=objective) <= 0.6
               for blind in ("zero", "shuffled") for seed in (0, 1))


def test_awr_regresses_onto_the_prior_times_exp_advantage_and_never_silences_a_token():
    """awr_loss's weights are min(exp(A / beta), cap) prior(c) / q; fitted on one state where token 1 won and token 2
    lost, p(. | s) settles near the weighted frequencies (prior 1/2: e / (e + 1/e) = 0.88), not at 1 -- and once
    token 2 starts winning the fit moves back to it (REINFORCE with p / q weights does not: p(2) ~ 0 silences it)."""
    from policies.extoken.selector import TokenSelector, awr_loss, fit_selector

    torch.manual_seed(0)
    sel = TokenSelector(3, 2, hidden=8)
    emb, tok = torch.ones(4, 3), torch.tensor([1, 1, 2, 2])
    adv, q, prior = torch.tensor([1.0, 1.0, -1.0, -1.0]), torch.full((4,), 0.5), torch.tensor([0.5, 0.5])
    loss, st = awr_loss(sel, emb, tok, adv, q, prior, beta=1.0, max_weight=25.0)
    logp = torch.log_softmax(sel(emb), -1).gather(1, (tok - 1)[:, None])[:, 0]
    w = torch.exp(adv)  # prior / q = 1
    assert loss.item() == pytest.approx(-(w * logp).sum().item() / w.sum().item(), rel=1e-5)
    opt = torch.optim.Adam(sel.parameters(), lr=1e-2)
    for _ in range(30):
        fit_selector(sel, opt, emb, tok, adv, q, prior, 20, 0.0, 0.0, 5.0, objective="awr", beta=1.0)
    p1 = float(sel.probs(emb[:1]).detach()[0, 0])
    assert p1 == pytest.approx(math.e / (math.e + 1 / math.e), abs=0.02)
    for _ in range(30):
        fit_selector(sel, opt, emb, tok, -adv, q, prior, 20, 0.0, 0.0, 5.0, objective="awr", beta=1.0)
    assert float(sel.probs(emb[:1]).detach()[0, 1]) == pytest.approx(p1, abs=0.02)  # the other way round
    with pytest.raises(ValueError, match="pg or awr"):
        fit_selector(sel, opt, emb, tok, adv, q, prior, 1, 0.0, 0.0, 5.0, objective="bandit")


def test_selector_loss_weights_by_truncated_importance_and_pulls_to_the_prior():
    from policies.extoken.selector import TokenSelector, selector_loss

    torch.manual_seed(0)
    sel = TokenSelector(3, K, hidden=8)
    emb, tok, adv = torch.randn(5, 3), torch.tensor([1, 2, 3, 4, 1]), torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0])
    prior = torch.tensor([0.7, 0.1, 0.1, 0.1])
    loss, st = selector_loss(sel, emb, tok, adv, torch.full((5,), 1e-3), prior, 0.0, 0.0, max_importance=5.0)
    assert st["importance_mean"] == pytest.approx(5.0)  # p / q = p / 1e-3 >> 5: truncated
    logp = torch.log_softmax(sel(emb), -1).gather(1, (tok - 1)[:, None])[:, 0]
    assert loss.item() == pytest.approx(-(5.0 * adv * logp).mean().item(), rel=1e-5)
    loss, _ = selector_loss(sel, emb, tok, adv, torch.full((5,), 0.5), prior, 0.0, 0.0, 5.0)  # w = p / q below the cap
    assert loss.item() == pytest.approx(-(logp.exp() / 0.5 * adv * logp).mean().item(), rel=1e-5)
    _, st = selector_loss(sel, emb, tok, torch.zeros(5), torch.full((5,), 0.25), prior, 0.0, 1.0, 5.0)
    p = torch.softmax(sel(emb), -1)
    assert st["prior_kl"] == pytest.approx(float((p * (p.log() - prior.log())).sum(-1).mean().detach()), rel=1e-5)


# -- the agent -----------------------------------------------------------------------------------------------------
def test_stratified_exploration_tries_every_token_twice_in_a_group_of_2k():
    from policies.extoken.agent import ExTokenAgent

    agent = ExTokenAgent(pretrained_vla(), cfg_of(groups_per_update=1), seed=3)
    infos, tokens = play(agent, 4 * 2 * K)
    for lo in range(0, len(tokens), 2 * K):
        assert collections.Counter(tokens[lo: lo + 2 * K]) == {c: 2 for c in range(1, K + 1)}, tokens
    assert len({tuple(tokens[lo: lo + K]) for lo in range(0, len(tokens), 2 * K)}) > 1  # a new permutation per group
    assert all(info[f"tokens/count_{c}"] == 2.0 for info in infos for c in range(1, K + 1))

    # token_unit chunk: at every macro-step of the group, each token twice
    agent = ExTokenAgent(pretrained_vla(), cfg_of(groups_per_update=1, token_unit="chunk"), seed=3)
    per_step = collections.defaultdict(list)
    for _ in range(2 * K):
        agent.begin_episode(obs_of(0), {}, learn=True)
        for t in range(3):
            agent.act_chunk(agent.observe(obs_of(0)), np.random.default_rng(0), warmup=False)
        tokens = agent.episode_log()["tokens"]
        for t, c in enumerate(tokens):
            per_step[t].append(c)
        agent.end_episode({"success": False})
    assert all(collections.Counter(v) == {c: 2 for c in range(1, K + 1)} for v in per_step.values()), per_step


def test_the_sampler_the_ratio_and_the_kl_run_under_the_rollouts_token(monkeypatch):
    from policies.extoken.agent import ExTokenAgent
    from policies.grpo import agent as grpo

    vla = pretrained_vla()
    # behaviourally: the tokens condition the head apart, a chain sampled under token 2 is likelier under token 2
    batch = {"instruction": [TASK] * 200, "state": np.zeros((200, 1), np.float32)}
    s = vla.sample_actions_stochastic(batch, token=2, generator=torch.Generator().manual_seed(0))
    assert (vla.chain_logprob(batch, s.chain, token=2).sum(1) > vla.chain_logprob(batch, s.chain, token=1).sum(1)).all()
    assert np.mean([arm_of(c) == 1 for c in s.chain[:, -1]]) > 0.9  # token 2 -> arm 1

    agent = ExTokenAgent(vla, cfg_of(groups_per_update=1, epochs=1, kl_coef=1e-3), seed=0)
    calls = {"policy": [], "ref": []}
    for who, model in (("policy", agent.policy), ("ref", agent.vla)):
        real = model.chain_logprob

        def spy(obs, chain, token=None, sigma=0.1, _real=real, _who=who):
            calls[_who].append((chain.detach().clone(), token))
            return _real(obs, chain, token=token, sigma=sigma)

        monkeypatch.setattr(model, "chain_logprob", spy)
    seen = []
    real_surrogate = grpo.clipped_surrogate
    monkeypatch.setattr(grpo, "clipped_surrogate", lambda new, old, *a, **k: seen.append((new.detach(), old.clone()))
                        or real_surrogate(new, old, *a, **k))
    for _ in range(2 * K - 1):
        agent.begin_episode(obs_of(0), {}, learn=True)
        agent.act_chunk(agent.observe(obs_of(0)), np.random.default_rng(0), warmup=False)
        agent.end_episode({"success": False})
    agent.begin_episode(obs_of(0), {}, learn=True)
    agent.act_chunk(agent.observe(obs_of(0)), np.random.default_rng(0), warmup=False)
    steps = [r.steps[0] for r in agent._group] + [agent._rollout.steps[0]]
    assert sorted(s.token for s in steps) == sorted(list(range(1, K + 1)) * 2)
    # the stored log-probabilities are the sampler's under the token ...
    obs8 = {"instruction": [TASK] * len(steps), "state": np.zeros((len(steps), 1), np.float32)}
    chains = torch.stack([s.chain for s in steps])
    stored = torch.stack([s.logp for s in steps])
    tokens = torch.tensor([s.token for s in steps])
    assert torch.allclose(stored, vla.chain_logprob(obs8, chains, token=tokens), atol=1e-4)
    assert not torch.allclose(stored, vla.chain_logprob(obs8, chains, token=0), atol=1e-2)
    calls["policy"].clear(), calls["ref"].clear()  # (the checks above went through the spy too)
    agent.end_episode({"success": True})  # one success among failures: the group has signal, GRPO updates
    # ... and the update's policy and reference took each chain under the token it was sampled with
    for who in ("policy", "ref"):
        assert calls[who], who
        for chain, token in calls[who]:
            assert token is not None and len(token) == len(chain)
            for c, t in zip(chain, token):
                i = int((chains - c).flatten(1).abs().sum(1).argmin())
                assert int(t) == int(tokens[i]), who
    new, old = seen[0]
    perm = [int((stored - row).abs().sum(1).argmin()) for row in old]
    assert torch.allclose(new, vla.chain_logprob(obs8, chains, token=tokens)[perm], atol=1e-4)


def test_without_learn_policy_only_the_selector_moves():
    from policies.extoken.agent import ExTokenAgent

    vla = pretrained_vla()
    agent = ExTokenAgent(vla, cfg_of(learn_policy=False), seed=0)
    policy0 = {k: v.clone() for k, v in agent.policy.state_dict().items()}
    sel0 = {k: v.clone() for k, v in agent.selector.state_dict().items()}
    infos, _ = play(agent, 2 * 2 * K * 2)
    assert len(infos) == 2 and agent.updates == 2
    assert all(torch.equal(policy0[k], v) for k, v in agent.policy.state_dict().items())
    assert not all(torch.equal(sel0[k], v) for k, v in agent.selector.state_dict().items())
    assert infos[0]["losses/policy"] == 0.0 and "losses/selector" in infos[0]
    assert infos[0]["charts/usable_groups"] == 1.0  # the paying token's arm succeeds in every group


def test_a_vla_without_tokens_is_refused_with_how_to_get_one():
    from policies.extoken.agent import ExTokenAgent

    with pytest.raises(ValueError, match=r"no behaviour tokens.*vla train --tokens"):
        ExTokenAgent(TokenBanditVLA(num_tokens=0), cfg_of())
    with pytest.raises(ValueError, match=r"vla train --tokens"):
        ExTokenAgent.build(TokenBanditVLA(num_tokens=0), cfg_of())


def test_evaluation_takes_the_deploy_token_from_the_current_observation():
    from policies.extoken.agent import ExTokenAgent

    agent = ExTokenAgent(pretrained_vla(), cfg_of(), seed=0)

    def eval_token(a, kind, generator=None):
        a.begin_episode(obs_of(kind), {}, learn=False)
        a.act_chunk(a.observe(obs_of(kind)), np.random.default_rng(0), warmup=False, generator=generator)
        a.act_chunk(a.observe(obs_of(1 - kind)), np.random.default_rng(0), warmup=False, generator=generator)
        return a.episode_log()["token"]

    emb = {k: agent._embed(agent.observe(obs_of(k))["batch"]) for k in (0, 1)}
    want = {k: int(agent.selector.choose(emb[k])[0]) for k in (0, 1)}
    # the first observation decides (episode unit), the same one always the same token
    assert [eval_token(agent, k) for k in (0, 1, 0, 1)] == [want[0], want[1], want[0], want[1]]
    null = ExTokenAgent(pretrained_vla(), cfg_of(deploy="null"), seed=0)
    assert eval_token(null, 0) == 0
    rand = ExTokenAgent(pretrained_vla(), cfg_of(deploy="random"), seed=0)
    draws = [eval_token(rand, 0, torch.Generator().manual_seed(i)) for i in range(40)]
    assert set(draws) == set(range(1, K + 1))
    assert draws == [eval_token(rand, 0, torch.Generator().manual_seed(i)) for i in range(40)]  # the eval's generator


def test_state_dict_round_trip_restores_the_selector_exactly():
    from policies.extoken.agent import ExTokenAgent

    a = ExTokenAgent(pretrained_vla(), cfg_of(groups_per_update=1), seed=0)
    play(a, 2 * K + 3)  # one update, and a group in progress
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = ExTokenAgent(pretrained_vla(), cfg_of(groups_per_update=1), seed=5)
    b.load_state_dict(torch.load(buf, weights_only=False))
    assert all(torch.equal(v, b.selector.state_dict()[k]) for k, v in a.selector.state_dict().items())
    sa, sb = a.selector_opt.state_dict()["state"], b.selector_opt.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) for i in sa)
    # both continue alike: the group's permutation, the sampler's noise, the next selector update (the sampler's
    # initial noise comes from torch's global stream, which a session checkpoints and restores itself: rng.pt)
    kind_of = lambda e: ((e + 2 * K + 3) // (2 * K)) % 2  # noqa: E731
    torch.manual_seed(11)
    ia, ta = play(a, 2 * K + 5, kind_of)
    torch.manual_seed(11)
    ib, tb = play(b, 2 * K + 5, kind_of)
    untimed = lambda infos: [{k: v for k, v in i.items() if not k.startswith("time/")} for i in infos]  # noqa: E731
    assert ta == tb and untimed(ia) == untimed(ib)  # time/*: the update's wall clock, never alike
    assert all(torch.equal(v, b.selector.state_dict()[k]) for k, v in a.selector.state_dict().items())


def test_the_prior_comes_from_the_config_then_the_checkpoint_then_uniform(tmp_path):
    from policies.extoken.agent import ExTokenAgent

    assert torch.allclose(ExTokenAgent(pretrained_vla(), cfg_of()).prior, torch.full((K,), 0.25))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"kind": "compact-flow-vla", "config": {"num_tokens": K},
                                                  "tokens": {"k": K, "unit": "episode", "prior": [0.4, 0.3, 0.2, 0.1],
                                                             "file_sha256": "x"}}))
    vla = pretrained_vla()
    vla.checkpoint_dir = str(ckpt)
    agent = ExTokenAgent(vla, cfg_of())
    assert torch.allclose(agent.prior, torch.tensor([0.4, 0.3, 0.2, 0.1]))
    assert agent.prior_source.startswith("checkpoint")
    agent = ExTokenAgent(vla, cfg_of(prior=(1, 1, 1, 5)))
    assert torch.allclose(agent.prior, torch.tensor([0.125, 0.125, 0.125, 0.625])) and agent.prior_source == "config"
    with pytest.raises(ValueError, match="prior"):
        ExTokenAgent(pretrained_vla(), cfg_of(prior=(1.0, 1.0)))


def test_config_refuses_bad_fields_and_the_cli_builds_it():
    from vla.cli import build_parser
    from vla.commands.rl import _method_config

    for bad in (dict(explore="greedy"), dict(token_unit="tick"), dict(deploy="best"), dict(selector_epochs=0),
                dict(prior=(-1.0, 2.0)), dict(max_importance=0.0), dict(selector_objective="bandit"),
                dict(selector_beta=0.0), dict(selector_memory=-1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ExTokenConfig(**bad)
    args = build_parser().parse_args(["rl", "--method", "extoken", "--token-unit", "chunk", "--explore", "selector",
                                      "--no-learn-policy", "--deploy", "random", "--prior", "1", "3",
                                      "--selector-epochs", "7", "--group-size", "4", "--selector-objective", "pg"])
    cfg = _method_config(args, "extoken")
    assert isinstance(cfg, ExTokenConfig)
    assert (cfg.token_unit, cfg.explore, cfg.learn_policy, cfg.deploy, cfg.prior, cfg.selector_epochs,
            cfg.group_size, cfg.selector_objective) == ("chunk", "selector", False, "random", (1.0, 3.0), 7, 4, "pg")


def test_diversity_metrics():
    from policies.common.diversity import chunk_distance, ee_coverage

    a = np.array([[0.001, 0.001, 0.001], [0.015, 0.0, 0.0], [0.021, 0.0, 0.0]])  # voxels (0,0,0), (0,0,0), (1,0,0)
    b = np.array([[0.0, 0.05, 0.0]])  # (0,2,0)
    assert ee_coverage([a]) == 2 and ee_coverage([a, b]) == 3 and ee_coverage([]) == 0
    assert chunk_distance([np.zeros((2, 2)), np.ones((2, 2)), np.zeros((2, 2))]) == pytest.approx(4 / 3)
    assert chunk_distance([np.zeros(3)]) == 0.0


# -- in a session --------------------------------------------------------------------------------------------------
class TokenBanditEnv(gym.Env):
    """One tick per episode; the scene's kind (the state) is the seed's parity. Reward 1 when the action lands on the
    arm of the kind's best token. ``info["ee_pos"]``: the action as an end-effector position (diversity metrics)."""

    max_ticks = 1

    def __init__(self) -> None:
        self.observation_space = spaces.Dict({"images": spaces.Dict({"front": spaces.Box(0, 255, (4, 4, 3), np.uint8)}),
                                              "state": spaces.Box(0.0, 1.0, (1,), np.float32)})
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.kind = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.kind = int(seed or 0) % 2
        return obs_of(self.kind), {}

    def step(self, action):
        a = np.asarray(action, np.float32).reshape(-1)
        ok = arm_of(a) == BEST_TOKEN[self.kind] - 1
        return obs_of(self.kind), float(ok), True, False, {"success": ok, "ee_pos": np.array([a[0], a[1], 0.0])}


def make_env():
    return TokenBanditEnv()


def _session_cfg(out, total_ticks, **kw):
    from session.config import RLConfig

    return RLConfig(checkpoint="stub", out=str(out), task="", env="tests.policies.test_extoken:make_env",
                    method="extoken", agent=cfg_of(**kw), instruction=TASK, total_ticks=total_ticks, warmup_steps=0,
                    eval_every=0, eval_episodes=20, videos=0, checkpoint_every=16)


def test_an_extoken_session_learns_the_token_per_scene_writes_its_selector_and_resumes(tmp_path):
    from policies.extoken.selector import load_selector
    from session.runner import run_session

    torch.manual_seed(0)
    vla = pretrained_vla()
    before = {k: v.clone() for k, v in vla.state_dict().items()}
    per_update = 2 * 2 * K
    s = run_session(_session_cfg(tmp_path / "run", per_update * 8), make_env(), vla, progress=False)
    assert s["vla_weights_unchanged"] and all(torch.equal(before[k], v) for k, v in vla.state_dict().items())
    assert s["base_success_rate"] < 0.5 and s["final_success_rate"] >= 0.9, s  # the null token vs the selector
    assert s["agent"]["updates"] == 8 and s["agent"]["token_counts"] == {str(c): 8 * 4 for c in range(1, K + 1)}
    eps = [json.loads(x) for x in open(tmp_path / "run/episodes.jsonl")]
    assert all(collections.Counter(e["token"] for e in eps[i:i + 2 * K]) == {c: 2 for c in range(1, K + 1)}
               for i in range(0, len(eps), 2 * K))
    ups = [e for e in eps if "selector/entropy" in e]
    assert len(ups) == 8 and all(e["diversity/ee_coverage"] >= 4 and e["diversity/chunk_distance"] > 0.5 for e in ups)
    assert ups[-1]["selector/best_token_accuracy"] == 1.0
    sel = load_selector(str(tmp_path / "run/policy"))
    emb = torch.cat([vla.embed({"instruction": [TASK], "state": np.array([[k]], np.float32)}) for k in (0, 1)])
    assert sel.choose(emb).tolist() == [BEST_TOKEN[0], BEST_TOKEN[1]]  # the deployed choice changes with the state
    meta = json.load(open(tmp_path / "run/policy/selector.json"))
    assert meta["num_tokens"] == K and meta["embed_dim"] == vla.embed_dim
    s2 = run_session(_session_cfg(tmp_path / "run", per_update * 9), make_env(), vla, resume=True, progress=False)
    assert s2["agent"]["updates"] == 9 and s2["episodes"] == per_update * 9


def _tiny_compact_vla(path, num_tokens: int) -> str:
    """A compact VLA (random weights) sized for ``tests.session.toy_env``, with ``num_tokens`` behaviour tokens."""
    from vla.models.compact import CompactVLA, CompactVLAConfig

    torch.manual_seed(0)
    m = CompactVLA(CompactVLAConfig(cameras=("front",), image_size=32, state_dim=2, action_dim=2, horizon=4,
                                    hidden=32, cond_dim=32, keypoints=4, pretrained=False, num_tokens=num_tokens))
    m.set_normalization(np.zeros(2), np.ones(2), -np.ones(2), np.ones(2))
    m.save(str(path))
    return str(path)


def test_vla_rl_method_extoken_runs_from_the_command_line_on_a_compact_vla_and_refuses_one_without_tokens(
        tmp_path, capsys):
    """`vla rl --method extoken` end to end on a compact VLA with 3 tokens (its own embed / token handles), token per
    chunk; the same command on a token-free checkpoint exits with the way to get one."""
    from policies.extoken.selector import load_selector
    from vla.cli import main

    argv = ["rl", "--method", "extoken", "--env", "tests.session.toy_env:make_env", "--instruction",
            "reach the red dot", "--total-episodes", "4", "--total-ticks", "1000", "--group-size", "2",
            "--groups-per-update", "1", "--token-unit", "chunk", "--train", "head", "--minibatch", "8",
            "--eval-every", "0", "--eval-episodes", "1", "--videos", "0"]
    ckpt = _tiny_compact_vla(tmp_path / "tok", 3)
    assert main([*argv, "--checkpoint", ckpt, "--out", str(tmp_path / "run")]) == 0
    s = json.loads((tmp_path / "run/summary.json").read_text())
    assert s["episodes"] == 4 and s["agent"]["updates"] == 2 and s["vla_weights_unchanged"]
    assert sum(s["agent"]["token_counts"].values()) > 4  # a token per macro-step
    eps = [json.loads(x) for x in open(tmp_path / "run/episodes.jsonl")]
    assert all(len(e["tokens"]) == -(-e["ticks"] // 4) and set(e["tokens"]) <= {1, 2, 3} for e in eps)  # exec 4
    assert "selector/entropy" in eps[1] and "diversity/chunk_distance" in eps[1]
    final = json.loads((tmp_path / "run/final_eval.json").read_text())  # the final evaluation, episode by episode
    assert final["episodes"] == 1 and len(final["per_episode"]) == 1 and "frames" not in final
    assert final["per_episode"][0]["token"] in (1, 2, 3) and final["per_episode"][0]["token"] == \
        final["per_episode"][0]["tokens"][0]
    assert load_selector(str(tmp_path / "run/policy")).num_tokens == 3
    assert json.loads((tmp_path / "run/policy/config.json").read_text())["tuned_by"] == "extoken"

    capsys.readouterr()
    ckpt0 = _tiny_compact_vla(tmp_path / "notok", 0)
    assert main([*argv, "--checkpoint", ckpt0, "--out", str(tmp_path / "run0")]) == 2
    assert "vla train --tokens" in capsys.readouterr().err
