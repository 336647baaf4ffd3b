"""``SACConfig``: the settings of ``policies.common.sac.SAC``, in a module without torch so that
command lines can build their flags from it (``vla rl --help`` imports no torch)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

UPDATE_SCHEDULES = ("per_step", "legacy")
TIME_LIMITS = ("bootstrap", "terminal")
ENSEMBLE_TARGETS = ("min_subset", "mean", "mean_minus_std")


@dataclass(frozen=True)
class ValueTargetConfig:
    """What the critic's TD target means: reward offset, time-limit handling, per-tick discount and the ensemble's
    reduction. Shared by every critic-based method (``SACConfig.value`` for DSRL, ``ResidualConfig.value``); read
    by ``policies.common.replay.ReplayBuffer.n_step_gather`` and ``policies.common.sac.ensemble_target``.

    Why it matters (issue 61, ``../shared/METHODS.md``, "Value targets with sparse rewards and time limits"): with
    a 0 / 1 success reward, a bootstrapped time limit, no time in the state and gamma 0.99 per 4-tick macro-step, a
    failed attempt only looks like a delayed success to the critic: the value gap between a good and a bad action
    is about 1 - gamma^k, the size of the ensemble's spread. ``bench/critic_truth.py`` measures each setting's
    ranking of candidate actions against Monte-Carlo returns at the states that decide the outcome."""

    reward_offset: float = 0.0
    """c: every stored macro-step's reward r becomes r - c in the target (0: the raw 0 / 1 success reward). DSRL's
    robomimic runs (``ajwagen/dsrl``) train on r - 1 per env step (0 at success); DSRL-pi0 (``nakamotoo/dsrl_pi0``)
    on -1 per chunk and 0 at success: a step spent is a cost, so a failure is worse than a late success."""
    time_limit: str = dataclasses.field(default="bootstrap", metadata={"choices": TIME_LIMITS})
    """How the target treats an episode cut by the time limit (the session's ``max_episode_ticks`` or the env's
    truncation). ``bootstrap``: done = terminated only, the target goes on through a truncation as if the episode
    continued (Pardo et al. 2018; SB3 / CleanRL / RLPD): right for an infinite-horizon task, but the state has
    no time, so a failure that ran out of time is valued as a success that comes later. ``terminal``: the last
    transition of a truncated episode is terminal (value 0 after it), as DSRL's robomimic runs end the episode at
    the time limit: the critic estimates the return within the episode, which is what success rate measures."""
    gamma_per_tick: float | None = None
    """Discount per control tick; each stored macro-step is discounted by gamma_per_tick ** (rows it executed), so
    a short last chunk is discounted less (None: the method's ``gamma`` per macro-step). References: DSRL-pi0
    LIBERO 0.999 per env step; ResFiT 0.995 per env step (0.995^4 = 0.980 per 4-tick macro-step)."""
    target_ensemble: str = dataclasses.field(default="min_subset", metadata={"choices": ENSEMBLE_TARGETS})
    """How the target critics' values at (s', a') become one number: ``min_subset`` (RLPD, ResFiT: the min over a
    random ``critic_subset`` of them; pessimistic by a multiple of the ensemble's spread per backup), ``mean``
    (DSRL-pi0: the mean of its 10 Q-heads) or ``mean_minus_std`` (mean - target_std_k * std over the ensemble: a
    pessimism that is a set multiple of the spread)."""
    target_std_k: float = 1.0
    """``mean_minus_std``: k in mean - k std."""

    def __post_init__(self) -> None:
        if self.time_limit not in TIME_LIMITS:
            raise ValueError(f"time_limit must be one of {TIME_LIMITS}, got {self.time_limit!r}")
        if self.target_ensemble not in ENSEMBLE_TARGETS:
            raise ValueError(f"target_ensemble must be one of {ENSEMBLE_TARGETS}, got {self.target_ensemble!r}")
        if self.gamma_per_tick is not None and not 0.0 < self.gamma_per_tick <= 1.0:
            raise ValueError(f"gamma_per_tick must be in (0, 1] (or None), got {self.gamma_per_tick}")
        if not self.target_std_k >= 0:
            raise ValueError(f"target_std_k must be >= 0, got {self.target_std_k}")
        if not math.isfinite(self.reward_offset):
            raise ValueError(f"reward_offset must be finite, got {self.reward_offset}")

    def sample_kwargs(self, gamma: float, n_step: int) -> dict:
        """The keyword arguments of ``ReplayBuffer.sample`` / ``sample_mixed`` for this target."""
        return {"n_step": n_step, "gamma": gamma if self.gamma_per_tick is None else self.gamma_per_tick,
                "per_tick": self.gamma_per_tick is not None, "reward_offset": self.reward_offset,
                "time_limit": self.time_limit}

    @property
    def is_default(self) -> bool:
        return self == ValueTargetConfig()


@dataclass(frozen=True)
class SACConfig:
    actor_lr: float = 3e-4
    """Adam learning rate of the actor (DSRL on pi0 uses 1e-4)."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critic ensemble (and of the shared encoder, if any)."""
    alpha_lr: float = 3e-4
    """Adam learning rate of the log temperature."""
    batch_size: int = 256
    """Transitions per gradient step."""
    gamma: float = 0.99
    """Discount per transition. For action chunks as macro-steps, pass the per-chunk discount."""
    tau: float = 0.005
    """Target network smoothing: theta_target <- tau * theta + (1 - tau) * theta_target."""
    num_critics: int = 10
    """Q-networks in the critic ensemble (RLPD: 10; CleanRL: 2)."""
    critic_subset: int = 2
    """Target critics drawn at random for the TD target, which takes their min (RLPD: 2 of 10)."""
    utd: int = 20
    """Update-to-data ratio: gradient steps per ``update_many`` call (one call per env / macro-step)."""
    update_schedule: str = dataclasses.field(default="per_step", metadata={"choices": UPDATE_SCHEDULES})
    """``per_step``: every one of the ``utd`` gradient steps updates critic, actor and temperature on a
    fresh batch (both DSRL codes, SB3 / jaxrl2 SAC: UTD 20 = 20 actor and 20 temperature steps).
    ``legacy``: ``utd`` critic steps, then one actor + temperature step on the last batch (RLPD's
    ``update``; this project's schedule before issue 15, kept for ablations)."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the actor and of each critic."""
    critic_layer_norm: bool = True
    """LayerNorm after each hidden linear layer of the critics (RLPD)."""
    init_temperature: float = 1.0
    """Initial entropy temperature alpha."""
    target_entropy: float | None = None
    """Entropy the temperature steers to; None means -action_dim / 2 (RLPD, DSRL-pi0). The entropy is
    that of the action in [-b, b] (log b per dimension included, as jaxrl2 / DSRL-pi0; SB3 and so
    DSRL-robomimic measure it in [-1, 1], where their target 0 sits)."""
    action_scale: float = 1.0
    """b: actions lie in [-b, b]^A (DSRL: the latent-noise magnitude, 1.0 - 2.5)."""
    backup_entropy: bool = True
    """Subtract alpha * log pi(a'|s') in the TD target (soft backup)."""
    log_std_min: float = -5.0
    """Lower bound of the actor's log standard deviation."""
    log_std_max: float = 2.0
    """Upper bound of the actor's log standard deviation."""
    n_step: int = 1
    """TD over n stored macro-steps of the episode before the target bootstraps (``ReplayBuffer.n_step_gather``;
    ResFiT: 3-5-step returns; 1: one-step TD, both DSRL codes)."""
    value: ValueTargetConfig = ValueTargetConfig()
    """The TD target's reward offset, time-limit handling, per-tick discount and ensemble reduction."""
    init_log_std: float | None = None
    """None: the actor's heads keep PyTorch's default init (CleanRL; the initial log std is then near
    the middle of [log_std_min, log_std_max], -1.5). A number: both heads start near-constant (weights
    in +-1e-3), mean 0 and this log std for every observation. DSRL sets 0: its first noise policy
    is then close to the N(0, I) the frozen VLA was trained to denoise, i.e. the base VLA itself."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        for name in ("actor_lr", "critic_lr", "alpha_lr", "init_temperature", "action_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if self.update_schedule not in UPDATE_SCHEDULES:
            raise ValueError(f"update_schedule must be one of {UPDATE_SCHEDULES}, got {self.update_schedule!r}")
        if self.n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {self.n_step}")
        if self.batch_size < 1 or self.utd < 1:
            raise ValueError(f"batch_size and utd must be >= 1, got {self.batch_size} and {self.utd}")
        if not 1 <= self.critic_subset <= self.num_critics:
            raise ValueError(f"critic_subset must be between 1 and num_critics={self.num_critics}, "
                             f"got {self.critic_subset}")
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden must list at least one positive width, got {self.hidden}")
        if not self.log_std_min < self.log_std_max:
            raise ValueError(f"log_std_min ({self.log_std_min}) must be below log_std_max ({self.log_std_max})")
        if self.init_log_std is not None and not self.log_std_min < self.init_log_std < self.log_std_max:
            raise ValueError(f"init_log_std ({self.init_log_std}) must lie strictly between log_std_min "
                             f"({self.log_std_min}) and log_std_max ({self.log_std_max})")
