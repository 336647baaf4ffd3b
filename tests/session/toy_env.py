"""A tiny gymnasium env with the observation layout of DESIGN.md, for ``vla rl --env``: a point
reaches for a goal on a 2-D plane.

Observation: ``images = {"front": 16 x 16 x 3 uint8}`` (the point in green, the goal in red),
``state = (x, y)`` float32, ``instruction``. ``step`` takes an action chunk ``[n, 2]`` (one row a
control tick: a displacement of up to 0.15 per axis); reward 1 and the episode ends
(``info["success"]``) when the point is within 0.3 of the goal; ``max_ticks`` 16.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

INSTRUCTION = "reach the red dot"


class ReachEnv(gym.Env):
    max_ticks = 16

    def __init__(self) -> None:
        self.observation_space = spaces.Dict({
            "images": spaces.Dict({"front": spaces.Box(0, 255, (16, 16, 3), np.uint8)}),
            "state": spaces.Box(-1.0, 1.0, (2,), np.float32)})
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.pos = np.zeros(2, np.float32)
        self.goal = np.zeros(2, np.float32)

    def _obs(self) -> dict:
        img = np.zeros((16, 16, 3), np.uint8)
        for xy, ch in ((self.goal, 0), (self.pos, 1)):
            i, j = (np.clip((xy + 1) / 2 * 15, 0, 15)).round().astype(int)
            img[j, i, ch] = 255
        return {"images": {"front": img}, "state": self.pos.copy(), "instruction": INSTRUCTION}

    def reset(self, seed: int | None = None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-0.8, 0.8, 2).astype(np.float32)
        self.goal = self.np_random.uniform(-0.8, 0.8, 2).astype(np.float32)
        return self._obs(), {}

    def step(self, chunk):
        chunk = np.asarray(chunk, np.float32).reshape(-1, 2)
        success = False
        for row in chunk:
            self.pos = np.clip(self.pos + 0.15 * np.clip(row, -1, 1), -1, 1).astype(np.float32)
            success = bool(np.linalg.norm(self.pos - self.goal) < 0.3)
            if success:
                break
        return self._obs(), float(success), success, False, {"success": success}


def make_env() -> ReachEnv:
    return ReachEnv()
