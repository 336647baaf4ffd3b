"""SARL's semantic MDP: one action is a language prompt, held by the frozen VLA for up to K chunks.

``SemanticEnv`` wraps two callables the caller owns (the env, the frozen VLA and its latest observation
live behind them, so nothing here knows a robot or a backbone):

* ``reset() -> (obs, info)``: start an episode (gymnasium's ``reset``);
* ``step_chunk(prompt) -> (obs, reward, terminated, truncated, info)``: the frozen VLA samples one
  action chunk for the latest observation with ``prompt`` as its instruction, and the chunk is executed
  (stopping at the first terminated / truncated row, as the session does). ``info["ticks"]``, if
  present, is the number of control ticks the chunk took; ``info["subgoals"]`` (``{name: bool}``, as
  ``rewards.sim_success`` puts there) and ``info["success"]`` are read when present.

One semantic step (``SemanticEnv.step(prompt)``)::

    terminator.start(prompt, obs, info)
    for chunk in 1..K:                                  K = max_chunks (SARLConfig.chunks_per_prompt)
        obs, r, terminated, truncated, info = step_chunk(prompt)
        reward += r                                     sparse: the task's success reward
        if terminated or truncated: stop                the episode ended
        if terminator.stop(obs, info, chunk): stop      the prompt's sub-skill is done (or its budget)
    after max_steps semantic steps the episode is truncated

Terminators decide when a prompt has done its job:

* ``ChunkBudget(k)``: hold every prompt for exactly ``k`` chunks (non-privileged: deployable anywhere).
* ``ClassifierTerminator(classifier)``: a success classifier on observations (a learned sub-goal
  detector, a VLM judge): the real-robot path.
* ``PrivilegedSubgoalTerminator``: a *privileged* simulator predicate (a task's sub-goals, or
  ``hardware.sim_tasks.skill_done`` for the prompted sub-skill): sim only, an upper bound.

Grounding (``SemanticStepResult.subgoals_reached``): the sub-goals that became true under a prompt,
read from ``info["subgoals"]`` when the env reports them (simulators do). It is a diagnostic: it never
reaches the prompt policy.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence

ChunkStep = Callable[[str], tuple[Any, float, bool, bool, dict]]
"""prompt -> (obs, reward, terminated, truncated, info): one chunk of the frozen VLA under ``prompt``."""
Reset = Callable[[], tuple[Any, dict]]
"""() -> (obs, info): a new episode."""


@dataclasses.dataclass(frozen=True)
class SemanticStepResult:
    """What one prompt did (one transition of the semantic MDP)."""

    prompt: str
    """The prompt the frozen VLA was given."""
    obs: Any
    """The next semantic state: the observation after the last chunk."""
    reward: float
    """Sum of the chunks' rewards (with a sparse task reward: 1 when the task succeeded under this prompt)."""
    terminated: bool
    """The episode reached a terminal state (success or failure): the TD target does not bootstrap."""
    truncated: bool
    """The episode was cut (the env's time limit or ``max_steps`` semantic steps): the target bootstraps."""
    success: bool
    """The task succeeded during this step (``info["success"]`` if the env reports it, else terminated
    with a positive reward)."""
    chunks: int
    """Chunks executed under the prompt (1..K)."""
    ticks: int
    """Control ticks used (``info["ticks"]`` summed over the chunks, ``ticks_per_chunk`` per chunk
    that does not report it)."""
    stopped_by: str
    """Why the prompt ended: ``terminator`` (its sub-skill is done), ``budget`` (K chunks) or ``episode``
    (the episode terminated or was truncated)."""
    subgoals_reached: tuple[str, ...]
    """Grounding: the sub-goals true at the end of some chunk of this step that were false when the
    prompt was given (empty when the env reports none)."""
    info: dict
    """The last chunk's info."""

    @property
    def done(self) -> bool:
        """The episode is over (terminated or truncated)."""
        return self.terminated or self.truncated


class Terminator(Protocol):
    """Decides when a prompt has done its job. ``privileged``: it reads simulator state that no real
    robot has (an upper bound, not a deployable method)."""

    privileged: bool

    def start(self, prompt: str, obs: Any, info: dict) -> None:
        """A semantic step begins: ``prompt`` is given in state ``obs`` / ``info``."""

    def stop(self, obs: Any, info: dict, chunks: int) -> bool:
        """After ``chunks`` chunks under the prompt: end the semantic step now?"""


class ChunkBudget:
    """Hold every prompt for ``k`` chunks (a fixed budget; non-privileged)."""

    privileged: ClassVar[bool] = False

    def __init__(self, k: int) -> None:
        if int(k) < 1:
            raise ValueError(f"ChunkBudget: k must be >= 1 chunk, got {k}")
        self.k = int(k)

    def start(self, prompt: str, obs: Any, info: dict) -> None:
        pass  # nothing to remember: the budget is the same for every prompt

    def stop(self, obs: Any, info: dict, chunks: int) -> bool:
        return chunks >= self.k


class ClassifierTerminator:
    """End the prompt when ``classifier(obs, prompt)`` (a probability or a bool: "has the robot done
    what the prompt asked?") reaches ``threshold``, after at least ``min_chunks`` chunks. The
    real-robot path: the classifier sees only what the robot's sensors give (non-privileged)."""

    privileged: ClassVar[bool] = False

    def __init__(self, classifier: Callable[[Any, str], float | bool], threshold: float = 0.5,
                 min_chunks: int = 1) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"ClassifierTerminator: threshold must be in (0, 1], got {threshold}")
        if int(min_chunks) < 1:
            raise ValueError(f"ClassifierTerminator: min_chunks must be >= 1, got {min_chunks}")
        self.classifier, self.threshold, self.min_chunks = classifier, float(threshold), int(min_chunks)
        self._prompt = ""

    def start(self, prompt: str, obs: Any, info: dict) -> None:
        self._prompt = prompt

    def stop(self, obs: Any, info: dict, chunks: int) -> bool:
        return chunks >= self.min_chunks and float(self.classifier(obs, self._prompt)) >= self.threshold


