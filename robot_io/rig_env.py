"""``RigEnv``: the keyboard rig as a gymnasium env with a discrete action space, in real time.

The game runs on the host screen at 60 Hz and does not wait: ``step(a)`` sends the key set of
action ``a`` over the keyboard device (the microcontroller) at once, then waits for
``frames_per_step`` new camera frames while the keys stay held (action repeat in wall time: at
30 fps, 2 frames = 4 game ticks, DQN's frame skip), and returns the newest frame. Rewards, lives
and the episode's end come from the screen's ``game_state`` stream (every displayed frame, summed
over the step), not from the picture.

* ``key_sets[a]``: the keys to hold for action ``a`` (the caller builds them with
  ``hardware.ale_screen.KeyMap.keys_for`` over the game's minimal actions; robot_io imports no
  hardware). Only the difference to the keys held is sent (``key_release`` then ``key_press``;
  ``key_release_all`` for an empty set).
* Observation (DESIGN.md layout): ``images["screen"]`` the camera frame through ``rectify``
  (``calibration.screen.Rectifier``: the calibration's homography; [210, 160, 3]); or, with
  ``source="screen"`` (emulation without a camera), the screen's own frame from the stream;
  ``state = [lives]``; ``t = {"frame": capture time ns}``.
* ``info``: ``score``, ``lives``, ``frame_to_key_ms`` (the observation the action was chosen on:
  its capture stamp -> the microcontroller's ack of the key command; None when the key set did not
  change, nothing was sent), ``dropped`` (camera frames never seen by the agent this step: camera
  drops and frames the agent was too slow for), and ``frames``.

``stats()`` summarises the run: frame-to-key latency p50 / p99, the achieved decision and frame
rates, dropped frames. numpy + pyzmq only (rectify brings OpenCV): it runs on the edge device.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from robot_io.client import DeviceClient, StreamReader

log = logging.getLogger(__name__)


class RigEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, keyboard: DeviceClient, screen: DeviceClient, key_sets: Sequence[Sequence[str]],
                 camera_stream: str | None = None, screen_stream: str | None = None,
                 rectify: Callable[[np.ndarray], np.ndarray] | None = None, source: str = "camera",
                 frames_per_step: int = 2, max_episode_steps: int | None = None, settle_s: float = 0.15,
                 timeout_s: float = 2.0, action_names: Sequence[str] = ()) -> None:
        if source not in ("camera", "screen"):
            raise ValueError(f"source must be 'camera' or 'screen', got {source!r}")
        if frames_per_step < 1:
            raise ValueError(f"frames_per_step must be >= 1, got {frames_per_step}")
        if not key_sets:
            raise ValueError("key_sets must list the keys of each action (at least one)")
        self.keyboard, self.screen, self.source = keyboard, screen, source
        self.key_sets = [frozenset(k) for k in key_sets]
        self.action_names = tuple(action_names) or tuple(str(i) for i in range(len(self.key_sets)))
        self.rectify, self.frames_per_step, self.settle_s = rectify, int(frames_per_step), float(settle_s)
        self.max_episode_steps, self.timeout_s = max_episode_steps, float(timeout_s)
        sd = screen.describe()
        screen_stream = screen_stream or sd.get("stream_endpoint")
        if not screen_stream:
            raise ValueError(f"screen {screen.device!r} has no stream endpoint (game_state) to read rewards from")
        self.states = StreamReader(screen_stream, "record", keyboard.keys, max_queue=2000, name=f"{screen.device}-state")
        self.frames = None
        if source == "camera":
            if not camera_stream:
                raise ValueError("source='camera' needs the camera's stream endpoint (camera_stream)")
            self.frames = StreamReader(camera_stream, "latest", keyboard.keys, name="rig-camera")
        self.action_space = spaces.Discrete(len(self.key_sets))
        shape = tuple(sd.get("frame_shape", (210, 160, 3)))
        self.observation_space = spaces.Dict({"images": spaces.Dict({"screen": spaces.Box(0, 255, shape, np.uint8)}),
                                              "state": spaces.Box(0, np.inf, (1,), np.float32)})
        self._held: frozenset = frozenset()
        self._last_frame = None  # (t_mono_ns, index) of the newest frame the agent has seen
        self._score, self._lives, self._over, self._steps = 0, 0, False, 0
        self.latencies_ms: list[float] = []
        self.step_times: list[int] = []
        self.frames_seen = self.frames_dropped = 0
        self.ack_clock = "none"
        self._last_obs: dict | None = None

    # -- keys -----------------------------------------------------------------------------------------
    def _set_keys(self, keys: frozenset) -> int | None:
        """Hold exactly ``keys``; -> the microcontroller's ack time (ns, its monotonic clock) of the last
        command sent, None when nothing changed."""
        if keys == self._held:
            return None
        if not keys:
            reply = self.keyboard.request("key_release_all")
        else:
            off, on = self._held - keys, keys - self._held
            reply = None
            if off:
                reply = self.keyboard.request("key_release", keys=sorted(off))
            if on:
                reply = self.keyboard.request("key_press", keys=sorted(on))
        self._held = keys
        return self._ack_time_ns(reply)

    def _ack_time_ns(self, reply) -> int:
        """When the microcontroller applied the command, on this host's monotonic clock. Its ack carries
        its own clock in microseconds, wrapping at 2**32 (71 min): unwrapped against ours it is exact
        when the two are one clock (the emulated microcontroller on this machine). A real Pico's clock
        is another one: then the host's reply time less half the serial round trip stands in."""
        now_us = time.monotonic_ns() // 1000
        behind = (now_us - int(reply["mcu_t_us"])) % 2**32
        if behind < 1_000_000:  # the same clock: the ack is less than a second old
            self.ack_clock = "mcu"
            return (now_us - behind) * 1000
        self.ack_clock = "host"
        return time.monotonic_ns() - int(reply.get("ack_rtt_ns", 0)) // 2

    # -- observations -----------------------------------------------------------------------------------
    def _drain_states(self) -> tuple[int, int]:
        """Every game_state since the last call: (reward summed, frames)."""
        reward, n = 0, 0
        while True:
            m = self.states.next(timeout_s=0)
            if m is None:
                return reward, n
            n += 1
            reward += int(m.get("reward", 0))
            self._score, self._lives, self._over = int(m["score"]), int(m["lives"]), bool(m["episode_over"])
            self._screen_msg = m

    def _next_frame(self, after_ns: int) -> tuple[np.ndarray, int, int]:
        """The newest camera (or screen) frame stamped after ``after_ns``: (rgb, t_mono_ns, index)."""
        if self.source == "camera":
            m = self.frames.latest(self.timeout_s, newer_than_ns=after_ns)
            return m.arrays["rgb"], int(m.t_mono_ns), int(m["index"])
        m = self.states.latest(self.timeout_s, newer_than_ns=after_ns)
        return m.arrays["rgb"], int(m.t_mono_ns), int(m["index"])

    def _observe(self, rgb: np.ndarray, t_ns: int) -> dict:
        pic = self.rectify(rgb) if self.rectify is not None else rgb
        obs = {"images": {"screen": pic}, "state": np.array([self._lives], np.float32), "instruction": "",
               "t": {"frame": np.int64(t_ns)}}
        self._last_obs = obs
        return obs

    def _wait_frames(self, n: int) -> tuple[np.ndarray, int, int]:
        """Wait for ``n`` frames newer than the last seen; count the ones skipped (dropped)."""
        seen = 0
        dropped = 0
        while True:
            t_prev, i_prev = self._last_frame
            rgb, t, idx = self._next_frame(t_prev)
            gap = idx - i_prev - 1
            if gap > 0:
                dropped += gap
            seen += 1 + max(gap, 0)
            self._last_frame = (t, idx)
            self.frames_seen += 1
            if seen >= n:
                self.frames_dropped += dropped
                return rgb, t, dropped

    # -- gymnasium ----------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._set_keys(frozenset())
        self.screen.request("reset", seed=seed, timeout_s=max(self.timeout_s, 2.0))
        t_reset = time.monotonic_ns()
        time.sleep(self.settle_s)  # the camera's capture latency still shows the old game: let it pass
        self._drain_states()
        self._score, self._over, self._steps = 0, False, 0
        rgb, t, idx = self._next_frame(t_reset + int(self.settle_s * 1e9) // 2)
        self._last_frame = (t, idx)
        self._drain_states()
        self._score = 0
        return self._observe(rgb, t), {"lives": self._lives, "score": 0}

    def step(self, action):
        a = int(action)
        if not 0 <= a < len(self.key_sets):
            raise ValueError(f"action {action!r} is not in 0..{len(self.key_sets) - 1}")
        t_obs = self._last_frame[0]
        ack_ns = self._set_keys(self.key_sets[a])
        lat = None if ack_ns is None else (ack_ns - t_obs) / 1e6
        if lat is not None:
            self.latencies_ms.append(lat)
        rgb, t, dropped = self._wait_frames(self.frames_per_step)
        reward, frames = self._drain_states()
        self._steps += 1
        self.step_times.append(time.monotonic_ns())
        terminated = self._over
        truncated = self.max_episode_steps is not None and self._steps >= self.max_episode_steps and not terminated
        info = {"score": self._score, "lives": self._lives, "frame_to_key_ms": lat, "dropped": dropped,
                "frames": frames}
        return self._observe(rgb, t), float(reward), bool(terminated), bool(truncated), info

    def stats(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies_ms, np.float64)
        st = np.diff(np.asarray(self.step_times, np.float64)) / 1e9
        out: dict[str, Any] = {"steps": len(self.step_times), "key_commands": int(lat.size), "ack_clock": self.ack_clock,
                               "frames_seen": self.frames_seen, "frames_dropped": self.frames_dropped}
        if lat.size:
            out.update(frame_to_key_ms_p50=float(np.percentile(lat, 50)), frame_to_key_ms_p99=float(np.percentile(lat, 99)),
                       frame_to_key_ms_max=float(lat.max()))
        if st.size:
            out.update(decision_hz=float(1.0 / st.mean()), frame_hz=float(self.frames_per_step / st.mean()))
        return out

    def render(self):
        return None if self._last_obs is None else self._last_obs["images"]["screen"]

    def close(self) -> None:
        try:
            self._set_keys(frozenset())
        except Exception as e:  # closing anyway: the watchdog and the firmware's heartbeat timeout release them
            log.warning("rig env: releasing the keys on close failed: %s", e)
        self.states.close()
        if self.frames is not None:
            self.frames.close()
