"""ExToken: exploration over behaviour tokens, layered on GRPO (``vla rl --method extoken``).

The VLA is token-conditioned, pi(a | s, c) (``vla train --tokens``: token c in 1..K names a cluster of the demos'
behaviours, 0 is the null token). ExToken is no learner of its own: GRPO (``policies.grpo.agent``) improves the
policy; ExToken decides which token each rollout runs under, and trains a selector p(c | s) that picks the token at
deployment. One update, top to bottom (``ExTokenAgent._update``):

1. The session runs ``group_size`` training episodes from one scene. Each draws its token(s) (``chunk_token``): at
   its first macro-step (``token_unit episode``) or at every one (``chunk``), by ``explore``: ``stratified`` (the
   group cycles through a random permutation of 1..K: every token is tried in every scene), ``selector``
   (c ~ p(. | s)) or ``uniform``. Each decision keeps (embedding of s, c, q = the probability c had under the
   behaviour distribution). The embedding is the session's frozen VLA's ``embed(obs)``, so the selector's input never
   drifts while the policy trains. The stochastic sampler runs under the token, and the token is stored in every
   ``Step``: GRPO's ratio pi_theta(step | o, c) / pi_old(step | o, c) and its KL to the reference (the session's VLA)
   are taken under the rollout's own token.
2. After ``groups_per_update`` groups, the diagnostics of what the tokens did, before anything moves: decisions per
   token, mean return per token, the selector's accuracy against each group's best token (on scenes it has not been
   trained on yet), trajectory diversity (end-effector voxels visited per group, pairwise distance of the first
   chunks).
3. GRPO's update of the policy (``learn_policy``; off: the VLA stays frozen, a contextual bandit over tokens).
4. The selector: ``selector_epochs`` full-batch Adam steps on the newest ``selector_memory`` decisions (this
   update's and the earlier ones'), each weighted by its episode's group advantage A = (R - mean R) / (std R + delta):
   ``selector_objective awr`` (default) regresses p(c | s) onto prior(c) exp(A / beta)
   (``policies.extoken.selector.awr_loss``), ``pg`` runs truncated-importance REINFORCE + entropy bonus + KL to the
   demos' token prior (``selector_loss``).

Evaluations take the token from ``deploy`` (the selector's argmax on the episode's first observation, or every
macro-step's with ``chunk``) and the tuned policy's deterministic sampler. ``summarize`` writes the tuned policy
(``RUN/policy``, GRPO's) and the selector beside it (``RUN/policy/selector.safetensors`` + ``selector.json``:
``policies.extoken.selector.load_selector``).

On-policy, like GRPO: in-process sessions only.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
from typing import Any

import numpy as np
import torch

from policies.extoken.config import ExTokenConfig
from policies.extoken.selector import TokenSelector, fit_selector, normalized_prior, save_selector
from policies.grpo.agent import GRPOAgent, Rollout, group_advantages

log = logging.getLogger(__name__)

NO_TOKENS = ("ExToken steers a token-conditioned VLA pi(a | s, c), and {name} has no behaviour tokens "
             "(num_tokens = 0): train one with `vla tokens` + `vla train --tokens` and pass that checkpoint")


def require_tokens(vla) -> int:
    """K, the VLA's behaviour tokens; a clear refusal when it has none."""
    k = int(getattr(vla, "num_tokens", 0) or 0)
    if k < 1:
        raise ValueError(NO_TOKENS.format(name=type(vla).__name__))
    return k


@dataclasses.dataclass
class TokenRollout(Rollout):
    """A GRPO rollout with ExToken's decisions: (embedding [D], token, behaviour probability q) per draw."""

    decisions: list[tuple[torch.Tensor, int, float]] = dataclasses.field(default_factory=list)


