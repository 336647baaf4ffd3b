"""``GRPOConfig`` / ``LfHConfig``: the settings of GRPO on a flow VLA and of LfH's hindsight relabelling (no torch
here: ``vla rl`` builds its flags from the documented fields). Where a value comes from is said on each field;
``policies/grpo/__init__.py`` lists the reconstruction's choices."""

from __future__ import annotations

import dataclasses

TRAIN = ("head", "policy", "lora")
HINDSIGHT = ("off", "lfh", "instruction-only", "rescore-only", "random")


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    group_size: int = 8
    """G: rollouts per group, all from one initial scene (LfH: 8 in simulation, 4 on the real robot; pi0.5's LIBERO
    GRPO: 8)."""
    groups_per_update: int = 2
    """Groups gathered before one policy update (an update reads every rollout of them; a CPU budget: LfH's RLinf
    runs gather many more per step on GPUs)."""
    sigma: float = 0.1
    """Std of the Gaussian noise each stochastic denoising step adds, in the VLA's normalised action units (the
    sampler's exploration; the log-probabilities are those of these Gaussian transitions: ``vla.models.flow``)."""
    exec_steps: int | None = 4
    """Rows of each sampled chunk executed before the VLA is queried again (None: the whole chunk; pi0.5's GRPO:
    chunks of 5)."""
    train: str = dataclasses.field(default="policy", metadata={"choices": TRAIN})
    """Which weights GRPO moves, on its own copy of the VLA (the session's VLA and the base checkpoint's files are
    never touched): ``head`` (the flow action expert only), ``policy`` (everything but the pretrained vision backbone
    and the sentence encoder: SFT's frozen-backbone mode) or ``lora`` (LoRA adapters on the backbone + the policy
    parts)."""
    lora_rank: int = 8
    """``train lora``: rank of the adapters."""
    lr: float = 5e-6
    """Adam step size (pi0.5's LIBERO GRPO: 5e-6 on the whole model; 1e-5 here clipped 27-30% of the tokens in the
    first updates on place_cube_in_bowl)."""
    epochs: int = 2
    """Passes over an update's rollouts (LfH: 2)."""
    minibatch: int = 64
    """Macro-steps per gradient step."""
    clip: float = 0.2
    """PPO's clip range on the ratio (LfH: 0.2)."""
    dual_clip: float = 3.0
    """c of dual-clip PPO: a token with a negative advantage contributes at most -c A (verl / RLinf: 3.0; 0: off).
    Without it a ratio far above 1 -- a hindsight prompt g' against the old policy under g -- scales the
    gradient without bound."""
    kl_coef: float = 1e-3
    """Weight of the KL to the reference (the VLA the session started from) (LfH: 1e-3). The KL is the k3 estimator
    exp(q) - q - 1, q = log pi_ref - log pi_theta, on each denoising step's log-probability."""
    adv_eps: float = 1e-6
    """delta in (R - mean R) / (std R + delta) (a group whose rewards are all equal has zero advantages: no signal)."""
    max_grad_norm: float = 1.0
    """Clip the gradient's global norm (0: no clipping)."""
    cache_features: bool = True
    """Keep the VLA's ``frozen_features`` of each macro-step (the compact VLA's trunk maps, when the trunk is frozen:
    ``train`` head / policy) from the rollout for the update, which then never runs the trunk: the same update, about
    95% of its CPU time saved (``bench/grpo_cost.py``). False: recompute them (the cost before issue 64)."""
    seed: int = 0
    """Seeds the sampler's noise and the anchor / minibatch draws (a ``vla rl`` session passes its own ``--seed``)."""
    # -- LfH ------------------------------------------------------------------------------------------
    hindsight: str = dataclasses.field(default="off", metadata={"choices": HINDSIGHT})
    """LfH relabelling of weak groups: ``off`` (plain GRPO), ``lfh`` (the judge proposes what an anchor failure did
    achieve and re-scores every rollout under it), or the paper's ablations: ``instruction-only`` (relabel the
    instruction, keep the task rewards), ``rescore-only`` (re-score under g' but keep the instruction g in the
    ratio), ``random`` (relabel, then random 0 / 1 rewards)."""
    judge: str = dataclasses.field(default="sim", metadata={"metavar": "sim|vlm:DIR|classifier:DIR|human"})
    """Who proposes and scores hindsight instructions (``rewards.judges.make_judge``): ``sim`` (PRIVILEGED, sim
    only: the tasks' success predicates on the simulator's state), ``vlm:DIR`` (a local vision-language model),
    ``classifier:DIR`` (a ``vla reward`` classifier: judges its own task only) or ``human`` (the terminal)."""
    eta: float = 0.8
    """Relabel a group whose mean task reward is below eta (LfH: 0.8)."""
    hindsight_coef: float = 0.1
    """lambda in L_GRPO + lambda * L_H-GRPO (LfH: 0.1 on the real robot; the simulation value is not given)."""
    hindsight_clip_percentile: float = 85.0
    """The H-GRPO loss is rescaled to at most c, c the this-th percentile of its values over the first
    ``hindsight_clip_updates`` updates (the paper: the 85th percentile of early training; its code rescales the loss
    above a threshold, which keeps the gradient's direction where a min would zero it)."""
    hindsight_clip_updates: int = 5
    """Updates whose H-GRPO losses fix c (unclipped until then)."""
    judge_frames: int = 8
    """Frames of an episode kept for the judge (evenly spaced, the last one always)."""

    def __post_init__(self) -> None:
        for name in ("group_size", "groups_per_update", "epochs", "minibatch", "lora_rank", "judge_frames",
                     "hindsight_clip_updates"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{type(self).__name__}.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"{type(self).__name__}.group_size must be >= 2 (advantages are relative to the "
                             f"group), got {self.group_size}")
        for name in ("sigma", "lr", "clip"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"{type(self).__name__}.{name} must be positive, got {getattr(self, name)}")
        for name in ("kl_coef", "adv_eps", "max_grad_norm", "hindsight_coef"):
            if float(getattr(self, name)) < 0:
                raise ValueError(f"{type(self).__name__}.{name} must be >= 0, got {getattr(self, name)}")
        if self.exec_steps is not None and int(self.exec_steps) < 1:
            raise ValueError(f"{type(self).__name__}.exec_steps must be >= 1 (or None: the whole chunk), "
                             f"got {self.exec_steps}")
        if self.train not in TRAIN:
            raise ValueError(f"{type(self).__name__}.train must be one of {TRAIN}, got {self.train!r}")
        if self.hindsight not in HINDSIGHT:
            raise ValueError(f"{type(self).__name__}.hindsight must be one of {HINDSIGHT}, got {self.hindsight!r}")
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"{type(self).__name__}.dual_clip must be > 1 (or 0: off), got {self.dual_clip}")
        if not 0.0 < self.eta <= 1.0:
            raise ValueError(f"{type(self).__name__}.eta must be in (0, 1], got {self.eta}")
        if not 0.0 < self.hindsight_clip_percentile <= 100.0:
            raise ValueError(f"{type(self).__name__}.hindsight_clip_percentile must be in (0, 100], "
                             f"got {self.hindsight_clip_percentile}")
        kind = self.judge.split(":", 1)[0]
        if kind not in ("sim", "vlm", "classifier", "human") or (kind in ("vlm", "classifier") and ":" not in self.judge):
            raise ValueError(f"{type(self).__name__}.judge must be sim, vlm:DIR, classifier:DIR or human, "
                             f"got {self.judge!r}")


@dataclasses.dataclass(frozen=True)
class LfHConfig(GRPOConfig):
    """GRPO with LfH's hindsight relabelling on (``vla rl --method lfh``)."""

    hindsight: str = dataclasses.field(default="lfh", metadata={"choices": HINDSIGHT})
    """LfH relabelling of weak groups: ``lfh`` (the judge proposes what an anchor failure did achieve and re-scores
    every rollout under it), ``off`` (plain GRPO), or the paper's ablations: ``instruction-only`` (relabel the
    instruction, keep the task rewards), ``rescore-only`` (re-score under g' but keep the instruction g in the
    ratio), ``random`` (relabel, then random 0 / 1 rewards)."""