def info_subgoals(obs: Any, info: dict) -> Mapping[str, bool]:
    """The simulator's sub-goals of this state as the env reports them (``info["subgoals"]``, put there
    by ``rewards.sim_success``); empty when it reports none."""
    return info.get("subgoals") or {}


class PrivilegedSubgoalTerminator:
    """PRIVILEGED (simulator state only): end the prompt when a watched sub-goal becomes newly true,
    i.e. holds now but did not when the prompt was given.

    ``subgoals(obs, info) -> {name: bool}`` reads the sub-goals; the default reads ``info["subgoals"]``
    (a sim task's ``Task.subgoals`` via ``rewards.sim_success``). For the prompted sub-skill's own
    completion, pass e.g. ``lambda obs, info: {"done": hardware.sim_tasks.skill_done(skill, *state)}``.
    ``watch``: the names that count (None: any sub-goal)."""

    privileged: ClassVar[bool] = True

    def __init__(self, subgoals: Callable[[Any, dict], Mapping[str, bool]] = info_subgoals,
                 watch: Sequence[str] | None = None) -> None:
        self.subgoals = subgoals
        self.watch = None if watch is None else frozenset(watch)
        self._before: frozenset[str] = frozenset()

    def _true(self, obs: Any, info: dict) -> frozenset[str]:
        true = {k for k, v in self.subgoals(obs, info).items() if v}
        return frozenset(true if self.watch is None else true & self.watch)

    def start(self, prompt: str, obs: Any, info: dict) -> None:
        self._before = self._true(obs, info)

    def stop(self, obs: Any, info: dict, chunks: int) -> bool:
        return bool(self._true(obs, info) - self._before)


class SemanticEnv:
    """The semantic MDP over a chunk-level env and a frozen VLA (see the module docstring).

    Args:
        reset: ``() -> (obs, info)``, a new episode.
        step_chunk: ``prompt -> (obs, reward, terminated, truncated, info)``, one chunk under ``prompt``.
        terminator: when a prompt is done (``ChunkBudget``, ``ClassifierTerminator``,
            ``PrivilegedSubgoalTerminator``).
        max_chunks: K, the most chunks one prompt is held (``SARLConfig.chunks_per_prompt``).
        max_steps: semantic steps per episode (``SARLConfig.max_semantic_steps``); the episode is then
            truncated.
        ticks_per_chunk: control ticks counted for a chunk whose info has no ``ticks``.
    """

    def __init__(self, reset: Reset, step_chunk: ChunkStep, terminator: Terminator, max_chunks: int,
                 max_steps: int, ticks_per_chunk: int = 1) -> None:
        if int(max_chunks) < 1 or int(max_steps) < 1:
            raise ValueError(f"SemanticEnv: max_chunks and max_steps must be >= 1, got {max_chunks} and {max_steps}")
        self._reset, self._step_chunk, self.terminator = reset, step_chunk, terminator
        self.max_chunks, self.max_steps, self.ticks_per_chunk = int(max_chunks), int(max_steps), int(ticks_per_chunk)
        self.steps = 0
        """Semantic steps taken in the current episode."""
        self._obs: Any = None
        self._info: dict = {}
        self._done = True

    def reset(self) -> tuple[Any, dict]:
        """Start an episode: -> (obs, info) of its first state."""
        self._obs, self._info = self._reset()
        self.steps, self._done = 0, False
        return self._obs, self._info

    def step(self, prompt: str) -> SemanticStepResult:
        """Hold ``prompt`` for up to K chunks (see the module docstring)."""
        if self._done:
            raise RuntimeError("SemanticEnv.step: the episode is over (or never started); call reset() first")
        before = {k for k, v in info_subgoals(self._obs, self._info).items() if v}
        reached: dict[str, None] = {}  # ordered set: the order in which sub-goals first held
        self.terminator.start(prompt, self._obs, self._info)
        reward, ticks, terminated, truncated, stopped_by = 0.0, 0, False, False, "budget"
        chunks = 0
        for chunks in range(1, self.max_chunks + 1):
            obs, r, terminated, truncated, info = self._step_chunk(prompt)
            self._obs, self._info = obs, info
            reward += float(r)
            ticks += int(info.get("ticks", self.ticks_per_chunk))
            reached.update((k, None) for k, v in info_subgoals(obs, info).items() if v and k not in before)
            if terminated or truncated:
                stopped_by = "episode"
                break
            if self.terminator.stop(obs, info, chunks):
                stopped_by = "terminator"
                break
        self.steps += 1
        if not terminated and self.steps >= self.max_steps:
            truncated = True  # the semantic time limit
        self._done = bool(terminated or truncated)
        success = bool(self._info.get("success", terminated and reward > 0))
        return SemanticStepResult(prompt=prompt, obs=self._obs, reward=reward, terminated=bool(terminated),
                                  truncated=bool(truncated), success=success, chunks=chunks, ticks=ticks,
                                  stopped_by=stopped_by, subgoals_reached=tuple(reached), info=self._info)
