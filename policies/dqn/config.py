"""``DQNConfig``: the settings of a Nature-DQN run (no torch here).

Defaults follow CleanRL's ``dqn_atari.py`` (Adam 1e-4, Huber-free MSE there; we keep Nature's Huber
loss) where it departs from the Nature paper (Mnih et al. 2015: RMSprop 2.5e-4, target update every
10K updates, replay 1M, epsilon 1 -> 0.1 over 1M frames); ``optimizer="rmsprop"`` with
``learning_rate=2.5e-4`` gives the paper's optimiser (its centred RMSprop with eps 0.01).
``total_steps`` counts agent steps (one step = ``frame_skip`` emulator frames).
"""

from __future__ import annotations

import dataclasses
import json
import os

OPTIMIZERS = ("adam", "rmsprop")


@dataclasses.dataclass(frozen=True)
class DQNConfig:
    game: str = "pong"
    """The Atari game (an ale-py ROM id)."""
    total_steps: int = 200_000
    """Agent steps to train for (each is ``frame_skip`` emulator frames)."""
    learning_rate: float = 1e-4
    """Optimiser step size (Nature's RMSprop: 2.5e-4; CleanRL's Adam: 1e-4)."""
    optimizer: str = dataclasses.field(default="adam", metadata={"choices": OPTIMIZERS})
    """``adam`` (CleanRL, eps 1.5e-4 as in Dopamine) or ``rmsprop`` (Nature: alpha 0.95, eps 0.01, centred)."""
    buffer_size: int = 100_000
    """Replay capacity in transitions (Nature: 1M; each costs ~35 KB of uint8 frames)."""
    gamma: float = 0.99
    """Discount factor."""
    target_update_every: int = 1000
    """Copy the online network into the target network every this many agent steps (tau = 1)."""
    batch_size: int = 32
    """Transitions per gradient step."""
    start_e: float = 1.0
    """Epsilon at the start of training."""
    end_e: float = 0.01
    """Epsilon after ``exploration_fraction * total_steps`` steps (linear decay; Nature: 0.1)."""
    exploration_fraction: float = 0.10
    """Share of ``total_steps`` over which epsilon decays linearly."""
    learning_starts: int = 10_000
    """Steps of random play before the first update (fills the replay)."""
    train_every: int = 4
    """One gradient step every this many agent steps."""
    max_grad_norm: float = 10.0
    """Clip the gradient's global norm (0: no clipping)."""
    frame_skip: int = 4
    """Action repeat: emulator frames per agent step (the rig: the keys are held this long)."""
    frame_stack: int = 4
    """Frames stacked into one observation."""
    frame_size: int = 84
    """Side of the square grey frame the network sees."""
    action_history: int = 0
    """The agent's own last actions the network sees beside the pictures (one-hot each, newest last; 0:
    pictures only). A delay-aware state for a rig whose camera shows the screen as it was before the last
    key took effect (``hardware.virtual_rig``: ~57 ms of capture + key latency, about one decision).
    Behaviour cloning (``policies.dqn.bc``) trains it; the TD update here does not (``train`` refuses it)."""
    noop_max: int = 30
    """Random no-ops at the start of an episode (0..noop_max)."""
    terminal_on_life_loss: bool = True
    """Training only: a lost life ends the transition's bootstrap (Nature); evaluation plays whole games."""
    clip_rewards: bool = True
    """Train on sign(reward) (Nature); reported returns are the game's score."""
    max_episode_steps: int = 27_000
    """Truncate an episode after this many agent steps (108K frames, 30 minutes of play)."""
    eval_epsilon: float = 0.05
    """Epsilon of evaluation episodes (Nature: 0.05)."""
    checkpoint_every: int = 50_000
    """Checkpoint (network, optimiser, replay, RNG) every this many agent steps and at the end."""
    seed: int = 0
    """Seeds the emulator, the exploration and the network initialisation."""
    threads: int = 1
    """torch threads (the machine is shared)."""

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        for k in ("total_steps", "buffer_size", "target_update_every", "batch_size", "train_every", "frame_skip",
                  "frame_stack", "frame_size", "max_episode_steps", "checkpoint_every", "threads"):
            if int(getattr(self, k)) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")
        if not 0 <= self.end_e <= self.start_e <= 1:
            raise ValueError(f"need 0 <= end_e <= start_e <= 1, got start_e={self.start_e}, end_e={self.end_e}")
        if not 0 < self.exploration_fraction <= 1:
            raise ValueError(f"exploration_fraction must be in (0, 1], got {self.exploration_fraction}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if self.batch_size > self.buffer_size:
            raise ValueError(f"batch_size ({self.batch_size}) exceeds buffer_size ({self.buffer_size})")
        if self.learning_starts < self.batch_size:
            raise ValueError(f"learning_starts ({self.learning_starts}) must be at least batch_size "
                             f"({self.batch_size}): the first update samples a full batch")
        if self.action_history < 0:
            raise ValueError(f"action_history must be >= 0, got {self.action_history}")
        if self.noop_max < 0 or not 0 <= self.eval_epsilon <= 1 or self.learning_rate <= 0:
            raise ValueError("need noop_max >= 0, 0 <= eval_epsilon <= 1 and learning_rate > 0")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DQNConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown DQN config field(s): {', '.join(sorted(unknown))}")
        return cls(**d)

    def to_json(self, path: str) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
        os.replace(tmp, path)
