"""Soft Actor-Critic with the RLPD pieces, shared by every SAC-based RL module (DSRL first).

Read top to bottom: config, networks (critic ensemble, tanh-Gaussian actor), then the update.

* SAC (Haarnoja et al. 2018), written after CleanRL's ``sac_continuous_action.py``.
* RLPD (Ball et al. 2023, ``ikostrikov/rlpd``): an ensemble of ``num_critics`` Q-networks with
  LayerNorm, a TD target from the min over a *random subset* of ``critic_subset`` target critics,
  actor loss on the ensemble *mean*, target entropy ``-|A|/2``. (RLPD's 50/50 online/offline
  batches are ``replay.sample_mixed``.)
* The update schedule (``SACConfig.update_schedule``): ``per_step`` (default) runs ``utd`` gradient
  steps, each a critic, an actor and a temperature step on one fresh batch, as both DSRL codes do
  (SB3's ``SAC.train`` in ``ajwagen/dsrl``, jaxrl2's ``_update_jit`` in ``dsrl_pi0``); ``legacy`` runs
  ``utd`` critic steps and then one actor + temperature step on the last batch (RLPD). With
  ``legacy`` the temperature moves ``utd`` times slower per env step, which kept DSRL's noise policy
  at its initial distribution for whole sessions (issue 15).
* Images (DrQ / SERL): an optional ``encoder`` turns an observation dict into a feature vector.
  Actor and critic share it; it is trained by the critic loss only -- the actor sees its output
  detached. Next-state features come from the same encoder without gradient (DrQ-v2), so there
  is no target encoder.

The network input is a feature vector: float ``[B, D]``, or whatever ``encoder`` takes.
A batch is the dict ``ReplayBuffer.sample`` returns: ``obs, action, reward, next_obs, done``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from policies.common.sac_config import SACConfig  # noqa: F401  (torch-free, for the CLI)


# -- networks ------------------------------------------------------------------------------------
class EnsembleCritic(nn.Module):
    """``num_critics`` MLP Q-functions Q_i(s, a), evaluated in one batched pass: layer l holds
    weights [N, in, out] and is applied with ``torch.baddbmm``. Linear -> LayerNorm -> ReLU per
    hidden layer, a linear output. ``forward(x, a) -> [N, B]``; ``members`` picks a subset."""

    def __init__(self, obs_dim: int, action_dim: int, num_critics: int = 10, hidden: tuple[int, ...] = (256, 256),
                 layer_norm: bool = True) -> None:
        super().__init__()
        self.num_critics, self.layer_norm = num_critics, layer_norm
        sizes = [obs_dim + action_dim, *hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        self.ln_weights = nn.ParameterList()
        self.ln_biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            # nn.Linear's default init, drawn independently for every member
            bound = 1.0 / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(torch.empty(num_critics, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(num_critics, 1, fan_out).uniform_(-bound, bound)))
        if layer_norm:
            for h in hidden:
                self.ln_weights.append(nn.Parameter(torch.ones(num_critics, 1, h)))
                self.ln_biases.append(nn.Parameter(torch.zeros(num_critics, 1, h)))

    def forward(self, obs: torch.Tensor, action: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        x = torch.cat([obs, action], dim=-1)
        n = self.num_critics if members is None else len(members)
        pick = (lambda p: p) if members is None else (lambda p: p[members])  # noqa: E731
        h = x.unsqueeze(0).expand(n, *x.shape)  # [N, B, D], a view
        last = len(self.weights) - 1
        for l in range(len(self.weights)):
            h = torch.baddbmm(pick(self.biases[l]), h, pick(self.weights[l]))  # h @ W_i + b_i for every i
            if l < last:
                if self.layer_norm:
                    # per-member LayerNorm: normalise over features, then member i's own scale and shift
                    # (the constant unit weight takes ATen's fast CPU kernel; weight=None is ~2x slower)
                    h = F.layer_norm(h, h.shape[-1:], h.new_ones(h.shape[-1]))
                    h = h * pick(self.ln_weights[l]) + pick(self.ln_biases[l])
                h = F.relu(h)
        q = h.squeeze(-1)
        assert q.shape == (n, x.shape[0]), f"critic output {tuple(q.shape)} != (members={n}, batch={x.shape[0]})"
        return q


class TanhGaussianActor(nn.Module):
    """pi(a|s): an MLP gives mean and log std of u ~ N(mean, std); a = b * tanh(u) in [-b, b]^A."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...] = (256, 256), action_scale: float = 1.0,
                 log_std_min: float = -5.0, log_std_max: float = 2.0, init_log_std: float | None = None) -> None:
        super().__init__()
        layers, d = [], obs_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        self.trunk = nn.Sequential(*layers)
        self.mean = nn.Linear(d, action_dim)
        self.log_std = nn.Linear(d, action_dim)
        self.action_dim, self.action_scale = action_dim, float(action_scale)
        self.log_std_min, self.log_std_max = log_std_min, log_std_max
        if init_log_std is not None:  # mean ~0 and log std ~init_log_std whatever the observation
            with torch.no_grad():
                for head in (self.mean, self.log_std):
                    head.weight.uniform_(-1e-3, 1e-3)
                self.mean.bias.zero_()
                # forward() maps x -> min + (max - min) (tanh(x) + 1) / 2: invert it for the bias
                y = 2 * (init_log_std - log_std_min) / (log_std_max - log_std_min) - 1
                self.log_std.bias.fill_(math.atanh(y))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads(self.trunk(obs))

    def heads(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Trunk features h -> (mean, log std) of u (a layer that shares the trunk calls it: AutoSafe)."""
        mean, log_std = self.mean(h), torch.tanh(self.log_std(h))
        # squash log std into [min, max] smoothly (CleanRL), so its gradient never vanishes at a hard clamp
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (log_std + 1)
        return mean, log_std

    def _squash_log_det(self, u: torch.Tensor) -> torch.Tensor:
        # log |da/du| summed over action dims, a = b tanh(u):
        # log b + log(1 - tanh(u)^2), with log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) (stable)
        return (math.log(self.action_scale) + 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)

    def sample(self, obs: torch.Tensor, deterministic: bool = False,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (action [B, A] in [-b, b], log pi(action | obs) [B]). Differentiable in the actor's
        parameters (reparameterisation). ``deterministic``: the squashed mean, its log-prob."""
        return self.sample_from(*self(obs), deterministic=deterministic, generator=generator)

    def sample_from(self, mean: torch.Tensor, log_std: torch.Tensor, deterministic: bool = False,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``sample`` given the heads' output (mean, log std) [B, A]."""
        std = log_std.exp()
        if deterministic:
            u = mean
        else:
            # reparameterisation trick: u = mean + std * eps, eps ~ N(0, I)
            u = mean + std * torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        # change of variables: log pi(a) = log N(u; mean, std) - log |da/du|
        log_n = (-0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return self.action_scale * torch.tanh(u), log_n - self._squash_log_det(u)

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """log pi(action | obs) [B] of given actions in (-b, b) (clipped to 1 - eps inside the bound)."""
        return self.log_prob_from(*self(obs), action, eps)

    def log_prob_from(self, mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor,
                      eps: float = 1e-6) -> torch.Tensor:
        """``log_prob`` given the heads' output (mean, log std) [B, A]."""
        y = (action / self.action_scale).clamp(-1 + eps, 1 - eps)
        u = torch.atanh(y)
        log_n = (-0.5 * ((u - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return log_n - self._squash_log_det(u)


# -- the agent -----------------------------------------------------------------------------------
class SAC:
    """Actor, critic ensemble, target critic, log temperature and their Adam optimisers.

    ``update(batch)``: one critic step, then (by default) one actor + temperature step (UTD 1).
    ``update_many(sample_fn)``: ``utd`` gradient steps on fresh batches, by ``cfg.update_schedule``.
    ``state_dict`` holds everything for an exact resume, including the generator that draws the
    critic subsets and the actor's noise.
    """

    def __init__(self, obs_dim: int | None, action_dim: int, cfg: SACConfig = SACConfig(),
                 encoder: nn.Module | None = None, device: torch.device | str = "cpu", seed: int = 0,
                 critic_trains_encoder: bool = True) -> None:
        """``critic_trains_encoder=False`` leaves the encoder out of the critic optimiser: the caller
        trains it with a loss of its own (DSRL-NA: the action critic's TD loss)."""
        if encoder is not None:
            enc_dim = int(getattr(encoder, "out_dim"))
            if obs_dim is not None and obs_dim != enc_dim:
                raise ValueError(f"obs_dim={obs_dim} but the encoder outputs {enc_dim} features; pass obs_dim=None")
            obs_dim = enc_dim
        if obs_dim is None or obs_dim < 1 or action_dim < 1:
            raise ValueError(f"obs_dim and action_dim must be >= 1, got {obs_dim} and {action_dim}")
        self.cfg, self.obs_dim, self.action_dim, self.device = cfg, obs_dim, action_dim, torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
            torch.manual_seed(seed)
            self.actor = TanhGaussianActor(obs_dim, action_dim, cfg.hidden, cfg.action_scale,
                                           cfg.log_std_min, cfg.log_std_max, cfg.init_log_std).to(self.device)
            self.critic = EnsembleCritic(obs_dim, action_dim, cfg.num_critics, cfg.hidden,
                                         cfg.critic_layer_norm).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.encoder = encoder.to(self.device) if encoder is not None else None
        self.log_alpha = torch.tensor(math.log(cfg.init_temperature), device=self.device, requires_grad=True)
        self.target_entropy = -action_dim / 2.0 if cfg.target_entropy is None else float(cfg.target_entropy)
        critic_params = list(self.critic.parameters())
        if self.encoder is not None and critic_trains_encoder:
            critic_params += list(self.encoder.parameters())
        fused = self.device.type in ("cpu", "cuda")  # one fused kernel per step instead of one per op
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_lr, fused=fused)
        self.critic_opt = torch.optim.Adam(critic_params, lr=cfg.critic_lr, fused=fused)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.alpha_lr, fused=fused)
        self.critic_updates = 0
        self.actor_updates = 0

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp().detach()

    def features(self, obs: Any) -> torch.Tensor:
        """Observation -> feature vector [B, D] (through the encoder if there is one)."""
        if self.encoder is not None:
            return self.encoder(obs)
        if not isinstance(obs, torch.Tensor):
            raise ValueError("this SAC has no encoder: obs must be a float tensor [B, obs_dim], "
                             f"got {type(obs).__name__} (pass encoder=... for image observations)")
        return obs

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
        """Actions [B, A] in [-b, b] for a batch of observations (no gradient, encoder in eval mode)."""
        if self.encoder is not None:
            was_training = self.encoder.training
            self.encoder.eval()
        try:
            action, _ = self.actor.sample(self.features(_to(obs, self.device)), deterministic, generator)
        finally:
            if self.encoder is not None:
                self.encoder.train(was_training)
        return action

    # -- the update ------------------------------------------------------------------------------
    @torch.no_grad()
    def td_target(self, next_feat: torch.Tensor, reward: torch.Tensor, done: torch.Tensor,
                  discount: torch.Tensor | None = None) -> torch.Tensor:
        """y = r + gamma (1 - d) (Qbar(s', a') - alpha log pi(a'|s')), a' ~ pi(.|s'), Qbar the target critics
        reduced by ``cfg.value.target_ensemble`` (default: the min over a random subset of ``critic_subset``,
        RLPD). ``discount``: per-transition gamma^m of an n-step / per-tick batch (default ``cfg.gamma``). -> [B]"""
        next_action, next_log_pi = self.actor.sample(next_feat, generator=self.generator)
        next_q = ensemble_target(self.critic_target, next_feat, next_action, self.cfg.num_critics,
                                 self.cfg.critic_subset, self.cfg.value, self.generator)
        if self.cfg.backup_entropy:
            next_q = next_q - self.alpha * next_log_pi
        gamma = self.cfg.gamma if discount is None else discount
        return reward + gamma * (1.0 - done) * next_q

    def _critic_step(self, batch: dict[str, Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        action, reward, done = batch["action"], batch["reward"], batch["done"]
        B = action.shape[0]
        assert action.shape == (B, self.action_dim), f"action {tuple(action.shape)} != (B, {self.action_dim})"
        assert reward.shape == (B,) and done.shape == (B,), f"reward {tuple(reward.shape)}, done {tuple(done.shape)}"
        with torch.no_grad():
            next_feat = self.features(batch["next_obs"])
        target = self.td_target(next_feat, reward, done, batch.get("discount"))

        feat = self.features(batch["obs"])
        qs = self.critic(feat, action)  # [N, B]
        # J_Q = sum_i mean_B (Q_i(s, a) - y)^2: every member regresses on the same target
        qf_loss = ((qs - target.unsqueeze(0)) ** 2).mean(dim=1).sum()
        self.critic_opt.zero_grad(set_to_none=True)
        qf_loss.backward()
        self.critic_opt.step()

        # Polyak averaging: theta_target <- tau * theta + (1 - tau) * theta_target
        with torch.no_grad():
            torch._foreach_lerp_(list(self.critic_target.parameters()), list(self.critic.parameters()), self.cfg.tau)
        self.critic_updates += 1
        info = {"losses/qf_loss": qf_loss.detach(), "losses/qf_values": qs.detach().mean(),
                "losses/td_target": target.mean()}
        return info, feat.detach()

    def _actor_step(self, feat: torch.Tensor) -> dict[str, torch.Tensor]:
        # actor: minimise E[alpha log pi(a|s) - mean_i Q_i(s, a)], a ~ pi reparameterised;
        # features detached (the encoder learns from the critic only); the critic is a fixed function here
        self.critic.requires_grad_(False)  # no gradient into the critic's weights (saves the work)
        try:
            action, log_pi = self.actor.sample(feat, generator=self.generator)
            q = self.critic(feat, action).mean(dim=0)  # RLPD: ensemble mean
            actor_loss = (self.alpha * log_pi - q).mean()
            self.actor_opt.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_opt.step()
        finally:
            self.critic.requires_grad_(True)

        # temperature: minimise E[-alpha (log pi(a|s) + target_entropy)]
        alpha_loss = -(self.log_alpha.exp() * (log_pi.detach() + self.target_entropy)).mean()
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()
        self.actor_updates += 1
        return {"losses/actor_loss": actor_loss.detach(), "losses/alpha_loss": alpha_loss.detach(),
                "losses/alpha": self.alpha, "losses/entropy": -log_pi.detach().mean()}

    def update(self, batch: dict[str, Any], update_actor: bool = True) -> dict[str, float]:
        """One critic step on ``batch``; then, if ``update_actor``, one actor + temperature step on it."""
        batch = _to(batch, self.device)
        info, feat = self._critic_step(batch)
        if update_actor:
            info.update(self._actor_step(feat))
        return {k: float(v) for k, v in info.items()}

    def update_many(self, sample_fn: Callable[[], dict[str, Any]], utd: int | None = None) -> dict[str, float]:
        """``utd`` gradient steps, each on a fresh ``sample_fn()`` batch. ``per_step``: critic, actor and
        temperature every step; ``legacy``: critic every step, actor + temperature once, on the last batch.
        -> the last step's metrics, qf_loss averaged over the steps, and the policy diagnostics
        (``policy_diagnostics``) on the last batch."""
        utd = self.cfg.utd if utd is None else int(utd)
        per_step = self.cfg.update_schedule == "per_step"
        qf_losses = []
        for i in range(utd):
            info, feat = self._critic_step(_to(sample_fn(), self.device))
            qf_losses.append(info["losses/qf_loss"])
            if per_step or i == utd - 1:
                info.update(self._actor_step(feat))
        info["losses/qf_loss_mean_utd"] = torch.stack(qf_losses).mean()
        info.update(self.policy_diagnostics(feat))
        return {k: float(v) for k, v in info.items()}

    @torch.no_grad()
    def policy_diagnostics(self, feat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Where the policy stands on features ``feat`` [B, D]: the mean over batch and action dims of
        its pre-squash log std and |mean|, the RMS of its (squashed) mean action, its entropy estimate
        -E[log pi] from one sample per row, and alpha. A policy that never leaves its initial
        distribution shows log std and entropy flat at their initial values."""
        mean, log_std = self.actor(feat)
        _, log_pi = self.actor.sample(feat, generator=torch.Generator(feat.device).manual_seed(0))
        a = self.actor.action_scale * torch.tanh(mean)
        return {"diag/actor_log_std": log_std.mean(), "diag/actor_abs_mean": mean.abs().mean(),
                "diag/actor_mean_action_rms": a.pow(2).mean().sqrt(), "diag/entropy": -log_pi.mean(),
                "diag/alpha": self.alpha}

    # -- exact resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"config": dataclasses.asdict(self.cfg), "actor": self.actor.state_dict(),
                "critic": self.critic.state_dict(), "critic_target": self.critic_target.state_dict(),
                "encoder": self.encoder.state_dict() if self.encoder is not None else None,
                "log_alpha": self.log_alpha.detach().clone(), "actor_opt": self.actor_opt.state_dict(),
                "critic_opt": self.critic_opt.state_dict(), "alpha_opt": self.alpha_opt.state_dict(),
                "generator": self.generator.get_state(), "critic_updates": self.critic_updates,
                "actor_updates": self.actor_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["encoder"] is None) != (self.encoder is None):
            raise ValueError("checkpoint and this SAC disagree on having an encoder")
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        if self.encoder is not None:
            self.encoder.load_state_dict(state["encoder"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.generator.set_state(state["generator"])
        self.critic_updates, self.actor_updates = int(state["critic_updates"]), int(state["actor_updates"])


@torch.no_grad()
def ensemble_target(critic_target: EnsembleCritic, s: torch.Tensor, a: torch.Tensor, num_critics: int,
                    critic_subset: int, value, generator: torch.Generator) -> torch.Tensor:
    """The target critics' value at (s', a') [B], reduced as ``value.target_ensemble`` says
    (``policies.common.sac_config.ValueTargetConfig``): ``min_subset`` the min over ``critic_subset`` members drawn
    from ``generator`` (RLPD; all members when the subset is the whole ensemble), ``mean`` their mean (DSRL-pi0),
    ``mean_minus_std`` mean - k std. The subset is drawn in every mode, so that the RNG streams of two settings
    stay paired."""
    subset = torch.randperm(num_critics, generator=generator, device=s.device)
    subset = subset[:critic_subset] if critic_subset < num_critics else None
    mode = value.target_ensemble
    if mode == "min_subset":
        return critic_target(s, a, members=subset).min(dim=0).values
    q = critic_target(s, a)  # [N, B]
    if mode == "mean":
        return q.mean(dim=0)
    if mode == "mean_minus_std":
        return q.mean(dim=0) - value.target_std_k * q.std(dim=0)
    raise ValueError(f"target_ensemble must be min_subset, mean or mean_minus_std, got {mode!r}")


def _to(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x
