"""Residual off-policy RL over a frozen VLA: a small actor adds a bounded correction to every executed action
of the VLA's chunk (ResFiT, Ankile et al. 2025, arXiv 2509.19301; Policy Decorator, Yuan et al. 2024).

The VLA stays black-box (it is queried, never differentiated through), so any backbone of the VLA interface
works. One macro-step:

    feat  = vla.embed(obs)                             frozen features
    base  = vla.sample(feat, noise)[:exec_steps]       the base chunk, normalised units [n, A]
    delta = pi(s, base)  in [-b, b]^(n A) or [-b, b]^A  the residual (TD3: deterministic, tanh-bounded,
                                                       last layer zero-initialised: the session starts at
                                                       the base)
    a     = clip(base + delta)                         executed (training: delta + N(0, explore_std^2))

Learning is TD3 with RLPD's critic (ResFiT's choices):

* critics ``Q_i(s, a)`` on the *executed* chunk (not the residual): an operator's intervention or a recorded
  demonstration, which have no residual behind them, train them as they are; the base chunk is stored in
  ``obs`` and ``next_obs`` (``obs_spec["base"]``), so the TD target never re-runs the VLA:
  ``y = R_n + gamma^m (1 - d) min_{i in K} Qbar_i(s', clip(base' + pibar(s', base') + eps))``, ``eps`` TD3's
  clipped target smoothing, ``K`` ``critic_subset`` of the ``num_critics`` target critics, ``R_n`` the rewards of
  the m <= ``n_step`` stored macro-steps of the episode from s, s' the observation after the last of them
  (``ReplayBuffer.n_step_gather``; ResFiT's n-step returns);
* the actor maximises the ensemble mean ``mean_i Q_i(s, clip(base + pi(s, base)))``, one step every
  ``actor_every`` critic steps once ``critic_warmup`` critic steps are done; target actor and critics by
  Polyak averaging;
* demos and interventions in the demo buffer, sampled 50 / 50 with the online one;
* warm-up (the session's ``--warmup-steps``): the base chunk plus uniform noise, so the critic sees actions
  around the base before the actor moves.

Departures from ResFiT's code, each for this project's budgets (20K ticks on 2 CPU cores, not 300K steps on a
GPU): the residual is chosen once per macro-step of ``exec_steps`` ticks from that macro-step's observation
(ResFiT: every env step, with the base's chunk open-loop over 20 steps), so the TD backup runs over
macro-steps (ResFiT: 3-7-step returns per env step); networks 2 x 256 (ResFiT 2 x 1024); actor lr 1e-5 (1e-6);
UTD 4 critic steps per macro-step (4 per env step); 1000 critic-only steps (10K). ResFiT has no mechanism that
grows the bound with the critic's confidence. Ours, off by default: ``residual_penalty`` p makes the actor maximise
``Q - p mean((delta / b)^2)``, so a residual grows only where the critic's gain for it beats p (a soft bound that
opens with the critic's confidence; TD3+BC's form with the base as the behaviour).

Observation encoders (``ResidualConfig.encoder``) as DSRL's: ``vla`` (the embedding's summary columns),
``cnn`` (a small CNN on the frames + state, trained by the critic's TD loss, read detached by the actor; DrQ's
random shift on replayed frames), ``oracle`` (a labelled oracle: the embedding and the simulator's privileged
object poses).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np
import torch
from torch import nn

from policies.base import Act, Agent, check_handles
from policies.common.encoders import SmallImageStateEncoder, count_parameters, shift_observations
from policies.common.replay import ReplayBuffer, sample_mixed
from policies.common.sac import EnsembleCritic, ensemble_target
from policies.common.vla_features import SelectFeatures, SelectPrivileged, camera_layout, embed_dim, encoder_inputs
from policies.common.vla_features import split_refusal as _split_refusal, summary_dim
from policies.residual.config import ResidualConfig


class ResidualActor(nn.Module):
    """(s [B, S], base chunk [B, C]) -> residual [B, R] in [-b, b]: an MLP with LayerNorm (ResFiT), its last
    layer zero-initialised so that the first residual is exactly 0 whatever the input."""

    def __init__(self, obs_dim: int, base_dim: int, out_dim: int, hidden: tuple[int, ...], bound: float) -> None:
        super().__init__()
        layers, d = [], obs_dim + base_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.LayerNorm(h), nn.ReLU()]
            d = h
        self.trunk = nn.Sequential(*layers)
        self.out = nn.Linear(d, out_dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        self.bound = float(bound)

    def forward(self, s: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        return self.bound * torch.tanh(self.out(self.trunk(torch.cat([s, base], dim=-1))))


class ResidualAgent(Agent):
    """The residual RL agent (``policies.base.Agent``; ``vla rl --method residual``). Args:
        vla: the frozen VLA (``embed``, ``sample_actions_from_embedding``, ``noise_shape``, ``action_shape``,
            ``clip_normalized_actions``).
        feat_dim: width of ``vla.embed()`` (default: the VLA's ``embed_dim``).
        cameras, state_dim: encoder ``cnn``: the env's camera names and robot state length.
        privileged_dim: encoder ``oracle``: the length of the env's ``privileged`` observation.
    """

    name = "residual"
    HANDLES = ("noise", "embed", "sample_actions_from_embedding", "normalize_actions", "unnormalize_actions")

    def __init__(self, vla, cfg: ResidualConfig = ResidualConfig(), seed: int = 0, feat_dim: int | None = None,
                 cameras: list[str] | tuple[str, ...] | None = None, state_dim: int | None = None,
                 privileged_dim: int | None = None) -> None:
        self.vla, self.cfg = vla, cfg
        horizon, self.a = (int(x) for x in vla.action_shape)
        self.noise_shape = tuple(int(x) for x in vla.noise_shape)
        self.exec_steps = cfg.exec_steps or horizon
        if not 1 <= self.exec_steps <= horizon:
            raise ValueError(f"exec_steps must be in [1, {horizon}] (the VLA's chunk), got {cfg.exec_steps}")
        self.chunk_shape = (self.exec_steps, self.a)
        self.chunk_dim = self.exec_steps * self.a
        self.action_dim = self.chunk_dim if cfg.rows == "each" else self.a  # the stored agent action: the residual
        self.feat_dim = feat_dim or embed_dim(vla)
        self.obs_spec: dict[str, tuple[tuple[int, ...], Any]] = {}
        """What one observation holds in the replay buffers: the encoder's input and the base chunk ``base``."""
        self.cameras: list[str] = []
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
            torch.manual_seed(seed)
            if cfg.encoder == "cnn":
                if not cameras or state_dim is None:
                    raise ValueError("encoder 'cnn' needs cameras=[...] and state_dim= (the env's camera names and "
                                     "robot state length)")
                clash = {"feat", "state", "base", "privileged"} & set(cameras)
                if clash:
                    raise ValueError(f"camera name(s) {sorted(clash)} clash with observation fields; rename them")
                self.cameras = list(cameras)
                self.encoder: nn.Module = SmallImageStateEncoder(self.cameras, cfg.image_size, int(state_dim))
                s = cfg.image_size
                self.obs_spec.update({c: ((s, s, 3), np.uint8) for c in self.cameras})
                self.obs_spec["state"] = ((int(state_dim),), np.float32)
            else:
                if not self.feat_dim:
                    raise ValueError("feat_dim: the width of vla.embed() could not be inferred; pass feat_dim")
                self.summary_dim = summary_dim(vla, self.feat_dim)
                self.obs_spec["feat"] = ((self.summary_dim,), np.float32)  # the columns the networks read
                if cfg.encoder == "oracle":
                    if not privileged_dim:
                        raise ValueError("encoder 'oracle' needs privileged_dim= (the env's `privileged` observation "
                                         "length: a sim task env made with privileged=True)")
                    self.encoder = SelectPrivileged(self.summary_dim, int(privileged_dim))
                    self.obs_spec["privileged"] = ((int(privileged_dim),), np.float32)
                else:
                    self.encoder = SelectFeatures(self.summary_dim)
            self.obs_spec["base"] = ((self.chunk_dim,), np.float32)
            obs_dim = int(self.encoder.out_dim)
            self.actor = ResidualActor(obs_dim, self.chunk_dim, self.action_dim, cfg.hidden, cfg.residual_bound)
            self.critic = EnsembleCritic(obs_dim, self.chunk_dim, cfg.num_critics, cfg.hidden, True)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.critic_params = [*self.critic.parameters(), *self.encoder.parameters()]
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_lr)
        self.critic_opt = torch.optim.Adam(self.critic_params, lr=cfg.critic_lr)
        self.generator = torch.Generator().manual_seed(seed)  # exploration, target smoothing, critic subsets, DrQ
        self.base_generator = torch.Generator().manual_seed(seed + 7919)  # the base VLA's sampler noise
        self.updates = self.critic_steps = self.actor_steps = 0

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def build(cls, vla, cfg: ResidualConfig, seed: int = 0, observation_space=None) -> "ResidualAgent":
        check_handles(vla, cls.HANDLES, cls.name)
        return cls(vla, cfg, seed=seed, **camera_layout(cfg, observation_space))

    @classmethod
    def split_refusal(cls, cfg: ResidualConfig) -> str | None:
        return _split_refusal(cfg)

    def parameter_counts(self) -> dict[str, int]:
        n = {"encoder": count_parameters(self.encoder), "actor": count_parameters(self.actor),
             "critic": count_parameters(self.critic)}
        n["total"] = sum(n.values())
        return n

    # -- acting --------------------------------------------------------------------------------
    @torch.no_grad()
    def embed(self, obs_batch: dict) -> torch.Tensor:
        return self.vla.embed(obs_batch)

    @torch.no_grad()
    def base_chunk(self, feat: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The base VLA's chunk for features ``feat`` [B, D]: its first ``exec_steps`` rows, normalised,
        flattened [B, n A]; its sampler noise N(0, I) from ``generator`` (default ``base_generator``; ``base_noise``
        sample) or 0."""
        shape = (len(feat), *self.noise_shape)
        noise = torch.zeros(shape) if self.cfg.base_noise == "zero" else \
            torch.randn(shape, generator=generator or self.base_generator)
        x = self.vla.sample_actions_from_embedding(feat, noise=noise, normalized=True)[:, : self.exec_steps]
        return x.reshape(len(feat), -1).float()

    def observe(self, obs: dict) -> dict[str, torch.Tensor]:
        """The encoder's input of ``obs``, the base VLA's chunk there (``base``) and, for ``act_chunk`` only (not
        stored), the VLA's features (``vla_feat``)."""
        from vla.envs import VLAPolicy

        return self.observe_with(obs, self.embed(VLAPolicy.batch(obs)))

    def observe_with(self, obs: dict, feat: torch.Tensor) -> dict[str, torch.Tensor]:
        """``observe`` for an observation whose VLA features ``feat`` [1, D] are known already."""
        out = encoder_inputs(obs, self.obs_spec, self.cameras, self.cfg.image_size)
        if "feat" in self.obs_spec:
            out["feat"] = feat[:, : self.summary_dim].float()
        out["base"] = self.base_chunk(feat)
        out["vla_feat"] = feat
        return out

    def executed(self, base: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """clip(base + delta) [B, n A]: ``delta`` [B, R] added to every row (``rows`` shared) or row by row,
        limited to the range the VLA's sampler returns (differentiable in ``delta`` inside it)."""
        b = len(base)
        d = delta.reshape(b, 1, self.a) if self.cfg.rows == "shared" else delta.reshape(b, self.exec_steps, self.a)
        x = base.reshape(b, self.exec_steps, self.a) + d
        return self.vla.clip_normalized_actions(x).reshape(b, -1)

    @torch.no_grad()
    def residual(self, aobs: dict[str, torch.Tensor], rng: np.random.Generator, warmup: bool,
                 explore: bool) -> torch.Tensor:
        """The residual [B, R] for a batch laid out by ``obs_spec``: warm-up U(+-warmup_noise) (from ``rng``);
        else the actor's, plus N(0, explore_std^2) when ``explore``, clipped to the bound."""
        b = len(aobs["base"])
        if warmup:
            w = self.cfg.warmup_noise
            return torch.from_numpy(rng.uniform(-w, w, (b, self.action_dim)).astype(np.float32))
        was = self.encoder.training
        self.encoder.eval()
        try:
            delta = self.actor(self.encoder(aobs), aobs["base"])
        finally:
            self.encoder.train(was)
        if explore and self.cfg.explore_std > 0:
            delta = delta + self.cfg.explore_std * torch.randn(delta.shape, generator=self.generator)
        return delta.clamp(-self.cfg.residual_bound, self.cfg.residual_bound)

    def act_chunk(self, aobs: dict[str, torch.Tensor], rng: np.random.Generator, warmup: bool,
                  deterministic: bool = False, generator: torch.Generator | None = None) -> Act:
        """Training episodes explore (the actor's residual plus Gaussian noise); an evaluation (``deterministic``,
        or a ``generator`` of its own) takes the actor's residual itself, TD3's policy. An evaluation's
        ``generator`` also draws the base VLA's noise, so that evaluations are seeded by their episode and leave the
        training streams alone (nothing of an evaluation is stored)."""
        explore = not deterministic and generator is None
        if generator is not None and "vla_feat" in aobs:
            aobs = {**aobs, "base": self.base_chunk(aobs["vla_feat"], generator)}
        delta = self.residual({k: aobs[k] for k in self.obs_spec}, rng, warmup=warmup, explore=explore)
        chunk = self.executed(aobs["base"], delta)[0].reshape(self.chunk_shape)
        return Act(action=delta[0].numpy().astype(np.float32), chunk=chunk)

    def buffers(self, intervention: bool) -> tuple[str, ...]:
        """The critic reads executed chunks: an operator's chunk trains it online and in the demo buffer."""
        return ("online", "demo") if intervention else ("online",)

    def demo_transitions(self, roots, instruction: str, progress: bool = True):
        from policies.common.demos import demo_transitions

        return demo_transitions(self, roots, instruction, progress=progress)

    def actor_parameters(self) -> dict[str, torch.Tensor]:
        return self.actor.state_dict()

    def load_actor_parameters(self, params: dict[str, torch.Tensor]) -> None:
        self.actor.load_state_dict(params)

    # -- learning ------------------------------------------------------------------------------
    def update(self, online: ReplayBuffer, offline: ReplayBuffer | None, rng: np.random.Generator) -> dict[str, float]:
        """One update round (one per macro-step): ``utd`` critic steps, each on a fresh batch (50 / 50 online /
        demo when the demo buffer holds any), and an actor step every ``actor_every`` critic steps once
        ``critic_warmup`` are done. -> losses and diagnostics."""
        cfg = self.cfg
        use_off = offline is not None and len(offline) > 0
        closs, aloss = [], []
        for _ in range(cfg.utd):
            kw = cfg.value.sample_kwargs(cfg.gamma, cfg.n_step)  # n-step returns, offset, time limit, per tick
            b = sample_mixed(online, offline, cfg.batch_size, 0.5, rng, **kw) if use_off \
                else online.sample(cfg.batch_size, rng, **kw)
            if cfg.encoder == "cnn" and cfg.image_pad:
                b = shift_observations(b, cfg.image_pad, self.generator)
            s, q, loss = self._critic_step(b)
            closs.append(loss)
            if self.critic_steps > cfg.critic_warmup and self.critic_steps % cfg.actor_every == 0:
                aloss.append(self._actor_step(s.detach(), b["obs"]["base"]))
        self.updates += 1
        info = {"losses/critic_loss": float(torch.stack(closs).mean()), "losses/q_values": float(q.detach().mean()),
                "charts/critic_steps": float(self.critic_steps), "charts/actor_steps": float(self.actor_steps)}
        if aloss:
            info["losses/actor_loss"] = float(torch.stack(aloss).mean())
        if cfg.diag_every and self.updates % cfg.diag_every == 0:
            info.update(self.diagnostics(s.detach(), b["obs"]["base"], b["chunk"]))
        return info

    def _critic_step(self, b: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        with torch.no_grad():
            s2, base2 = self.encoder(b["next_obs"]), b["next_obs"]["base"]
            d2 = self.actor_target(s2, base2)
            eps = (cfg.target_noise * torch.randn(d2.shape, generator=self.generator)).clamp(-cfg.target_noise_clip,
                                                                                             cfg.target_noise_clip)
            a2 = self.executed(base2, (d2 + eps).clamp(-cfg.residual_bound, cfg.residual_bound))
            q2 = ensemble_target(self.critic_target, s2, a2, cfg.num_critics, cfg.critic_subset, cfg.value,
                                 self.generator)
            y = b["reward"] + b["discount"] * (1.0 - b["done"]) * q2  # discount: gamma^(steps summed)
        s = self.encoder(b["obs"])  # with gradient: the critic's TD loss trains the cnn encoder
        q = self.critic(s, b["chunk"].reshape(len(s), -1))
        loss = ((q - y.unsqueeze(0)) ** 2).mean(dim=1).sum()
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.critic_params, cfg.grad_clip)
        self.critic_opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(list(self.critic_target.parameters()), list(self.critic.parameters()), cfg.tau)
        self.critic_steps += 1
        return s, q, loss.detach()

    def _actor_step(self, s: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        """max_pi mean_i Q_i(s, clip(base + pi(s, base))) - residual_penalty mean((delta / b)^2) (the observation
        read detached)."""
        self.critic.requires_grad_(False)
        try:
            delta = self.actor(s, base)
            loss = -self.critic(s, self.executed(base, delta)).mean()
            if self.cfg.residual_penalty > 0:
                loss = loss + self.cfg.residual_penalty * (delta / self.cfg.residual_bound).pow(2).mean()
            self.actor_opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(self.actor.parameters(), self.cfg.grad_clip)
            self.actor_opt.step()
        finally:
            self.critic.requires_grad_(True)
        with torch.no_grad():
            torch._foreach_lerp_(list(self.actor_target.parameters()), list(self.actor.parameters()), self.cfg.tau)
        self.actor_steps += 1
        return loss.detach()

    @torch.no_grad()
    def diagnostics(self, s: torch.Tensor, base: torch.Tensor, chunk: torch.Tensor) -> dict[str, float]:
        """Is the residual moving, and does the critic want it? On a replayed batch: the RMS of the actor's
        residual as a fraction of the bound; ``q_gain``: the critics' mean Q at base + residual minus at the base
        alone (> 0: the critic prefers the correction); the ensemble's spread (std over critics) at the executed
        chunks; how far the executed chunks lay from the base (RMS, normalised units)."""
        delta = self.actor(s, base)
        q_res = self.critic(s, self.executed(base, delta))
        q_base = self.critic(s, self.vla.clip_normalized_actions(base.reshape(len(s), self.exec_steps, self.a))
                             .reshape(len(s), -1))
        q_data = self.critic(s, chunk.reshape(len(s), -1))
        return {"diag/residual_rms_of_bound": float(delta.pow(2).mean().sqrt() / self.cfg.residual_bound),
                "diag/q_gain": float((q_res.mean(0) - q_base.mean(0)).mean()),
                "diag/q_ensemble_std": float(q_data.std(dim=0).mean()),
                "diag/executed_minus_base_rms": float((chunk.reshape(len(s), -1) - base).pow(2).mean().sqrt())}

    # -- exact resume --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"config": dataclasses.asdict(self.cfg), "actor": self.actor.state_dict(),
                "actor_target": self.actor_target.state_dict(), "critic": self.critic.state_dict(),
                "critic_target": self.critic_target.state_dict(), "encoder": self.encoder.state_dict(),
                "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "generator": self.generator.get_state(), "base_generator": self.base_generator.get_state(),
                "updates": self.updates, "critic_steps": self.critic_steps, "actor_steps": self.actor_steps}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        for k in ("encoder", "rows", "exec_steps"):
            if d["config"].get(k) != getattr(self.cfg, k):
                raise ValueError(f"the checkpoint's residual agent has {k} {d['config'].get(k)!r}, this one "
                                 f"{getattr(self.cfg, k)!r}")
        for k in ("actor", "actor_target", "critic", "critic_target", "encoder"):
            getattr(self, k).load_state_dict(d[k])
        self.actor_opt.load_state_dict(d["actor_opt"])
        self.critic_opt.load_state_dict(d["critic_opt"])
        self.generator.set_state(d["generator"])
        self.base_generator.set_state(d["base_generator"])
        self.updates, self.critic_steps, self.actor_steps = int(d["updates"]), int(d["critic_steps"]), int(d["actor_steps"])
