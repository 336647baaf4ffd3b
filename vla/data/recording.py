"""One demonstration episode: teleop -> RobotEnv -> EpisodeWriter. Used by `vla record` and
bench/record.py, so the benchmark measures exactly the loop a lab records with."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from robot_io.client import CommandError

DART_LABELS = ("clean", "executed")
"""What a DART frame stores as its action: the expert's clean answer, or the noisy command that ran."""

# server refusals that break an episode without anything being wrong with the data or the
# teleoperator: the episode is discarded and its scene recorded again
STALL_CODES = {"safe_state": "watchdog", "deadline_exceeded": "late"}


@dataclasses.dataclass
class EpisodeResult:
    outcome: str  # success | failure | rerecord | stop | interrupted | watchdog | late
    frames: int
    loop: dict
    """RobotEnv loop statistics for this episode (achieved_hz, late_ms_p50/p99/max, ...)."""
    step_ms: np.ndarray
    """Wall time of each recorded tick (teleop read + env step + add_frame), ms."""
    segments: list = dataclasses.field(default_factory=list)
    """``[first frame, task]`` each time the frames' task changed (one entry: the episode's)."""


def record_episode(env, teleop, writer, instruction: str, max_steps: int, seed: int | None = None,
                   task: str | None = None, privileged_fn: Callable[[], dict] | None = None,
                   end_on_success: bool = True, should_stop: Callable[[], bool] = lambda: False,
                   dart_sigma: float = 0.0, dart_label: str = "clean",
                   driver: Callable[[dict], np.ndarray | None] | None = None,
                   frame_task: Callable[[], str] | None = None) -> EpisodeResult:
    """Record one episode into ``writer``'s buffer (the caller saves or discards it).

    Frame k holds the observation the operator saw at tick k, the action the server applied on
    that tick (after its limits), the intervention flag and the real capture time (seconds since
    the episode's first frame; the oldest sample of the observation).

    ``dart_sigma`` > 0 turns on DART noise injection (Laskey et al. 2017) for a closed-loop expert:
    the robot executes the expert's action plus Gaussian noise of that std (m per tick) on the
    translation, and the frame stores the expert's *clean* action for the state it saw. The states
    drift off the expert's path and the labels say how to come back: recovery data for
    behaviour cloning. The noise is seeded by the episode seed. ``dart_label="executed"`` stores what the
    server applied instead (the noisy command): demos whose actions are as broad as the noise, the base a
    latent-noise RL method (DSRL) can steer.

    ``driver`` (DAgger, Ross et al. 2011): ``obs -> action [A]`` or None. Each tick the teleop (a
    closed-loop expert) still reads the state, but the robot executes the driver's action (a policy
    being trained); the frame stores the expert's action for the state the policy led to, and its
    intervention flag is False. A None from the driver lets the expert act on that tick (DAgger's
    beta mixing). The policy's own mistakes become labelled recovery data.

    ``frame_task``: called after each teleop read, the task string of that frame (LeRobot v3 keeps
    one per frame): the sub-skill the scripted expert is carrying out (``vla record
    --label-subskills``). Default: ``instruction`` for every frame.
    """
    if dart_sigma < 0:
        raise ValueError(f"dart_sigma must be >= 0 (m per tick), got {dart_sigma}")
    if dart_label not in DART_LABELS:
        raise ValueError(f"dart_label must be one of {DART_LABELS}, got {dart_label!r}")
    dart_rng = np.random.default_rng([0xDA27, seed if seed is not None else 0])
    teleop.begin_episode(task, seed, instruction)
    obs, _ = env.reset(seed=seed)
    t_first = None
    outcome, n = None, 0
    step_ms = []
    segments: list = []
    while outcome is None:
        if should_stop():
            outcome = "interrupted"
            break
        t0 = time.perf_counter()
        cmd = teleop.read(obs, privileged_fn() if privileged_fn is not None else None)
        for ev in ("stop", "rerecord", "success", "failure"):
            if ev in cmd.events:
                outcome = ev
                break
        if outcome is not None:
            break
        executed = cmd.action
        relabel = dart_sigma > 0 and dart_label == "clean"
        driven = False
        if driver is not None:
            act = driver(obs)
            if act is not None:
                executed = np.asarray(act, np.float32).reshape(np.shape(cmd.action))
                relabel = driven = True
        if dart_sigma > 0:
            executed = np.array(cmd.action, np.float32, copy=True)
            executed[:3] += dart_rng.normal(0.0, dart_sigma, 3).astype(np.float32)
        try:
            new_obs, _, terminated, _, info = env.step(executed)
        except CommandError as e:
            if e.code not in STALL_CODES:
                raise
            # the server's watchdog stopped the robot (this loop stalled past command_timeout_ms), or
            # the command reached the server after its deadline and was not applied (a loaded
            # machine): the episode is broken; the caller discards it and the next reset re-arms
            # the robot
            outcome = STALL_CODES[e.code]
            break
        t_cap = min(int(t) for t in obs["t"].values())
        t_first = t_cap if t_first is None else t_first
        frame = {f"observation.images.{c}": img for c, img in obs["images"].items()}
        frame["observation.state"] = obs["state"]
        # the label: what the server applied, or under DART the expert's clean action (the applied
        # command carried the injected noise)
        frame["action"] = (np.asarray(cmd.action, np.float32) if relabel
                           else info["applied"][0].astype(np.float32))
        frame["intervention"] = np.array([cmd.intervening and not driven], bool)
        frame["observation.capture_time"] = np.array([(t_cap - t_first) / 1e9], np.float64)
        label = frame_task() if frame_task is not None else instruction
        if not segments or segments[-1][1] != label:
            segments.append([n, label])
        writer.add_frame(frame, task=label)
        n += 1
        obs = new_obs
        step_ms.append((time.perf_counter() - t0) * 1e3)
        if terminated and end_on_success:
            outcome = "success"  # the environment's success detector fired
        elif n >= max_steps:
            outcome = "failure"
    return EpisodeResult(outcome, n, env.loop_stats(), np.asarray(step_ms), segments)
