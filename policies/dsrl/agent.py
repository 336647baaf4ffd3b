"""DSRL: steer a frozen flow / diffusion VLA by choosing the initial noise of its sampler
(Wagenmaker et al., CoRL 2025, arXiv 2506.15799).

The VLA stays frozen; a small SAC agent acts in the *noise* space. One macro-step:

    feat = vla.embed(obs)                     frozen features (the agent's observation)
    w    = pi^W(feat)  in [-b, b]^d           the agent's action: the latent noise
    x    = vla.sample(feat, noise = T(w))     the VLA denoises w into a chunk [H, A]
    env.step(x[:exec_steps])                  executed as one macro-step

``T(w)`` reshapes a full ``H*A``-dim w to ``[H, A]``, or, with ``noise_dims = A``, places one ``A``-dim
w in the chunk's noise: ``noise_subspace`` ``tile`` repeats it over all ``H`` rows (the paper's pi0
option), ``mean`` makes it each action dim's coordinate along the all-ones direction over the rows
(``w / sqrt(H)`` on every row) plus a fresh i.i.d. remainder orthogonal to it,
``T(w) = 1 w^T / sqrt(H) + (I - 1 1^T / H) eps``, ``eps ~ N(0, I)``: for w ~ N(0, I) that is N(0, I) exactly.

Variants (``DSRLConfig.variant``):

* ``sac``: plain SAC in the noise MDP (``policies.common.sac.SAC`` on ``(feat, w, r, feat')``).
* ``action``: the baseline the paper compares with -- plain SAC on the raw action space: the
  agent's action *is* the normalised chunk (``[-b, b]^(H*A)``, ``b = action_bound``, in the VLA's
  own normalised units: min / max for the compact VLA, mean / std for LeRobot's), the VLA only
  provides features.
* ``na`` (noise-aliased, the paper's recommendation): an action-space critic ``Q^A(s, a)`` on the
  executed chunk ``a`` (normalised units) is trained by TD with
  ``y = r + gamma (1 - d) (min_{i in K} Qbar^A_i(s', pi_vla(s', w')) - alpha log pi^W(w'|s'))``,
  ``w' ~ pi^W(s')``; a noise-space critic ``Q^W(s, w)`` is distilled from it,
  ``(Q^W(s, w) - Q^A(s, pi_vla(s, w)))^2`` with ``w ~ N(0, I)`` (``distill_steps`` per update);
  the actor maximises ``Q^W - alpha log pi^W``. Because ``Q^A`` lives in action space, demos and
  operator interventions (action chunks with no noise behind them) train it directly: the
  offline buffer is sampled 50 / 50 with the online one (RLPD).

NA needs ``vla.sample_actions_from_embedding`` (the compact VLA has it): the distillation
re-generates chunks for replayed states with fresh noise.

Observation encoders (``DSRLConfig.encoder``): what the actor and the critics read.

* ``vla``: the frozen VLA's embedding ``feat`` (no trainable encoder).
* ``oracle`` (a labelled oracle, sim tasks only): the VLA's embedding summary and the simulator's
  privileged state ``obs["privileged"]`` (object poses relative to the gripper, ``vla.oracle_env``),
  concatenated; no trainable encoder. A diagnostic: no real robot has that state.
* ``cnn`` (the paper's pi0 setup): the camera frames at ``image_size`` (uint8) and the robot
  state through ``SmallImageStateEncoder``, shared by actor and critics (SERL / DrQ): trained by
  the critic's TD loss (NA: ``Q^A``'s), read detached by the actor (and, in NA, by ``Q^W``'s
  distillation, so ``Q^A`` and ``Q^W`` see the same encoded observation); replayed images get
  DrQ's random shift (+-``image_pad`` pixels, ``obs`` and ``next_obs`` independently) in every
  critic update. NA still stores ``feat``: ``pi_vla(s, w)`` is the VLA denoising from its own
  embedding, which the low-resolution frames cannot rebuild.

``DSRLAgent.obs_spec`` is the observation the replay buffers store per transition.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from policies.common.decisions import decision_indices
from policies.common.encoders import SmallImageStateEncoder, count_parameters, shift_observations
from policies.common.replay import ReplayBuffer, sample_mixed
from policies.base import Act, Agent, check_handles
from policies.common.sac import SAC, EnsembleCritic, ensemble_target
from policies.common.vla_features import SelectFeatures as _Select, SelectPrivileged as _SelectPrivileged
from policies.common.vla_features import camera_layout as _camera_layout, embed_dim as _embed_dim
from policies.common.vla_features import encoder_inputs, split_refusal as _split_refusal, summary_dim as _summary_dim
from policies.dsrl.config import ENCODERS, VARIANTS, DSRLConfig  # noqa: F401


class DSRLAgent(Agent):
    """The DSRL agent (``policies.base.Agent``; ``vla rl --method dsrl``). Args:
        vla: the frozen VLA (``noise_shape``, ``embed``, ``sample_actions_from_embedding``, ...).
        feat_dim: size of ``vla.embed()`` (default: ``vla.embed_dim``); needed unless the agent
            never reads the embedding (encoder ``cnn`` with variant ``sac`` / ``action``). Encoder
            ``vla``: actor and critics read its first ``vla.embed_summary_dim`` columns.
        cameras, state_dim: encoder ``cnn``: the camera names and the robot state's length.
        privileged_dim: encoder ``oracle``: the length of the env's ``privileged`` observation.
    """

    def __init__(self, vla, cfg: DSRLConfig = DSRLConfig(), seed: int = 0, feat_dim: int | None = None,
                 cameras: list[str] | tuple[str, ...] | None = None, state_dim: int | None = None,
                 privileged_dim: int | None = None) -> None:
        self.vla, self.cfg = vla, cfg
        self.h, self.a = (int(x) for x in vla.noise_shape)  # the sampler's noise [H, A]
        horizon, self.action_width = (int(x) for x in vla.action_shape)  # the chunk it returns
        if cfg.variant == "action" and (horizon, self.action_width) != (self.h, self.a):
            raise ValueError(f"variant 'action' needs the VLA's noise shape {(self.h, self.a)} to be its action "
                             f"shape {(horizon, self.action_width)}")
        self.exec_steps = cfg.exec_steps or horizon
        if not 1 <= self.exec_steps <= horizon:
            raise ValueError(f"exec_steps must be in [1, {horizon}], got {cfg.exec_steps}")
        if cfg.noise_dims not in (None, self.h * self.a, self.a):
            raise ValueError(f"noise_dims must be None, {self.h * self.a} (H*A) or {self.a} (A, tiled over the "
                             f"chunk), got {cfg.noise_dims}")
        self.noise_dim = cfg.noise_dims or self.h * self.a
        # the embedding's size: the VLA interface's ``embedding_dim`` where it has one
        self.feat_dim = feat_dim or _embed_dim(vla)
        # NA re-generates chunks pi_vla(s, w) from the stored embedding, whatever the encoder
        stores_feat = cfg.encoder in ("vla", "oracle") or cfg.variant == "na"
        if stores_feat and not self.feat_dim:
            raise ValueError("feat_dim: size of vla.embed() features could not be inferred; pass feat_dim")
        self.obs_spec: dict[str, tuple[tuple[int, ...], Any]] = {}
        """What one observation holds in the replay buffers (and what ``act`` reads): {name: (shape, dtype)}."""
        if cfg.encoder == "cnn":
            if not cameras or state_dim is None:
                raise ValueError("encoder 'cnn' needs cameras=[...] and state_dim= (the env's camera names and "
                                 "robot state length)")
            clash = {"feat", "state"} & set(cameras)
            if clash:
                raise ValueError(f"camera name(s) {sorted(clash)} clash with observation fields; rename the camera(s)")
            self.cameras = list(cameras)
            with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
                torch.manual_seed(seed + 2)
                encoder = SmallImageStateEncoder(self.cameras, cfg.image_size, int(state_dim))
            s = cfg.image_size
            self.obs_spec.update({c: ((s, s, 3), np.uint8) for c in self.cameras})
            self.obs_spec["state"] = ((int(state_dim),), np.float32)
        elif cfg.encoder == "oracle":
            if not privileged_dim:
                raise ValueError("encoder 'oracle' needs privileged_dim= (the env's `privileged` observation length: "
                                 "a sim task env made with privileged=True)")
            self.cameras = []
            encoder = _SelectPrivileged(_summary_dim(vla, self.feat_dim), int(privileged_dim))
            self.obs_spec["privileged"] = ((int(privileged_dim),), np.float32)
        else:
            self.cameras = []
            encoder = _Select(_summary_dim(vla, self.feat_dim))
        if stores_feat:
            self.obs_spec["feat"] = ((self.feat_dim,), np.float32)
        bound = cfg.action_bound if cfg.variant == "action" else cfg.noise_bound
        sac_cfg = dataclasses.replace(cfg.sac, action_scale=bound)
        # NA: the encoder learns from Q^A's TD loss (below), not from Q^W's distillation
        self.sac = SAC(None, self.noise_dim, sac_cfg, encoder=encoder, seed=seed,
                       critic_trains_encoder=cfg.variant != "na")
        self.chunk_dim = self.exec_steps * self.action_width
        self.chunk_shape = (self.exec_steps, self.action_width)
        self.action_dim = self.noise_dim  # the stored agent action: the noise w
        if cfg.variant == "na":
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed + 1)
                self.qa = EnsembleCritic(self.sac.obs_dim, self.chunk_dim, sac_cfg.num_critics, sac_cfg.hidden,
                                         sac_cfg.critic_layer_norm)
            self.qa_target = copy.deepcopy(self.qa).requires_grad_(False)
            self.qa_opt = torch.optim.Adam([*self.qa.parameters(), *self.sac.encoder.parameters()],
                                           lr=sac_cfg.critic_lr)
        self.updates = 0

    def parameter_counts(self) -> dict[str, int]:
        """Trainable parameters: encoder, actor, noise critic Q^W, action critic Q^A (NA), total
        (target networks not counted: they are copies)."""
        n = {"encoder": count_parameters(self.sac.encoder), "actor": count_parameters(self.sac.actor),
             "critic_w": count_parameters(self.sac.critic),
             "critic_a": count_parameters(self.qa) if self.cfg.variant == "na" else 0}
        n["total"] = sum(n.values())
        return n

    # -- acting --------------------------------------------------------------------------------
    def w_to_noise(self, w: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """[B, d] -> [B, H, A]: reshape (d = H*A), or for d = A tile one row over the chunk or (subspace
        ``mean``) set the rows' mean to ``w / sqrt(H)`` and draw the rest from ``generator`` (default the
        SAC generator, part of the training state)."""
        w = torch.as_tensor(w, dtype=torch.float32)
        if self.noise_dim == self.a and self.noise_dim != self.h * self.a:
            rows = w[:, None, :].expand(w.shape[0], self.h, self.a)
            if self.cfg.noise_subspace == "tile":
                return rows.contiguous()
            eps = torch.randn(w.shape[0], self.h, self.a, generator=generator or self.sac.generator)
            return rows / self.h ** 0.5 + eps - eps.mean(dim=1, keepdim=True)
        return w.reshape(w.shape[0], self.h, self.a)

    @torch.no_grad()
    def embed(self, obs_batch: dict) -> torch.Tensor:
        return self.vla.embed(obs_batch)

    @torch.no_grad()
    def chunk(self, feat: torch.Tensor, w: torch.Tensor, normalized: bool = False,
              generator: torch.Generator | None = None) -> torch.Tensor:
        """The chunk [B, H, A] for features ``feat`` and agent action ``w``: the VLA's denoising of
        noise ``T(w)`` (DSRL; ``generator`` draws the remainder of subspace ``mean``), or ``w`` itself
        as a normalised chunk (the ``action`` baseline)."""
        if self.cfg.variant == "action":
            x = self.w_to_noise(w)  # within [-action_bound, action_bound]: tanh-squashed (warm-up: clipped)
            return x if normalized else self.vla.unnormalize_actions(x)
        return self.vla.sample_actions_from_embedding(feat, noise=self.w_to_noise(w, generator), normalized=normalized)

    def act(self, obs: torch.Tensor | dict[str, torch.Tensor], rng: np.random.Generator, warmup: bool,
            deterministic: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
        """-> w [B, d] for a batch of observations laid out by ``obs_spec`` (a bare tensor: the VLA
        features ``feat``). In warm-up, w ~ N(0, I) clipped to the bound (the base VLA; for the
        ``action`` baseline: random actions). ``generator``: draws the policy's noise (default the
        SAC generator, part of the training state; evaluations pass their own)."""
        if isinstance(obs, torch.Tensor):
            obs = {"feat": obs}
        if warmup:
            w = rng.standard_normal((len(next(iter(obs.values()))), self.noise_dim)).astype(np.float32)
            b = self.sac.cfg.action_scale
            return torch.from_numpy(np.clip(w, -b, b))
        return self.sac.act(obs, deterministic=deterministic, generator=generator or self.sac.generator)

    # -- the Agent interface (policies.base) ---------------------------------------------------
    name = "dsrl"
    HANDLES = ("noise", "embed", "sample_actions_from_embedding", "normalize_actions", "unnormalize_actions")

    @classmethod
    def build(cls, vla, cfg: DSRLConfig, seed: int = 0, observation_space=None) -> "DSRLAgent":
        check_handles(vla, cls.HANDLES, cls.name)
        return cls(vla, cfg, seed=seed, **_camera_layout(cfg, observation_space))

    @classmethod
    def split_refusal(cls, cfg: DSRLConfig) -> str | None:
        return _split_refusal(cfg)

    def observe(self, obs: dict) -> dict[str, torch.Tensor]:
        """The VLA's features of ``obs`` (always, under ``feat``: the VLA denoises from them) and, for
        encoder ``cnn``, each camera resized to ``image_size`` (uint8) and the robot state."""
        from vla.envs import VLAPolicy

        return self.observe_with(obs, self.embed(VLAPolicy.batch(obs)))

    def observe_with(self, obs: dict, feat: torch.Tensor) -> dict[str, torch.Tensor]:
        """``observe`` for an observation whose VLA features ``feat`` [1, D] are known already."""
        out = encoder_inputs(obs, self.obs_spec, self.cameras, self.cfg.image_size)
        out["feat"] = feat
        return out

    def act_chunk(self, aobs: dict[str, torch.Tensor], rng: np.random.Generator, warmup: bool,
                  deterministic: bool = False, generator: torch.Generator | None = None) -> Act:
        w = self.act({k: aobs[k] for k in self.obs_spec}, rng, warmup=warmup, deterministic=deterministic,
                     generator=generator)
        chunk_n = self.chunk(aobs["feat"], w, normalized=True, generator=generator)[0, : self.exec_steps]
        return Act(action=w[0].numpy().astype(np.float32), chunk=chunk_n)

    def buffers(self, intervention: bool) -> tuple[str, ...]:
        """DSRL-SAC's critic lives in noise space: an operator's chunk has no noise behind it, so for
        that variant interventions go to the demo buffer only (NA's action critic and the raw-action
        baseline take them online too)."""
        if not intervention:
            return ("online",)
        return ("demo",) if self.cfg.variant == "sac" else ("online", "demo")

    def demo_transitions(self, roots, instruction: str, progress: bool = True):
        from policies.common.demos import demo_transitions

        return demo_transitions(self, roots, instruction, progress=progress)

    def actor_parameters(self) -> dict[str, torch.Tensor]:
        return self.sac.actor.state_dict()

    def load_actor_parameters(self, params: dict[str, torch.Tensor]) -> None:
        self.sac.actor.load_state_dict(params)

    # -- learning ------------------------------------------------------------------------------
    def update(self, online: ReplayBuffer, offline: ReplayBuffer | None, rng: np.random.Generator) -> dict[str, float]:
        """One update round (one per macro-step): ``sac.utd`` gradient steps by ``sac.update_schedule``,
        then, every ``diag_every`` rounds, the critic diagnostics (``critic_diagnostics``)."""
        bs = self.cfg.sac.batch_size
        # the value target's returns: n-step, reward offset, time limit, per-tick discount (SACConfig.value)
        kw = self.cfg.sac.value.sample_kwargs(self.cfg.sac.gamma, self.cfg.sac.n_step)
        if self.cfg.variant in ("sac", "action"):
            # the noise-space critic can only learn from transitions that have a noise action
            info = self.sac.update_many(lambda: self._augment(online.sample(bs, rng, **kw)))
        else:
            use_off = offline is not None and len(offline) > 0

            def sample() -> dict[str, Any]:
                b = sample_mixed(online, offline, bs, 0.5, rng, **kw) if use_off else online.sample(bs, rng, **kw)
                return self._augment(b)

            info = self._update_na(sample)
        self.updates += 1
        if self.cfg.diag_every and self.updates % self.cfg.diag_every == 0:
            info.update(self.critic_diagnostics(online))
        return info

    def _augment(self, batch: dict[str, Any]) -> dict[str, Any]:
        """cnn: DrQ's random shift of every replayed frame (obs and next_obs drawn independently), from
        the SAC generator, so that a resumed agent shifts exactly as the uninterrupted one."""
        if self.cfg.encoder != "cnn" or self.cfg.image_pad == 0:
            return batch
        return shift_observations(batch, self.cfg.image_pad, self.sac.generator)

    def _qa_action(self, batch: dict[str, Any]) -> torch.Tensor:
        return batch["chunk"].reshape(batch["chunk"].shape[0], -1)

    def _update_na(self, sample: Callable[[], dict[str, Any]]) -> dict[str, float]:
        """DSRL-NA's round. ``per_step`` (the reference, ``ajwagen/dsrl``'s ``DSRL.train``): ``utd`` steps
        of Q^A's TD update, each followed by an actor and a temperature step on the same batch against
        Q^W; then ``distill_steps`` Q^W distillation steps, each on a fresh batch. ``legacy``: ``utd`` Q^A
        steps, the distillation on the last batch only, then one actor + temperature step."""
        sac, cfg = self.sac, self.sac.cfg
        per_step = cfg.update_schedule == "per_step"
        qa_losses, info = [], {}
        for i in range(cfg.utd):
            b = sample()
            s, qa, loss = self._qa_step(b)
            qa_losses.append(loss)
            if per_step:
                # actor: max_w Q^W(s, w) - alpha log pi^W(w|s), and the temperature, on Q^A's batch;
                # the observation read detached (only Q^A's TD loss trains the encoder)
                info = sac._actor_step(s.detach())
        # distil Q^W(s, w) <- Q^A(s, pi_vla(s, w)), w ~ N(0, I): the noise critic sees every noise the
        # VLA maps to the same action as equally good ("noise aliasing"). Q^W reads the same encoded
        # observation as Q^A, detached: only Q^A's TD loss trains the encoder
        qw_losses = []
        for _ in range(self.cfg.distill_steps):
            if per_step:  # a fresh batch per distillation step (the reference); legacy: Q^A's last batch
                b = sample()
                with torch.no_grad():
                    s = sac.features(b["obs"])
            qw_losses.append(self._distill_step(s.detach(), b["obs"]["feat"]))
        if not per_step:
            info = sac._actor_step(s.detach())
        info = {k: float(v) for k, v in info.items()}
        info.update({k: float(v) for k, v in sac.policy_diagnostics(s.detach()).items()})
        info.update({"losses/qa_loss": float(torch.stack(qa_losses).mean()),
                     "losses/qw_distill_loss": float(torch.stack(qw_losses).mean()),
                     "losses/qa_values": float(qa.detach().mean())})
        return info

    def _qa_step(self, b: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One TD step of Q^A on batch ``b``. -> (encoded observation s, with gradient history; Q^A(s, a);
        the loss)."""
        sac, cfg = self.sac, self.sac.cfg
        # s: the agent's encoded observation (encoder "vla": the VLA features themselves);
        # feat: the VLA's embedding, which pi_vla denoises from
        with torch.no_grad():
            s2, feat2 = sac.features(b["next_obs"]), b["next_obs"]["feat"]  # no target encoder (DrQ-v2)
            # y = r + gamma (1 - d) (min_{i in K} Qbar^A_i(s', pi_vla(s', w')) - alpha log pi^W(w'|s')); with
            # n-step returns / a per-tick discount, r the summed return and gamma the batch's discount; the
            # ensemble's reduction by cfg.value.target_ensemble (default RLPD's min over a random subset)
            w2, logp2 = sac.actor.sample(s2, generator=sac.generator)
            a2 = self.chunk(feat2, w2, normalized=True)[:, : self.exec_steps].reshape(len(s2), -1)
            q2 = ensemble_target(self.qa_target, s2, a2, cfg.num_critics, cfg.critic_subset, cfg.value,
                                 sac.generator)
            if cfg.backup_entropy:
                q2 = q2 - sac.alpha * logp2
            y = b["reward"] + b.get("discount", cfg.gamma) * (1.0 - b["done"]) * q2
        s = sac.features(b["obs"])  # with gradient: Q^A's TD loss trains the encoder (cnn)
        qa = self.qa(s, self._qa_action(b))
        loss = ((qa - y.unsqueeze(0)) ** 2).mean(dim=1).sum()
        self.qa_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.qa_opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(list(self.qa_target.parameters()), list(self.qa.parameters()), cfg.tau)
        return s, qa, loss.detach()

    def _distill_step(self, s: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        """One step of (Q^W(s, w) - mean_i Q^A_i(s, pi_vla(s, w)))^2, w ~ N(0, I) clipped to the bound."""
        sac = self.sac
        w = torch.randn(len(s), self.noise_dim, generator=sac.generator).clamp(-self.cfg.noise_bound,
                                                                               self.cfg.noise_bound)
        with torch.no_grad():
            a = self.chunk(feat, w, normalized=True)[:, : self.exec_steps].reshape(len(s), -1)
            target = self.qa(s, a).mean(dim=0)
        qw = sac.critic(s, w)
        loss = ((qw - target.unsqueeze(0)) ** 2).mean(dim=1).sum()
        sac.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        sac.critic_opt.step()
        return loss.detach()

    @torch.no_grad()
    def critic_diagnostics(self, online: ReplayBuffer) -> dict[str, float]:
        """Does the critic give the actor a signal? At the first ``diag_states`` decision states of ``online``
        (``policies.common.decisions``: the executed chunk closes or opens the gripper; the first states of the
        buffer until there is one, ``diag/at_decision_states`` 0) and ``diag_noises`` fixed noises w ~ N(0, I) (clipped; drawn from
        their own seeded generator, so the training RNG streams are untouched): the spread over w of
        Q^W(s, w) and (NA) of Q^A(s, pi_vla(s, w)), as the std and the max - min over w, averaged over
        the states (flat spreads: the actor sees no gradient). ``qw_policy_gain``: Q^W at the policy's
        mean noise minus its mean over the random noises (> 0: the actor has found noises its critic
        prefers). Critics are ensemble means."""
        idx, at_decisions = decision_indices(online, self.vla, self.cfg.diag_states)
        k = len(idx)
        if k == 0:
            return {}
        obs = online.gather(idx)["obs"]
        s = self.sac.features(obs)
        m, d = self.cfg.diag_noises, self.noise_dim
        b = self.sac.actor.action_scale
        w = torch.randn(m, d, generator=torch.Generator().manual_seed(0)).clamp(-b, b)
        s_rep = s.repeat_interleave(m, dim=0)  # [k*m, D]: state i with every noise j
        w_rep = w.repeat(k, 1)
        out = {}
        qw = self.sac.critic(s_rep, w_rep).mean(dim=0).reshape(k, m)
        out.update(_spread("diag/qw", qw))
        w_pi = self.sac.actor.action_scale * torch.tanh(self.sac.actor(s)[0])
        out["diag/qw_policy_gain"] = float((self.sac.critic(s, w_pi).mean(dim=0) - qw.mean(dim=1)).mean())
        if self.cfg.variant == "na":
            feat = obs["feat"].repeat_interleave(m, dim=0)
            a = self.chunk(feat, w_rep, normalized=True, generator=torch.Generator().manual_seed(1))
            a = a[:, : self.exec_steps].reshape(k * m, -1)
            out.update(_spread("diag/qa", self.qa(s_rep, a).mean(dim=0).reshape(k, m)))
        out["diag/at_decision_states"] = float(at_decisions)
        return out

    # -- exact resume --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        d = {"sac": self.sac.state_dict(), "updates": self.updates, "config": dataclasses.asdict(self.cfg)}
        if self.cfg.variant == "na":
            d.update(qa=self.qa.state_dict(), qa_target=self.qa_target.state_dict(), qa_opt=self.qa_opt.state_dict())
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        for k in ("variant", "encoder"):
            saved = d["config"].get(k, "vla" if k == "encoder" else None)
            if saved != getattr(self.cfg, k):
                raise ValueError(f"the checkpoint's agent has {k} {saved!r}, this one {getattr(self.cfg, k)!r}")
        self.sac.load_state_dict(d["sac"])
        self.updates = int(d["updates"])
        if self.cfg.variant == "na":
            self.qa.load_state_dict(d["qa"])
            self.qa_target.load_state_dict(d["qa_target"])
            self.qa_opt.load_state_dict(d["qa_opt"])


def _spread(name: str, q: torch.Tensor) -> dict[str, float]:
    """q [states, noises] -> the std and the max - min over the noises, each averaged over the states."""
    return {f"{name}_spread_std": float(q.std(dim=1).mean()),
            f"{name}_spread_range": float((q.max(dim=1).values - q.min(dim=1).values).mean())}
