"""Settings of the safety layers, torch-free: ``AutoSafeConfig`` (``policies.safety.autosafe``) and
``SafeExplorerConfig`` with its ablation variants (``policies.safety.safeexplorer``)."""

from __future__ import annotations

import dataclasses
import difflib

from policies.common.sac_config import SACConfig


@dataclasses.dataclass(frozen=True)
class AutoSafeConfig:
    sharpness_init: float = 1.0
    """Initial sharpness p(s) of the blend (the head's bias; its weights start near 0). p -> 0 gives the
    linear blend lambda = 1 - Delta; a large p hands control to the learner everywhere but near the boundary."""
    sharpness_eps: float = 1e-3
    """p = p_max tanh((softplus(head) + eps) / p_max): eps keeps p > 0."""
    sharpness_max: float = 2.0
    """p_max, a smooth cap on p. A large p lets the learner act with almost full authority a little inside
    the boundary, and a single step of full force can then cross it: the cap is part of the certificate
    and depends on the system (cart-pole, ``policies.safety.cartpole``: a uniform random actor stays in the
    safe set with p <= 2, not with p = 10)."""
    blend_floor: float = 1e-6
    """The log-prob uses log max(1 - lambda, blend_floor): at the boundary (lambda = 1) the blended policy
    is a point mass on a_safe and its density is infinite; this bounds the entropy term there."""
    sac: SACConfig = SACConfig(num_critics=2, critic_subset=2, utd=1, update_schedule="per_step")
    """The SAC under the layer (critic, temperature and update unchanged; CleanRL's 2 critics, UTD 1)."""

    def __post_init__(self) -> None:
        if not self.sharpness_eps > 0:
            raise ValueError(f"sharpness_eps must be > 0 (p must stay positive), got {self.sharpness_eps}")
        if not self.sharpness_max > self.sharpness_eps:
            raise ValueError(f"sharpness_max ({self.sharpness_max}) must exceed sharpness_eps ({self.sharpness_eps})")
        if not self.sharpness_eps < self.sharpness_init < self.sharpness_max:
            raise ValueError(f"sharpness_init ({self.sharpness_init}) must lie strictly between sharpness_eps "
                             f"({self.sharpness_eps}) and sharpness_max ({self.sharpness_max})")
        if not 0 < self.blend_floor < 1:
            raise ValueError(f"blend_floor must be in (0, 1), got {self.blend_floor}")


SAFEEXPLORER_VARIANTS: dict[str, dict[str, bool]] = {
    "ppo": dict(use_recovery=False, analytic_value=False, compat_loss=False, curriculum=False),
    "masked": dict(use_recovery=True, analytic_value=False, compat_loss=False, curriculum=False),
    "masked+value": dict(use_recovery=True, analytic_value=True, compat_loss=False, curriculum=False),
    "safeexplorer": dict(use_recovery=True, analytic_value=True, compat_loss=True, curriculum=True),
}
"""The ablation rows of ``bench/safeexplorer.py``: which pieces of SafeExplorer are on (see
``SafeExplorerConfig.variant``)."""


@dataclasses.dataclass(frozen=True)
class SafeExplorerConfig:
    """Settings of SafeExplorer (``policies.safety.safeexplorer``): PPO (CleanRL's ppo_continuous_action
    defaults) with a recovery policy outside a safe region R, and the switchable pieces of the method."""

    use_recovery: bool = True
    """Hand control to the env side's deterministic recovery whenever the state leaves R (the policy gradient
    then keeps only the learner's timesteps). False: plain PPO, a fall ends the episode."""
    analytic_value: bool = True
    """Value of recovery states from the recorded recovery segment (its discounted return, bootstrapped with
    the critic where the learner takes over again) instead of the critic; the critic then trains on learner
    states only."""
    compat_loss: bool = True
    """Outcome-gated compatibility loss: behaviour cloning of the recovery's actions on recovery segments that
    brought the state back into R (never on those that ended in a fall or were cut off)."""
    curriculum: bool = True
    """Grow R linearly from ``d0`` to ``dmax`` over ``curriculum_steps`` env steps (off: R = ``dmax``)."""
    d0: float = 0.4
    """Initial size of R (the RecoverySpec's level in (0, 1]; 1 the largest region the recovery is trusted in)."""
    dmax: float = 1.0
    """Final size of R."""
    curriculum_steps: int = 50_000
    """Env steps over which R grows from ``d0`` to ``dmax``."""
    compat_coef: float = 0.5
    """Weight of the compatibility loss (MSE of the policy mean to the recovery action)."""
    num_steps: int = 2048
    """Env steps per rollout (one env)."""
    gamma: float = 0.99
    gae_lambda: float = 0.95
    update_epochs: int = 10
    num_minibatches: int = 32
    learning_rate: float = 3e-4
    anneal_lr: bool = True
    """Linear decay of the learning rate to 0 over ``total_steps`` (CleanRL)."""
    clip_coef: float = 0.2
    """PPO ratio clip eps: min(rho A, clip(rho, 1 - eps, 1 + eps) A)."""
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    """Normalise advantages per minibatch over the learner's timesteps."""
    norm_obs: bool = True
    """Running mean / std normalisation of the observations the networks see (the RecoverySpec sees raw ones)."""
    hidden: tuple[int, ...] = (64, 64)
    init_log_std: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.d0 <= self.dmax <= 1:
            raise ValueError(f"need 0 < d0 <= dmax <= 1 (levels of the safe region), got d0={self.d0}, dmax={self.dmax}")
        if (self.analytic_value or self.compat_loss or self.curriculum) and not self.use_recovery:
            raise ValueError("analytic_value, compat_loss and curriculum act on recovery segments: they need "
                             "use_recovery=True (or use variant 'ppo')")
        if self.num_steps % self.num_minibatches:
            raise ValueError(f"num_steps ({self.num_steps}) must be a multiple of num_minibatches ({self.num_minibatches})")
        if not (0 < self.gamma <= 1 and 0 <= self.gae_lambda <= 1 and self.clip_coef > 0):
            raise ValueError("need 0 < gamma <= 1, 0 <= gae_lambda <= 1 and clip_coef > 0")
        if self.curriculum_steps < 1:
            raise ValueError(f"curriculum_steps must be >= 1, got {self.curriculum_steps}")

    @classmethod
    def variant(cls, name: str, **overrides) -> "SafeExplorerConfig":
        """The config of an ablation row (``SAFEEXPLORER_VARIANTS``: ppo, masked, masked+value, safeexplorer)
        with ``overrides``; a typo gets a did-you-mean."""
        if name not in SAFEEXPLORER_VARIANTS:
            close = difflib.get_close_matches(name, list(SAFEEXPLORER_VARIANTS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown SafeExplorer variant {name!r} (known: {', '.join(SAFEEXPLORER_VARIANTS)}){hint}")
        return cls(**{**SAFEEXPLORER_VARIANTS[name], **overrides})
