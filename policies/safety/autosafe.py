"""AutoSafe (arXiv 2606.31320): a safety-structured SAC policy, as a layer over the shared SAC actor;
and the hard safety filter (Simplex) it is compared with.

The blended action (read with ``AutoSafeActor.sample``)::

    a~ = (1 - lambda(s)) a_theta + lambda(s) a_safe(s)
    lambda = (exp(p (1 - Delta)) - 1) / (exp(p) - 1)

* ``a_theta ~ pi_theta(.|s)``: the SAC actor's tanh-squashed Gaussian, ``b tanh(u)``, u ~ N(mu, sigma).
* ``a_safe(s)``, ``Delta(s)``: a :class:`SafetySpec` -- a certified controller (LQR, Simplex, a
  workspace controller) and a normalised safety margin, 0 on (and outside) the boundary of the safe
  set, 1 deep inside. Functions of the state only: no parameter, no gradient.
* ``p(s) > 0``: the sharpness, a linear head on the actor's trunk (shared with the mean and log std
  heads), ``p = p_max tanh((softplus(z) + eps) / p_max)``. lambda is 1 at Delta = 0 whatever p, 0 at
  Delta = 1, decreasing in Delta and in p; p -> 0 gives the linear blend 1 - Delta, a large p gives
  ~exp(-p Delta) (the learner acts until close to the boundary). ``p_max`` bounds how close: it is part
  of the certificate (``AutoSafeConfig.sharpness_max``).

Where the tanh squash sits: the blend is applied *after* the squash, in action space. Reasons:
(1) a~ is a convex combination of two actions in [-b, b]^A (a_safe is clipped to the bounds), so it
stays in bounds without a second squash; (2) at lambda = 1 the certified controller's action is
applied exactly (blending the pre-squash Gaussian would need atanh(a_safe / b), infinite for a
saturated controller, and would bend the controller's action through the tanh); (3) the log-prob
is an exact change of variables. Given s, a~ is the affine map a~ = a_safe + (1 - lambda)(a_theta - a_safe)
of a_theta, with Jacobian (1 - lambda) I_A, so::

    log pi~(a~|s) = log pi_theta(a_theta|s) - A log(1 - lambda)
                  = [log N(u; mu, sigma) - sum log(b (1 - tanh(u)^2))] - sum_A log(1 - lambda)

and the distribution of a~ is that of a_theta with its mean moved toward a_safe,
E[a~] = (1 - lambda) E[a_theta] + lambda a_safe, and its spread shrunk, Cov[a~] = (1 - lambda)^2 Cov[a_theta].
At lambda = 1 it is a point mass (infinite density): the log-prob uses log max(1 - lambda, floor).

SAC is unchanged around the layer (:class:`AutoSafeSAC` only swaps the actor): the critic is trained
on the executed (blended) actions; its TD target and the actor loss E[alpha log pi~(a~|s) - Q(s, a~)]
draw a~ from the blended policy, so gradients reach the actor through (1 - lambda) a_theta and the
sharpness head through lambda (the critic's gradient in a~ and the -A log(1 - lambda) entropy term);
the temperature is tuned on the blended policy's entropy, the policy that acts. The entropy bonus on
the -A log(1 - lambda) term rewards a larger p (less blending): the trade-off against the critic is
what the head learns.

Not in ``policies.REGISTRY``: the ``Agent`` interface acts through a VLA's steering handles and
stores the agent's own action (DSRL: a noise w), while the blend must act on the executed action and
the log-prob of the stored action; wrapping a VLA agent means blending its executed chunk, which is
not a policy over its stored action. AutoSafe is a layer for any SAC whose actor reads the state the
safety spec reads (:class:`AutoSafeActor` over a ``TanhGaussianActor``; :class:`AutoSafeSAC`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from policies.common.sac import SAC, TanhGaussianActor
from policies.safety.config import AutoSafeConfig

P_SERIES = 1e-4
"""Below this sharpness lambda and 1 - lambda come from their first-order series in p (0 / 0 at p = 0)."""


@dataclasses.dataclass(frozen=True)
class SafetySpec:
    """A certified safe controller and a normalised safety margin, on the observation the actor reads."""

    safe_action: Callable[[torch.Tensor], torch.Tensor]
    """obs [B, D] -> a_safe [B, A], within the actor's bounds [-b, b] (clipped to them by the layer)."""
    margin: Callable[[torch.Tensor], torch.Tensor]
    """obs [B, D] -> Delta [B] in [0, 1]: 0 on / outside the boundary of the safe set, 1 deep inside."""


