"""The keyboard rig's host screen: an Atari game (ALE, ``ale-py``) running in real time (driver ``ale_screen``).

The game ticks at 60 Hz on its own thread, as the console did: each tick reads the keys held
*now*, maps them to an ALE action (:class:`KeyMap`), advances the emulator one frame and shows
the new frame. Nobody waits for the agent; a tick that wakes late skips ahead on a fixed
schedule (``stats()["late_ticks"]``) rather than speeding up to catch up.

Keys arrive through :meth:`AleScreen.set_keys` -- the set of keys held, by the names of
``hardware.firmware.keyproto.KEYS``. A key source wires a keyboard to it (``keys=`` in the
site's params, see :data:`KEY_SOURCES`):

* ``"none"`` (default): only ``set_keys`` (tests, or a caller that injects the host keyboard's
  events itself);
* ``"emulated_mcu"``: the screen starts the rig's emulated microcontroller
  (``hardware.keyboard_mcu_emulator``) on a pty and listens to its ``on_change`` hook, as the
  host listens to the Pico's USB HID reports. Its serial end is ``describe()["mcu_port"]``; with
  ``mcu_link: PATH`` a symlink to it is made there, so a site's ``serial_keypresser`` (the edge
  side, possibly another process) can name a fixed ``port:`` like a udev link of the real Pico.
* ``"hid_socket"``: the microcontroller is emulated in another process (``vla rig mcu``) and
  pushes its HID reports (the held keys) to ``hid_endpoint``, where the screen listens
  (:class:`HidSocketKeys`): the emulated rig with every part in its own process.

Key maps (``KEY_MAPS``; a game not listed uses ``DEFAULT_KEY_MAP``): each key names one
component of an ALE action -- UP, DOWN, LEFT, RIGHT or FIRE. The held keys' components are
combined into ALE's action name in ALE's order (UP/DOWN, then LEFT/RIGHT, then FIRE; opposite
directions cancel), e.g. SPACE + LEFT_ARROW -> ``LEFTFIRE``. Pong's paddle moves with ALE's
RIGHT (up) and LEFT (down), so its map sends the arrow keys a player would use there:

=========  ============================  ============================
game       key -> component              minimal action set (agent)
=========  ============================  ============================
pong       UP_ARROW -> RIGHT (paddle up), NOOP FIRE RIGHT LEFT RIGHTFIRE LEFTFIRE
           DOWN_ARROW -> LEFT (down),
           SPACE -> FIRE
breakout   LEFT_ARROW -> LEFT,            NOOP FIRE RIGHT LEFT
           RIGHT_ARROW -> RIGHT, SPACE -> FIRE
(default)  the four arrows -> their       the game's own
           direction, SPACE -> FIRE
=========  ============================  ============================

``KeyMap.keys_for(action)`` inverts the map: the keys an agent must hold for one of the game's
minimal actions (a DQN's discrete action space). Every action ALE accepts is in its full
legal set, so a combination outside the minimal set is still applied (ALE treats it as the
nearest action the game knows).

Test pattern: ``reset(game="key_flash")`` shows a black frame while no key is held and a white
one while any key is held (the same size as the game's frames), through the same tick and key
path: what ``calibration.screen`` films to measure key -> pixel latency, like a photodiode
latency tester. ``reset(game="pong")`` goes back to a game.

Reset with a seed reloads the ROM with ALE's ``random_seed`` (about 0.15 s; the last frame stays
on the screen meanwhile) and then plays ``seed``-drawn no-ops (0..``noop_max``, not shown), so the
same seed gives the same start. ``repeat_action_probability`` defaults to 0 (no sticky actions:
the rig's own latency and jitter are the randomness being studied).

ale-py is imported on ``connect()`` (``pip install 'vla-stack[rig]'``); no torch here.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from typing import Any, Callable

import numpy as np

from hardware.base import DeviceError, Screen, ScreenFrame
from hardware.firmware import keyproto as kp

log = logging.getLogger(__name__)

COMPONENTS = ("UP", "DOWN", "LEFT", "RIGHT", "FIRE")
DEFAULT_KEY_MAP: dict[str, str] = {"UP_ARROW": "UP", "DOWN_ARROW": "DOWN", "LEFT_ARROW": "LEFT",
                                   "RIGHT_ARROW": "RIGHT", "SPACE": "FIRE"}
KEY_MAPS: dict[str, dict[str, str]] = {
    "pong": {"UP_ARROW": "RIGHT", "DOWN_ARROW": "LEFT", "SPACE": "FIRE"},
    "breakout": {"LEFT_ARROW": "LEFT", "RIGHT_ARROW": "RIGHT", "SPACE": "FIRE"},
}
PATTERNS = ("key_flash",)
"""Test patterns the screen shows instead of a game (see the module docstring)."""
ALE_FRAME_SHAPE = (210, 160, 3)


class KeyMap:
    """Held keys <-> ALE action names for one game (see the module docstring)."""

    def __init__(self, mapping: dict[str, str]) -> None:
        for k, c in mapping.items():
            if k not in kp.KEYS:
                raise ValueError(f"key map: {k!r} is not a key the rig can press; known: {', '.join(kp.KEYS)}")
            if c not in COMPONENTS:
                raise ValueError(f"key map: {k!r} -> {c!r}; a key maps to one of {', '.join(COMPONENTS)}")
        self.mapping = dict(mapping)

    @classmethod
    def for_game(cls, game: str) -> "KeyMap":
        return cls(KEY_MAPS.get(game, DEFAULT_KEY_MAP))

    def action(self, keys) -> str:
        """The ALE action name the held ``keys`` make ("NOOP" when none of them is mapped)."""
        c = {self.mapping[k] for k in keys if k in self.mapping}
        vert = "UP" if "UP" in c and "DOWN" not in c else "DOWN" if "DOWN" in c and "UP" not in c else ""
        horiz = "LEFT" if "LEFT" in c and "RIGHT" not in c else "RIGHT" if "RIGHT" in c and "LEFT" not in c else ""
        name = vert + horiz + ("FIRE" if "FIRE" in c else "")
        return name or "NOOP"

    def keys_for(self, action: str) -> tuple[str, ...]:
        """The keys to hold for ``action`` (an ALE action name); ValueError when the map cannot make it."""
        want = [] if action == "NOOP" else [c for c in COMPONENTS if c in action]
        keys = []
        for c in want:
            k = sorted(k for k, v in self.mapping.items() if v == c)
            if not k:
                raise ValueError(f"no key of this map makes {c} (for {action}); map: {self.mapping}")
            keys.append(k[0])
        if self.action(keys) != action:
            raise ValueError(f"the key map cannot make {action!r}")
        return tuple(keys)


# --------------------------------------------------------------------------------------------
# key sources
# --------------------------------------------------------------------------------------------


class EmulatedMcuKeys:
    """Key source ``emulated_mcu``: the rig's emulated microcontroller on a pty, its ``on_change``
    wired to the screen (the host side of the Pico's USB keyboard)."""

    def __init__(self, link: str | None = None, timeout_ms: int = kp.HEARTBEAT_TIMEOUT_MS) -> None:
        self.link, self.timeout_ms = link, int(timeout_ms)
        self.mcu = None

    def start(self, on_change: Callable[[frozenset], None]) -> None:
        from hardware.keyboard_mcu_emulator import EmulatedMicrocontroller

        self.mcu = EmulatedMicrocontroller(self.timeout_ms, on_change=on_change).start()
        if self.link:
            if os.path.islink(self.link):
                os.unlink(self.link)  # a stale link from a run that died
            elif os.path.exists(self.link):
                self.mcu.stop()
                raise DeviceError(f"mcu_link {self.link!r} exists and is not a symlink; not replacing it")
            os.symlink(self.mcu.port, self.link)

    def stop(self) -> None:
        if self.mcu is not None:
            self.mcu.stop()
        if self.link and os.path.islink(self.link):
            os.unlink(self.link)

    def describe(self) -> dict[str, Any]:
        if self.mcu is None:
            return {"keys": "emulated_mcu"}
        return {"keys": "emulated_mcu", "mcu_port": self.mcu.port, "mcu_link": self.link, "mcu": self.mcu.stats()}


class HidSocketKeys:
    """Key source ``hid_socket``: the USB HID link of a microcontroller emulated in *another* process
    (``python -m hardware.keyboard_mcu_emulator --hid ENDPOINT``, ``vla rig mcu``). The screen binds a
    ZMQ PULL socket at ``hid_endpoint``; the emulator pushes the set of held keys (a msgpack list of
    key names) each time it changes, as the Pico sends a HID report. Names outside the rig's keys
    are dropped and counted (``bad_reports``)."""

    def __init__(self, link: str | None = None, timeout_ms: int = kp.HEARTBEAT_TIMEOUT_MS,
                 endpoint: str = "tcp://127.0.0.1:5589") -> None:
        self.endpoint = endpoint
        self.reports = self.bad_reports = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock = None

    def start(self, on_change: Callable[[frozenset], None]) -> None:
        import zmq

        self._sock = zmq.Context.instance().socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(self.endpoint)
        except zmq.ZMQError as e:
            self._sock.close()
            raise DeviceError(f"hid_socket: cannot bind {self.endpoint}: {e}") from None
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(on_change,), daemon=True, name="screen-hid")
        self._thread.start()

    def _run(self, on_change) -> None:
        import msgpack

        sock = self._sock
        while not self._stop.is_set():
            if not sock.poll(50):
                continue
            try:
                keys = msgpack.unpackb(sock.recv(), raw=False)
                if not isinstance(keys, list):
                    raise ValueError("not a list")
            except Exception as e:  # a malformed report is dropped, counted and logged; the link stays up
                self.bad_reports += 1
                log.warning("hid_socket: malformed report dropped: %s", e)
                continue
            good = frozenset(k for k in keys if isinstance(k, str) and k in kp.KEYS)
            self.bad_reports += len(keys) - len(good)
            self.reports += 1
            on_change(good)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def describe(self) -> dict[str, Any]:
        return {"keys": "hid_socket", "hid_endpoint": self.endpoint, "hid_reports": self.reports,
                "hid_bad_reports": self.bad_reports}


