"""The host screen seen from another process: its ``game_state`` stream on the bridge, as a
``frame_at`` / ``latest`` source (what ``hardware.screen_camera`` films).

On the emulated rig the host screen (``vla rig host``) and the simulated camera (``vla rig camera``)
are separate processes, as the monitor and the camera are separate things: the camera subscribes
to the screen's stream (``screen: "tcp://127.0.0.1:5581"`` in its site params: the screen device's
``stream`` endpoint) and keeps the last ``history`` displayed frames, stamped with the host's
``time.monotonic_ns()`` at display (one machine: one clock). It only reads: keys reach the screen
through the keyboard, never through here.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import zmq

from hardware.base import DeviceError, ScreenFrame
from robot_io.wire import ProtocolError, decode


class RemoteScreen:
    """Read-only view of a screen served elsewhere (duck-types the parts of ``hardware.base.Screen``
    a camera uses: ``name``, ``is_connected``, ``connect``, ``disconnect``, ``latest``, ``frame_at``)."""

    def __init__(self, endpoint: str, name: str = "remote_screen", history: int = 120,
                 connect_timeout_s: float = 5.0) -> None:
        if not isinstance(endpoint, str) or "://" not in endpoint:
            raise ValueError(f"remote screen: endpoint must be the screen's stream endpoint (tcp://HOST:PORT), "
                             f"got {endpoint!r}")
        self.endpoint, self.name, self.connect_timeout_s = endpoint, name, float(connect_timeout_s)
        self._frames: collections.deque[ScreenFrame] = collections.deque(maxlen=int(history))
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.received = 0
        self.decode_errors = 0
        self.error: BaseException | None = None

    @property
    def is_connected(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def connect(self) -> "RemoteScreen":
        if self.is_connected:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"remote-screen-{self.name}")
        self._thread.start()
        with self._cond:
            if not self._cond.wait_for(lambda: self._frames or self.error is not None, self.connect_timeout_s):
                self.disconnect()
                raise DeviceError(f"remote screen: no game_state from {self.endpoint} within "
                                  f"{self.connect_timeout_s:.1f} s (is `vla rig host` running?)")
        if self.error is not None:
            raise DeviceError(f"remote screen {self.endpoint}: {self.error}")
        return self

    def disconnect(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._thread = None

    def _run(self) -> None:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 10)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self.endpoint)
        try:
            while not self._stop.is_set():
                if not sock.poll(50):
                    continue
                try:
                    m = decode(sock.recv_multipart(copy=False))
                except ProtocolError:
                    self.decode_errors += 1
                    continue
                if m.type != "game_state":
                    continue
                f = ScreenFrame(rgb=m.arrays["rgb"], index=int(m["index"]), t_mono_ns=int(m.t_mono_ns),
                                game=str(m.get("game", "")), score=int(m["score"]), reward=int(m.get("reward", 0)),
                                lives=int(m["lives"]), episode_over=bool(m["episode_over"]),
                                episode=int(m.get("episode", 0)), keys=frozenset(m.get("keys", ())),
                                action=str(m.get("action", "")))
                with self._cond:
                    self._frames.append(f)
                    self.received += 1
                    self._cond.notify_all()
        except BaseException as e:  # surfaced through .error and connect()
            self.error = e
            with self._cond:
                self._cond.notify_all()
        finally:
            sock.close(linger=0)

    def latest(self) -> ScreenFrame:
        with self._cond:
            if not self._frames:
                raise DeviceError(f"remote screen {self.endpoint}: no frame yet")
            return self._frames[-1]

    def frame_at(self, t_mono_ns: int) -> ScreenFrame | None:
        with self._cond:
            frames = list(self._frames)
        for f in reversed(frames):
            if f.t_mono_ns <= t_mono_ns:
                return f
        return None

    def describe(self) -> dict[str, Any]:
        return {"remote": self.endpoint, "received": self.received, "decode_errors": self.decode_errors,
                "age_ms": (time.monotonic_ns() - self._frames[-1].t_mono_ns) / 1e6 if self._frames else None}
