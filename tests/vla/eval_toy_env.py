"""A tiny gymnasium env with DESIGN.md's observation layout, for ``vla eval --env`` / ``vla rl --env``
tests: a point on a 2-D plane reaches a goal.

Observation: ``images.front`` 16x16 RGB (the point white, the goal red), ``state`` float32
``[x, y, goal_x, goal_y]``, ``instruction``. Action: one ``[dx, dy]`` (clipped to +-0.2) per
step, a control tick. ``info["success"]`` once the point is within 0.15 of the goal (the episode
terminates); truncated after ``max_episode_steps`` ticks.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

SIZE = 16


class ReachEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, max_episode_steps: int = 12, instruction: str = "reach the red dot") -> None:
        self.max_episode_steps, self.instruction = max_episode_steps, instruction
        self.action_space = spaces.Box(-0.2, 0.2, (2,), np.float32)
        self.observation_space = spaces.Dict({
            "images": spaces.Dict({"front": spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8)}),
            "state": spaces.Box(-1.0, 1.0, (4,), np.float32),
            "instruction": spaces.Text(max_length=256)})
        self.pos = np.zeros(2, np.float32)
        self.goal = np.zeros(2, np.float32)
        self.ticks = 0

    def _obs(self) -> dict:
        img = np.zeros((SIZE, SIZE, 3), np.uint8)
        for p, colour in ((self.goal, (255, 0, 0)), (self.pos, (255, 255, 255))):
            c, r = (np.clip((p + 1) / 2 * (SIZE - 1), 0, SIZE - 1)).round().astype(int)
            img[r, c] = colour
        return {"images": {"front": img}, "state": np.concatenate([self.pos, self.goal]).astype(np.float32),
                "instruction": self.instruction}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-0.8, 0.8, 2).astype(np.float32)
        self.goal = self.np_random.uniform(-0.8, 0.8, 2).astype(np.float32)
        self.ticks = 0
        return self._obs(), {}

    def step(self, action):
        a = np.asarray(action, np.float32)
        if a.shape != (2,):
            raise ValueError(f"action must be [2], got shape {list(a.shape)}")
        self.pos = np.clip(self.pos + np.clip(a, -0.2, 0.2), -1, 1).astype(np.float32)
        self.ticks += 1
        success = bool(np.linalg.norm(self.pos - self.goal) < 0.15)
        return self._obs(), float(success), success, self.ticks >= self.max_episode_steps, {"success": success}

    def render(self):
        return self._obs()["images"]["front"]


def make_env(**kwargs) -> ReachEnv:
    return ReachEnv(**kwargs)
