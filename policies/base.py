"""The ``Agent`` interface: what every RL method in ``policies/`` implements for the session.

The session (``session/``) runs any Agent, in process or split into an actor (at the robot) and a
learner (GPU box), and never names a method. One macro-step of the session::

    aobs = agent.observe(obs)                       the agent's view of the env observation
    act  = agent.act_chunk(aobs, rng, warmup=...)   the chunk to execute (the VLA's normalised units,
                                                    [exec_steps, A]) + the agent's own action to store
    (an operator may replace act.chunk; the transition is flagged as an intervention and stores
     vla.clip_normalized_actions(vla.normalize_actions(operator chunk)))
    env.step(vla.unnormalize_actions(act.chunk))
    for name in agent.buffers(intervention): session.<name>.add(transition)     "online" / "demo"
    agent.update(online, demo, rng) -> {"losses/...": float}                    after warm-up

A transition is ``dict(obs, action, reward, next_obs, done, chunk, intervention)``: ``obs`` /
``next_obs`` hold the ``obs_spec`` keys of ``observe``'s output (one row), ``action`` the agent's
action (``action_dim`` floats), ``chunk`` the executed chunk (normalised, ``chunk_shape``).
"Normalised" is the backbone's own action space (``vla.models.base.VLA.normalize_actions``): min /
max units in [-1, 1] for the compact VLA, mean / std units (unbounded) for the LeRobot adapters; an
agent must not assume [-1, 1].
The same arrays travel from the actor to the learner (``session.protocol``), so a method that
fits this interface splits without any change to the protocol.

The agent acts through the VLA's steering handles only (``embed``, ``sample_actions_from_embedding``
with ``noise`` / ``token`` / ``instruction``, ``normalize_actions`` / ``unnormalize_actions``,
``noise_shape``, ``action_shape``); ``HANDLES`` names those a method needs, and ``check_handles``
refuses a VLA that lacks one, naming it.

A method is a folder ``policies/<name>/`` with its Agent subclass and its config (a frozen
dataclass with documented fields: the fields become ``vla rl`` flags), and one line in
``policies.REGISTRY``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np


@dataclasses.dataclass
class Act:
    """What the agent decided for one macro-step (a batch of one observation)."""

    action: np.ndarray
    """The agent's own action, float32 ``[action_dim]``: what the transition stores (DSRL: the noise w)."""
    chunk: Any
    """The chunk to execute, a torch tensor ``[exec_steps, A]`` in the VLA's normalised units (the
    backbone's own: not necessarily within [-1, 1])."""


def check_handles(vla, names: tuple[str, ...] | list[str], method: str) -> None:
    """Refuse a VLA that lacks one of the steering handles ``names``, naming the missing one(s)."""
    if hasattr(vla, "require_handles"):  # the VLA interface's own check
        vla.require_handles(*names)
        return
    attr = {"noise": "noise_shape", "token": "num_tokens", "instruction": "sample_actions"}
    missing = [n for n in names if not hasattr(vla, attr.get(n, n))]
    if missing:
        raise ValueError(f"method {method!r} steers the VLA through {', '.join(missing)}, which "
                         f"{type(vla).__name__} does not have (missing steering handle(s): {', '.join(missing)})")


