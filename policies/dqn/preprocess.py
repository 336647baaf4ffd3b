"""Frame preprocessing for DQN, and ``AleEnv``: Atari straight on ale-py (pure emulation).

Both ``AleEnv`` and the rig's env (``robot_io.rig_env.RigEnv``) give the observation layout of
DESIGN.md with one picture, ``obs["images"]["screen"]`` ([210, 160, 3] uint8: what the host
screen shows; on the rig, the camera frame rectified with the calibration's homography), and
``obs["state"] = [lives]``. ``FrameStack`` turns a stream of such pictures into the network's
input, as the Nature paper did (and CleanRL through SB3's wrappers)::

    picture --rectify (rig: done by the env; here any extra callable)--> grey (ITU-R 601 luma)
            --resize 84 x 84 (area)--> the last 4 stacked: uint8 [4, 84, 84]

Action repeat / frame skip is the env's: ``AleEnv.step`` plays ``frame_skip`` emulator frames
with the same action and returns the pixel-wise max of the last two (Atari sprites flicker
between frames; ``max_pool=False``: the last frame alone, as the rig's camera gives one frame per
picture); the rig holds the keys for the same wall time. Numpy + OpenCV + ale-py, no torch.
"""

from __future__ import annotations

from typing import Callable

import cv2
import gymnasium as gym
import numpy as np
from gymnasium import spaces

SCREEN_SHAPE = (210, 160, 3)


def grey_resize(rgb: np.ndarray, size: int = 84) -> np.ndarray:
    """[H, W, 3] uint8 RGB (or [H, W] grey) -> [size, size] uint8 grey."""
    assert rgb.dtype == np.uint8 and rgb.ndim in (2, 3), f"expected a uint8 image, got {rgb.dtype} {rgb.shape}"
    g = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY) if rgb.ndim == 3 else rgb
    return cv2.resize(g, (size, size), interpolation=cv2.INTER_AREA)


class FrameStack:
    """The last ``stack`` preprocessed pictures, oldest first: uint8 ``[stack, size, size]``.
    ``rectify``: an extra callable applied to each picture first (None: the picture as given)."""

    def __init__(self, size: int = 84, stack: int = 4, rectify: Callable[[np.ndarray], np.ndarray] | None = None):
        self.size, self.stack, self.rectify = int(size), int(stack), rectify
        self.frames = np.zeros((self.stack, self.size, self.size), np.uint8)

    def _prep(self, rgb: np.ndarray) -> np.ndarray:
        return grey_resize(self.rectify(rgb) if self.rectify is not None else rgb, self.size)

    def reset(self, rgb: np.ndarray) -> np.ndarray:
        """A new episode: every slot holds the first picture."""
        self.frames[:] = self._prep(rgb)[None]
        return self.frames.copy()

    def push(self, rgb: np.ndarray) -> np.ndarray:
        self.frames[:-1] = self.frames[1:]
        self.frames[-1] = self._prep(rgb)
        return self.frames.copy()


class ActionHistory:
    """The agent's last ``k`` actions, oldest first: int64 ``[k]``, -1 where none was taken yet (the
    network reads -1 as an all-zero one-hot). ``k = 0``: an empty array (a pictures-only network)."""

    def __init__(self, k: int) -> None:
        if k < 0:
            raise ValueError(f"action history length must be >= 0, got {k}")
        self.k = int(k)
        self.actions = np.full(self.k, -1, np.int64)

    def reset(self) -> np.ndarray:
        self.actions[:] = -1
        return self.actions.copy()

    def push(self, action: int) -> np.ndarray:
        if self.k:
            self.actions[:-1] = self.actions[1:]
            self.actions[-1] = int(action)
        return self.actions.copy()


def obs_picture(obs: dict) -> np.ndarray:
    """The one picture of an env observation (``images["screen"]``, or its only camera)."""
    imgs = obs["images"]
    if "screen" in imgs:
        return imgs["screen"]
    if len(imgs) != 1:
        raise ValueError(f"DQN reads one picture; the observation has cameras {sorted(imgs)} and no 'screen'")
    return next(iter(imgs.values()))


