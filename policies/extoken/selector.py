"""ExToken's token selector p(c | s) and the trajectory-diversity metrics of a group of rollouts.

``TokenSelector``: an MLP over the frozen VLA's ``embed(obs)`` -> K logits, column k - 1 for token k (tokens 1..K;
the null token 0 is never selected). Its loss over an update's token decisions (``selector_loss``)::

    L = -mean_i( min(p(c_i | s_i) / q_i, max_importance).detach() * A_i * log p(c_i | s_i) )
        - entropy_coef * mean_i H(p(. | s_i)) + prior_kl_coef * mean_i KL(p(. | s_i) || prior)

A_i the GRPO group-normalised advantage of the decision's episode, q_i the probability the behaviour distribution
gave c_i (1/K for stratified / uniform draws). The truncated ratio p / q turns the sampled decisions into an estimate
of the gradient of E_{c ~ p}[A] (off-policy REINFORCE with V-trace's truncation), a bounded objective. Its gradient
vanishes for a token p has all but dropped, and only the entropy bonus pulls such a token back. On the tests'
two-kind bandit (one kind in 80% of the scenes) with entropy_coef 0.01, early noise decided which token a kind of
scene locked into: fed shuffled features, a selector still scored 100% in 1 of 12 seeds, and at lr 3e-3 one locked the
minority kind into the majority's token in 1 of 8; with 0.1, neither in 12 seeds.

``load_selector(path)`` reads what ``ExTokenAgent.summarize`` writes (``RUN/policy/selector.safetensors`` +
``selector.json``) for deployment: ``sel.choose(vla.embed(batch))`` is the token to pass to
``vla.sample_actions(..., token=)``.

The trajectory-diversity metrics are in ``policies.common.diversity`` (GRPO logs them too).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch
from torch import nn

SELECTOR_FILE = "selector.safetensors"
SELECTOR_META = "selector.json"


class TokenSelector(nn.Module):
    """p(c | s) over tokens 1..K from an observation embedding [B, D]."""

    def __init__(self, embed_dim: int, num_tokens: int, hidden: int = 128) -> None:
        super().__init__()
        if int(num_tokens) < 1:
            raise ValueError(f"a token selector needs num_tokens >= 1, got {num_tokens}")
        self.embed_dim, self.num_tokens, self.hidden = int(embed_dim), int(num_tokens), int(hidden)
        # LayerNorm first: embeddings of different backbones live on different scales
        self.net = nn.Sequential(nn.LayerNorm(self.embed_dim), nn.Linear(self.embed_dim, self.hidden), nn.SiLU(),
                                 nn.Linear(self.hidden, self.hidden), nn.SiLU(),
                                 nn.Linear(self.hidden, self.num_tokens))

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        """Embeddings [B, D] -> logits [B, K] (column k - 1: token k)."""
        emb = torch.as_tensor(emb, dtype=torch.float32)
        assert emb.ndim == 2 and emb.shape[1] == self.embed_dim, \
            f"selector input must be [B, {self.embed_dim}], got {list(emb.shape)}"
        return self.net(emb)

    def probs(self, emb: torch.Tensor) -> torch.Tensor:
        """p(. | s) [B, K] over tokens 1..K."""
        return torch.softmax(self(emb), dim=-1)

    @torch.no_grad()
    def choose(self, emb: torch.Tensor) -> torch.Tensor:
        """The deployment token per row: argmax p(c | s), in 1..K (long [B]); deterministic given the embedding."""
        return self(emb).argmax(-1) + 1

    @torch.no_grad()
    def sample(self, emb: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens c ~ p(. | s) in 1..K (long [B]) and the probability each had (float [B]: the behaviour q)."""
        p = self.probs(emb)
        idx = torch.multinomial(p, 1, generator=generator)[:, 0]
        return idx + 1, p.gather(1, idx[:, None])[:, 0]


def normalized_prior(prior: Any, num_tokens: int) -> torch.Tensor:
    """A token prior as float [K] over tokens 1..K summing to 1. Takes K numbers (tokens 1..K) or K + 1 (token 0 first,
    dropped: the selector never picks the null token)."""
    p = torch.as_tensor(np.asarray(prior, np.float64), dtype=torch.float32).reshape(-1)
    if len(p) == num_tokens + 1:
        p = p[1:]
    if len(p) != num_tokens or not bool(torch.isfinite(p).all()) or bool((p < 0).any()) or float(p.sum()) <= 0:
        raise ValueError(f"a token prior takes {num_tokens} non-negative numbers (tokens 1..{num_tokens}) with a "
                         f"positive sum, got {p.tolist()}")
    return p / p.sum()