# -- the blend weight ----------------------------------------------------------------------------
def blend_weight(p: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (lambda, 1 - lambda) for sharpness p > 0 and margin Delta in [0, 1] (broadcast).

    lambda = (e^{p(1-D)} - 1) / (e^p - 1) = e^{-pD} (1 - e^{-p(1-D)}) / (1 - e^{-p})   (no overflow for large p)
    1 - lambda = (1 - e^{-pD}) / (1 - e^{-p})                                       (exact near the boundary)
    Both with expm1. p -> 0: lambda = (1 - D)(1 - p D / 2) + O(p^2), 1 - lambda = D (1 + p (1 - D) / 2) + O(p^2).
    """
    delta = delta.clamp(0.0, 1.0)
    ps = p.clamp_min(P_SERIES)  # the exact branch never sees p ~ 0 (no 0 / 0, no NaN gradient through where)
    lam = torch.exp(-ps * delta) * torch.expm1(-ps * (1 - delta)) / torch.expm1(-ps)
    one_minus = torch.expm1(-ps * delta) / torch.expm1(-ps)
    small = p < P_SERIES
    lam = torch.where(small, (1 - delta) * (1 - p * delta / 2), lam)
    one_minus = torch.where(small, delta * (1 + p * (1 - delta) / 2), one_minus)
    return lam.clamp(0.0, 1.0), one_minus.clamp(0.0, 1.0)


# -- the layer -----------------------------------------------------------------------------------
class AutoSafeActor(nn.Module):
    """pi~(.|s): a ``TanhGaussianActor`` (``base``) blended with a safe controller (see the module
    docstring). Same interface as the base: ``forward(obs) -> (mean, log std)`` of the base Gaussian,
    ``sample(obs, deterministic, generator) -> (a~, log pi~(a~|s))``, ``log_prob(obs, a~)``,
    ``action_scale``; and ``blend(obs)`` for diagnostics."""

    def __init__(self, base: TanhGaussianActor, spec: SafetySpec, cfg: AutoSafeConfig = AutoSafeConfig()) -> None:
        super().__init__()
        self.base, self.spec, self.cfg = base, spec, cfg
        self.action_dim, self.action_scale = base.action_dim, base.action_scale
        self.sharpness = nn.Linear(base.mean.in_features, 1)  # shares the base's trunk
        with torch.no_grad():  # p = sharpness_init for every state at the start
            self.sharpness.weight.uniform_(-1e-3, 1e-3)
            pre = cfg.sharpness_max * math.atanh(cfg.sharpness_init / cfg.sharpness_max) - cfg.sharpness_eps
            self.sharpness.bias.fill_(pre + math.log(-math.expm1(-pre)))  # softplus^-1(pre)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.base(obs)

    def _p(self, h: torch.Tensor) -> torch.Tensor:
        # softplus + eps keeps p > 0; p_max tanh(. / p_max) caps it smoothly (gradient never cut)
        pmax = self.cfg.sharpness_max
        return pmax * torch.tanh((F.softplus(self.sharpness(h).squeeze(-1)) + self.cfg.sharpness_eps) / pmax)

    def _safety(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B = obs.shape[0]
        a_safe = self.spec.safe_action(obs).clamp(-self.action_scale, self.action_scale)
        delta = self.spec.margin(obs)
        assert a_safe.shape == (B, self.action_dim), f"safe_action {tuple(a_safe.shape)} != ({B}, {self.action_dim})"
        assert delta.shape == (B,), f"margin {tuple(delta.shape)} != ({B},)"
        return a_safe, delta

    def _heads(self, obs: torch.Tensor):
        h = self.base.trunk(obs)
        mean, log_std = self.base.heads(h)
        a_safe, delta = self._safety(obs)
        lam, one_minus = blend_weight(self._p(h), delta)
        return mean, log_std, a_safe, lam, one_minus

    def _log_det(self, one_minus: torch.Tensor) -> torch.Tensor:
        # log |da~/da_theta| = A log(1 - lambda), floored where the blend is (nearly) a point mass
        return self.action_dim * torch.log(one_minus.clamp_min(self.cfg.blend_floor))

    def sample(self, obs: torch.Tensor, deterministic: bool = False,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (a~ [B, A] in [-b, b], log pi~(a~|s) [B]); differentiable in the actor's and the head's
        parameters. ``deterministic``: the blend of the squashed mean with a_safe."""
        mean, log_std, a_safe, lam, one_minus = self._heads(obs)
        a, log_pi = self.base.sample_from(mean, log_std, deterministic, generator)  # a = b tanh(u), reparameterised
        # the blend, after the squash: a~ = (1 - lambda) a + lambda a_safe, written around a_safe so that
        # 1 - lambda (exact near the boundary) multiplies the learner's part
        blended = a_safe + one_minus.unsqueeze(-1) * (a - a_safe)
        # change of variables through the affine blend: the density is divided by (1 - lambda)^A
        return blended, log_pi - self._log_det(one_minus)

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """log pi~(action|s) [B] of blended actions: a_theta = a_safe + (a~ - a_safe) / (1 - lambda), then
        the base's tanh-Gaussian log-prob and the blend's log-determinant. Exact where 1 - lambda >= blend_floor."""
        mean, log_std, a_safe, lam, one_minus = self._heads(obs)
        a = a_safe + (action - a_safe) / one_minus.clamp_min(self.cfg.blend_floor).unsqueeze(-1)
        return self.base.log_prob_from(mean, log_std, a, eps) - self._log_det(one_minus)

    @torch.no_grad()
    def blend(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """{lambda, p, delta, a_safe} on ``obs`` (for logs and plots)."""
        h = self.base.trunk(obs)
        a_safe, delta = self._safety(obs)
        p = self._p(h)
        return {"lambda": blend_weight(p, delta)[0], "p": p, "delta": delta, "a_safe": a_safe}


class AutoSafeSAC(SAC):
    """``policies.common.sac.SAC`` with its actor under the AutoSafe layer: critic, TD target, actor
    and temperature losses, update schedule and resume are SAC's own, run on the blended policy.
    The actor and the spec read the observation vector (no encoder: the spec must see the state)."""

    def __init__(self, obs_dim: int, action_dim: int, spec: SafetySpec, cfg: AutoSafeConfig = AutoSafeConfig(),
                 device: torch.device | str = "cpu", seed: int = 0) -> None:
        super().__init__(obs_dim, action_dim, cfg.sac, device=device, seed=seed)
        self.safety_cfg = cfg
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            self.actor = AutoSafeActor(self.actor, spec, cfg).to(self.device)
        fused = self.device.type in ("cpu", "cuda")
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=cfg.sac.actor_lr, fused=fused)

    @torch.no_grad()
    def policy_diagnostics(self, feat: torch.Tensor) -> dict[str, torch.Tensor]:
        info = super().policy_diagnostics(feat)
        b = self.actor.blend(feat)
        info.update({"diag/lambda_mean": b["lambda"].mean(), "diag/lambda_max": b["lambda"].max(),
                     "diag/sharpness_mean": b["p"].mean(), "diag/margin_mean": b["delta"].mean()})
        return info


# -- the baseline: a hard safety filter (Simplex) --------------------------------------------------
class SimplexFilter:
    """Switch to the safe action when the learner's would be unsafe (Seto et al.'s Simplex).

    With ``predict(obs, action) -> next obs`` (a model): switch when the predicted next state has
    margin <= ``threshold`` (``threshold`` 0: when it would leave the safe set; with an exact model and
    a safe set invariant under a_safe, no step ever leaves it). Without a model: switch when the
    current margin is below ``threshold``. ``__call__(obs [B, D], action [B, A]) -> (action, switched [B])``."""

    def __init__(self, spec: SafetySpec, threshold: float = 0.0,
                 predict: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
        if not 0.0 <= threshold < 1.0:
            raise ValueError(f"threshold must be in [0, 1), got {threshold}")
        if predict is None and threshold == 0.0:
            raise ValueError("without a model (predict) the filter needs threshold > 0: a margin of 0 means "
                             "the state has already left the safe set")
        self.spec, self.threshold, self.predict = spec, float(threshold), predict

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.predict is not None:
            switched = self.spec.margin(self.predict(obs, action)) <= self.threshold
        else:
            switched = self.spec.margin(obs) < self.threshold
        return torch.where(switched.unsqueeze(-1), self.spec.safe_action(obs).to(action), action), switched
