"""``RobotEnv``: a gymnasium.Env over a bridge client, at a fixed control rate, with action chunks.

``step(action)`` takes one action ``[A]`` or a chunk ``[H, A]`` (A = 7: dpos(3) m, drot(3) rad
axis-angle, gripper opening in [0, 1]). Each row is sent as one ``ee_delta`` command on the
control clock (``control_hz``); the observation is taken after the last row. In streaming mode
the loop sleeps to the next tick and records how late each command went out: ``loop_stats()``
gives the jitter (p50 / p99 / max lateness) and the achieved rate, and ``info["loop"]`` carries
them too. In ``sync`` mode (fast simulation) there is no clock: every command advances the
physics by one control period on the server.

Hooks: ``reward_fn(env, obs, info) -> (reward, terminated)`` and ``reset_fn(env, seed)`` (the
default reset asks the arm to reset, which in simulation also re-randomises the scene).
``tick_callback(obs)`` (default ``None``: off) sees an observation after every row of a chunk
but the last (whose observation ``step`` returns): ``vla eval`` records its videos at the control
rate with it. Each call costs one extra observation; in streaming mode it is taken on the tick,
before the next row goes out, so it adds its latency to that row.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from robot_io.gripper import gripper_mode, snap_opening
from robot_io.robot import STATE_DIM, RobotClient

ACTION_DIM = 7


class LoopClock:
    """Fixed-rate scheduler that measures how late each tick fires (the loop's jitter)."""

    def __init__(self, hz: float, window: int = 10_000) -> None:
        if hz <= 0:
            raise ValueError(f"control_hz must be positive, got {hz}")
        self.period = 1.0 / hz
        self.window = window
        self.restart()

    def restart(self) -> None:
        """Tick 0 is now; the first ``wait()`` returns one period from now."""
        self.next_t = time.perf_counter() + self.period
        self.lateness: list[float] = []
        self.ticks: list[float] = []

    def wait(self) -> float:
        """Sleep until the next tick; return how late we are (s, >= 0)."""
        now = time.perf_counter()
        if self.next_t > now:
            time.sleep(self.next_t - now)
            now = time.perf_counter()
        late = now - self.next_t
        # Fell behind by more than a period: re-anchor instead of firing a burst of catch-up ticks.
        self.next_t = now + self.period if late > self.period else self.next_t + self.period
        if len(self.lateness) >= self.window:
            del self.lateness[: self.window // 2], self.ticks[: self.window // 2]
        self.lateness.append(late)
        self.ticks.append(now)
        return late

    def stats(self) -> dict[str, float]:
        if len(self.ticks) < 2:
            return {"n": len(self.ticks)}
        late = np.asarray(self.lateness) * 1e3
        periods = np.diff(self.ticks)
        return {"n": len(self.ticks), "target_hz": 1.0 / self.period, "achieved_hz": float(1.0 / periods.mean()),
                "late_ms_p50": float(np.percentile(late, 50)), "late_ms_p99": float(np.percentile(late, 99)),
                "late_ms_max": float(late.max()),
                "period_ms_std": float(periods.std() * 1e3)}


class RobotEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}
    chunk_actions = True
    """``step`` takes a whole chunk ``[H, A]`` (the stack's env contract, ``vla.envs.step_chunk``)."""

    def __init__(self, client: RobotClient, instruction: str = "", control_hz: float = 10.0,
                 max_episode_steps: int | None = None,
                 reward_fn: Callable[["RobotEnv", dict, dict], tuple[float, bool]] | None = None,
                 reset_fn: Callable[["RobotEnv", int | None], None] | None = None, gripper: str = "raw") -> None:
        self.client = client
        self.gripper = gripper_mode(gripper, "gripper")
        """``binary``: each row's gripper opening is snapped shut / open at 0.5 before it is sent
        (``robot_io.gripper``); ``info["applied"]`` is what the arm applied."""
        self.instruction = instruction
        self.clock = LoopClock(control_hz)
        self.max_episode_steps = max_episode_steps
        self.reward_fn, self.reset_fn = reward_fn, reset_fn
        lim = client.description.get("limits", {})
        m, r = float(lim.get("max_step_m", 0.05)), float(lim.get("max_step_rad", 0.25))
        self.action_space = spaces.Box(np.array([-m] * 3 + [-r] * 3 + [0.0], np.float32),
                                       np.array([m] * 3 + [r] * 3 + [1.0], np.float32), dtype=np.float32)
        obs = client.observe(instruction)
        self.observation_space = spaces.Dict({
            "images": spaces.Dict({c: spaces.Box(0, 255, img.shape, np.uint8) for c, img in obs["images"].items()}),
            "state": spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32),
            "instruction": spaces.Text(max_length=1024),
            "t": spaces.Dict({k: spaces.Box(0, np.iinfo(np.int64).max, (), np.int64) for k in obs["t"]}),
        })
        self._steps = 0
        self._last_obs = obs
        self.tick_callback: Callable[[dict], None] | None = None
        """Called with an observation after every row of a chunk but the last (see the module docstring)."""

    def _obs(self, newer_than_ns: int = 0, cameras_newer_than_ns: int | None = 0) -> dict:
        o = self.client.observe(self.instruction, newer_than_ns, cameras_newer_than_ns)
        o["t"] = {k: np.int64(v) for k, v in o["t"].items()}
        self._last_obs = o
        return o

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "instruction" in options:
            self.instruction = options["instruction"]
        if self.reset_fn is not None:
            self.reset_fn(self, seed)
        else:
            self.client.reset(seed)
        self._steps = 0
        t = time.monotonic_ns()
        obs = self._obs(newer_than_ns=t, cameras_newer_than_ns=t)  # nothing from before the reset
        self.clock.restart()
        return obs, {}

    def step(self, action):
        chunk = np.asarray(action, np.float32)
        if chunk.ndim == 1:
            chunk = chunk[None]
        if chunk.ndim != 2 or chunk.shape[1] != ACTION_DIM:
            raise ValueError(f"action must be [{ACTION_DIM}] or a chunk [H, {ACTION_DIM}], got shape {list(np.shape(action))}")
        if not np.isfinite(chunk).all():
            raise ValueError("action contains NaN or inf; nothing was sent")
        if self.gripper == "binary":
            chunk = snap_opening(chunk)
        applied, clipped, late = [], [], []
        t_sent = 0
        for i, row in enumerate(chunk):
            # Each row goes out at once (the previous step ended on a tick), then acts for one
            # control period: H rows take exactly H periods.
            t_sent = time.monotonic_ns()
            reply = self.client.ee_delta(row)
            applied.append(np.asarray(reply.arrays["applied"]))
            clipped.append(list(reply.get("clipped", [])))
            if not self.client.sync:
                late.append(self.clock.wait())
            if self.tick_callback is not None and i < len(chunk) - 1:
                self.tick_callback(self._obs(newer_than_ns=0 if self.client.sync else t_sent))
        # The arm state must postdate the last command; cameras give their newest frame (at equal
        # camera and control rates, insisting on a frame newer than the command would add a frame
        # of latency to every step).
        obs = self._obs(newer_than_ns=0 if self.client.sync else t_sent)
        self._steps += 1
        info: dict[str, Any] = {"applied": np.stack(applied), "clipped": clipped,
                                "late_ms": np.asarray(late) * 1e3, "loop": self.clock.stats()}
        reward, terminated = 0.0, False
        if self.reward_fn is not None:
            reward, terminated = self.reward_fn(self, obs, info)
        truncated = self.max_episode_steps is not None and self._steps >= self.max_episode_steps
        return obs, float(reward), bool(terminated), bool(truncated), info

    def loop_stats(self) -> dict[str, float]:
        return self.clock.stats()

    def render(self):
        imgs = list(self._last_obs["images"].values())
        return np.concatenate(imgs, axis=1) if imgs else None

    def close(self) -> None:
        self.client.close()
