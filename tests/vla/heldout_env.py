"""A held-out-style gymnasium env for the env-contract tests, built the way a user's env is built,
not by this repo's sim: its own dynamics, one action per ``step``, no ``spec`` and no declared
episode limit (it truncates itself).

"Slide the drawer open": a gripper in the unit cube, a drawer whose handle sits somewhere in
front of it. Observation (DESIGN.md's layout): ``images.front`` 24x24 RGB (gripper white,
handle red, drawer opening shown as a blue bar), ``state`` float32 ``[gx, gy, gz, grip,
opening]``, ``instruction``. Action: ONE float32 ``[4]`` per step, ``(dx, dy, dz, grip)`` in
[-1, 1]: the gripper moves by ``0.08 * d``; ``grip > 0`` closes it. A closed gripper within 0.25
of the handle drags it along x, which opens the drawer (opening in [0, 0.3]). Reward 1 and
``terminated`` once the opening reaches ``open_at``; the env truncates itself after
``horizon`` steps. ``step`` refuses anything but one action ``[4]`` (as Meta-World's envs do).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

SIZE = 24
INSTRUCTION = "slide the drawer open"


class DrawerEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, horizon: int = 30, open_at: float = 0.04) -> None:
        self._horizon, self._open_at = int(horizon), float(open_at)
        self.action_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.observation_space = spaces.Dict({
            "images": spaces.Dict({"front": spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8)}),
            "state": spaces.Box(-np.inf, np.inf, (5,), np.float32),
            "instruction": spaces.Text(max_length=256)})
        self.gripper = np.zeros(3, np.float32)
        self.handle = np.zeros(3, np.float32)
        self.grip = 0.0
        self.opening = 0.0
        self._t = 0

    def _obs(self) -> dict:
        img = np.full((SIZE, SIZE, 3), 40, np.uint8)
        bar = int(round(self.opening / 0.3 * (SIZE - 1)))
        img[SIZE - 2:, : bar + 1] = (40, 40, 255)
        for p, colour in ((self.handle, (255, 0, 0)), (self.gripper, (255, 255, 255))):
            c, r = np.clip(np.round(p[:2] * (SIZE - 1)), 0, SIZE - 1).astype(int)
            img[r, c] = colour
        state = np.array([*self.gripper, self.grip, self.opening], np.float32)
        return {"images": {"front": img}, "state": state, "instruction": INSTRUCTION}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.handle = self.np_random.uniform(0.2, 0.6, 3).astype(np.float32)
        self.gripper = (self.handle + self.np_random.uniform(-0.1, 0.1, 3)).astype(np.float32)
        self.grip, self.opening, self._t = 0.0, 0.0, 0
        return self._obs(), {}

    def step(self, action):
        a = np.asarray(action, np.float32)
        if a.shape != (4,):
            raise ValueError(f"action must be one action [4], got shape {list(a.shape)}")
        if not np.isfinite(a).all():
            raise ValueError("action holds NaN or inf")
        a = np.clip(a, -1.0, 1.0)
        move = 0.08 * a[:3]
        self.grip = 1.0 if a[3] > 0 else 0.0
        attached = self.grip > 0 and np.linalg.norm(self.gripper - self.handle) < 0.25
        self.gripper = np.clip(self.gripper + move, 0.0, 1.0).astype(np.float32)
        if attached:
            new = float(np.clip(self.opening + move[0], 0.0, 0.3))
            self.handle[0] += new - self.opening
            self.opening = new
        self._t += 1
        success = self.opening >= self._open_at
        return self._obs(), float(success), bool(success), self._t >= self._horizon, {"success": bool(success)}

    def render(self):
        return self._obs()["images"]["front"]


def make_env(**kwargs) -> DrawerEnv:
    return DrawerEnv(**kwargs)


def tiny_vla(path, seed: int = 0, num_tokens: int = 0) -> str:
    """A randomly initialised compact VLA sized for this env (one camera 32x32 input, state 5, action 4,
    chunks of 4), saved at ``path``: the stand-in for a user's checkpoint. ``num_tokens``: with that many
    behaviour tokens (what ExToken steers)."""
    import torch

    from vla.models.compact import CompactVLA, CompactVLAConfig

    torch.manual_seed(seed)
    m = CompactVLA(CompactVLAConfig(cameras=("front",), image_size=32, state_dim=5, action_dim=4, horizon=4,
                                    hidden=32, cond_dim=32, keypoints=4, pretrained=False, num_tokens=num_tokens))
    m.set_normalization(np.zeros(5), np.ones(5), -np.ones(4), np.ones(4))
    m.save(str(path))
    return str(path)
