"""SafeExplorer (R): PPO whose rollouts hand control to a deterministic recovery policy outside a safe region.

No code was found for SafeExplorer; this is a reconstruction from the paper's description (METHODS.md),
written as CleanRL's ``ppo_continuous_action.py`` (one env, Gaussian policy with a state-independent log
std, tanh MLPs 64 x 64, GAE, clipped surrogate, 10 epochs x 32 minibatches, lr 3e-4 annealed) plus four
switchable pieces (``SafeExplorerConfig``; ``SAFEEXPLORER_VARIANTS`` names the ablation rows):

1. **Recovery outside R** (``use_recovery``). The env side supplies a :class:`RecoverySpec`: ``in_region(obs,
   level)`` (is the raw observation inside R_level, e.g. torso height and tilt limits) and a deterministic
   ``recovery(obs)`` (e.g. a stand-up / stabilise controller). At every step of a rollout: if s_t is in R the
   learner samples a_t ~ pi_theta(.|s_t) (a *learner* timestep, t in T_R); otherwise the recovery acts,
   a_t = recovery(s_t), until the state is back in R (and, where the spec has ``settled``, the recovery has
   finished its manoeuvre: a stand-up that passes through R mid-rise is not interrupted). Off (variant
   ``ppo``): plain PPO, a fall ends the episode, as it does in every variant when the recovery fails.
2. **Masked policy gradient.** Importance sampling is undefined for a deterministic behaviour policy, so the
   clipped surrogate keeps only the learner's timesteps::

       L_PG = -(1 / |T_R|) sum_{t in T_R} min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t),
       rho_t = pi_theta(a_t | s_t) / pi_old(a_t | s_t)

   (:func:`masked_pg_loss`, per minibatch), while the advantages come from GAE over the *full* mixed
   trajectory (:func:`gae`): the rewards collected while the recovery acted reach the learner's actions
   that led out of R through the recursion A_t = delta_t + gamma lambda A_{t+1}.
3. **Analytic value of recovery states** (``analytic_value``). With deterministic dynamics and recovery, the
   recovery segment from a state s_t outside R is a function of s_t alone, so its value is known exactly
   once the segment has been recorded (:func:`recovery_values`; "recorded from the trajectory", no model)::

       V_R(s_t) = sum_{j=0}^{k-1} gamma^j r_{t+j} + gamma^k V_phi(s_{t+k})

   where t + k is the first step at which the learner acts again (re-entry into R; V_phi the critic there),
   the bootstrap is 0 when the recovery ended in a fall (termination) and V_phi(last state) when the
   segment is cut by a time limit or the end of the rollout. V_R replaces the critic at recovery states in
   GAE (the TD errors inside a segment are then exactly 0, and the learner step that left R sees the exact
   cost of the recovery), and the critic is trained on the learner's states only. Off: the critic predicts
   the value of recovery states like any other and is trained on all states.
4. **Outcome-gated compatibility loss** (``compat_loss``): behaviour cloning of the recovery's actions,
   ``L_C = mean over gated t of ||mu_theta(s_t) - a_t^rec||^2 / A`` (the Gaussian policy's mean; its std is
   left alone), on the steps of recovery segments whose *outcome* was a re-entry into R. Segments that
   ended in a fall, or were cut by a time limit or the end of the rollout, are not imitated. As R grows,
   the learner then already acts like the recovery in the states it inherits from it.
5. **Curriculum** (``curriculum``): R = R_d with d growing linearly from ``d0`` to ``dmax`` over
   ``curriculum_steps`` env steps (:meth:`SafeExplorer.level`); off, R = R_dmax. ``level`` is the spec's
   size parameter in (0, 1]: 1 the largest region the recovery is trusted from.

The total loss is L_PG - ent_coef H + vf_coef L_V + compat_coef L_C. Observations are normalised by running
statistics for the networks (the RecoverySpec always sees the raw observation). Falls are counted as the
env's terminations.

Not in ``policies.REGISTRY``: SafeExplorer is on-policy and drives its env itself (``collect``), while the
``Agent`` interface is a replay-buffer method acting through a VLA's steering handles. ``policies`` never
imports ``hardware``: a robot's region and recovery come in as callables from the env side (``bench/``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np
import torch
from torch import nn
from torch.distributions.normal import Normal

from policies.safety.config import SafeExplorerConfig


@dataclasses.dataclass(frozen=True)
class RecoverySpec:
    """The env side's safe region and recovery policy, on raw observations (numpy, one state)."""

    in_region: Callable[[np.ndarray, float], bool]
    """(obs, level) -> whether obs lies in R_level; R_level grows with level in (0, 1]."""
    recovery: Callable[[np.ndarray], np.ndarray]
    """obs -> the recovery's action [A] (deterministic given the state and the segment's start)."""
    start: Callable[[np.ndarray], None] | None = None
    """Called with the first state of every recovery segment (a stateful controller resets its phase here)."""
    settled: Callable[[], bool] | None = None
    """Whether the running recovery has finished its manoeuvre (e.g. a stand-up controller that has held its
    posture for its settle time). Given, a segment hands control back only once the state is in R *and* the
    recovery has settled: a robot that passes through R while still falling or rising is not handed back
    mid-manoeuvre. None: control returns the moment the state re-enters R (the paper's rule)."""