class ExTokenAgent(GRPOAgent):
    name = "extoken"
    HANDLES = GRPOAgent.HANDLES + ("token", "embed", "embed_dim")

    @classmethod
    def build(cls, vla, cfg, seed: int = 0, observation_space=None) -> "ExTokenAgent":
        require_tokens(vla)  # before the generic handle check: say how to get a token-conditioned VLA
        return super().build(vla, cfg, seed=seed, observation_space=observation_space)

    @classmethod
    def split_refusal(cls, cfg) -> str | None:
        return ("ExToken runs GRPO on its own rollouts and trains its selector at the end of each group (on-policy): "
                "run it in-process, --updates lockstep")

    def __init__(self, vla, cfg: ExTokenConfig = ExTokenConfig(), seed: int = 0) -> None:
        self.num_tokens = require_tokens(vla)
        super().__init__(vla, cfg, seed=seed)
        with torch.random.fork_rng(devices=[]):  # the selector's init from the agent's seed, not the global stream
            torch.manual_seed(self.seed + 7919)
            self.selector = TokenSelector(int(vla.embed_dim), self.num_tokens, cfg.selector_hidden)
        self.selector_opt = torch.optim.Adam(self.selector.parameters(), lr=cfg.selector_lr)
        self.prior, self.prior_source, self.token_meta = self._resolve_prior(vla, cfg)
        self.eval_rng = np.random.default_rng(self.seed + 1)  # deploy random without an evaluation generator
        self._perm: np.ndarray | None = None  # the current group's token permutation (stratified)
        self._tokens: list[int] = []  # the current episode's tokens (episode_log)
        self._step_in_episode = 0
        self.token_counts = np.zeros(self.num_tokens + 1, np.int64)  # training decisions per token, all updates
        self.token_return_sum = np.zeros(self.num_tokens + 1, np.float64)
        self._memory: dict[str, torch.Tensor] | None = None  # the selector's decisions so far (selector_memory)

    def _resolve_prior(self, vla, cfg: ExTokenConfig) -> tuple[torch.Tensor, str, dict | None]:
        """The demos' token prior over 1..K: the config's, else the VLA's (``token_prior``, or the ``tokens`` block
        of the checkpoint it was loaded from, ``checkpoint_dir``), else uniform. -> (prior, where from, the block)."""
        k = self.num_tokens
        if cfg.prior:
            return normalized_prior(cfg.prior, k), "config", None
        if getattr(vla, "token_prior", None) is not None:
            return normalized_prior(vla.token_prior, k), "vla.token_prior", None
        ckpt = getattr(vla, "checkpoint_dir", None)
        if ckpt:
            from policies.extoken.prior import token_meta

            meta = token_meta(str(ckpt))
            if meta is not None:
                if int(meta["k"]) != k:
                    raise ValueError(f"{ckpt}: its tokens block has k={meta['k']}, the VLA {k} tokens")
                if meta.get("unit") != cfg.token_unit:
                    log.warning("the token prior of %s was clustered per %s; this session draws tokens per %s "
                                "(--token-unit)", ckpt, meta.get("unit"), cfg.token_unit)
                return normalized_prior(meta["prior"], k), "checkpoint", meta  # its tokens block
        return torch.full((k,), 1.0 / k), "uniform", None

    # -- acting -------------------------------------------------------------------------------------
    def _embed(self, batch: dict[str, Any]) -> torch.Tensor:
        """The selector's input for one observation batch: the session's frozen VLA's features [1, D]."""
        with torch.no_grad():
            return self.vla.embed(batch).float()

    def begin_episode(self, obs: dict, info: dict, learn: bool = False) -> None:
        self._tokens, self._step_in_episode = [], 0
        if learn and (not self._group or self._perm is None):  # a new group: a new permutation of the tokens
            self._perm = self.rng.permutation(self.num_tokens) + 1
        self._rollout = TokenRollout(instruction=str(obs["instruction"])) if learn else None
        if learn:
            self._note(obs, info)

    def chunk_token(self, batch: dict[str, Any], generator: torch.Generator | None = None) -> int:
        """This macro-step's token: the episode's (drawn at its first macro-step) or, with ``token_unit chunk``, a new
        one. Training: by ``explore``, the decision kept for the selector. Evaluation: by ``deploy``."""
        t = self._step_in_episode
        self._step_in_episode += 1
        if self.cfg.token_unit == "episode" and t > 0:
            return self._tokens[0]
        k = self.num_tokens
        if self._rollout is None:  # evaluation
            if self.cfg.deploy == "null":
                token = 0
            elif self.cfg.deploy == "random":
                token = int(torch.randint(1, k + 1, (1,), generator=generator)) if generator is not None \
                    else int(self.eval_rng.integers(1, k + 1))
            else:  # argmax p(c | s): deterministic given the observation
                token = int(self.selector.choose(self._embed(batch))[0])
        else:
            emb = self._embed(batch)
            if self.cfg.explore == "stratified":  # rollout i of the group (at macro-step t with chunk)
                i = len(self._group)
                token, q = int(self._perm[(i + (t if self.cfg.token_unit == "chunk" else 0)) % k]), 1.0 / k
            elif self.cfg.explore == "uniform":
                token, q = int(self.rng.integers(1, k + 1)), 1.0 / k
            else:
                c, p = self.selector.sample(emb, generator=self.generator)
                token, q = int(c[0]), float(p[0])
            self._rollout.decisions.append((emb[0], token, q))
        self._tokens.append(token)
        return token

    # -- the update ---------------------------------------------------------------------------------
    def _update(self) -> dict[str, float]:
        cfg = self.cfg
        groups = list(self._groups)
        # 2. what the tokens did, before the policy or the selector moves
        info = self._token_diagnostics(groups)
        # 3. GRPO's policy update under the rollouts' tokens (or none: the selector alone, the VLA frozen)
        info.update(super()._update() if cfg.learn_policy else self._frozen_round(groups))
        # 4. the selector, on every token decision of the update, weighted by its episode's group advantage
        embs, toks, advs, qs = [], [], [], []
        for g in groups:
            A = group_advantages(torch.tensor([float(r.success) for r in g]), cfg.adv_eps)
            for r, a in zip(g, A):
                for emb, token, q in r.decisions:
                    embs.append(emb)
                    toks.append(token)
                    advs.append(float(a))
                    qs.append(q)
        if embs:
            new = {"emb": torch.stack(embs).float(), "token": torch.tensor(toks, dtype=torch.long),
                   "adv": torch.tensor(advs, dtype=torch.float32), "q": torch.tensor(qs, dtype=torch.float32)}
            if cfg.selector_memory and self._memory is not None:  # the newest selector_memory decisions
                new = {k: torch.cat([self._memory[k], v])[-max(cfg.selector_memory, len(v)):] for k, v in new.items()}
            self._memory = new
            self.selector.train()
            st = fit_selector(self.selector, self.selector_opt, new["emb"], new["token"], new["adv"], new["q"],
                              self.prior, cfg.selector_epochs, cfg.entropy_coef, cfg.prior_kl_coef,
                              cfg.max_importance, objective=cfg.selector_objective, beta=cfg.selector_beta)
            self.selector.eval()
            info.update({"losses/selector": st["loss"], "selector/pg": st["pg"], "selector/entropy": st["entropy"],
                         "selector/prior_kl": st["prior_kl"], "selector/importance_mean": st["importance_mean"],
                         "selector/decisions": float(len(embs)), "selector/memory": float(len(new["token"]))})
        return info

    def _token_diagnostics(self, groups: list[list[TokenRollout]]) -> dict[str, float]:
        """Decisions and mean return (the task success R) per token, the selector's accuracy against each group's
        best token (GRPO's update adds the trajectory diversity)."""
        k = self.num_tokens
        counts = np.zeros(k + 1, np.int64)
        returns = np.zeros(k + 1, np.float64)
        hits, judged = 0, 0
        for g in groups:
            for r in g:
                for _, token, _ in r.decisions:
                    counts[token] += 1
                    returns[token] += float(r.success)
            # the group's best token(s): the highest mean R among the tokens its rollouts started with
            first = [(r.decisions[0][1], float(r.success)) for r in g if r.decisions]
            means = {c: np.mean([s for cc, s in first if cc == c]) for c in {c for c, _ in first}}
            if len(set(means.values())) > 1:  # some token did better than another: a best token to match
                best = {c for c, m in means.items() if m == max(means.values())}
                with torch.no_grad():
                    choice = int(self.selector.choose(g[0].decisions[0][0][None])[0])
                hits += choice in best
                judged += 1
        self.token_counts += counts
        self.token_return_sum += returns
        info: dict[str, float] = {}
        for c in range(k + 1):
            if counts[c]:
                info[f"tokens/count_{c}"] = float(counts[c])
                info[f"tokens/return_{c}"] = float(returns[c] / counts[c])
        if judged:
            info["selector/best_token_accuracy"] = hits / judged
        return info

    def _frozen_round(self, groups: list[list[TokenRollout]]) -> dict[str, float]:
        """``learn_policy`` off: the groups are consumed and counted as GRPO would, the policy untouched."""
        self._groups = []
        self.updates += 1
        rewards = [torch.tensor([float(r.success) for r in g]) for g in groups]
        usable = sum(bool(group_advantages(R, self.cfg.adv_eps).abs().sum() > 0) for R in rewards)
        self.totals["groups"] += len(groups)
        self.totals["usable_task"] += usable
        self.totals["usable_any"] += usable
        return {"charts/group_success": float(torch.cat(rewards).mean()), "charts/usable_groups": usable / len(groups),
                "charts/usable_groups_with_hindsight": usable / len(groups), "losses/policy": 0.0,
                **self.diversity(groups)}

    # -- logs ---------------------------------------------------------------------------------------
    def episode_log(self) -> dict[str, Any]:
        """The episode's token (its first with ``token_unit chunk``, all of them under ``tokens``) and GRPO's log."""
        out = super().episode_log()
        if self._tokens:
            out["token"] = int(self._tokens[0])
            if self.cfg.token_unit == "chunk":
                out["tokens"] = [int(t) for t in self._tokens]
        return out

    def report(self, per_episode: list[dict[str, Any]]) -> list[str]:
        tokens = [e["token"] for e in per_episode if e.get("token") is not None]
        if not tokens:
            return []
        used = ", ".join(f"{c}: {tokens.count(c)}" for c in sorted(set(tokens)))
        return [f"evaluation tokens (deploy {self.cfg.deploy}, first token per episode): {used}"]

    def summarize(self, run_dir: str) -> dict[str, Any]:
        """GRPO's (the tuned policy in ``RUN/policy``) + the selector beside it, and the token statistics."""
        out = super().summarize(run_dir)
        policy_dir = os.path.join(run_dir, "policy")
        save_selector(self.selector, policy_dir, extra={"prior": self.prior.tolist(), "prior_source": self.prior_source,
                                                         "token_unit": self.cfg.token_unit, "deploy": self.cfg.deploy,
                                                         "updates": self.updates})
        cfg_path = os.path.join(policy_dir, "config.json")
        if os.path.isfile(cfg_path):  # the tuned checkpoint keeps the base's tokens block (its prior), names its tuner
            with open(cfg_path) as f:
                meta = json.load(f)
            meta["tuned_by"] = "extoken"
            if self.token_meta is not None:
                meta.setdefault("tokens", self.token_meta)
            with open(cfg_path + ".tmp", "w") as f:
                json.dump(meta, f, indent=2)
            os.replace(cfg_path + ".tmp", cfg_path)
        n = np.maximum(self.token_counts, 1)
        out.update(selector=os.path.join("policy", "selector.safetensors"), tokens=self.num_tokens,
                   prior=[round(float(p), 6) for p in self.prior], prior_source=self.prior_source,
                   learn_policy=self.cfg.learn_policy,
                   token_counts={str(c): int(v) for c, v in enumerate(self.token_counts) if v},
                   token_mean_return={str(c): float(self.token_return_sum[c] / n[c])
                                      for c, v in enumerate(self.token_counts) if v})
        return out

    # -- state --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        d = super().state_dict()
        d["extoken"] = {"selector": {k: v.detach().clone() for k, v in self.selector.state_dict().items()},
                        "selector_opt": copy.deepcopy(self.selector_opt.state_dict()),
                        "perm": None if self._perm is None else self._perm.copy(),
                        "eval_rng": self.eval_rng.bit_generator.state, "prior": self.prior.clone(),
                        "prior_source": self.prior_source, "token_counts": self.token_counts.copy(),
                        "token_return_sum": self.token_return_sum.copy(),
                        "memory": None if self._memory is None else {k: v.clone() for k, v in self._memory.items()}}
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        e = d["extoken"]
        self.selector.load_state_dict(e["selector"])
        self.selector_opt.load_state_dict(e["selector_opt"])
        self._perm = None if e["perm"] is None else np.asarray(e["perm"]).copy()
        self.eval_rng.bit_generator.state = e["eval_rng"]
        self.prior, self.prior_source = torch.as_tensor(e["prior"]).clone(), e["prior_source"]
        self.token_counts = np.asarray(e["token_counts"]).copy()
        self.token_return_sum = np.asarray(e["token_return_sum"]).copy()
        mem = e.get("memory")  # absent in checkpoints from before the selector kept its decisions
        self._memory = None if mem is None else {k: torch.as_tensor(v).clone() for k, v in mem.items()}

    def actor_parameters(self) -> dict[str, Any]:
        return {**super().actor_parameters(),
                **{"selector." + k: v.detach().clone() for k, v in self.selector.state_dict().items()}}

    def load_actor_parameters(self, params: dict[str, Any]) -> None:
        sel = {k[len("selector."):]: v for k, v in params.items() if k.startswith("selector.")}
        super().load_actor_parameters({k: v for k, v in params.items() if not k.startswith("selector.")})
        if sel:
            self.selector.load_state_dict(sel)

    def parameter_counts(self) -> dict[str, int]:
        counts = super().parameter_counts()
        n = sum(p.numel() for p in self.selector.parameters())
        return {**counts, "selector": n, "total": counts["total"] + n}
