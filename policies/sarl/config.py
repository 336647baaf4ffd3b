"""``SARLConfig``: the settings of a SARL prompt policy (no torch here: ``vla rl`` can build its flags
from the documented fields). The choices and which of them are reconstructions (R) are in
``policies/sarl/__init__.py``."""

from __future__ import annotations

import dataclasses

EXPLORATIONS = ("boltzmann", "epsilon")
TERMINATORS = ("budget", "subgoal")
PROMPT_POLICIES = ("learned", "subskills", "random")
"""``vla rl --terminator``: a fixed chunk budget (deployable anywhere) or the sim task's sub-goals (PRIVILEGED);
``classifier:DIR`` (a success classifier from ``vla reward``) is the real-robot path."""


@dataclasses.dataclass(frozen=True)
class SARLConfig:
    chunks_per_prompt: int = 4
    """K: the most action chunks the frozen VLA executes under one prompt (one semantic step); a
    terminator may end the step earlier."""
    max_semantic_steps: int = 12
    """Semantic steps (prompts) per episode; the episode is truncated after that many (a time limit:
    the TD target still bootstraps through it)."""
    gamma: float = 0.9
    """Discount per *semantic step* (not per control tick): a prompt that needs two more prompts to
    success is worth gamma^2."""
    n_step: int = 3
    """n of the n-step TD target over semantic steps (1: one-step Q-learning)."""
    lr: float = 3e-4
    """Adam step size of the critics."""
    batch_size: int = 64
    """Semantic transitions per gradient step."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of each critic MLP Q(s, e) (LayerNorm + ReLU after each hidden layer)."""
    tau: float = 0.01
    """Polyak coefficient of the target critics: target <- (1 - tau) target + tau online, every update."""
    exploration: str = dataclasses.field(default="boltzmann", metadata={"choices": EXPLORATIONS})
    """How training picks prompts after warm-up: ``boltzmann`` samples softmax(Q / temperature) over the
    library; ``epsilon`` takes a uniform prompt with probability epsilon, else argmax Q."""
    temperature_start: float = 1.0
    """Boltzmann temperature (in units of Q, i.e. of the 0 / 1 task reward) when warm-up ends."""
    temperature_end: float = 0.02
    """Boltzmann temperature after ``explore_decay_steps`` semantic steps (linear decay)."""
    epsilon_start: float = 1.0
    """Epsilon when warm-up ends (exploration ``epsilon``)."""
    epsilon_end: float = 0.05
    """Epsilon after ``explore_decay_steps`` semantic steps (linear decay)."""
    explore_decay_steps: int = 500
    """Semantic steps after warm-up over which the temperature / epsilon decays linearly."""
    replay_capacity: int = 20_000
    """Semantic transitions kept (a ring: the oldest is overwritten)."""
    updates_per_step: int = 8
    """Gradient steps per semantic step, once warm-up is over (a semantic step costs seconds of robot
    time, a gradient step milliseconds)."""
    warmup_steps: int = 32
    """Semantic steps of uniformly random prompts before the first update."""
    max_grad_norm: float = 10.0
    """Clip the critics' gradient global norm (0: no clipping)."""
    seed: int = 0
    """Seeds the critics' initialisation, prompt sampling and replay sampling (a ``vla rl`` session passes its
    own ``--seed``)."""
    # -- in a ``vla rl`` session ----------------------------------------------------------------------
    exec_steps: int | None = None
    """Rows of each VLA chunk executed before the VLA is queried again under the held prompt (None: the whole
    chunk). A prompt is held for up to ``chunks_per_prompt`` x this many control ticks."""
    terminator: str = dataclasses.field(default="budget", metadata={"metavar": "budget|subgoal|classifier:DIR"})
    """When a prompt has done its job: ``budget`` (exactly ``chunks_per_prompt`` chunks; non-privileged),
    ``subgoal`` (PRIVILEGED, sim only: as soon as one of the task's sub-goals named by ``subgoal_watch`` becomes
    newly true, read from the simulator's ``info["subgoals"]``) or ``classifier:DIR`` (a success classifier
    trained with ``vla reward`` whose probability on the camera frames reaches its threshold: the real-robot
    path). Every terminator also stops at the chunk budget."""
    subgoal_watch: tuple[str, ...] = ("lifted_*", "*_in_bowl", "released")
    """Terminator ``subgoal``: the sub-goal names (shell patterns) whose becoming true ends a prompt (a pick ends
    when its cube is lifted, a place when the cube is in the bowl or released)."""
    prompts: str = ""
    """A text file of extra candidate prompts, one per line (a real robot's skill vocabulary); added after the
    sim task's vocabulary (its instruction, trained paraphrases, sub-skill instructions and templates)."""
    prompt_policy: str = dataclasses.field(default="learned", metadata={"choices": PROMPT_POLICIES})
    """Who picks the prompts: ``learned`` (SARL's critic), ``subskills`` (the hand-written sequence: the sim task's
    sub-skill instructions in order, moving to the next one when the terminator ends the current one and repeating
    it when the chunk cap does, so a missed grasp is retried; the last one is repeated; the upper bound a prompt
    policy is measured against) or ``random`` (uniform over the library at every prompt, also in evaluations). The two
    fixed ones learn nothing: run them with ``--total-ticks 0`` to evaluate them."""
    templates: bool = True
    """Add the verb / object / place templates (``policies.sarl.library.SIM_TEMPLATES`` over the colours) to the
    library; off: only the task's own instruction, paraphrases, sub-skills and ``prompts``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        for name in ("chunks_per_prompt", "max_semantic_steps", "n_step", "batch_size", "replay_capacity",
                     "updates_per_step", "explore_decay_steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"SARLConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_steps < 0:
            raise ValueError(f"SARLConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"SARLConfig.gamma must be in (0, 1], got {self.gamma}")
        if not self.lr > 0:
            raise ValueError(f"SARLConfig.lr must be positive, got {self.lr}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"SARLConfig.tau must be in (0, 1] (1: copy the critics every update), got {self.tau}")
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"SARLConfig.hidden must list at least one positive width, got {self.hidden}")
        if self.exploration not in EXPLORATIONS:
            raise ValueError(f"SARLConfig.exploration must be one of {EXPLORATIONS}, got {self.exploration!r}")
        if not 0.0 < self.temperature_end <= self.temperature_start:
            raise ValueError(f"SARLConfig.temperature_start / temperature_end: need 0 < temperature_end <= "
                             f"temperature_start, got {self.temperature_start} and {self.temperature_end}")
        if not 0.0 <= self.epsilon_end <= self.epsilon_start <= 1.0:
            raise ValueError(f"SARLConfig.epsilon_start / epsilon_end: need 0 <= epsilon_end <= epsilon_start <= 1, "
                             f"got {self.epsilon_start} and {self.epsilon_end}")
        if self.max_grad_norm < 0:
            raise ValueError(f"SARLConfig.max_grad_norm must be >= 0 (0: no clipping), got {self.max_grad_norm}")
        if self.exec_steps is not None and int(self.exec_steps) < 1:
            raise ValueError(f"SARLConfig.exec_steps must be >= 1 (or None: the whole chunk), got {self.exec_steps}")
        if self.terminator not in TERMINATORS and not (self.terminator.startswith("classifier:")
                                                       and len(self.terminator) > len("classifier:")):
            raise ValueError(f"SARLConfig.terminator must be 'budget', 'subgoal' or 'classifier:DIR', "
                             f"got {self.terminator!r}")
        if self.prompt_policy not in PROMPT_POLICIES:
            raise ValueError(f"SARLConfig.prompt_policy must be one of {PROMPT_POLICIES}, got {self.prompt_policy!r}")
        object.__setattr__(self, "subgoal_watch", tuple(str(w) for w in self.subgoal_watch))
        if self.batch_size > self.replay_capacity:
            raise ValueError(f"SARLConfig.batch_size ({self.batch_size}) must not exceed replay_capacity "
                             f"({self.replay_capacity})")

    @property
    def label(self) -> str:
        """Short name for progress bars and summaries."""
        return f"sarl-{self.exploration}"
