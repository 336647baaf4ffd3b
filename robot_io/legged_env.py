"""``LeggedEnv``: a gymnasium.Env over a legged robot's bridge client (the RobotEnv conventions).

Actions (``action="velocity"`` or ``"joints"``), one row ``[A]`` or a chunk ``[H, A]``:

* ``velocity``: A = 3, (vx m/s, vy m/s, yaw rate rad/s) -> one ``body_velocity`` command per row;
  the action space is the server's ``limits.max_velocity`` box.
* ``joints``: A = 12, absolute joint targets (rad, Unitree order) -> one ``legged_joints`` command
  per row with the env's fixed ``kp`` / ``kd``; the action space is the joint range.

Each row goes out on the control clock (``control_hz``, jitter in ``info["loop"]``) in streaming
mode; in ``sync`` mode (a fast simulation) every command advances the physics one control period on
the server and the observation is taken with ``capture``. The observation is the layout of
DESIGN.md: ``{"images": {}, "state": float32 [STATE_DIM], "instruction": str, "t": {device: ns}}``
with state = ``q(12), dq(12), quat wxyz(4), gyro(3), accel(3), base_height(1), tilt(1)``
(``base_height`` is NaN on a real robot, which cannot measure it). The raw last state message is
``last_state`` (``fallen``, ``mode``, a simulator's privileged ``base_pos`` / ``base_lin_vel``).

An episode terminates when the robot reports a fall (``terminate_on_fall``). Hooks:
``reward_fn(env, obs, info) -> (reward, terminated)``, ``reset_fn(env, seed)`` (default: the
device's ``reset`` with the seed, which re-arms it after a safe stop).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from robot_io.client import DeviceClient, StreamReader
from robot_io.env import LoopClock
from robot_io.wire import Message

STATE_DIM = 36
STATE_KEYS = ("q", "dq", "quat", "gyro", "accel", "base_height", "tilt")


def legged_state_vector(msg: Message) -> np.ndarray:
    a = msg.arrays
    return np.concatenate([np.asarray(a[k], np.float32).reshape(-1) for k in STATE_KEYS])


class LeggedEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, client: DeviceClient, action: str = "velocity", control_hz: float = 50.0,
                 sync: bool | None = None, stream_endpoint: str | None = None, instruction: str = "",
                 kp: float = 60.0, kd: float = 2.0, max_episode_steps: int | None = None,
                 terminate_on_fall: bool = True,
                 reward_fn: Callable[["LeggedEnv", dict, dict], tuple[float, bool]] | None = None,
                 reset_fn: Callable[["LeggedEnv", int | None], None] | None = None,
                 timeout_s: float = 2.0) -> None:
        if action not in ("velocity", "joints"):
            raise ValueError(f"action must be 'velocity' or 'joints', got {action!r}")
        self.client, self.action, self.instruction = client, action, instruction
        self.description = client.describe()
        if self.description.get("kind") != "legged":
            raise ValueError(f"device {client.device!r} is a {self.description.get('kind')!r}, not a legged robot")
        if sync is None:  # a fast simulation advances per command; observe it on request
            sync = bool(self.description.get("fast"))
        self.sync, self.timeout_s = sync, timeout_s
        self.reader = None
        if not sync:
            ep = stream_endpoint or self.description.get("stream_endpoint")
            if not ep:
                raise ValueError(f"device {client.device!r} has no stream endpoint; use sync=True (fast simulation)")
            self.reader = StreamReader(ep, "latest", client.keys, name=client.device)
        self.clock = LoopClock(control_hz)
        self.max_episode_steps, self.terminate_on_fall = max_episode_steps, terminate_on_fall
        self.reward_fn, self.reset_fn = reward_fn, reset_fn
        n = int(self.description.get("num_joints", 12))
        self.kp, self.kd = np.full(n, kp, np.float32), np.full(n, kd, np.float32)
        if action == "velocity":
            m = np.asarray(self.description.get("limits", {}).get("max_velocity", (0.5, 0.3, 1.0)), np.float32)
            dev_max = self.description.get("max_body_velocity")
            if dev_max is not None:
                m = np.minimum(m, np.asarray(dev_max, np.float32))
            self.action_space = spaces.Box(-m, m, dtype=np.float32)
        else:
            self.action_space = spaces.Box(np.asarray(self.description["joint_lower"], np.float32),
                                           np.asarray(self.description["joint_upper"], np.float32), dtype=np.float32)
        self.action_dim = int(self.action_space.shape[0])
        self.observation_space = spaces.Dict({
            "images": spaces.Dict({}),
            "state": spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32),
            "instruction": spaces.Text(max_length=1024, min_length=0),
            "t": spaces.Dict({client.device: spaces.Box(0, np.iinfo(np.int64).max, (), np.int64)}),
        })
        self.last_state: Message | None = None
        self._steps = 0

    def _obs(self, newer_than_ns: int = 0) -> dict:
        if self.sync:
            st = self.client.request("capture")
            st.t_mono_ns = st.get("state_t_mono_ns", st.t_mono_ns)
        else:
            st = self.reader.latest(self.timeout_s, newer_than_ns)
        self.last_state = st
        return {"images": {}, "state": legged_state_vector(st), "instruction": self.instruction,
                "t": {self.client.device: np.asarray(st.t_mono_ns, np.int64)}}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "instruction" in options:
            self.instruction = options["instruction"]
        if self.reset_fn is not None:
            self.reset_fn(self, seed)
        else:
            self.client.request("reset", seed=seed, timeout_s=30.0)
        self._steps = 0
        obs = self._obs(newer_than_ns=time.monotonic_ns())
        self.clock.restart()
        return obs, {}

    def _send(self, row: np.ndarray) -> Message:
        if self.action == "velocity":
            return self.client.request("body_velocity", {"velocity": row})
        return self.client.request("legged_joints", {"q": row, "kp": self.kp, "kd": self.kd})

    def step(self, action):
        chunk = np.asarray(action, np.float32)
        if chunk.ndim == 1:
            chunk = chunk[None]
        if chunk.ndim != 2 or chunk.shape[1] != self.action_dim:
            raise ValueError(f"action must be [{self.action_dim}] or a chunk [H, {self.action_dim}], "
                             f"got shape {list(np.shape(action))}")
        if not np.isfinite(chunk).all():
            raise ValueError("action contains NaN or inf; nothing was sent")
        applied, clipped, late = [], [], []
        t_sent = 0
        for row in chunk:
            t_sent = time.monotonic_ns()
            reply = self._send(np.ascontiguousarray(row))
            applied.append(np.asarray(reply.arrays["applied"]))
            clipped.append(list(reply.get("clipped", [])))
            if not self.sync:
                late.append(self.clock.wait())
        obs = self._obs(newer_than_ns=0 if self.sync else t_sent)
        self._steps += 1
        fallen = bool(self.last_state.get("fallen", False))
        info: dict[str, Any] = {"applied": np.stack(applied), "clipped": clipped, "fallen": fallen,
                                "mode": self.last_state.get("mode"), "late_ms": np.asarray(late) * 1e3,
                                "loop": self.clock.stats()}
        reward, terminated = 0.0, False
        if self.reward_fn is not None:
            reward, terminated = self.reward_fn(self, obs, info)
        terminated = bool(terminated) or (self.terminate_on_fall and fallen)
        truncated = self.max_episode_steps is not None and self._steps >= self.max_episode_steps
        return obs, float(reward), terminated, bool(truncated), info

    def loop_stats(self) -> dict[str, float]:
        return self.clock.stats()

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        self.client.close()