KEY_SOURCES: dict[str, type | None] = {"none": None, "emulated_mcu": EmulatedMcuKeys, "hid_socket": HidSocketKeys}
"""``keys=`` names of the site params -> key source class (an object with ``start(on_change)``,
``stop()`` and ``describe()``; an instance may also be passed in directly)."""


# --------------------------------------------------------------------------------------------
# the screen
# --------------------------------------------------------------------------------------------


class AleScreen(Screen):
    def __init__(self, name: str = "screen", game: str = "pong", fps: float = 60.0, seed: int | None = 0,
                 noop_max: int = 30, repeat_action_probability: float = 0.0, auto_reset: bool = False,
                 history: int = 120, keys: Any = "none", mcu_link: str | None = None,
                 mcu_timeout_ms: int = kp.HEARTBEAT_TIMEOUT_MS, hid_endpoint: str | None = None) -> None:
        super().__init__(name)
        if fps <= 0:
            raise ValueError(f"screen {name!r}: fps must be positive, got {fps}")
        if history < 2:
            raise ValueError(f"screen {name!r}: history must hold at least 2 frames, got {history}")
        if noop_max < 0:
            raise ValueError(f"screen {name!r}: noop_max must be >= 0, got {noop_max}")
        self.game, self.fps, self.seed = game, float(fps), seed
        self.noop_max, self.sticky = int(noop_max), float(repeat_action_probability)
        self.auto_reset, self.history = bool(auto_reset), int(history)
        if isinstance(keys, str):
            if keys not in KEY_SOURCES:
                raise ValueError(f"screen {name!r}: keys={keys!r}; known key sources: {', '.join(KEY_SOURCES)}")
            src_cls = KEY_SOURCES[keys]
            extra = {"endpoint": hid_endpoint} if src_cls is HidSocketKeys and hid_endpoint else {}
            self.key_source = None if src_cls is None else src_cls(link=mcu_link, timeout_ms=mcu_timeout_ms, **extra)
        else:
            self.key_source = keys  # an object with start(on_change) / stop() / describe()
        self.key_names = tuple(kp.KEYS)
        self._ale = None
        self._rom_ids: tuple[str, ...] = ()
        self._ale_lock = threading.Lock()  # the game thread's tick vs reset from the command thread
        self._cond = threading.Condition()
        self._frames: collections.deque[ScreenFrame] = collections.deque(maxlen=self.history)
        self._keys: frozenset = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._stats = {"ticks": 0, "late_ticks": 0, "key_changes": 0, "resets": 0}
        # per-episode state (under _ale_lock)
        self._current = game
        self._keymap = KeyMap.for_game(game)
        self._score = 0
        self._episode = -1
        self._over = False
        self._index = -1

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def games(self) -> tuple[str, ...]:
        return self._rom_ids + PATTERNS

    def _connect(self) -> None:
        try:
            from ale_py import ALEInterface, LoggerMode, roms
        except ImportError as e:
            raise DeviceError(f"screen {self.name!r} needs ale-py: pip install 'vla-stack[rig]' ({e})") from None
        ALEInterface.setLoggerMode(LoggerMode.Error)
        self._roms = roms
        self._rom_ids = tuple(sorted(roms.get_all_rom_ids()))
        if self.game not in self.games:
            raise DeviceError(self._unknown_game(self.game))
        self._ale = ALEInterface()
        self._frames.clear()
        self._index, self._episode, self._keys = -1, -1, frozenset()
        self._stats = dict.fromkeys(self._stats, 0)
        self.reset(self.seed, self.game)
        self._stop.clear()
        self.error = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"screen-{self.name}")
        self._thread.start()
        if self.key_source is not None:
            self.key_source.start(self.set_keys)

    def _disconnect(self) -> None:
        try:
            if self.key_source is not None:
                self.key_source.stop()
        finally:
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=2)
            self._ale = None

    def _unknown_game(self, game: str) -> str:
        import difflib

        close = difflib.get_close_matches(str(game), self.games, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        return f"screen {self.name!r}: no game {str(game)[:60]!r}.{hint} It has the ROMs bundled with ale-py and {PATTERNS}"

    # -- input ------------------------------------------------------------------------------------
    def set_keys(self, keys) -> None:
        keys = frozenset(keys)
        with self._cond:
            if keys != self._keys:
                self._stats["key_changes"] += 1
            self._keys = keys

    @property
    def keys(self) -> frozenset:
        with self._cond:
            return self._keys

    @property
    def keymap(self) -> KeyMap:
        return self._keymap

    def minimal_actions(self) -> tuple[str, ...]:
        """The game's minimal ALE action set, by name (an agent's discrete actions)."""
        if self._current in PATTERNS:
            return ("NOOP", "FIRE")
        with self._ale_lock:
            return tuple(a.name for a in self._ale.getMinimalActionSet())

    # -- the game -----------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, game: str | None = None) -> ScreenFrame:
        self._require_connected_or_connecting()
        game = game or self._current
        if game not in self.games:
            raise DeviceError(self._unknown_game(game))
        with self._ale_lock:
            if game not in PATTERNS:
                from ale_py import Action

                self._Action = Action
                if seed is not None or game != self._current or self._episode < 0:
                    # ALE reads its seed when a ROM loads: a seeded restart reloads it
                    self._ale.setInt("random_seed", int(seed or 0) % 2**31)
                    self._ale.setFloat("repeat_action_probability", self.sticky)
                    self._ale.loadROM(self._roms.get_rom_path(game))
                self._ale.reset_game()
                noops = int(np.random.default_rng(seed).integers(0, self.noop_max + 1)) if self.noop_max else 0
                for _ in range(noops):  # not shown: the start state is a function of the seed
                    self._ale.act(Action.NOOP)
            self._current = game
            self._keymap = KeyMap.for_game(game)
            self._score, self._over = 0, False
            self._episode += 1
            self._stats["resets"] += 1
            frame = self._show(self._render_locked(), reward=0, action="NOOP", keys=self.keys)
        return frame

    def _require_connected_or_connecting(self) -> None:
        if self._ale is None:
            self._require_connected()

    def _render_locked(self) -> np.ndarray:
        if self._current == "key_flash":
            return np.full(ALE_FRAME_SHAPE, 255 if self._keys else 0, np.uint8)
        return self._ale.getScreenRGB()

    def _show(self, rgb: np.ndarray, reward: int, action: str, keys: frozenset) -> ScreenFrame:
        rgb.flags.writeable = False
        lives = 0 if self._current in PATTERNS else int(self._ale.lives())
        with self._cond:
            self._index += 1
            f = ScreenFrame(rgb=rgb, index=self._index, t_mono_ns=time.monotonic_ns(), game=self._current,
                            score=int(self._score), reward=int(reward), lives=lives, episode_over=self._over,
                            episode=self._episode, keys=keys, action=action)
            self._frames.append(f)
            self._cond.notify_all()
        return f

    def _tick(self) -> None:
        with self._ale_lock:
            keys = self.keys
            action, reward = "NOOP", 0
            if self._current not in PATTERNS:
                if self._over and self.auto_reset:
                    self._ale.reset_game()
                    self._score, self._over = 0, False
                    self._episode += 1
                elif not self._over:
                    action = self._keymap.action(keys)
                    reward = int(self._ale.act(getattr(self._Action, action)))
                    self._score += reward
                    self._over = bool(self._ale.game_over())
            self._stats["ticks"] += 1
            self._show(self._render_locked(), reward, action, keys)

    def _run(self) -> None:
        period_ns = int(round(1e9 / self.fps))
        next_ns = time.monotonic_ns() + period_ns
        try:
            while not self._stop.is_set():
                wait = (next_ns - time.monotonic_ns()) / 1e9
                if wait > 0:
                    self._stop.wait(wait)
                    if self._stop.is_set():
                        break
                self._tick()
                next_ns += period_ns
                now = time.monotonic_ns()
                if now - next_ns > period_ns:  # fell behind by more than a frame: skip ahead, don't burst
                    missed = (now - next_ns) // period_ns
                    self._stats["late_ticks"] += int(missed)
                    next_ns += missed * period_ns
        except BaseException as e:  # surfaced through .error, wait_frame() and the log
            self.error = e
            log.exception("screen %r: the game loop stopped", self.name)
            with self._cond:
                self._cond.notify_all()

    # -- output -----------------------------------------------------------------------------------
    def latest(self) -> ScreenFrame:
        self._require_connected()
        with self._cond:
            return self._frames[-1]

    def frame_at(self, t_mono_ns: int) -> ScreenFrame | None:
        self._require_connected()
        with self._cond:
            frames = list(self._frames)
        for f in reversed(frames):
            if f.t_mono_ns <= t_mono_ns:
                return f
        return None

    def frames_since(self, t_mono_ns: int) -> list[ScreenFrame]:
        """The remembered frames displayed at or after ``t_mono_ns``, oldest first."""
        self._require_connected()
        with self._cond:
            return [f for f in self._frames if f.t_mono_ns >= t_mono_ns]

    def wait_frame(self, after_index: int, timeout_s: float = 1.0) -> ScreenFrame:
        self._require_connected()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._frames[-1].index <= after_index:
                if self.error is not None:
                    raise DeviceError(f"screen {self.name!r}: the game loop stopped: {self.error!r}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeviceError(f"screen {self.name!r}: no new frame within {timeout_s:.3f} s")
                self._cond.wait(left)
            return self._frames[-1]

    def stats(self) -> dict[str, int]:
        return dict(self._stats)

    def describe(self) -> dict[str, Any]:
        d = {**super().describe(), "game": self._current, "fps": self.fps, "frame_shape": list(ALE_FRAME_SHAPE),
             "key_map": dict(self._keymap.mapping), "auto_reset": self.auto_reset, "patterns": list(PATTERNS)}
        if self.is_connected:
            d["actions"] = list(self.minimal_actions())
            d["stats"] = self.stats()
        if self.key_source is not None:
            d.update(self.key_source.describe())
        return d
