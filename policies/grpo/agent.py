"""GRPO on a flow VLA, with LfH's hindsight relabelling (``vla rl --method grpo`` / ``--method lfh``).

One update, top to bottom (``GRPOAgent._update``):

1. The session runs ``group_size`` training episodes from one scene (``episodes_per_scene``: the same seed), the VLA
   acting through its stochastic sampler (``sample_actions_stochastic``: Gaussian denoising steps of std ``sigma``),
   each macro-step keeping the observation, the sampled chain and its per-step log-probabilities (and the VLA's
   ``frozen_features`` where it has them: the update then never runs the frozen vision trunk again). An episode's reward
   is binary: the task's success.
2. After ``groups_per_update`` groups: each group's advantages A_i = (R_i - mean R) / (std R + delta). A group whose
   rewards are all equal has no signal (``usable`` counts the others).
3. LfH (``hindsight`` != off), for each group with mean R < eta: an anchor drawn uniformly among its failures; the
   judge proposes g', what the anchor did achieve, or Nothing (the group is skipped); the judge scores every rollout
   of the group under g' (yes 1, unsure 0.5, no 0); hindsight advantages from those scores.
4. ``epochs`` passes of PPO-clip over minibatches of macro-steps. Each denoising step is a token: ratio
   pi_theta(step | o, g) / pi_old(step | o, g), surrogate -min(rA, clip(r)A) averaged over tokens. A hindsight item's
   ratio is pi_theta(step | o, g') / pi_old(step | o, g): the prompt re-encoded with g', the rollout's old
   log-probabilities kept. Loss: L_GRPO + lambda * rescale(L_H, c) + kl_coef * KL(pi_theta || pi_ref), each
   surrogate dual-clipped (a negative-advantage token's loss at most -3 A).

The weights move on the agent's own copy of the VLA (``policy``); the session's VLA (the reference of the KL) and
the base checkpoint's files are untouched. ``summarize`` writes the tuned copy as a checkpoint, ``RUN/policy``, which
``vla eval`` and ``vla rl`` load like any other. Evaluations take the tuned policy's deterministic sampler (the flow
ODE from the evaluation's noise), as the base is evaluated.

GRPO is on-policy: it runs in-process only (``split_refusal``).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from typing import Any

import numpy as np
import torch

from policies.base import Act, Agent
from policies.common.diversity import chunk_distance, ee_coverage, ee_position
from policies.grpo.config import GRPOConfig


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(R - mean R) / (std R + eps) within one group (population std); all-equal rewards give zeros."""
    r = torch.as_tensor(rewards, dtype=torch.float32)
    std = r.std(unbiased=False)
    return (r - r.mean()) / (std + eps) if float(std) > 0 else torch.zeros_like(r)