def _log_probs(selector: TokenSelector, emb: torch.Tensor, token: torch.Tensor, adv: torch.Tensor, q: torch.Tensor,
               prior: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What both selector objectives read: log p(c_i | s_i) [N], the mean entropy H(p(. | s)) and the mean
    KL(p(. | s) || demo prior), with the shapes of ``token`` / ``adv`` / ``q`` checked against ``emb``."""
    n = emb.shape[0]
    assert token.shape == adv.shape == q.shape == (n,), \
        f"token / adv / q must be [{n}], got {list(token.shape)} / {list(adv.shape)} / {list(q.shape)}"
    logp_all = torch.log_softmax(selector(emb), dim=-1)  # [N, K]
    p_all = logp_all.exp()
    logp = logp_all.gather(1, (token.long() - 1)[:, None])[:, 0]  # log p(c_i | s_i)
    entropy = -(p_all * logp_all).sum(-1).mean()
    kl = (p_all * (logp_all - torch.log(prior.clamp(min=1e-8)))).sum(-1).mean()
    return logp, entropy, kl


def selector_loss(selector: TokenSelector, emb: torch.Tensor, token: torch.Tensor, adv: torch.Tensor,
                  q: torch.Tensor, prior: torch.Tensor, entropy_coef: float, prior_kl_coef: float,
                  max_importance: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The selector's loss over token decisions: ``emb`` [N, D], ``token`` [N] in 1..K, ``adv`` [N] (the episode's
    group advantage), ``q`` [N] (behaviour probability of the token), ``prior`` [K]. -> (loss, stats)."""
    logp, entropy, kl = _log_probs(selector, emb, token, adv, q, prior)
    # truncated importance weight p / q: the decisions were drawn by the behaviour distribution q, not by p
    w = torch.clamp(logp.detach().exp() / q.clamp(min=1e-8), max=max_importance)
    pg = -(w * adv * logp).mean()
    loss = pg - entropy_coef * entropy + prior_kl_coef * kl
    return loss, {"pg": float(pg.detach()), "entropy": float(entropy.detach()), "prior_kl": float(kl.detach()),
                  "importance_mean": float(w.mean())}


def awr_loss(selector: TokenSelector, emb: torch.Tensor, token: torch.Tensor, adv: torch.Tensor, q: torch.Tensor,
             prior: torch.Tensor, beta: float, max_weight: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantage-weighted regression of p(c | s) onto the token prior: -mean(w log p(c_i | s_i)) with
    w = min(exp(adv / beta), max_weight) prior(c_i) / q_i. Its minimiser over p(. | s) is proportional to
    prior(c) E[exp(A / beta) | s, c], the solution of max_p E_p[A] - beta KL(p || prior). -> (loss, stats)."""
    logp, entropy, kl = _log_probs(selector, emb, token, adv, q, prior)
    w = torch.clamp(torch.exp(adv / beta), max=max_weight) * prior[token.long() - 1] / q.clamp(min=1e-8)
    loss = -(w * logp).sum() / w.sum().clamp(min=1e-8)
    return loss, {"pg": float(loss.detach()), "entropy": float(entropy.detach()), "prior_kl": float(kl.detach()),
                  "importance_mean": float(w.mean())}


def fit_selector(selector: TokenSelector, optimizer: torch.optim.Optimizer, emb: torch.Tensor, token: torch.Tensor,
                 adv: torch.Tensor, q: torch.Tensor, prior: torch.Tensor, epochs: int, entropy_coef: float,
                 prior_kl_coef: float, max_importance: float, objective: str = "pg",
                 beta: float = 1.0) -> dict[str, float]:
    """``epochs`` full-batch Adam steps of ``selector_loss`` (``objective`` pg) or ``awr_loss`` (awr, weights capped
    at ``max_importance`` ** 2). -> the last step's stats (``loss``, ``pg``, ``entropy``, ...)."""
    if objective not in ("pg", "awr"):
        raise ValueError(f"selector objective must be pg or awr, got {objective!r}")
    stats: dict[str, float] = {}
    for _ in range(int(epochs)):
        if objective == "awr":
            loss, stats = awr_loss(selector, emb, token, adv, q, prior, beta, max_importance ** 2)
        else:
            loss, stats = selector_loss(selector, emb, token, adv, q, prior, entropy_coef, prior_kl_coef,
                                        max_importance)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        stats["loss"] = float(loss.detach())
    return stats


# -- deployment ------------------------------------------------------------------------------------------------------
def save_selector(selector: TokenSelector, directory: str, extra: dict[str, Any] | None = None) -> None:
    """Write ``selector.safetensors`` + ``selector.json`` (K, embed dim, hidden width, ``extra``) into ``directory``
    (atomically per file)."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, SELECTOR_FILE + ".tmp")
    save_file({k: v.detach().contiguous() for k, v in selector.state_dict().items()}, tmp)
    os.replace(tmp, os.path.join(directory, SELECTOR_FILE))
    meta = {"kind": "extoken-selector", "num_tokens": selector.num_tokens, "embed_dim": selector.embed_dim,
            "hidden": selector.hidden, **(extra or {})}
    tmp = os.path.join(directory, SELECTOR_META + ".tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=2)
    os.replace(tmp, os.path.join(directory, SELECTOR_META))


def load_selector(path: str) -> TokenSelector:
    """A selector written by ``save_selector`` (``path``: its directory, e.g. ``RUN/policy``, or the
    ``selector.safetensors`` file), in eval mode. ``selector.json`` beside it gives K and the embedding width."""
    from safetensors.torch import load_file

    directory = os.path.dirname(path) if path.endswith(".safetensors") else path
    meta_path = os.path.join(directory, SELECTOR_META)
    if not os.path.isfile(meta_path):
        raise FileNotFoundError(f"{meta_path}: no ExToken selector there (a `vla rl --method extoken` run writes "
                                f"RUN/policy/{SELECTOR_META})")
    with open(meta_path) as f:
        meta = json.load(f)
    sel = TokenSelector(meta["embed_dim"], meta["num_tokens"], meta.get("hidden", 128))
    sel.load_state_dict(load_file(os.path.join(directory, SELECTOR_FILE)))
    return sel.eval()