class AleEnv(gym.Env):
    """An Atari game on ale-py, as fast as the CPU goes (no real time), with action repeat.

    Actions: the game's minimal action set (``action_names``: ALE names, the same ones
    ``hardware.ale_screen.KeyMap.keys_for`` turns into key sets on the rig). Reset: a new game
    (ALE's ``reset_game``) and 0..``noop_max`` no-op frames drawn from the env's RNG. ``info``:
    ``lives``, ``score`` (the episode's game score), ``frames`` (emulator frames played).
    ``max_pool``: the picture is the pixel-wise max of the step's last two frames (Nature's
    preprocessing; a moving ball shows in two places); False: the last frame alone (what the rig's
    camera gives: one exposure per picture).
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, game: str = "pong", frame_skip: int = 4, noop_max: int = 30, max_episode_steps: int | None = None,
                 repeat_action_probability: float = 0.0, seed: int = 0, max_pool: bool = True) -> None:
        from ale_py import ALEInterface, LoggerMode, roms

        if frame_skip < 1 or noop_max < 0:
            raise ValueError(f"need frame_skip >= 1 and noop_max >= 0, got {frame_skip}, {noop_max}")
        ALEInterface.setLoggerMode(LoggerMode.Error)
        ids = roms.get_all_rom_ids()
        if game not in ids:
            import difflib

            close = difflib.get_close_matches(game, ids, n=3)
            raise ValueError(f"no Atari game {game!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))
        self.game, self.frame_skip, self.noop_max = game, int(frame_skip), int(noop_max)
        self.max_pool = bool(max_pool)
        self.max_episode_steps = max_episode_steps
        self.ale = ALEInterface()
        self.ale.setInt("random_seed", int(seed) % 2**31)
        self.ale.setFloat("repeat_action_probability", float(repeat_action_probability))
        self.ale.loadROM(roms.get_rom_path(game))
        self._actions = list(self.ale.getMinimalActionSet())
        self.action_names = tuple(a.name for a in self._actions)
        self.action_space = spaces.Discrete(len(self._actions))
        self.observation_space = spaces.Dict({
            "images": spaces.Dict({"screen": spaces.Box(0, 255, SCREEN_SHAPE, np.uint8)}),
            "state": spaces.Box(0, np.inf, (1,), np.float32)})
        self._rng = np.random.default_rng(seed)
        self._buf = np.zeros((2, *SCREEN_SHAPE), np.uint8)
        self._score, self._steps, self.frames = 0, 0, 0

    def _obs(self, rgb: np.ndarray) -> dict:
        return {"images": {"screen": rgb}, "state": np.array([self.ale.lives()], np.float32), "instruction": ""}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.ale.reset_game()
        for _ in range(int(self._rng.integers(0, self.noop_max + 1)) if self.noop_max else 0):
            self.ale.act(self._actions[0])
            self.frames += 1
            if self.ale.game_over():
                self.ale.reset_game()
        self._score, self._steps = 0, 0
        rgb = self.ale.getScreenRGB()
        return self._obs(rgb), {"lives": int(self.ale.lives()), "score": 0, "frames": self.frames}

    def step(self, action):
        a = self._actions[int(action)]
        reward = 0
        for i in range(self.frame_skip):
            reward += self.ale.act(a)
            self.frames += 1
            if i >= self.frame_skip - 2:  # the last two frames, max-pooled (sprites flicker)
                self.ale.getScreenRGB(self._buf[i - (self.frame_skip - 2)] if self.frame_skip > 1 else self._buf[1])
            if self.ale.game_over():
                self.ale.getScreenRGB(self._buf[1])
                self._buf[0] = self._buf[1]
                break
        self._score += reward
        self._steps += 1
        rgb = np.maximum(self._buf[0], self._buf[1]) if self.frame_skip > 1 and self.max_pool else self._buf[1].copy()
        terminated = bool(self.ale.game_over())
        truncated = self.max_episode_steps is not None and self._steps >= self.max_episode_steps and not terminated
        info = {"lives": int(self.ale.lives()), "score": int(self._score), "frames": self.frames}
        return self._obs(rgb), float(reward), terminated, bool(truncated), info

    def ram_at_key(self) -> np.ndarray:
        """The RAM at the tick where an action taken now takes effect: here the present one (a step's
        action acts from its first frame). ``hardware.virtual_rig.VirtualRig`` has the rig's version."""
        return self.ale.getRAM()

    def render(self):
        return self.ale.getScreenRGB()