class Agent:
    """The interface (subclass it). Attributes every agent sets in ``__init__``:

    ``cfg`` (its config), ``exec_steps`` (chunk rows executed per macro-step), ``chunk_shape``
    (``(exec_steps, A)``), ``obs_spec`` ({name: (shape, dtype)} of what a transition's observation
    holds), ``action_dim`` (length of the stored agent action), ``updates`` (update rounds done:
    the version of the actor parameters).
    """

    name: ClassVar[str] = "agent"
    HANDLES: ClassVar[tuple[str, ...]] = ()
    """The VLA steering handles this method uses (names of ``vla.models.base.VLA.HANDLES``: noise, token,
    instruction, embed, normalize_actions, ...), checked when the agent is built."""

    cfg: Any
    exec_steps: int
    chunk_shape: tuple[int, int]
    obs_spec: dict[str, tuple[tuple[int, ...], Any]]
    action_dim: int
    updates: int = 0
    episodes_per_scene: int = 1
    """Consecutive training episodes the session starts from one scene (one seed): GRPO's group size; 1 for the rest."""

    # -- building ---------------------------------------------------------------------------------
    @classmethod
    def build(cls, vla, cfg, seed: int = 0, observation_space=None) -> "Agent":
        """The agent for a session: ``vla`` the frozen VLA, ``cfg`` the method's config,
        ``observation_space`` the env's (None on a learner, which has no env)."""
        check_handles(vla, cls.HANDLES, cls.name)
        return cls(vla, cfg, seed=seed)

    @classmethod
    def split_refusal(cls, cfg) -> str | None:
        """Why a session of this config cannot be split into actor / learner (None: it can)."""
        return None

    # -- acting -----------------------------------------------------------------------------------
    def observe(self, obs: dict) -> dict[str, Any]:
        """The agent's view of one env observation (images / state / instruction): a dict of torch
        tensors with a batch dimension of 1 holding every ``obs_spec`` key (it may hold more, for
        ``act_chunk`` only; those are not stored)."""
        raise NotImplementedError

    def act_chunk(self, aobs: dict[str, Any], rng: np.random.Generator, warmup: bool, deterministic: bool = False,
                  generator=None) -> Act:
        """The chunk to execute for ``aobs`` and the action to store. ``warmup``: the method's
        warm-up behaviour (before any update); ``deterministic``: its mean action (evaluations);
        ``generator``: a torch generator for the policy's noise (evaluations pass their own, so
        that they leave the training RNG streams alone)."""
        raise NotImplementedError

    def buffers(self, intervention: bool) -> tuple[str, ...]:
        """Which replay buffers a transition goes to: ``online`` and / or ``demo``. Default: every
        transition online, an operator's intervention also in the demo buffer."""
        return ("online", "demo") if intervention else ("online",)

    def demo_transitions(self, roots, instruction: str, progress: bool = True) -> tuple[list[dict], dict]:
        """Recorded demonstrations (LeRobot datasets) as transitions for the demo buffer, and a
        report. Default: the method takes none."""
        raise ValueError(f"method {self.name!r} takes no recorded demos")

    # -- optional hooks (defaults do nothing) -------------------------------------------------------
    def bind(self, task: Any = None, instruction: str | None = None) -> None:
        """The session's task, once, before anything else: ``task`` a sim task object
        (``hardware.sim_tasks.Task``, read by duck typing; None on a real robot or an ``--env``) and
        ``instruction`` the session's instruction. Default: not needed."""

    def begin_episode(self, obs: dict, info: dict, learn: bool = False) -> None:
        """A training (``learn``) or evaluation episode starts (``obs``, ``info``: the env's reset)."""

    def end_episode(self, result: dict[str, Any]) -> dict[str, float]:
        """A training episode of an in-process session ended (``result``: success, ticks, return, ...). -> an
        episode-level update's diagnostics (on-policy methods update here; {}: none, the default)."""
        return {}

    def after_chunk(self, obs: dict, info: dict) -> None:
        """A chunk was executed (``obs``, ``info``: the env's after it), before the next ``observe``."""

    def episode_log(self) -> dict[str, Any]:
        """What the agent adds to the episode's line of ``episodes.jsonl`` (numbers also go to TensorBoard)."""
        return {}

    def summarize(self, run_dir: str) -> dict[str, Any]:
        """What the agent adds to ``summary.json`` (it may write its own files into ``run_dir``)."""
        return {}

    def report(self, per_episode: list[dict[str, Any]]) -> list[str]:
        """Lines printed after the final evaluation (``per_episode``: its episodes, with ``episode_log``'s
        entries)."""
        return []

    # -- learning ---------------------------------------------------------------------------------
    def update(self, online, demo, rng: np.random.Generator) -> dict[str, float]:
        """One update round from the replay buffers (``demo`` may be empty). -> diagnostics, flat
        namespaced keys (``losses/...``, ``charts/...``)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs (networks, optimisers, counters, generator states)."""
        raise NotImplementedError

    def load_state_dict(self, d: dict[str, Any]) -> None:
        raise NotImplementedError

    def actor_parameters(self) -> dict[str, Any]:
        """What a remote actor needs to act: {name: float tensor} (pushed by the learner)."""
        raise NotImplementedError

    def load_actor_parameters(self, params: dict[str, Any]) -> None:
        raise NotImplementedError

    def parameter_counts(self) -> dict[str, int]:
        """Trainable parameters by part, with ``total``."""
        return {"total": 0}
