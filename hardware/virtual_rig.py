"""The keyboard rig on a simulated clock: host screen, camera and key path in one process, faster
than real time, each of the rig's failure sources a switch.

The emulated rig of ``bench/rig.py`` (four processes: ``ale_screen`` host, ``screen_camera``,
the microcontroller, the edge agent) runs in real time: a 5-minute game of Pong takes 5 minutes, so a
study of 10 games x 3 seeds x 7 conditions would take a day. ``VirtualRig`` plays the same chain
on a simulated clock, as fast as the CPU renders the camera:

* the **host screen** is ALE at 60 Hz: tick ``k`` is displayed from ``k / 60`` s; the keys held at
  the start of a tick are the tick's action (the ``ale_screen`` driver reads its key source per tick);
* the **camera** is ``hardware.screen_camera.ScreenCamera``'s renderer (perspective, lens
  distortion, blur, sensor noise, exposure and flicker) on its own schedule: frame ``i`` is
  delivered ``1 / fps`` after frame ``i - 1``, jittered by ``jitter_ms``, sometimes dropped
  (``drop_prob``), and shows the screen as it was ``latency_ms`` before delivery;
* the **agent** sees every ``frames_per_step``-th delivered frame, rectified with the screen
  homography found from the ArUco markers at start-up (``calibration.screen.calibrate_screen``
  with the camera's intrinsics, as a calibrated rig does), and its keys reach the game
  ``key_ms`` after that frame's delivery (agent + serial + microcontroller; drawn per decision from a
  log-normal with the measured median and p99 of ``bench/results/rig.json``: 6.9 / 26.2 ms).

The observation layout is ``policies.dqn.preprocess.AleEnv``'s (``images["screen"]``: the
rectified [210, 160, 3] picture), the actions are the game's minimal action set, rewards and lives
come from the game (the host's ``game_state`` stream on the real rig). ``ale`` is exposed so that a
PRIVILEGED teacher (``policies.dqn.teacher``) can label the game's present state.

``RigNoise.without(source)`` switches one failure source off (``SOURCES``): ``latency`` (camera
capture latency and the key path), ``jitter`` (frame-interval jitter and drops), ``perspective``
(a frontal camera without lens distortion), ``blur_noise``, ``lighting`` (exposure and flicker).
``RigNoise.off()`` switches all of them off: the camera then still resamples the screen through
the rectification, and the agent still sees single frames 2 camera periods apart (emulation gives it
the max of the step's last two frames, at zero latency).

``film=False`` keeps the rig's timing and skips the camera: the picture is the emulator's own screen as
it was shown at the exposure time (no perspective, blur, noise, lighting or rectification; the
picture-quality fields of ``RigNoise`` are then unused). It runs at about emulation speed: for what
depends on the timing alone (a teacher's timing, a delay-aware student's data).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

SCREEN_SHAPE = (210, 160, 3)
TICK_S = 1.0 / 60.0


@dataclasses.dataclass(frozen=True)
class RigNoise:
    """The rig's imperfections. Defaults: the ``sim-rig`` preset's camera (``hardware.screen_camera``
    defaults, 50 ms capture latency) and the key path measured through the four-process rig
    (``bench/results/rig.json``: frame-to-key p50 6.9 ms, p99 26.2 ms; 0.17% of frames dropped)."""

    fps: float = 30.0
    width: int = 640
    height: int = 480
    yaw_deg: float = 12.0
    pitch_deg: float = -8.0
    roll_deg: float = 2.0
    dist: tuple[float, ...] = (-0.08, 0.02, 0.0, 0.0, 0.0)
    blur_sigma: float = 0.7
    noise_std: float = 3.0
    exposure: float = 1.0
    flicker: float = 0.04
    flicker_hz: float = 7.0
    jitter_ms: float = 2.0
    drop_prob: float = 0.002
    latency_ms: float = 50.0
    key_ms_median: float = 6.9
    key_ms_p99: float = 26.2

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "dist":
                continue
            if not (isinstance(v, (int, float)) and math.isfinite(v)):
                raise ValueError(f"RigNoise.{f.name} must be a finite number, got {v!r}")
        if not 0 <= self.drop_prob < 1:
            raise ValueError(f"RigNoise.drop_prob must be in [0, 1), got {self.drop_prob}")
        if self.key_ms_median < 0 or (self.key_ms_median > 0 and self.key_ms_p99 < self.key_ms_median):
            raise ValueError(f"RigNoise: need 0 <= key_ms_median <= key_ms_p99, got {self.key_ms_median}, "
                             f"{self.key_ms_p99}")

    def without(self, *sources: str) -> "RigNoise":
        """A copy with the named failure sources (``SOURCES``) switched off."""
        out = self
        for s in sources:
            if s not in SOURCES:
                raise ValueError(f"unknown rig failure source {s!r}: there are {', '.join(SOURCES)}")
            out = dataclasses.replace(out, **SOURCES[s])
        return out

    @classmethod
    def off(cls) -> "RigNoise":
        return cls().without(*SOURCES)

    def scaled(self, **factors: float) -> "RigNoise":
        """A copy with fields multiplied (domain randomisation draws, e.g. ``blur_sigma=1.5``)."""
        return dataclasses.replace(self, **{k: getattr(self, k) * v for k, v in factors.items()})


SOURCES: dict[str, dict[str, Any]] = {
    "latency": {"latency_ms": 0.0, "key_ms_median": 0.0, "key_ms_p99": 0.0},
    "jitter": {"jitter_ms": 0.0, "drop_prob": 0.0},
    "perspective": {"yaw_deg": 0.0, "pitch_deg": 0.0, "roll_deg": 0.0, "dist": (0.0, 0.0, 0.0, 0.0, 0.0)},
    "blur_noise": {"blur_sigma": 0.0, "noise_std": 0.0},
    "lighting": {"exposure": 1.0, "flicker": 0.0},
}


class _Shown:
    """What ``ScreenCamera`` asks of a screen (``frame_at``); the virtual rig renders explicitly."""

    name = "virtual-screen"
    is_connected = True

    def frame_at(self, t_ns: int):  # pragma: no cover - never called: render() is given the picture
        return None


class VirtualRig(gym.Env):
    """The rig as a gymnasium env on a simulated clock (module docstring). ``noise``: ``RigNoise``;
    ``frames_per_step``: camera frames per decision (2 at 30 fps = 4 game ticks, DQN's frame skip);
    ``film``: False: the rig's timing with the emulator's own pictures (module docstring)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, game: str = "pong", noise: RigNoise | None = None, frames_per_step: int = 2,
                 noop_max: int = 30, max_episode_steps: int | None = None, seed: int = 0, film: bool = True) -> None:
        from ale_py import ALEInterface, LoggerMode, roms

        from calibration.screen import Rectifier, calibrate_screen
        from hardware.screen_camera import ScreenCamera

        if frames_per_step < 1 or noop_max < 0:
            raise ValueError(f"need frames_per_step >= 1 and noop_max >= 0, got {frames_per_step}, {noop_max}")
        ids = roms.get_all_rom_ids()
        if game not in ids:
            raise ValueError(f"no Atari game {game!r} in ale-py's ROMs")
        self.game, self.noise = game, noise or RigNoise()
        self.frames_per_step, self.noop_max = int(frames_per_step), int(noop_max)
        self.max_episode_steps = max_episode_steps
        ALEInterface.setLoggerMode(LoggerMode.Error)
        self.ale = ALEInterface()
        self.ale.setInt("random_seed", int(seed) % 2**31)
        self.ale.setFloat("repeat_action_probability", 0.0)
        self.ale.loadROM(roms.get_rom_path(game))
        self._actions = list(self.ale.getMinimalActionSet())
        self.action_names = tuple(a.name for a in self._actions)
        self.action_space = spaces.Discrete(len(self._actions))
        self.observation_space = spaces.Dict({
            "images": spaces.Dict({"screen": spaces.Box(0, 255, SCREEN_SHAPE, np.uint8)}),
            "state": spaces.Box(0, np.inf, (1,), np.float32)})
        n = self.noise
        self.film = bool(film)
        self.camera, self.rectifier, self.calibration_residual_px = None, None, None
        self._rng = np.random.default_rng(seed)
        self._key_sigma = (math.log(n.key_ms_p99 / n.key_ms_median) / 2.326) if n.key_ms_median > 0 else 0.0
        self._screens: collections.deque = collections.deque(maxlen=64)
        self.frames, self.dropped = 0, 0
        if not self.film:
            return
        self.camera = ScreenCamera(screen=_Shown(), width=n.width, height=n.height, fps=n.fps, yaw_deg=n.yaw_deg,
                                   pitch_deg=n.pitch_deg, roll_deg=n.roll_deg, dist=n.dist, blur_sigma=n.blur_sigma,
                                   noise_std=n.noise_std, exposure=n.exposure, flicker=n.flicker,
                                   flicker_hz=n.flicker_hz, jitter_ms=0.0, latency_ms=0.0, seed=seed)
        # calibrate as a rig does: the markers in one camera frame, with the camera's intrinsics
        self.ale.reset_game()
        first = self.camera.render(self.ale.getScreenRGB(), 0.0)
        cal = calibrate_screen(first, self.camera.markers, K=self.camera.ideal_K(), dist=self.camera.true_dist)
        self.rectifier = Rectifier(cal.H, cal.frame_size, self.camera.ideal_K(), self.camera.true_dist)
        self.calibration_residual_px = cal.residual_px

    # -- the clock ----------------------------------------------------------------------------------
    @staticmethod
    def _held(pending: collections.deque, k: int, action: int) -> int:
        """The key held at the start of tick ``k``: the last of ``pending`` (time, key) to have arrived by then
        (they are taken off ``pending``), else ``action``, the one held before."""
        while pending and pending[0][0] <= k * TICK_S:
            action = pending.popleft()[1]
        return action

    def _key_time(self, key_ms: float) -> float:
        """When a key sent on the present picture with ``key_ms`` of key path arrives: keys arrive in the order
        they were sent."""
        t_key = self._t_obs + key_ms / 1e3
        return max(t_key, self._pending[-1][0]) if self._pending else t_key

    def _tick(self) -> float:
        """Play one 60 Hz tick with the keys held at its start; remember what it displayed."""
        self._action = self._held(self._pending, self._k, self._action)
        r = self.ale.act(self._actions[self._action])
        self._k += 1
        self.frames += 1
        self._screens.append((self._k * TICK_S, self.ale.getScreenRGB()))
        return float(r)

    def _shown_at(self, t: float) -> np.ndarray:
        """The picture on the screen at time t (the last tick displayed at or before t)."""
        best = self._screens[0][1]
        for t_disp, rgb in self._screens:
            if t_disp <= t:
                best = rgb
            else:
                break
        return best

    def _next_delivery(self) -> float:
        n = self.noise
        period = 1.0 / n.fps
        step = period
        while n.drop_prob and self._rng.random() < n.drop_prob:
            step += period
            self.dropped += 1
        jitter = self._rng.normal(0.0, n.jitter_ms / 1e3) if n.jitter_ms else 0.0
        self._t_cam = self._t_cam + max(step + jitter, 0.2 * period)
        return self._t_cam

    def _observe(self) -> tuple[float, bool]:
        """Advance the game to the agent's next frame (``frames_per_step`` deliveries on) -> reward, game over."""
        reward = 0.0
        for _ in range(self.frames_per_step):
            t_deliver = self._next_delivery()
        while (self._k + 1) * TICK_S <= t_deliver:
            reward += self._tick()
            if self.ale.game_over():
                self._t_obs, self._picture = self._k * TICK_S, self._screens[-1][1]
                return reward, True
        t_expose = t_deliver - self.noise.latency_ms / 1e3
        self._t_obs = t_deliver
        self._picture = self._shown_at(t_expose)
        return reward, False

    def _obs(self) -> dict:
        img = self.rectifier(self.camera.render(self._picture, self._t_obs)) if self.film else self._picture.copy()
        return {"images": {"screen": img}, "state": np.array([self.ale.lives()], np.float32),
                "instruction": ""}

    # -- gymnasium ----------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.ale.reset_game()
        for _ in range(int(self._rng.integers(0, self.noop_max + 1)) if self.noop_max else 0):
            self.ale.act(self._actions[0])
        self._k, self._action, self._pending = 0, 0, collections.deque()
        self._screens.clear()
        self._screens.append((0.0, self.ale.getScreenRGB()))
        self._t_cam = float(self._rng.uniform(0, 1.0 / self.noise.fps))  # the camera's phase against the screen
        self._score, self._steps = 0.0, 0
        self._observe()
        return self._obs(), {"lives": int(self.ale.lives()), "score": 0, "frames": self.frames}

    def step(self, action):
        a = int(action)
        if not 0 <= a < len(self._actions):
            raise ValueError(f"action {action!r} is outside the game's {len(self._actions)} actions")
        n = self.noise
        key_ms = 0.0
        if n.key_ms_median > 0:
            key_ms = float(n.key_ms_median * math.exp(self._key_sigma * self._rng.standard_normal()))
        self._pending.append((self._key_time(key_ms), a))
        reward, over = self._observe()
        self._score += reward
        self._steps += 1
        truncated = self.max_episode_steps is not None and self._steps >= self.max_episode_steps and not over
        info = {"lives": int(self.ale.lives()), "score": int(self._score), "frames": self.frames, "key_ms": key_ms}
        return self._obs(), reward, bool(over), bool(truncated), info

    def ram_at_key(self) -> np.ndarray:
        """The game's RAM at the tick where a key sent now would take effect: the present state played
        forward under the keys already sent, over the key path's median delay to the next tick start
        (PRIVILEGED: for a teacher that labels what to press for the state its key will meet; in
        emulation that is the present state). The env's own state is unchanged."""
        t_key = self._key_time(self.noise.key_ms_median)
        state = self.ale.cloneState()
        k, action, pending = self._k, self._action, collections.deque(self._pending)
        while k * TICK_S < t_key and not self.ale.game_over():
            action = self._held(pending, k, action)
            self.ale.act(self._actions[action])
            k += 1
        ram = self.ale.getRAM().copy()
        self.ale.restoreState(state)
        return ram

    def render(self):
        return self.ale.getScreenRGB()
