"""``DSRLConfig``: the settings of a DSRL agent (no torch here: ``vla rl`` builds its flags from
the documented fields of this dataclass and of its nested ``SACConfig``)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from policies.common.sac_config import SACConfig, ValueTargetConfig

VARIANTS = ("sac", "na", "action")
ENCODERS = ("vla", "cnn", "oracle")
NOISE_SUBSPACES = ("tile", "mean")


@dataclasses.dataclass(frozen=True)
class DSRLConfig:
    NOT_FLAGS: ClassVar[tuple[str, ...]] = ("sac.action_scale",)
    """Fields the command line does not offer (action_scale is set from noise_bound / action_bound)."""

    variant: str = dataclasses.field(default="na", metadata={"choices": VARIANTS})
    """DSRL variant: ``na`` (noise-aliased, recommended), ``sac`` (SAC directly in noise space) or
    ``action`` (the baseline: plain SAC on the raw action chunk, not steering the VLA)."""
    encoder: str = dataclasses.field(default="vla", metadata={"choices": ENCODERS})
    """What actor and critics read: ``vla`` (the frozen VLA's embedding) or ``cnn`` (the camera frames at
    ``image_size`` + the robot state through a small CNN trained by the critic loss, as DSRL on pi0;
    the replay stores the frames, so such a session runs in-process only) or ``oracle`` (a labelled oracle for
    diagnostics, sim tasks only: the VLA's embedding plus the simulator's object poses relative to the gripper,
    ``vla.oracle_env``; does the critic fail because it cannot see what decides success?)."""
    noise_bound: float = 1.5
    """b: the agent's noise lies in [-b, b]^d (paper: 1.0 - 2.5)."""
    action_bound: float = 1.0
    """action: the agent's chunk lies in [-b, b]^(H*A) of the VLA's normalised action units (1: the compact
    VLA's whole min / max range; a LeRobot backbone's mean / std units need about 3 to reach most of its data)."""
    noise_dims: int | None = None
    """None: w has H*A dims (the whole chunk's noise). A: one A-dim w per chunk, placed by ``noise_subspace``."""
    noise_subspace: str = dataclasses.field(default="tile", metadata={"choices": NOISE_SUBSPACES})
    """With ``noise_dims`` A: ``tile`` repeats w over the H rows (the pi0 option; a tiled N(0, I) is not the
    N(0, I) a flow VLA was trained to denoise: the compact VLA solved 0 of 39 pick_red_cube episodes from it,
    against 25% from its own noise, issue 15). ``mean``: w is each action dim's noise along the chunk's
    all-ones direction (row mean w / sqrt(H)) and the orthogonal rest is drawn i.i.d. afresh for every
    chunk, so w ~ N(0, I) gives exactly the VLA's own N(0, I) noise: the base VLA is where the agent starts."""
    exec_steps: int | None = None
    """Rows of each chunk executed per macro-step (default: the whole chunk)."""
    distill_steps: int = 10
    """NA: noise-critic (Q^W) distillation steps per update round (the paper: 10)."""
    diag_every: int = 1
    """Critic diagnostics (``DSRLAgent.critic_diagnostics``: the spread over noises of Q^W and Q^A at fixed
    states) every this many update rounds, logged with the losses (0: never; the policy's log std, |mean|,
    entropy and alpha are logged every round regardless)."""
    diag_states: int = 8
    """Critic diagnostics: the first this many decision states of the online buffer (where the executed chunk
    closes or opens the gripper, ``policies.common.decisions``; the buffer's first states until one exists)."""
    diag_noises: int = 32
    """Critic diagnostics: this many fixed noises w ~ N(0, I) per state."""
    image_size: int = 64
    """cnn: side of the square uint8 camera frames the encoder reads (and the replay buffers store)."""
    image_pad: int = 4
    """cnn: DrQ random shift of the replayed frames by up to +-image_pad pixels per critic update (0: none)."""
    sac: SACConfig = SACConfig(utd=20, init_log_std=0.0, init_temperature=0.01, backup_entropy=False,
                               value=ValueTargetConfig(time_limit="terminal"))
    """SAC settings (action_scale is set from noise_bound, or action_bound for variant action). Against
    the reference codes (``ajwagen/dsrl`` on robomimic, ``nakamotoo/dsrl_pi0``):

    * ``update_schedule`` ``per_step``: as both: every gradient step updates critic, actor and
      temperature (UTD 20: 20 of each per macro-step); NA distils Q^W on a fresh batch per step.
    * ``init_temperature`` 0.01 (both references: 1.0). Departure: alpha moves by about ``alpha_lr``
      in log space per step (Adam), so from 1.0 it needs ~15K actor steps to reach 0.01, i.e. ~750
      macro-steps at UTD 20 -- the references' budgets (100Ks of steps) absorb that; ours (1-2K
      macro-steps) do not: a trial at alpha 1.0 held the policy at its maximal entropy for a whole
      10K-tick session (issue 15). With a 0 / 1 success reward, alpha 0.01 weighs ~50 nats of noise
      entropy at 0.5 success; the synthetic tests (``tests/policies/test_dsrl_sanity.py``) pass with it.
    * ``target_entropy`` None: -d/2 with d the noise dims (DSRL-pi0's 'auto'; robomimic and ALOHA
      use 0, measured in [-1, 1] on robomimic, i.e. d log b in our [-b, b] convention).
    * ``init_log_std`` 0 (SB3's ``log_std_init`` 0 on robomimic): the first noise policy is
      b tanh(N(0, I)), close to the N(0, I) the VLA denoises, so a session starts at the base VLA.
    * ``value.time_limit`` ``terminal`` (issue 61; DSRL's robomimic runs end the episode at the time limit): a
      failure that ran out of time is not valued as a later success (``tests/policies/test_value_target.py``'s
      MDP; ``bench/critic_truth.py``). The reward stays 0 / 1 (both references: -1 per step, 0 at success).
    * ``backup_entropy`` False (both references subtract alpha log pi in the TD target): sparse 0 / 1
      rewards (SERL); no entropy bonus inflates Q^A where no reward was ever seen.
    * Networks: ``hidden`` (256, 256) with LayerNorm, 10 critics, actor on the ensemble mean (RLPD);
      robomimic: 3 x 2048 with LayerNorm and Tanh, 2 critics, min; pi0: 3 x 128, 10 critics, mean.
    * Warm-up: the session's ``warmup_steps`` macro-steps of the base VLA (robomimic ~1.5K steps x 4
      envs, pi0 LIBERO 500, ALOHA 1000)."""

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"DSRLConfig.variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.noise_subspace not in NOISE_SUBSPACES:
            raise ValueError(f"DSRLConfig.noise_subspace must be one of {NOISE_SUBSPACES}, got {self.noise_subspace!r}")
        if not self.noise_bound > 0:
            raise ValueError(f"DSRLConfig.noise_bound must be positive, got {self.noise_bound}")
        if not self.action_bound > 0:
            raise ValueError(f"DSRLConfig.action_bound must be positive, got {self.action_bound}")
        if self.distill_steps < 1:
            raise ValueError("DSRLConfig.distill_steps must be >= 1")
        if self.diag_every < 0:
            raise ValueError(f"DSRLConfig.diag_every must be >= 0 (0: no critic diagnostics), got {self.diag_every}")
        if self.diag_states < 1 or self.diag_noises < 2:
            raise ValueError(f"DSRLConfig.diag_states must be >= 1 and diag_noises >= 2 (a spread needs two), got "
                             f"{self.diag_states} and {self.diag_noises}")
        if self.encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {self.encoder!r}")
        if self.image_size < 16 or self.image_size % 16:
            raise ValueError(f"DSRLConfig.image_size must be a positive multiple of 16 (the CNN halves it 4 times), "
                             f"got {self.image_size}")
        if not 0 <= self.image_pad < self.image_size // 2:
            raise ValueError(f"DSRLConfig.image_pad must be in [0, {self.image_size // 2}), got {self.image_pad}")

    def check_session(self, session) -> None:
        """Cross-checks with the session's settings (``session.config.RLConfig`` calls it)."""
        if session.demos and self.variant != "na":
            raise ValueError(f"demos enter DSRL-NA's action critic; variant {self.variant!r} has none (its critic "
                             "reads the noise, which a demonstration does not have): use variant 'na' or no demos")

    @property
    def label(self) -> str:
        """Short name for progress bars and summaries."""
        return f"dsrl-{self.variant}"
