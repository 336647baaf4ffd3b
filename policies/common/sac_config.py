"""``SACConfig``: the settings of ``policies.common.sac.SAC``, in a module without torch so that
command lines can build their flags from it (``vla rl --help`` imports no torch)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

UPDATE_SCHEDULES = ("per_step", "legacy")


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
