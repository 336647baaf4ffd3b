"""``RLConfig``: every knob of an online RL session (``vla rl``); no torch here."""

from __future__ import annotations

import dataclasses
import json

METHODS = ("dsrl",)
ENCODERS = ("vla", "cnn")


@dataclasses.dataclass(frozen=True)
class RLConfig:
    checkpoint: str
    """The VLA to steer: a checkpoint or `vla train` run directory. It stays frozen."""
    out: str
    """Run directory."""
    task: str
    """Sim task (hardware.sim_tasks) whose success predicate is the reward; "" on a real robot."""
    method: str = "dsrl"
    variant: str = "na"
    """DSRL variant: na (noise-aliased, recommended), sac, or action (baseline: SAC on raw actions)."""
    encoder: str = "vla"
    """What the agent reads: ``vla`` (the frozen VLA's embedding) or ``cnn`` (the cameras at 64 x 64 and the
    robot state through a small CNN trained by the critic loss, as DSRL on pi0; in-process sessions only)."""
    robot: str = "sim-franka-fast"
    """Site preset or YAML."""
    total_ticks: int = 10_000
    """Budget of environment steps (control ticks; a chunk of 8 executed rows = 8 ticks)."""
    max_episode_ticks: int | None = None
    """Episode length in ticks (default: the task's max_steps)."""
    exec_steps: int | None = None
    """Rows of each chunk executed per macro-step (default the whole chunk)."""
    noise_bound: float = 1.5
    noise_dims: int | None = None
    warmup_steps: int = 100
    """Macro-steps of the base VLA (w ~ N(0, I)) before learning starts."""
    distill_steps: int = 10
    """DSRL-NA: noise-critic distillation steps per update round (the paper: 10)."""
    utd: int = 20
    batch_size: int = 256
    num_critics: int = 10
    hidden: tuple[int, ...] = (256, 256)
    gamma: float = 0.99
    """Discount per macro-step."""
    init_temperature: float = 0.01
    """Initial SAC temperature. The success reward is 0 / 1 while a 56-d noise policy's log-density
    is tens of nats, so alpha starts small (alpha = 1 would drown the reward in entropy)."""
    init_log_std: float | None = 0.0
    """The noise policy's initial log std before the tanh (SACConfig.init_log_std); 0 starts it close
    to the N(0, I) the VLA denoises, i.e. at the base VLA (None: the CleanRL init, std ~0.22, which
    samples the VLA near its single 'mode' chunk)."""
    eval_policy: str = "sample"
    """Evaluations: ``sample`` draws the noise from the agent's policy (seeded by the evaluation
    episode, as the base VLA's N(0, I) is), ``mean`` takes its mean (SAC's deterministic action)."""
    backup_entropy: bool = False
    """Soft (entropy) term in the TD target (SERL turns it off for sparse rewards)."""
    eval_every: int = 10
    """Episodes between deterministic evaluations (0: none)."""
    eval_episodes: int = 10
    eval_seed_start: int = 200_000
    checkpoint_every: int = 1
    """Episodes between checkpoints (agent, replay buffers, counters, RNG states)."""
    seed: int = 0
    threads: int | None = 1
    videos: int = 1
    """Evaluation episodes saved as MP4 at the final evaluation."""
    reward: str = "task"
    """Reward source: ``task`` (the sim task's success predicate) or ``classifier:DIR`` (a success
    classifier from ``vla reward train``: the reward on a real robot)."""
    instruction: str | None = None
    """Real robot: the instruction given to the VLA (a sim task brings its own)."""
    demos: tuple[str, ...] = ()
    """LeRobot datasets (recorded with ``vla record``) whose episodes with the session's instruction
    enter the demo buffer before the first episode (DSRL-NA's action critic trains on them 50 / 50
    with online transitions; variant ``na`` only: the others have no action critic)."""
    reset_timeout_s: float = 300.0
    """Real robot: seconds the operator has to reset the scene and press Enter before the session
    pauses (its last checkpoint stays; ``--resume`` continues)."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {self.encoder!r}")
        for f in ("total_ticks", "utd", "batch_size", "num_critics", "eval_episodes", "checkpoint_every"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive, got {getattr(self, f)}")
        if self.eval_every < 0 or self.warmup_steps < 0:
            raise ValueError("eval_every and warmup_steps must be >= 0")
        if self.reward != "task" and not self.reward.startswith("classifier:"):
            raise ValueError(f"reward must be 'task' or 'classifier:DIR', got {self.reward!r}")
        if self.reward == "task" and not self.task:
            raise ValueError("reward 'task' needs a sim task (a real robot takes reward 'classifier:DIR')")
        if self.eval_policy not in ("sample", "mean"):
            raise ValueError(f"eval_policy must be 'sample' or 'mean', got {self.eval_policy!r}")
        if self.demos and self.variant != "na":
            raise ValueError(f"demos enter DSRL-NA's action critic; variant {self.variant!r} has none (its critic "
                             "reads the noise, which a demonstration does not have): use variant 'na' or no demos")
        if self.reset_timeout_s <= 0:
            raise ValueError(f"reset_timeout_s must be positive, got {self.reset_timeout_s}")

    def to_json(self, path: str) -> None:
        import os

        with open(path + ".tmp", "w") as f:
            json.dump(dataclasses.asdict(self), f, indent=2)
        os.replace(path + ".tmp", path)

    @classmethod
    def from_json(cls, path: str) -> "RLConfig":
        with open(path) as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def from_dict(cls, d: dict) -> "RLConfig":
        """From ``dataclasses.asdict`` output that went through JSON or msgpack (lists for tuples)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"RLConfig has no field(s) {sorted(unknown)}")
        d = dict(d)
        for k in ("hidden", "demos"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)
