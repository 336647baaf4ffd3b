"""``ResidualConfig``: the settings of a residual RL agent (no torch here: ``vla rl`` builds its flags from
the documented fields)."""

from __future__ import annotations

import dataclasses

from policies.common.sac_config import ValueTargetConfig

ENCODERS = ("vla", "cnn", "oracle")
ROWS = ("each", "shared")
BASE_NOISE = ("sample", "zero")


@dataclasses.dataclass(frozen=True)
class ResidualConfig:
    """Defaults follow ResFiT's code (``amazon-science/residual-offpolicy-rl``, ``config/residual_td3.py`` and
    ``config/rlpd.py``) where this project's budget allows; the departures are named on each field."""

    encoder: str = dataclasses.field(default="vla", metadata={"choices": ENCODERS})
    """What actor and critics read: ``vla`` (the frozen VLA's embedding summary), ``cnn`` (the camera frames at
    ``image_size`` + the robot state through a small CNN trained by the critic, as ResFiT's per-camera encoders;
    in-process sessions only) or ``oracle`` (a labelled oracle for diagnostics, sim tasks only: the embedding and
    the simulator's object poses relative to the gripper)."""
    residual_bound: float = 0.1
    """b: each residual coordinate lies in [-b, b] of the VLA's normalised action units (ResFiT: 0.1, 0.2 on its
    harder tasks; the compact VLA's units span [-1, 1], so 0.1 is 5% of an action dim's recorded range)."""
    rows: str = dataclasses.field(default="each", metadata={"choices": ROWS})
    """``each``: one residual per executed row of the chunk (exec_steps x A numbers, ResFiT's per-step residual
    seen from the chunk's first observation); ``shared``: one A-dim correction added to every row (a chunk-wide
    offset, fewer dims to explore)."""
    exec_steps: int | None = 4
    """Rows of each base chunk executed per macro-step, with the residual added (None: the whole chunk). The
    base VLA is queried again at every macro-step."""
    base_noise: str = dataclasses.field(default="sample", metadata={"choices": BASE_NOISE})
    """The base VLA's sampler noise: ``sample`` draws N(0, I) as the VLA does on its own (from the agent's own
    generator, part of its state), ``zero`` the noise-free chunk (a deterministic base, as ResFiT's ACT)."""
    explore_std: float = 0.05
    """Std of the Gaussian exploration noise added to the residual in training episodes (ResFiT: 0.05 constant);
    the sum is clipped to [-b, b]."""
    target_noise: float = 0.05
    """TD3's target policy smoothing: std of the noise on the target actor's residual (ResFiT: = explore_std)."""
    target_noise_clip: float = 0.3
    """... clipped to +-this before adding (ResFiT: 0.3)."""
    warmup_noise: float = 0.1
    """Warm-up macro-steps (the session's ``--warmup-steps``): the base chunk plus uniform noise in
    +-warmup_noise per coordinate, so the critic sees actions around the base before the actor moves (ResFiT:
    the base plus U(+-0.2) for 10K steps)."""
    utd: int = 4
    """Critic gradient steps per macro-step (ResFiT: 4 per env step; a macro-step here is exec_steps ticks, so
    this is fewer per tick: the CPU budget)."""
    actor_every: int = 4
    """One actor step per this many critic steps (TD3's policy delay; ResFiT: 4)."""
    critic_warmup: int = 1000
    """Critic steps before the first actor step, so the residual starts moving on a critic that has seen data
    (ResFiT: 10K critic-only steps after its 10K warm-up steps). Round 1 on pick_blue_cube with 200 (and actor lr
    1e-4) pushed the residual to 88% of its bound within 300 actor steps, on a critic whose preference for it was
    0.04, and the evaluations fell from the base's 25% to 10% and 0%."""
    residual_penalty: float = 0.0
    """Keeps the residual at zero until the critic wants it (ours): the actor maximises
    ``mean_i Q_i(s, base + delta) - residual_penalty * mean((delta / b)^2)``, so a residual at its full bound must
    gain this much Q (success probability, under the 0 / 1 reward) to be worth taking, and a critic whose action
    gradient is noise (Adam follows noise at full step size) leaves it near zero. 0: off (ResFiT)."""
    batch_size: int = 256
    """Transitions per gradient step (half from the demo buffer when it holds any: RLPD's 50 / 50)."""
    gamma: float = 0.99
    """Discount per macro-step (ResFiT: 0.99 per env step with 3-step returns; here one-step TD over macro-steps of
    exec_steps ticks)."""
    n_step: int = 1
    """TD over n macro-steps: the critic's target sums the rewards of up to n stored steps of the episode before it
    bootstraps (``ReplayBuffer.n_step_gather``). ResFiT's paper runs use 3-7 steps (with gamma 0.995 per env
    step); 1 is plain one-step TD."""
    value: ValueTargetConfig = ValueTargetConfig(time_limit="terminal")
    """The TD target's reward offset, time-limit handling, per-tick discount (which replaces ``gamma``) and ensemble
    reduction (``policies.common.sac_config.ValueTargetConfig``). Default: the time limit ends the target's episode
    (issue 61: a bootstrapped limit values a failure that ran out of time as a later success;
    ``tests/policies/test_value_target.py``), the rest as ResFiT / RLPD."""
    tau: float = 0.005
    """Polyak rate of the target critic and target actor (ResFiT: 0.005)."""
    num_critics: int = 10
    """Q-networks in the LayerNorm ensemble (ResFiT / RLPD: 10)."""
    critic_subset: int = 2
    """Target critics drawn at random for the TD target's min (ResFiT / RLPD: 2)."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the actor and of each critic (ResFiT: 2 x 1024 on a GPU)."""
    actor_lr: float = 1e-5
    """Adam learning rate of the actor (ResFiT: 1e-6 over ~300K actor steps; here ~5K in a 20K-tick session). Adam
    moves every weight by about the learning rate per step whatever the gradient's size, so only a small rate keeps
    an uninformed critic's noisy gradients from walking the residual to its bound (1e-4 did, round 1)."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critics (and the cnn encoder) (ResFiT: 1e-4)."""
    grad_clip: float = 1.0
    """Gradient norm clip of actor and critic (ResFiT: 1.0)."""
    diag_every: int = 10
    """The diagnostics (``ResidualAgent.diagnostics``: residual size, the critic's preference for it, ensemble
    spread) every this many update rounds (0: never): they cost about a critic step."""
    image_size: int = 64
    """cnn: side of the square uint8 camera frames the encoder reads (and the replay stores)."""
    image_pad: int = 4
    """cnn: DrQ random shift of the replayed frames by up to +-image_pad pixels per critic step (ResFiT: 4)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        if self.encoder not in ENCODERS:
            raise ValueError(f"ResidualConfig.encoder must be one of {ENCODERS}, got {self.encoder!r}")
        if self.rows not in ROWS:
            raise ValueError(f"ResidualConfig.rows must be one of {ROWS}, got {self.rows!r}")
        if self.base_noise not in BASE_NOISE:
            raise ValueError(f"ResidualConfig.base_noise must be one of {BASE_NOISE}, got {self.base_noise!r}")
        for name in ("residual_bound", "actor_lr", "critic_lr", "grad_clip"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ResidualConfig.{name} must be > 0, got {getattr(self, name)}")
        for name in ("explore_std", "target_noise", "target_noise_clip", "warmup_noise", "residual_penalty"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"ResidualConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.exec_steps is not None and self.exec_steps < 1:
            raise ValueError(f"ResidualConfig.exec_steps must be >= 1 (or None: the whole chunk), got {self.exec_steps}")
        for name in ("utd", "actor_every", "batch_size", "num_critics", "n_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"ResidualConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.diag_every < 0:
            raise ValueError(f"ResidualConfig.diag_every must be >= 0 (0: never), got {self.diag_every}")
        if self.critic_warmup < 0:
            raise ValueError(f"ResidualConfig.critic_warmup must be >= 0, got {self.critic_warmup}")
        if not 1 <= self.critic_subset <= self.num_critics:
            raise ValueError(f"ResidualConfig.critic_subset must be in [1, num_critics={self.num_critics}], "
                             f"got {self.critic_subset}")
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 < self.tau <= 1.0:
            raise ValueError(f"ResidualConfig: gamma must be in [0, 1] and tau in (0, 1], got {self.gamma}, {self.tau}")
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"ResidualConfig.hidden must list positive widths, got {self.hidden}")
        if self.image_size < 16 or self.image_size % 16:
            raise ValueError(f"ResidualConfig.image_size must be a positive multiple of 16, got {self.image_size}")
        if not 0 <= self.image_pad < self.image_size // 2:
            raise ValueError(f"ResidualConfig.image_pad must be in [0, {self.image_size // 2}), got {self.image_pad}")

    def check_session(self, session) -> None:
        """Cross-checks with the session's settings (``session.config.RLConfig`` calls it)."""
        if session.demos and self.encoder == "oracle":
            raise ValueError("--demos with --encoder oracle: recorded demos carry no simulator state for the "
                             "oracle's critic; drop --demos or use --encoder vla")

    @property
    def label(self) -> str:
        """Short name for progress bars and summaries."""
        return f"residual-{self.rows}"