# -- the pieces, as functions (tested one by one) -------------------------------------------------
def gae(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray, terminated: np.ndarray,
        ends: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """GAE over one env's trajectory of T steps (episodes concatenated). ``values[t]`` = V(s_t),
    ``next_values[t]`` = V(s_{t+1}) of the state the step reached (for a truncated episode the last
    observation before the reset); ``terminated[t]``: s_{t+1} is terminal (no bootstrap); ``ends[t]``:
    the episode ended after step t (terminated or truncated: the recursion stops).

        delta_t = r_t + gamma (1 - terminated_t) V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma lambda (1 - ends_t) A_{t+1}
    """
    T = len(rewards)
    adv = np.zeros(T, np.float64)
    last = 0.0
    for t in reversed(range(T)):
        delta = rewards[t] + gamma * (1.0 - terminated[t]) * next_values[t] - values[t]
        last = delta + gamma * lam * (1.0 - ends[t]) * last
        adv[t] = last
    return adv


def recovery_values(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray, terminated: np.ndarray,
                    ends: np.ndarray, learner: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """The analytic value of recovery states (module docstring, piece 3), recorded from the trajectory.

    -> (values, next_values) with every recovery state's entry replaced by
    V_R(s_t) = r_t + gamma (1 - terminated_t) V(s_{t+1}), where V(s_{t+1}) is V_R(s_{t+1}) while the
    recovery still acts at t + 1 in the same episode, else the given ``next_values[t]`` (the critic at the
    re-entry state, a truncated episode's last state or the state after the rollout). Unrolled:
    V_R(s_t) = sum_{j<k} gamma^j r_{t+j} + gamma^k V_phi(s_{t+k})."""
    T = len(rewards)
    v, nv = values.astype(np.float64).copy(), next_values.astype(np.float64).copy()
    for t in reversed(range(T)):
        if learner[t]:
            continue
        # nv[t] is V_R(s_{t+1}) when the recovery still acts at t + 1 (set below when t + 1 was done)
        v[t] = rewards[t] + gamma * (1.0 - terminated[t]) * nv[t]
        if t > 0 and not ends[t - 1]:
            nv[t - 1] = v[t]  # the step before (learner or recovery) reaches this state
    return v, nv


def masked_pg_loss(newlogprob: torch.Tensor, oldlogprob: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                   clip_coef: float) -> torch.Tensor:
    """L = -(1/|T_R|) sum_{t: mask_t} min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t); 0 when no step is
    masked in. Entries off the mask never touch the value or the gradient (a NaN there stays out)."""
    assert newlogprob.shape == oldlogprob.shape == adv.shape == mask.shape, \
        f"shapes {tuple(newlogprob.shape)}, {tuple(oldlogprob.shape)}, {tuple(adv.shape)}, {tuple(mask.shape)} differ"
    zero = torch.zeros((), dtype=newlogprob.dtype, device=newlogprob.device)
    ratio = torch.exp(torch.where(mask, newlogprob - oldlogprob, zero))
    a = torch.where(mask, adv, zero)
    per_step = torch.max(-a * ratio, -a * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef))  # = -min(rho A, clip A)
    return torch.where(mask, per_step, zero).sum() / mask.sum().clamp_min(1)


def compat_loss(mean: torch.Tensor, rec_action: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Outcome-gated BC: mean over gated steps of ||mu(s) - a_rec||^2 / A; 0 when nothing is gated."""
    assert mean.shape == rec_action.shape and gate.shape == mean.shape[:1], \
        f"mean {tuple(mean.shape)}, recovery actions {tuple(rec_action.shape)}, gate {tuple(gate.shape)}"
    err = ((mean - torch.where(gate[:, None], rec_action, mean.detach())) ** 2).mean(-1)
    return torch.where(gate, err, torch.zeros_like(err)).sum() / gate.sum().clamp_min(1)


def outcome_gate(learner: np.ndarray, terminated: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per step: True on the recovery steps of segments that ended with the learner acting again in the same
    episode (re-entry into R); False on learner steps, on segments that ended in a fall, were truncated, or
    are still open at the end of the trajectory."""
    T = len(learner)
    gate = np.zeros(T, bool)
    t = 0
    while t < T:
        if learner[t]:
            t += 1
            continue
        s = t  # a recovery segment: s .. e
        while t + 1 < T and not ends[t] and not learner[t + 1]:
            t += 1
        success = t + 1 < T and not ends[t] and learner[t + 1]
        gate[s:t + 1] = success
        t += 1
    return gate


class RunningMeanStd:
    """Running mean / variance of observations (Welford over batches; CleanRL's NormalizeObservation)."""

    def __init__(self, shape: tuple[int, ...], eps: float = 1e-4) -> None:
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), eps

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64).reshape(-1, *self.mean.shape)
        bm, bv, n = x.mean(0), x.var(0), x.shape[0]
        d, tot = bm - self.mean, self.count + n
        self.mean = self.mean + d * n / tot
        self.var = (self.var * self.count + bv * n + d ** 2 * self.count * n / tot) / tot
        self.count = tot

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -10, 10).astype(np.float32)