def clipped_surrogate(new_logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float,
                      mask: torch.Tensor | None = None, dual_clip: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip over tokens: ``new_logp`` / ``old_logp`` [B, K] (one column per denoising step), ``adv`` [B]
    (one per macro-step, broadcast over its tokens), ``mask`` [B, K] the stochastic steps. ``dual_clip`` c > 1
    bounds a negative-advantage token's loss at -c A (dual-clip PPO, Ye et al. 2020): a ratio far above 1 with
    A < 0 -- what a hindsight prompt g' gives against the old policy under g -- no longer scales the gradient
    without bound. -> (loss, stats)."""
    if mask is None:
        mask = torch.ones_like(new_logp)
    ratio = torch.exp((new_logp - old_logp).clamp(-20.0, 20.0))
    a = adv[:, None]
    surr = -torch.min(ratio * a, ratio.clamp(1.0 - clip, 1.0 + clip) * a)
    if dual_clip > 1.0:
        surr = torch.where(a < 0, torch.minimum(surr, -dual_clip * a), surr)
    n = mask.sum().clamp(min=1.0)
    loss = (surr * mask).sum() / n
    with torch.no_grad():
        clipped = (((ratio - 1.0).abs() > clip).float() * mask).sum() / n
        approx_kl = (((ratio - 1.0) - (new_logp - old_logp)) * mask).sum() / n
    return loss, {"clip_fraction": float(clipped), "approx_kl": float(approx_kl)}


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(pi_theta || pi_ref) per token by the k3 estimator exp(q) - q - 1, q = log pi_ref - log pi_theta."""
    q = (ref_logp - logp).clamp(-20.0, 20.0)
    return ((torch.exp(q) - q - 1.0) * mask).sum() / mask.sum().clamp(min=1.0)


@dataclasses.dataclass
class Step:
    """One macro-step of a training rollout: the observation (a batch of one, as ``VLAPolicy.batch`` makes it), the
    sampled chain [K+1, H, A] and its per-step log-probabilities [K] under the policy that acted, and the behaviour
    token it was sampled under (ExToken; None: no token)."""

    obs: dict[str, Any]
    chain: torch.Tensor
    logp: torch.Tensor
    token: int | None = None
    features: dict[str, torch.Tensor] | None = None
    """The VLA's ``frozen_features`` of ``obs`` (the compact VLA's trunk maps), kept so that the update does not run
    the frozen trunk again for every epoch and for the reference (None: the VLA has nothing to cache)."""


@dataclasses.dataclass
class Rollout:
    instruction: str
    steps: list[Step] = dataclasses.field(default_factory=list)
    frames: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
    achieved_tasks: set[str] = dataclasses.field(default_factory=set)
    achieved_skills: set[str] = dataclasses.field(default_factory=set)
    subgoals: set[str] = dataclasses.field(default_factory=set)
    success: bool = False
    ee: list[np.ndarray] = dataclasses.field(default_factory=list)
    """The end effector's position [3] at the reset and after every chunk (trajectory diversity)."""
    first_chunk: np.ndarray | None = None
    """The first macro-step's executed chunk, in the VLA's normalised units (trajectory diversity)."""


def batch_steps(steps: list[Step], instructions: list[str]) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """Macro-steps -> (observation batch with ``instructions``, chains [B, K+1, H, A], old log-probs [B, K])."""
    cams = steps[0].obs["images"].keys()
    obs = {"images": {c: np.concatenate([s.obs["images"][c] for s in steps]) for c in cams},
           "state": np.concatenate([s.obs["state"] for s in steps]), "instruction": list(instructions)}
    return obs, torch.stack([s.chain for s in steps]), torch.stack([s.logp for s in steps])


def batch_features(steps: list[Step]) -> dict[str, Any]:
    """The macro-steps' cached frozen features as ``chain_logprob``'s keyword (``{"features": {key: [B, ...]}}``),
    or no keyword when any step lacks them (the VLA recomputes everything)."""
    if any(s.features is None for s in steps):
        return {}
    return {"features": {k: torch.cat([s.features[k] for s in steps]) for k in steps[0].features}}


def step_tokens(steps: list[Step]) -> torch.Tensor | None:
    """The macro-steps' behaviour tokens, long [B] (ExToken: the ratio and the KL are taken under the token the
    rollout was sampled with), or None when no step carries one (token-free GRPO)."""
    tokens = [s.token for s in steps]
    if all(t is None for t in tokens):
        return None
    if any(t is None for t in tokens):
        raise ValueError("a minibatch mixes macro-steps with and without a behaviour token")
    return torch.tensor(tokens, dtype=torch.long)


class GRPOAgent(Agent):
    name = "grpo"
    HANDLES = ("instruction", "sample_actions_stochastic", "chain_logprob", "normalize_actions", "noise")

    def __init__(self, vla, cfg: GRPOConfig = GRPOConfig(), seed: int = 0) -> None:
        self.vla = vla  # the session's frozen VLA: the KL's reference, never trained
        self.cfg = cfg
        self.seed = int(seed)
        h, a = (int(x) for x in vla.action_shape)
        self.exec_steps = h if cfg.exec_steps is None else int(cfg.exec_steps)
        if self.exec_steps > h:
            raise ValueError(f"{type(cfg).__name__}.exec_steps {self.exec_steps} exceeds the VLA's chunk of {h} rows")
        self.chunk_shape = (self.exec_steps, a)
        self.obs_spec = {"step": ((1,), np.float32)}  # nothing to replay: GRPO learns from its own rollouts
        self.action_dim = 1
        self.episodes_per_scene = int(cfg.group_size)
        self.policy = self._trainable_copy(vla)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if not params:
            raise ValueError(f"train {cfg.train!r} leaves no trainable parameter in {type(vla).__name__}")
        self.optimizer = torch.optim.Adam(params, lr=cfg.lr)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.rng = np.random.default_rng(self.seed)
        self.updates = 0
        self.task = None
        self.judge = None
        self._groups: list[list[Rollout]] = []
        self._group: list[Rollout] = []
        self._rollout: Rollout | None = None
        self._clip_history: list[float] = []
        self._clip_c: float | None = None
        self._relabels_log: dict[str, Any] = {}
        self._t_rollouts: float | None = None
        self._t_sampling = 0.0
        self.totals = {"groups": 0, "usable_task": 0, "usable_any": 0, "relabel_tried": 0, "relabel_nothing": 0,
                       "relabel_usable": 0}

    def _trainable_copy(self, vla):
        policy = copy.deepcopy(vla)
        for p in policy.parameters():
            p.requires_grad_(False)
        if self.cfg.train == "head":
            head = getattr(policy, "head", None)
            if not isinstance(head, torch.nn.Module):
                raise ValueError(f"train 'head' needs the VLA's flow action expert (`head`); {type(vla).__name__} "
                                 "has none: use train 'policy' or 'lora'")
            for p in head.parameters():
                p.requires_grad_(True)
        elif self.cfg.train == "policy":
            policy.set_mode("frozen")
        else:
            policy.set_mode("lora", lora_rank=self.cfg.lora_rank, lora_alpha=2 * self.cfg.lora_rank)
        policy.eval()  # no dropout / BatchNorm statistics: the ratio compares like with like
        return policy

    @classmethod
    def split_refusal(cls, cfg) -> str | None:
        return ("GRPO is on-policy (every update reads the rollouts the current weights made): run it in-process, "
                "--updates lockstep")

    # -- acting -------------------------------------------------------------------------------------
    def bind(self, task: Any = None, instruction: str | None = None) -> None:
        self.task = task
        if self.cfg.hindsight != "off":
            from rewards.judges import make_judge

            self.judge = make_judge(self.cfg.judge)

    def observe(self, obs: dict) -> dict[str, Any]:
        from vla.envs import VLAPolicy

        return {"step": torch.zeros(1, 1), "batch": VLAPolicy.batch(obs)}

    def begin_episode(self, obs: dict, info: dict, learn: bool = False) -> None:
        self._rollout = Rollout(instruction=str(obs["instruction"])) if learn else None
        if learn:
            if not self._groups and not self._group:  # the first rollout of an update's groups
                self._t_rollouts, self._t_sampling = time.perf_counter(), 0.0
            self._note(obs, info)

    def act_chunk(self, aobs: dict[str, Any], rng: np.random.Generator, warmup: bool, deterministic: bool = False,
                  generator: torch.Generator | None = None) -> Act:
        """Training episodes: the stochastic sampler, the step kept for the update. Evaluations: the tuned policy's
        deterministic sampler from the evaluation's noise (zero noise when ``deterministic``)."""
        batch = aobs["batch"]
        t0 = time.perf_counter()
        token = self.chunk_token(batch, generator)
        with torch.no_grad():
            if self._rollout is not None:
                # a duck-typed VLA may not offer one
                cache = getattr(self.policy, "frozen_features", None) if self.cfg.cache_features else None
                feats = cache(batch) if cache is not None else None
                s = self.policy.sample_actions_stochastic(batch, token=token, sigma=self.cfg.sigma,
                                                          generator=self.generator,
                                                          **({} if feats is None else {"features": feats}))
                self._rollout.steps.append(Step(obs=batch, chain=s.chain[0].float(), logp=s.logprob[0].float(),
                                                token=token, features=feats))
                chunk = self.policy.clip_normalized_actions(s.chain[0, -1])
                if self._rollout.first_chunk is None:
                    self._rollout.first_chunk = chunk[: self.exec_steps].float().numpy().copy()
            else:
                shape = (1, *self.policy.noise_shape)
                noise = torch.zeros(shape) if deterministic else torch.randn(shape, generator=generator or self.generator)
                actions = self.policy.sample_actions(batch, noise=noise, token=token)
                chunk = self.policy.clip_normalized_actions(self.policy.normalize_actions(actions))[0]
        if self._rollout is not None:
            self._t_sampling += time.perf_counter() - t0
        return Act(action=np.zeros(1, np.float32), chunk=chunk[: self.exec_steps].float())

    def chunk_token(self, batch: dict[str, Any], generator: torch.Generator | None = None) -> int | None:
        """The behaviour token this macro-step samples under (None: none; ExToken draws one)."""
        return None

    def _note(self, obs: dict, info: dict) -> None:
        r = self._rollout
        r.frames.append({c: np.asarray(v) for c, v in obs["images"].items()})
        r.achieved_tasks |= set(info.get("achieved_tasks") or ())
        r.achieved_skills |= set(info.get("achieved_skills") or ())
        r.subgoals |= {k for k, v in (info.get("subgoals") or {}).items() if v}
        p = ee_position(obs, info)
        if p is not None:
            r.ee.append(p)

    def after_chunk(self, obs: dict, info: dict) -> None:
        if self._rollout is not None:
            self._note(obs, info)

    def end_episode(self, result: dict[str, Any]) -> dict[str, float]:
        """A training episode ended: it joins its group; an update runs once ``groups_per_update`` groups are full."""
        r, self._rollout = self._rollout, None
        if r is None:
            return {}
        r.success = bool(result["success"])
        r.frames = _keep_frames(r.frames, self.cfg.judge_frames)
        self._group.append(r)
        if len(self._group) == self.cfg.group_size:
            self._groups.append(self._group)
            self._group = []
        if len(self._groups) == self.cfg.groups_per_update:
            t0 = time.perf_counter()
            info = self._update()
            # the cost of an update (issue 64): its rollouts (acting, the robot, and whatever the session ran between
            # them: evaluations too) and the update itself, in seconds of this process's wall clock
            info["time/update_s"] = time.perf_counter() - t0
            if self._t_rollouts is not None:
                info["time/rollouts_s"] = t0 - self._t_rollouts
                info["time/sampling_s"] = self._t_sampling  # of which the VLA's stochastic sampler
            return info
        return {}

    def update(self, online, demo, rng: np.random.Generator) -> dict[str, float]:
        return {}  # on-policy: the update runs when a batch of groups is complete (end_episode)

    # -- LfH ----------------------------------------------------------------------------------------
    def relabel(self, group: list[Rollout]) -> tuple[str, torch.Tensor] | None:
        """LfH for one group: (g', hindsight rewards [G]) or None (the judge saw Nothing). The anchor is uniform
        among the group's failures."""
        from rewards.judges import VERDICT_SCORE, EpisodeRecord

        fails = [i for i, r in enumerate(group) if not r.success]
        if not fails:
            return None
        records = [EpisodeRecord(instruction=r.instruction, frames=r.frames, success=r.success,
                                 achieved_tasks=tuple(sorted(r.achieved_tasks)), subgoals=tuple(sorted(r.subgoals)),
                                 achieved_skills=tuple(sorted(r.achieved_skills)))
                   for r in group]
        anchor = int(fails[int(self.rng.integers(len(fails)))])
        g2 = self.judge.propose_instruction(records[anchor])
        if g2 is None:
            return None
        if self.cfg.hindsight == "random":
            scores = self.rng.integers(0, 2, len(group)).astype(np.float32)
        elif self.cfg.hindsight == "instruction-only":
            scores = np.array([float(r.success) for r in group], np.float32)
        else:
            scores = np.array([VERDICT_SCORE[self.judge.score(rec, g2)] for rec in records], np.float32)
        return g2, torch.from_numpy(scores)

    # -- the update ---------------------------------------------------------------------------------
    @staticmethod
    def diversity(groups: list[list[Rollout]]) -> dict[str, float]:
        """Trajectory diversity of the update's groups, averaged over groups: end-effector voxels (2 cm) visited by
        a group, and the mean pairwise distance of its rollouts' first chunks."""
        coverage = [ee_coverage([np.stack(r.ee) for r in g if r.ee]) for g in groups if any(r.ee for r in g)]
        distance = [chunk_distance([r.first_chunk for r in g if r.first_chunk is not None]) for g in groups
                    if sum(r.first_chunk is not None for r in g) > 1]
        info = {}
        if coverage:
            info["diversity/ee_coverage"] = float(np.mean(coverage))
        if distance:
            info["diversity/chunk_distance"] = float(np.mean(distance))
        return info

    def _update(self) -> dict[str, float]:
        cfg = self.cfg
        groups, self._groups = self._groups, []
        items: list[tuple[Step, float, str, bool]] = []  # (step, advantage, prompt for the numerator, hindsight)
        n_usable_task = n_usable_any = n_tried = n_nothing = n_relabel_usable = 0
        relabels: list[str] = []
        rewards = []
        for g in groups:
            R = torch.tensor([float(r.success) for r in g])
            rewards.append(R)
            A = group_advantages(R, cfg.adv_eps)
            usable = bool(A.abs().sum() > 0)
            if usable:
                items += [(s, float(a), r.instruction, False) for r, a in zip(g, A) for s in r.steps]
            usable_h = False
            if cfg.hindsight != "off" and float(R.mean()) < cfg.eta:
                n_tried += 1
                h = self.relabel(g)
                if h is None:
                    n_nothing += 1
                else:
                    g2, Rh = h
                    relabels.append(g2)
                    Ah = group_advantages(Rh, cfg.adv_eps)
                    usable_h = bool(Ah.abs().sum() > 0)
                    if usable_h:
                        n_relabel_usable += 1
                        prompt = g2 if cfg.hindsight != "rescore-only" else None
                        items += [(s, float(a), prompt or r.instruction, True) for r, a in zip(g, Ah) for s in r.steps]
            n_usable_task += usable
            n_usable_any += usable or usable_h
        t = self.totals
        t["groups"] += len(groups)
        t["usable_task"] += n_usable_task
        t["usable_any"] += n_usable_any
        t["relabel_tried"] += n_tried
        t["relabel_nothing"] += n_nothing
        t["relabel_usable"] += n_relabel_usable
        info: dict[str, float] = {
            "charts/group_success": float(torch.cat(rewards).mean()),
            "charts/usable_groups": n_usable_task / len(groups),
            "charts/usable_groups_with_hindsight": n_usable_any / len(groups),
            "charts/relabel_tried": float(n_tried), "charts/relabel_nothing": float(n_nothing),
            **self.diversity(groups),
        }
        self.updates += 1
        if not items:  # no group had a signal: nothing to learn from
            info["losses/policy"] = 0.0
            info["diag/macro_steps"] = 0.0
            self._relabels_log = {"relabels": relabels} if cfg.hindsight != "off" else {}
            return info
        ref_cache: dict[int, torch.Tensor] = {}  # the base's log-probabilities per item (the KL's pi_ref), once
        stats: dict[str, list[float]] = {"policy": [], "hindsight": [], "kl": [], "clip_fraction": [], "approx_kl": []}
        order = np.arange(len(items))
        h_losses = []
        for _ in range(cfg.epochs):
            self.rng.shuffle(order)
            for lo in range(0, len(order), cfg.minibatch):
                idx = order[lo: lo + cfg.minibatch]
                mb = [items[i] for i in idx]
                obs, chain, old = batch_steps([m[0] for m in mb], [m[2] for m in mb])
                # the frozen trunk's maps from the rollout (the policy's frozen part is the reference's: a copy
                # that is never trained), so neither pass below runs it again
                feats = batch_features([m[0] for m in mb])
                tok = step_tokens([m[0] for m in mb])  # the rollouts' own tokens, for pi_theta and pi_ref alike
                adv = torch.tensor([m[1] for m in mb])
                hind = torch.tensor([m[3] for m in mb])
                mask = (old != 0).float()  # the deterministic last step has no log-probability
                new = self.policy.chain_logprob(obs, chain, token=tok, sigma=cfg.sigma, **feats)
                if not all(int(i) in ref_cache for i in idx):  # the first epoch: every item once
                    with torch.no_grad():
                        ref_cache.update(zip(map(int, idx), self.vla.chain_logprob(obs, chain, token=tok,
                                                                                   sigma=cfg.sigma, **feats)))
                ref = torch.stack([ref_cache[int(i)] for i in idx])
                kl = k3_kl(new, ref, mask)
                loss = kl * cfg.kl_coef
                stats["kl"].append(float(kl.detach()))
                for is_h in (False, True):
                    sel = hind == is_h
                    if not bool(sel.any()):
                        continue
                    part, st = clipped_surrogate(new[sel], old[sel], adv[sel], cfg.clip, mask[sel], cfg.dual_clip)
                    if is_h:
                        h_losses.append(float(part.detach().abs()))
                        c = self._clip_c
                        if c is not None and float(part.detach().abs()) > c > 0:
                            part = part * (c / float(part.detach().abs()))
                        loss = loss + cfg.hindsight_coef * part
                        stats["hindsight"].append(float(part.detach()))
                    else:
                        loss = loss + part
                        stats["policy"].append(float(part.detach()))
                        stats["clip_fraction"].append(st["clip_fraction"])
                        stats["approx_kl"].append(st["approx_kl"])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(
                        [p for p in self.policy.parameters() if p.requires_grad], cfg.max_grad_norm)
                self.optimizer.step()
        if h_losses and self._clip_c is None:
            self._clip_history += h_losses
            if self.updates >= cfg.hindsight_clip_updates:
                self._clip_c = float(np.percentile(self._clip_history, cfg.hindsight_clip_percentile))
        for k, v in stats.items():
            if v:
                info[f"losses/{k}" if k in ("policy", "hindsight", "kl") else f"diag/{k}"] = float(np.mean(v))
        info["diag/macro_steps"] = float(len(items))
        self._relabels_log = {"relabels": relabels} if cfg.hindsight != "off" else {}
        return info

    # -- logs ---------------------------------------------------------------------------------------
    def episode_log(self) -> dict[str, Any]:
        """The hindsight instructions of the update this episode completed (its line of ``episodes.jsonl``)."""
        out, self._relabels_log = self._relabels_log, {}
        return out

    def summarize(self, run_dir: str) -> dict[str, Any]:
        """Write the tuned VLA to ``RUN/policy`` (a checkpoint like any other) and report the group statistics."""
        out = os.path.join(run_dir, "policy")
        if hasattr(self.policy, "save"):
            self.policy.save(out, extra={"tuned_by": self.cfg.hindsight != "off" and "lfh" or "grpo",
                                         "grpo_updates": self.updates})
        t = self.totals
        g = max(t["groups"], 1)
        return {"tuned_checkpoint": "policy" if hasattr(self.policy, "save") else None, "updates": self.updates,
                "groups": t["groups"], "usable_groups_share": t["usable_task"] / g,
                "usable_groups_share_with_hindsight": t["usable_any"] / g,
                "relabels_tried": t["relabel_tried"], "relabels_nothing": t["relabel_nothing"],
                "hindsight_clip_c": self._clip_c,
                "judge": None if self.judge is None else {"name": getattr(self.judge, "name", type(self.judge).__name__),
                                                          "privileged": bool(getattr(self.judge, "privileged", False)),
                                                          **(self.judge.stats() if hasattr(self.judge, "stats") else {})}}

    # -- state --------------------------------------------------------------------------------------
    def _trainable_state(self) -> dict[str, torch.Tensor]:
        names = {n for n, p in self.policy.named_parameters() if p.requires_grad}
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items() if k in names}

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self._trainable_state(), "optimizer": self.optimizer.state_dict(), "updates": self.updates,
                "generator": self.generator.get_state(), "rng": self.rng.bit_generator.state,
                "groups": self._groups, "group": self._group, "clip_history": self._clip_history,
                "clip_c": self._clip_c, "totals": dict(self.totals)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        missing = set(self._trainable_state()) - set(d["policy"])
        if missing:
            raise ValueError(f"GRPO state lacks trainable weights {sorted(missing)[:3]}: saved with another --train?")
        self.policy.load_state_dict(d["policy"], strict=False)
        self.optimizer.load_state_dict(d["optimizer"])
        self.updates = int(d["updates"])
        self.generator.set_state(d["generator"])
        self.rng.bit_generator.state = d["rng"]
        self._groups, self._group = d["groups"], d["group"]
        self._clip_history, self._clip_c = list(d["clip_history"]), d["clip_c"]
        self.totals = dict(d["totals"])

    def actor_parameters(self) -> dict[str, Any]:
        return self._trainable_state()

    def load_actor_parameters(self, params: dict[str, Any]) -> None:
        self.policy.load_state_dict(params, strict=False)

    def parameter_counts(self) -> dict[str, int]:
        n = sum(p.numel() for p in self.policy.parameters() if p.requires_grad)
        return {"policy": n, "total": n}


def _keep_frames(frames: list, n: int) -> list:
    """``n`` frames evenly spaced over the episode, the first and the last always among them."""
    if len(frames) <= n:
        return frames
    idx = np.unique(np.linspace(0, len(frames) - 1, n).round().astype(int))
    return [frames[i] for i in idx]


class LfHAgent(GRPOAgent):
    """GRPO with LfH's hindsight relabelling on by default (``LfHConfig``)."""

    name = "lfh"

    def __init__(self, vla, cfg=None, seed: int = 0) -> None:
        from policies.grpo.config import LfHConfig

        super().__init__(vla, cfg if cfg is not None else LfHConfig(), seed=seed)
