"""``ExTokenConfig``: ExToken's exploration over behaviour tokens, layered on GRPO (no torch here: ``vla rl`` builds its
flags from the documented fields). Where a value comes from is said on each field; ``policies/extoken/__init__.py``
lists the reconstruction's choices."""

from __future__ import annotations

import dataclasses
import math

from policies.grpo.config import GRPOConfig

TOKEN_UNITS = ("episode", "chunk")
EXPLORE = ("stratified", "selector", "uniform")
DEPLOY = ("selector", "random", "null")
SELECTOR_OBJECTIVES = ("awr", "pg")


@dataclasses.dataclass(frozen=True)
class ExTokenConfig(GRPOConfig):
    """GRPO on a token-conditioned VLA pi(a | s, c) whose rollouts draw distinct behaviour tokens c, and a selector
    p(c | s) trained from the returns the tokens produced (``vla rl --method extoken``)."""

    token_unit: str = dataclasses.field(default="episode", metadata={"choices": TOKEN_UNITS})
    """When a token is drawn: ``episode`` (one token per episode, at its first macro-step) or ``chunk`` (a new token
    at every macro-step). Use the unit the token prior was clustered with (``vla tokens --unit``: METHODS.md's
    per-demo-chunk k-means is ``chunk``; this stack's default prior is per episode)."""
    explore: str = dataclasses.field(default="stratified", metadata={"choices": EXPLORE})
    """How training rollouts draw tokens 1..K: ``stratified`` (each group of ``group_size`` rollouts from one scene
    cycles through a random permutation of the tokens, so every token is tried in every scene when group_size >= K;
    with ``chunk`` rollout i takes token perm[(i + t) mod K] at macro-step t) (R: the paper only says tokens are
    sampled), ``selector`` (sample p(c | s)) or ``uniform``."""
    learn_policy: bool = True
    """Improve pi(a | s, c) with GRPO (the wrapped RL method). Off: the VLA stays frozen and only the selector
    learns, a contextual bandit over tokens (an ablation)."""
    selector_hidden: int = 128
    """Width of the selector's two hidden layers (an MLP over the frozen VLA's embed(obs); R: the paper gives no
    architecture)."""
    selector_lr: float = 1e-3
    """Adam step size of the selector (R: Adam's common default)."""
    selector_epochs: int = 20
    """Full-batch selector steps per update, over every token decision of the update's rollouts (R)."""
    selector_objective: str = dataclasses.field(default="awr", metadata={"choices": SELECTOR_OBJECTIVES})
    """How the selector is fitted to the token decisions. ``awr``: advantage-weighted regression (Peng et al. 2019)
    onto the demos' token prior, -E_q[exp(A / selector_beta) prior(c) / q(c) log p(c | s)], whose optimum is p(c | s)
    proportional to prior(c) exp(A(s, c) / beta): the closed-form solution of METHODS.md's "returns with entropy and a KL
    to the demos' prior" (max E_p[A] - beta KL(p || prior)); it cannot lock onto a token the data do not favour.
    ``pg``: that objective by truncated-importance REINFORCE + entropy + KL (``entropy_coef``, ``prior_kl_coef``,
    ``max_importance``), the first reconstruction: measured on the crowded pick (bench/results/README.md, ExToken
    round 4) it went deterministic (entropy 1e-4) after the first update with a signal and never moved again, since
    p / q -> 0 silences a dropped token (R)."""
    selector_beta: float = 1.0
    """AWR's temperature beta on the group advantages (which GRPO normalises to unit scale): weights exp(A / beta),
    capped at ``max_importance`` ** 2 (R: AWR's beta ~ 1 for normalised advantages)."""
    selector_memory: int = 4096
    """Token decisions the selector is fitted on, the newest kept across updates (its replay; 0: the current update's
    only). Stratified decisions stay valid for the selector as the policy moves slowly (R)."""
    entropy_coef: float = 0.1
    """Weight of the selector's entropy bonus -H(p(. | s)) in its loss (METHODS.md: "with entropy"; the value is R:
    it pulls back a token the selector has dropped, where the p / q-weighted gradient vanishes; at 0.01 early noise
    decided which token a kind of scene locked into in 2 of 20 seeds of the tests' bandit, at 0.1 in none of 12)."""
    prior_kl_coef: float = 0.05
    """Weight of KL(p(. | s) || demo token prior) in the selector's loss (METHODS.md: "a KL to the demos' token
    prior"; the value is R)."""
    max_importance: float = 5.0
    """Cap on the selector's importance weight p(c | s) / q(c | s) (q: the probability the behaviour distribution
    gave the token, 1/K for stratified / uniform); truncated importance sampling as in V-trace (R)."""
    deploy: str = dataclasses.field(default="selector", metadata={"choices": DEPLOY})
    """The token at evaluation: ``selector`` (argmax p(c | s) of the episode's first observation, or of every
    macro-step's with ``chunk``), ``random`` (a uniform token: the no-selector ablation) or ``null`` (token 0: the VLA
    without behaviour conditioning)."""
    prior: tuple[float, ...] = ()
    """The demos' token prior over tokens 1..K (K numbers, normalised here). Default: the ``tokens`` block of the
    checkpoint's config.json (``vla train --tokens``: ``policies.extoken.prior.token_meta``) when the VLA says where
    it was loaded from (a ``checkpoint_dir`` attribute) or carries ``token_prior``; else uniform."""

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        for field, choices in (("token_unit", TOKEN_UNITS), ("explore", EXPLORE), ("deploy", DEPLOY),
                               ("selector_objective", SELECTOR_OBJECTIVES)):
            if getattr(self, field) not in choices:
                raise ValueError(f"{name}.{field} must be one of {', '.join(choices)}, got {getattr(self, field)!r}")
        if not isinstance(self.learn_policy, bool):
            raise ValueError(f"{name}.learn_policy must be True or False, got {self.learn_policy!r}")
        for field in ("selector_hidden", "selector_epochs"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"{name}.{field} must be >= 1, got {getattr(self, field)}")
        if int(self.selector_memory) < 0:
            raise ValueError(f"{name}.selector_memory must be >= 0, got {self.selector_memory}")
        if not float(self.selector_beta) > 0:
            raise ValueError(f"{name}.selector_beta must be positive, got {self.selector_beta}")
        if not float(self.selector_lr) > 0:
            raise ValueError(f"{name}.selector_lr must be positive, got {self.selector_lr}")
        for field in ("entropy_coef", "prior_kl_coef"):
            if float(getattr(self, field)) < 0:
                raise ValueError(f"{name}.{field} must be >= 0, got {getattr(self, field)}")
        if not float(self.max_importance) > 0:
            raise ValueError(f"{name}.max_importance must be positive, got {self.max_importance}")
        object.__setattr__(self, "prior", tuple(float(p) for p in self.prior))
        if self.prior and (not all(math.isfinite(p) and p >= 0 for p in self.prior) or sum(self.prior) <= 0):
            raise ValueError(f"{name}.prior must be K non-negative numbers with a positive sum (tokens 1..K), "
                             f"got {list(self.prior)}")