def _layer(i: int, o: int, std: float = np.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(i, o)
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, 0.0)
    return layer


def _mlp(i: int, hidden: tuple[int, ...], o: int, out_std: float) -> nn.Sequential:
    layers, d = [], i
    for h in hidden:
        layers += [_layer(d, h), nn.Tanh()]
        d = h
    return nn.Sequential(*layers, _layer(d, o, out_std))


class ActorCritic(nn.Module):
    """CleanRL's agent: critic V(s), actor mean mu(s) and a state-independent log std."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...], init_log_std: float) -> None:
        super().__init__()
        self.critic = _mlp(obs_dim, hidden, 1, 1.0)
        self.actor_mean = _mlp(obs_dim, hidden, act_dim, 0.01)
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), float(init_log_std)))

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def dist(self, x: torch.Tensor) -> tuple[Normal, torch.Tensor]:
        mean = self.actor_mean(x)
        return Normal(mean, self.actor_logstd.expand_as(mean).exp()), mean


# -- the method ----------------------------------------------------------------------------------
class SafeExplorer:
    """PPO with a recovery policy outside R (module docstring). ``collect(env)`` runs one rollout of
    ``cfg.num_steps`` steps on a gymnasium env (kept across calls), ``update(batch)`` runs the PPO epochs;
    ``train(env, total_steps)`` alternates them."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: SafeExplorerConfig = SafeExplorerConfig(),
                 recovery: RecoverySpec | None = None, seed: int = 0, total_steps: int | None = None) -> None:
        if cfg.use_recovery and recovery is None:
            raise ValueError("use_recovery=True needs a RecoverySpec (in_region, recovery) from the env side; "
                             "use variant 'ppo' to train without one")
        self.cfg, self.spec, self.obs_dim, self.act_dim = cfg, recovery, obs_dim, act_dim
        self.total_steps = total_steps
        torch.manual_seed(seed)
        self.net = ActorCritic(obs_dim, act_dim, cfg.hidden, cfg.init_log_std)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=cfg.learning_rate, eps=1e-5)
        self.obs_rms = RunningMeanStd((obs_dim,)) if cfg.norm_obs else None
        self.rng = np.random.default_rng(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.seed = seed
        self.global_step = 0
        self.stats = {"falls": 0, "episodes": 0, "takeovers": 0, "recoveries_ok": 0, "recoveries_failed": 0}
        self.episodes: list[dict[str, Any]] = []  # one row per finished episode
        self._obs: np.ndarray | None = None
        self._ep = {"return": 0.0, "length": 0, "recovery_steps": 0}
        self._act_recovering = False  # act()'s own recovery segment (evaluation), apart from collect()'s

    # -- helpers ----------------------------------------------------------------------------------
    def level(self, step: int | None = None) -> float:
        """The size of R at env step ``step`` (default now): d0 -> dmax linearly with the curriculum, else dmax."""
        c = self.cfg
        if not c.curriculum:
            return c.dmax
        frac = min(1.0, (self.global_step if step is None else step) / c.curriculum_steps)
        return c.d0 + (c.dmax - c.d0) * frac

    def norm(self, obs: np.ndarray) -> np.ndarray:
        return self.obs_rms(obs) if self.obs_rms is not None else np.asarray(obs, np.float32)

    def learner_acts(self, obs: np.ndarray, recovering: bool = False) -> bool:
        """Whether the learner acts in this raw state: always without recovery; else s in R_level, and, while a
        recovery segment is running (``recovering``) and the spec has ``settled``, only once it has settled."""
        if not self.cfg.use_recovery:
            return True
        inside = bool(self.spec.in_region(obs, self.level()))
        if inside and recovering and self.spec.settled is not None:
            return bool(self.spec.settled())
        return inside

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = True, with_recovery: bool = True) -> np.ndarray:
        """The action in one raw state (evaluation): the recovery's outside R (when on) and until it hands back
        (``RecoverySpec.settled``), else the policy's. Call :meth:`reset_act` at the start of an episode."""
        if with_recovery:
            recovering = self._act_recovering
            if not self.learner_acts(obs, recovering):
                if not recovering and self.spec.start is not None:
                    self.spec.start(np.asarray(obs, np.float64))
                self._act_recovering = True
                return np.asarray(self.spec.recovery(obs), np.float32)
            self._act_recovering = False
        d, mean = self.net.dist(torch.from_numpy(self.norm(obs))[None])
        return (mean if deterministic else d.sample())[0].numpy()

    def reset_act(self) -> None:
        """Forget a recovery segment :meth:`act` was running (a new episode starts with the learner)."""
        self._act_recovering = False

    # -- rollouts ---------------------------------------------------------------------------------
    @torch.no_grad()
    def collect(self, env) -> dict[str, np.ndarray]:
        """One rollout of ``num_steps`` env steps (continuing the env's episode across calls)."""
        T, c = self.cfg.num_steps, self.cfg
        low, high = env.action_space.low, env.action_space.high
        obs_n = np.zeros((T, self.obs_dim), np.float32)
        actions = np.zeros((T, self.act_dim), np.float32)
        logprobs, rewards, values = np.zeros(T, np.float32), np.zeros(T), np.zeros(T)
        learner, terminated, ends = np.zeros(T, bool), np.zeros(T, bool), np.zeros(T, bool)
        final_obs: dict[int, np.ndarray] = {}  # t -> last obs of a truncated episode (bootstrap)
        if self._obs is None:
            self._obs, _ = env.reset(seed=self.seed)
            self._prev_learner = True
        for t in range(T):
            raw = np.asarray(self._obs, np.float64)
            if self.obs_rms is not None:
                self.obs_rms.update(raw)
            x = torch.from_numpy(self.norm(raw))[None]
            obs_n[t] = x[0].numpy()
            values[t] = float(self.net.value(x))
            learner[t] = self.learner_acts(raw, recovering=not self._prev_learner)
            if learner[t]:
                d, _ = self.net.dist(x)
                a = d.sample()  # torch's global generator: seeded in __init__
                logprobs[t] = float(d.log_prob(a).sum(-1))
                actions[t] = a[0].numpy()
            else:  # the deterministic recovery acts; its log-prob is undefined and never used
                if self._prev_learner and self.spec.start is not None:
                    self.spec.start(raw)
                if self._prev_learner:
                    self.stats["takeovers"] += 1
                actions[t] = np.asarray(self.spec.recovery(raw), np.float32)
                self._ep["recovery_steps"] += 1
            self._prev_learner = bool(learner[t])
            nobs, r, term, trunc, info = env.step(np.clip(actions[t], low, high))
            self.global_step += 1
            rewards[t], terminated[t], ends[t] = r, term, term or trunc
            self._ep["return"] += float(r)
            self._ep["length"] += 1
            if term or trunc:
                if trunc and not term:
                    final_obs[t] = np.asarray(nobs, np.float64)
                self.stats["falls"] += int(term)
                self.stats["episodes"] += 1
                self.episodes.append({**self._ep, "fell": bool(term), "end_step": self.global_step,
                                      "level": self.level()})
                self._ep = {"return": 0.0, "length": 0, "recovery_steps": 0}
                nobs, _ = env.reset()
                self._prev_learner = True
            self._obs = nobs
        # V(s_{t+1}): the next row's value inside an episode, the critic on a truncated episode's last state,
        # the critic on the state after the rollout for the last step, 0 after a fall (unused: no bootstrap)
        next_values = np.zeros(T)
        next_values[:-1] = values[1:]
        next_values[ends] = 0.0
        tail = [(t, o) for t, o in final_obs.items()] + ([] if ends[-1] else [(T - 1, np.asarray(self._obs))])
        if tail:
            xs = torch.from_numpy(np.stack([self.norm(o) for _, o in tail]))
            for (t, _), v in zip(tail, self.net.value(xs).numpy()):
                next_values[t] = v
        seg_gate = outcome_gate(learner, terminated, ends)
        gate = seg_gate if c.compat_loss else np.zeros(T, bool)
        starts = ~learner & np.concatenate([[True], learner[:-1] | ends[:-1]])
        self.stats["recoveries_ok"] += int((starts & seg_gate).sum())
        self.stats["recoveries_failed"] += int((starts & ~seg_gate & self._segment_fell(learner, terminated, ends)).sum())
        if c.use_recovery and c.analytic_value:
            values, next_values = recovery_values(rewards, values, next_values, terminated, ends, learner, c.gamma)
        adv = gae(rewards, values, next_values, terminated, ends, c.gamma, c.gae_lambda)
        return {"obs": obs_n, "actions": actions, "logprobs": logprobs, "advantages": adv.astype(np.float32),
                "returns": (adv + values).astype(np.float32), "learner": learner, "gate": gate,
                "rewards": rewards, "terminated": terminated, "ends": ends}

    @staticmethod
    def _segment_fell(learner: np.ndarray, terminated: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Per step: True on the steps of recovery segments that ended in a fall."""
        out = np.zeros(len(learner), bool)
        t = 0
        while t < len(learner):
            if learner[t]:
                t += 1
                continue
            s = t
            while t + 1 < len(learner) and not ends[t] and not learner[t + 1]:
                t += 1
            out[s:t + 1] = bool(terminated[t])
            t += 1
        return out

    # -- the update ---------------------------------------------------------------------------------
    def update(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        c = self.cfg
        if c.anneal_lr and self.total_steps:
            self.opt.param_groups[0]["lr"] = c.learning_rate * max(0.0, 1.0 - self.global_step / self.total_steps)
        b = {k: torch.as_tensor(v) for k, v in batch.items()}
        T = len(b["rewards"])
        # the critic's targets: all states, or (analytic value) the learner's only -- recovery states have V_R
        vmask = b["learner"] if (c.use_recovery and c.analytic_value) else torch.ones(T, dtype=torch.bool)
        mb = T // c.num_minibatches
        logs: dict[str, list[float]] = {k: [] for k in ("pg", "v", "ent", "compat", "kl", "clipfrac")}
        for _ in range(c.update_epochs):
            perm = torch.from_numpy(self.rng.permutation(T))
            for i in range(0, T, mb):
                idx = perm[i:i + mb]
                m = b["learner"][idx]
                d, mean = self.net.dist(b["obs"][idx])
                newlogprob = d.log_prob(b["actions"][idx]).sum(-1)
                adv = b["advantages"][idx]
                if c.norm_adv and m.sum() > 1:  # normalised over the learner's timesteps only
                    am = adv[m]
                    adv = (adv - am.mean()) / (am.std() + 1e-8)
                # the clipped surrogate on the learner's timesteps only (rho is undefined where the recovery acted)
                pg = masked_pg_loss(newlogprob, b["logprobs"][idx], adv, m, c.clip_coef)
                newvalue = self.net.value(b["obs"][idx])
                vm = vmask[idx].float()
                v_loss = 0.5 * (((newvalue - b["returns"][idx]) ** 2) * vm).sum() / vm.sum().clamp_min(1)
                mf = m.float()
                ent = (d.entropy().sum(-1) * mf).sum() / mf.sum().clamp_min(1)
                # outcome-gated behaviour cloning of the recovery (steps of segments that re-entered R)
                cl = compat_loss(mean, b["actions"][idx], b["gate"][idx]) if c.compat_loss else torch.zeros(())
                loss = pg - c.ent_coef * ent + c.vf_coef * v_loss + c.compat_coef * cl
                self.opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.net.parameters(), c.max_grad_norm)
                self.opt.step()
                with torch.no_grad():
                    lr_ = (newlogprob - b["logprobs"][idx])[m]
                    if len(lr_):
                        logs["kl"].append(float(((lr_.exp() - 1) - lr_).mean()))  # the k3 estimator of KL
                        logs["clipfrac"].append(float(((lr_.exp() - 1).abs() > c.clip_coef).float().mean()))
                for k, v in (("pg", pg), ("v", v_loss), ("ent", ent), ("compat", cl)):
                    logs[k].append(float(v.detach()) if torch.is_tensor(v) else float(v))
        mean_ = lambda xs: float(np.mean(xs)) if xs else 0.0  # noqa: E731
        return {"losses/policy_loss": mean_(logs["pg"]), "losses/value_loss": mean_(logs["v"]),
                "losses/entropy": mean_(logs["ent"]), "losses/compat_loss": mean_(logs["compat"]),
                "losses/approx_kl": mean_(logs["kl"]), "losses/clipfrac": mean_(logs["clipfrac"]),
                "charts/learning_rate": self.opt.param_groups[0]["lr"],
                "charts/learner_fraction": float(batch["learner"].mean()),
                "charts/gated_fraction": float(batch["gate"].mean()), "charts/level": self.level()}

    def train(self, env, total_steps: int, callback: Callable[["SafeExplorer", dict], bool] | None = None) -> None:
        """Rollout / update until ``total_steps`` env steps; ``callback(agent, logs)`` after every update may
        return True to stop early."""
        self.total_steps = total_steps
        while self.global_step < total_steps:
            t0 = time.perf_counter()
            batch = self.collect(env)
            logs = self.update(batch)
            logs["charts/SPS"] = self.cfg.num_steps / (time.perf_counter() - t0)
            if callback is not None and callback(self, logs):
                break
