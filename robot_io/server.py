"""Device servers: one ROUTER (commands) and one PUB (streams) per device, a watchdog, limits.

A :class:`DeviceServer` puts one device behind the bridge. It owns two threads:

* the command thread polls the ROUTER socket, decodes each request (refusing malformed ones
  with an ``error`` reply that names the problem -- the device is not touched), checks its
  deadline, lets the :class:`Service` apply it and replies with what was actually applied.
  The same thread runs the watchdog: while the device is *active* (it has been given a motion
  command since its last reset/stop/release), no command or heartbeat *from its owner* for
  ``command_timeout_ms`` puts it in its safe state. The trip latches: motion commands are
  refused with code ``safe_state`` until a ``reset`` re-arms the device, so a client that lost
  contact can never resume motion by accident. Silence is measured up to the last message that
  arrived, not the last one the thread got round to: before tripping, the thread answers
  everything already readable on the socket (a thread starved of CPU wakes late, and would
  otherwise blame the owner for its own delay).
* Ownership: the client whose motion command made the device active owns it until the watchdog
  trips, or it sends ``release``, ``stop`` or ``reset``. A client is its header field ``client``
  (DeviceClient sends a random id, shared with its heartbeat thread's socket) or, without one,
  its ROUTER routing id. Only the owner's accepted messages feed the watchdog: another client's
  pings, captures or heartbeats never keep the device active. While owned, another client's
  motion command, ``reset`` or ``release`` is refused with code ``not_owner`` (field ``client``);
  ``stop`` (the software e-stop) is obeyed from anyone.
* the stream thread publishes the device's samples (arm states, camera frames) on PUB.

Services adapt a ``hardware`` device to the wire, one per device kind (:data:`SERVICES`). They
duck-type the device (robot_io never imports hardware), so any object with the
``hardware.base.Arm`` / ``Camera`` / ``KeyPresser`` / ``Screen`` / ``Legged`` methods works.
"""

from __future__ import annotations

import difflib
import logging
import math
import threading
import time
from typing import Any, Iterator

import numpy as np
import zmq

from robot_io import limits as L
from robot_io.security import CurveKeys, secure_server_socket
from robot_io.wire import (COMMAND_TYPES, Message, ProtocolError, check_array, decode, encode,
                           error_message, peek_req_id)

log = logging.getLogger(__name__)


class CommandRefused(Exception):
    """Raised by a service to refuse a well-formed command (e.g. while latched in safe state)."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code, self.field, self.message = code, field, message


# ------------------------------------------------------------------------------------------
# Services: device <-> messages
# ------------------------------------------------------------------------------------------


SERVER_TYPES = frozenset({"ping", "describe", "heartbeat", "stop", "release"})
"""Commands the DeviceServer answers itself for every kind of device; a service's ``accepts``
lists the others, which it applies in :meth:`Service.handle`."""


def paced_states(service, stop: threading.Event) -> Iterator[Message]:
    """``state`` messages from ``service._state_arrays()`` at ``service.state_hz`` on an absolute
    schedule (a late sample moves the schedule to now instead of bursting to catch up): the stream of
    the arm and legged services."""
    period = 1.0 / service.state_hz
    next_t = time.monotonic()
    while not stop.is_set():
        arrays, meta = service._state_arrays()
        yield Message("state", service.name, arrays, meta, t_mono_ns=meta["state_t_mono_ns"])
        next_t += period
        wait = next_t - time.monotonic()
        if wait > 0:
            stop.wait(wait)
        else:
            next_t = time.monotonic()


class Service:
    """Adapts one kind of device to the wire. A subclass names its ``kind`` (the key in
    :data:`SERVICES`), the wire command types it applies (``accepts``, all in
    ``robot_io.wire.MESSAGE_TYPES``; the server refuses the others with code ``unsupported``
    before the device is touched) and which of them make the device active (``motion_types``)."""

    kind = "device"
    accepts: frozenset[str] = frozenset()  # command types handle() applies (besides SERVER_TYPES)
    motion_types: frozenset[str] = frozenset()  # commands that make the device active (watchdog armed)

    @classmethod
    def from_spec(cls, name: str, device: Any, spec: Any) -> "Service":
        """The service for ``device`` as a site file describes it (``spec``: a
        ``robot_io.site.DeviceSpec``)."""
        return cls(name, device)

    def __init__(self, name: str, device: Any) -> None:
        self.name, self.device = name, device
        self.calibration: dict | None = None  # the device's calibration file, summarised (robot_io.site)

    def open(self) -> None:
        self.device.connect()

    def close(self) -> None:
        self.device.disconnect()

    def describe(self) -> dict:
        d = dict(self.device.describe())
        if self.calibration is not None:
            d["calibration"] = self.calibration
        return d

    def handle(self, msg: Message) -> tuple[dict[str, np.ndarray], dict]:
        """Apply a command; return (arrays, meta) of the reply."""
        raise CommandRefused("unsupported", f"{self.kind} {self.name!r} does not accept {msg.type!r} commands", "type")

    def safe_state(self) -> None:
        """Put the device in its safe state (called by the watchdog and by ``stop``)."""

    def stream(self, stop: threading.Event) -> Iterator[Message]:
        return iter(())


MAX_SEED = 2**63 - 1
"""Largest ``reset`` seed accepted (seeds are non-negative int64s)."""


class ArmService(Service):
    """An ``Arm`` behind the bridge: ee_delta / joint_position / reset / stop / capture."""

    kind = "arm"
    accepts = frozenset({"ee_delta", "joint_position", "reset", "capture"})
    motion_types = frozenset({"ee_delta", "joint_position"})

    @classmethod
    def from_spec(cls, name: str, device: Any, spec: Any) -> "ArmService":
        return cls(name, device, L.ArmLimits.from_dict(spec.limits), state_hz=spec.state_hz)

    def __init__(self, name: str, device: Any, limits: L.ArmLimits | None = None, state_hz: float = 100.0) -> None:
        super().__init__(name, device)
        self.limits = limits or L.ArmLimits()
        self.state_hz = float(state_hz)
        # In fast mode (a simulator with realtime=False) the physics only advances when told:
        # each motion command then advances one control period before the reply.
        self.fast = getattr(device, "realtime", True) is False
        self.tasks: tuple[str, ...] = ()  # scene layouts ``reset`` accepts (a simulator's describe()["tasks"])

    def open(self) -> None:
        super().open()
        self.tasks = tuple(self.device.describe().get("tasks") or ())

    def describe(self) -> dict:
        d = super().describe()
        d["limits"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(self.limits).items()}
        d["state_hz"] = self.state_hz
        d["fast"] = self.fast
        d["action"] = "ee_delta: [dx, dy, dz, drx, dry, drz, gripper] float32 (m, rad axis-angle, opening 0..1)"
        return d

    def _state_arrays(self) -> tuple[dict[str, np.ndarray], dict]:
        s = self.device.read_state()
        arrays = {
            "q": np.asarray(s.q, np.float32),
            "dq": np.asarray(s.dq, np.float32),
            "ee_pos": np.asarray(s.ee_pos, np.float32),
            "ee_quat": np.asarray(s.ee_quat, np.float32),
            "gripper": np.array([s.gripper], np.float32),
        }
        for k, v in (s.extras or {}).items():
            arrays[k] = np.asarray(v)  # keep the driver dtype (sim time needs float64)
        return arrays, {"safe": bool(s.safe), "state_t_mono_ns": int(s.t_mono_ns)}

    def _advance(self) -> None:
        if self.fast:
            self.device.step()

    def handle(self, msg: Message):
        t = msg.type
        if t == "ee_delta":
            a = check_array(msg, "action", "float32", (7,)).tolist()
            s = self.device.read_state()
            target, dpos, drot, grip, clipped = L.clip_ee_delta(self.limits, s.ee_pos, a[:3], a[3:6], a[6])
            quat = L.quat_mul(L.axis_angle_to_quat(drot), s.ee_quat)
            self.device.command_ee_pose(target, quat / math.sqrt(float(quat @ quat)), grip)
            self._advance()
            applied = np.array([*dpos, *drot, grip], np.float32)
            return ({"applied": applied, "target_pos": target.astype(np.float32),
                     "target_quat": quat.astype(np.float32)}, {"clipped": clipped})
        if t == "joint_position":
            lim = self.device.joint_limits
            n = len(lim.lower)
            q = check_array(msg, "q", "float32", (n,)).astype(np.float64)
            g = check_array(msg, "gripper", "float32", (1,), required=False)
            s = self.device.read_state()
            q2, clipped = L.clip_joints(self.limits, np.asarray(s.q), q, np.asarray(lim.lower), np.asarray(lim.upper))
            grip = None
            if g is not None:
                grip = float(np.clip(g[0], 0.0, 1.0))
                if grip != float(g[0]):
                    clipped.append("gripper:range")
            self.device.command_joint_positions(q2, grip)
            self._advance()
            arrays = {"applied": q2.astype(np.float32)}
            if grip is not None:
                arrays["gripper"] = np.array([grip], np.float32)
            return arrays, {"clipped": clipped}
        if t == "reset":
            # checked here, not by the driver: refused input must not reach the device (nor log a traceback)
            seed = msg.get("seed")
            if seed is not None and not (type(seed) is int and 0 <= seed <= MAX_SEED):
                raise CommandRefused("bad_field", f"reset seed must be nil or an integer in [0, 2**63), "
                                     f"got {seed!r:.40}", "seed")
            task = msg.get("task")
            if task is not None:
                if type(task) is not str:
                    raise CommandRefused("bad_field", f"reset task must be a string or nil, got {task!r:.40}", "task")
                if task not in self.tasks:
                    if not self.tasks:
                        raise CommandRefused("unknown_task", f"arm {self.name!r} has no tasks (only a simulator "
                                             f"lays out a task's scene); reset it without one", "task")
                    close = difflib.get_close_matches(task, self.tasks, n=3, cutoff=0.5)
                    hint = f" Did you mean {', '.join(close)}?" if close else ""
                    raise CommandRefused("unknown_task", f"unknown task {task[:60]!r}.{hint} Known: "
                                         f"{', '.join(sorted(self.tasks))}", "task")
            # a simulator places its scene for the task; a real arm only goes home
            self.device.reset(seed=seed, **({"task": task} if task is not None else {}))
            return self._state_arrays()
        if t == "capture":
            return self._state_arrays()
        return super().handle(msg)

    def safe_state(self) -> None:
        self.device.hold()

    def stream(self, stop: threading.Event) -> Iterator[Message]:
        return paced_states(self, stop)


class CameraService(Service):
    """A ``Camera`` behind the bridge: frames on the stream, ``capture`` on request.

    With ``stream=False`` (fast simulation) nothing is published and ``capture`` renders on
    demand in the command thread; otherwise ``capture`` returns the latest streamed frame.
    """

    kind = "camera"
    accepts = frozenset({"capture"})
    max_consecutive_failures = 30

    @classmethod
    def from_spec(cls, name: str, device: Any, spec: Any) -> "CameraService":
        return cls(name, device, stream=spec.streaming)

    def __init__(self, name: str, device: Any, stream: bool = True) -> None:
        super().__init__(name, device)
        self.streaming = stream
        self._latest: Message | None = None
        self._latest_lock = threading.Lock()

    def describe(self) -> dict:
        return {**super().describe(), "streaming": self.streaming}

    def _frame_message(self, f) -> Message:
        arrays = {"rgb": f.rgb}
        if f.depth is not None:
            arrays["depth"] = f.depth
        return Message("frame", self.name, arrays, {"index": int(f.index)}, t_mono_ns=int(f.t_mono_ns))

    def handle(self, msg: Message):
        if msg.type == "capture":
            if self.streaming:
                with self._latest_lock:
                    m = self._latest
                if m is None:
                    raise CommandRefused("no_frame", f"camera {self.name!r} has not produced a frame yet")
            else:
                f = self.device.render_now() if hasattr(self.device, "render_now") else self.device.read()
                m = self._frame_message(f)
            return dict(m.arrays), {"index": m["index"], "frame_t_mono_ns": m.t_mono_ns}
        return super().handle(msg)

    def stream(self, stop: threading.Event) -> Iterator[Message]:
        if not self.streaming:
            return
        try:
            yield from self._stream_frames(stop)
        finally:
            # a renderer's GL context belongs to this thread: let the device free it here
            release = getattr(self.device, "release_renderer", None)
            if release is not None:
                release()

    def _stream_frames(self, stop: threading.Event) -> Iterator[Message]:
        failures = 0
        while not stop.is_set():
            try:
                f = self.device.read(timeout_s=1.0)
            except Exception as e:  # a camera hiccup must not kill the server; repeated ones do, loudly
                failures += 1
                log.warning("camera %s: read failed (%d in a row): %s", self.name, failures, e)
                if failures >= self.max_consecutive_failures:
                    log.error("camera %s: %d consecutive read failures, stopping its stream", self.name, failures)
                    raise
                stop.wait(0.05)
                continue
            failures = 0
            m = self._frame_message(f)
            with self._latest_lock:
                self._latest = m
            yield m


class KeyboardService(Service):
    """A ``KeyPresser`` (the keyboard rig's microcontroller) behind the bridge: key_press /
    key_release / key_tap / key_release_all, reset (releases every key and re-arms after a safe
    stop) and capture (the held keys). Header field ``keys`` lists key names from the device's
    ``key_names``; every name (and a tap's ``hold_ms``) is checked before the device is touched.
    A reply carries the microcontroller's ack: its clock ``mcu_t_us``, the serial round trip
    ``ack_rtt_ns``, the keys it holds (``held``) and the ``pressed`` names. The safe state
    releases every key."""

    kind = "keyboard"
    accepts = frozenset({"key_press", "key_release", "key_tap", "key_release_all", "reset", "capture"})
    motion_types = frozenset({"key_press", "key_tap"})
    max_hold_ms = 0xFFFF

    def _keys(self, msg: Message) -> list[str]:
        keys = msg["keys"]  # a list (checked by wire.decode)
        known = self.device.key_names
        max_keys = getattr(self.device, "max_keys", 6)
        if not 1 <= len(keys) <= max_keys:
            raise CommandRefused("bad_field", f"{msg.type} needs 1..{max_keys} keys, got {len(keys)}", "keys")
        for k in keys:
            if type(k) is not str or k not in known:
                close = difflib.get_close_matches(k, known, n=1) if type(k) is str else []
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise CommandRefused("unknown_key", f"keyboard {self.name!r} has no key {k!r:.40}.{hint} "
                                     f"Known: {', '.join(known)}", "keys")
        return keys

    def handle(self, msg: Message):
        t = msg.type
        if t in ("key_press", "key_release", "key_tap"):
            keys = self._keys(msg)
            if t == "key_press":
                ack = self.device.press(keys)
            elif t == "key_release":
                ack = self.device.release(keys)
            else:
                hold = msg["hold_ms"]  # an int (wire-checked)
                if not 1 <= hold <= self.max_hold_ms:
                    raise CommandRefused("bad_field", f"key_tap hold_ms must be in 1..{self.max_hold_ms}, got {hold}",
                                         "hold_ms")
                ack = self.device.tap(keys, hold)
        elif t in ("key_release_all", "reset"):
            ack = self.device.release_all()
        elif t == "capture":
            return {}, {"pressed": sorted(self.device.pressed)}
        else:
            return super().handle(msg)
        return {}, {"pressed": sorted(self.device.pressed), "mcu_t_us": int(ack.mcu_t_us),
                    "ack_rtt_ns": int(ack.rtt_ns), "held": int(ack.held)}

    def safe_state(self) -> None:
        try:
            self.device.release_all()
        except Exception:  # called by the watchdog: never raise there; the firmware's own timeout still applies
            log.exception("keyboard %s: release_all failed in the safe state", self.name)


class ScreenService(Service):
    """A ``Screen`` (the rig's host: a game in real time) behind the bridge: every displayed frame on
    the stream as a ``game_state`` message (frame, score, lives, episode end, held keys); ``capture``
    returns the frame shown now; ``reset`` restarts the game from ``seed``, switching to the game or
    test pattern ``task`` names (one of the device's ``games``). Nothing here moves: the screen has
    no motion commands and its safe state is itself (the keyboard releases the keys)."""

    kind = "screen"
    accepts = frozenset({"reset", "capture"})

    @classmethod
    def from_spec(cls, name: str, device: Any, spec: Any) -> "ScreenService":
        return cls(name, device, stream=spec.streaming)

    def __init__(self, name: str, device: Any, stream: bool = True) -> None:
        super().__init__(name, device)
        self.streaming = stream

    def describe(self) -> dict:
        return {**super().describe(), "streaming": self.streaming}

    @staticmethod
    def _state(f) -> tuple[dict[str, np.ndarray], dict]:
        return {"rgb": f.rgb}, {"index": int(f.index), "score": int(f.score), "reward": int(f.reward),
                                "lives": int(f.lives), "episode_over": bool(f.episode_over),
                                "episode": int(f.episode), "keys": sorted(f.keys), "action": str(f.action),
                                "game": str(f.game)}

    def handle(self, msg: Message):
        t = msg.type
        if t == "reset":
            seed = msg.get("seed")
            if seed is not None and not (type(seed) is int and 0 <= seed <= MAX_SEED):
                raise CommandRefused("bad_field", f"reset seed must be nil or an integer in [0, 2**63), "
                                     f"got {seed!r:.40}", "seed")
            game = msg.get("task")  # a str or nil (wire-checked)
            if game is not None and game not in self.device.games:
                close = difflib.get_close_matches(game, self.device.games, n=3, cutoff=0.5)
                hint = f" Did you mean {', '.join(close)}?" if close else ""
                raise CommandRefused("unknown_task", f"screen {self.name!r} has no game {game[:60]!r}.{hint}", "task")
            f = self.device.reset(seed=seed, game=game)
        elif t == "capture":
            f = self.device.latest()
        else:
            return super().handle(msg)
        arrays, meta = self._state(f)
        meta["frame_t_mono_ns"] = int(f.t_mono_ns)
        return arrays, meta

    def stream(self, stop: threading.Event) -> Iterator[Message]:
        if not self.streaming:
            return
        last = -1
        while not stop.is_set():
            try:
                f = self.device.wait_frame(last, timeout_s=0.25)
            except Exception:  # no frame in time (e.g. during a reset); a dead game loop raises below
                if getattr(self.device, "error", None) is not None:
                    raise
                continue
            last = f.index  # a slow subscriber side skips frames (index gaps), never queues them here
            arrays, meta = self._state(f)
            yield Message("game_state", self.name, arrays, meta, t_mono_ns=int(f.t_mono_ns))


class LeggedService(Service):
    """A ``Legged`` robot (Go1) behind the bridge: legged_joints / body_velocity / stand / sit / damp /
    reset / capture. Joint targets are clipped to the joint range (less ``joint_margin_rad``) and to
    ``max_joint_step_rad`` of the measured position, gains to [0, max_kp] / [0, max_kd], body
    velocities to the smaller of ``limits.max_velocity`` and the device's ``max_body_velocity``;
    the reply names every clip. The safe state (watchdog, ``stop``, ``release``) is the device's
    ``damp_and_sit``. ``damp`` is not a motion (it is a safe command and never arms the watchdog)."""

    kind = "legged"
    accepts = frozenset({"legged_joints", "body_velocity", "stand", "sit", "damp", "reset", "capture"})
    motion_types = frozenset({"legged_joints", "body_velocity", "stand", "sit"})
    POSES = ("stand", "sit")

    @classmethod
    def from_spec(cls, name: str, device: Any, spec: Any) -> "LeggedService":
        return cls(name, device, L.LeggedLimits.from_dict(spec.limits), state_hz=spec.state_hz)

    def __init__(self, name: str, device: Any, limits: L.LeggedLimits | None = None, state_hz: float = 100.0) -> None:
        super().__init__(name, device)
        self.limits = limits or L.LeggedLimits()
        self.state_hz = float(state_hz)
        self.fast = getattr(device, "realtime", True) is False  # as ArmService: one control period per command

    def describe(self) -> dict:
        d = super().describe()
        d["limits"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(self.limits).items()}
        d["state_hz"] = self.state_hz
        d["fast"] = self.fast
        d["action"] = ("legged_joints: q, kp, kd [12] float32; body_velocity: velocity [3] float32 "
                       "(vx m/s, vy m/s, yaw rate rad/s)")
        return d

    def _state_arrays(self) -> tuple[dict[str, np.ndarray], dict]:
        s = self.device.read_state()
        arrays = {
            "q": np.asarray(s.q, np.float32), "dq": np.asarray(s.dq, np.float32), "tau": np.asarray(s.tau, np.float32),
            "quat": np.asarray(s.quat, np.float32), "gyro": np.asarray(s.gyro, np.float32),
            "accel": np.asarray(s.accel, np.float32), "foot_force": np.asarray(s.foot_force, np.float32),
            "base_height": np.array([s.base_height], np.float32), "tilt": np.array([s.tilt], np.float32),
        }
        for k, v in (s.extras or {}).items():
            arrays[k] = np.asarray(v)
        return arrays, {"safe": bool(s.safe), "fallen": bool(s.fallen), "mode": str(s.mode),
                        "state_t_mono_ns": int(s.t_mono_ns)}

    def _advance(self) -> None:
        if self.fast:
            self.device.step()

    def handle(self, msg: Message):
        t = msg.type
        if t == "legged_joints":
            lim = self.device.joint_limits
            n = len(lim.lower)
            q = check_array(msg, "q", "float32", (n,)).astype(np.float64)
            kp = check_array(msg, "kp", "float32", (n,))
            kd = check_array(msg, "kd", "float32", (n,))
            s = self.device.read_state()
            q2, clipped = L.clip_joints(self.limits, np.asarray(s.q), q, np.asarray(lim.lower), np.asarray(lim.upper))
            kp2, kd2, clipped_gains = L.clip_gains(self.limits, kp, kd)
            self.device.command_joint_positions(q2, kp2, kd2)
            self._advance()
            return ({"applied": q2.astype(np.float32), "kp": kp2.astype(np.float32), "kd": kd2.astype(np.float32)},
                    {"clipped": clipped + clipped_gains})
        if t == "body_velocity":
            v = check_array(msg, "velocity", "float32", (3,))
            v2, clipped = L.clip_velocity(self.limits, v, getattr(self.device, "max_body_velocity", None))
            self.device.command_body_velocity(*(float(x) for x in v2))
            self._advance()
            return {"applied": v2.astype(np.float32)}, {"clipped": clipped}
        if t in ("stand", "sit", "damp"):
            getattr(self.device, t)()
            self._advance()
            return self._state_arrays()
        if t == "reset":
            seed = msg.get("seed")
            if seed is not None and not (type(seed) is int and 0 <= seed <= MAX_SEED):
                raise CommandRefused("bad_field", f"reset seed must be nil or an integer in [0, 2**63), "
                                     f"got {seed!r:.40}", "seed")
            pose = msg.get("pose")
            if pose is not None and pose not in self.POSES:
                raise CommandRefused("bad_field", f"reset pose must be one of {list(self.POSES)} or nil, "
                                     f"got {pose!r:.40}", "pose")
            self.device.reset(seed=seed, **({"pose": pose} if pose is not None else {}))
            return self._state_arrays()
        if t == "capture":
            return self._state_arrays()
        return super().handle(msg)

    def safe_state(self) -> None:
        try:
            self.device.damp_and_sit()
        except Exception:  # called by the watchdog: never raise there
            log.exception("legged %s: damp_and_sit failed in the safe state", self.name)

    def stream(self, stop: threading.Event) -> Iterator[Message]:
        return paced_states(self, stop)


SERVICES: dict[str, type[Service]] = {
    "arm": ArmService,
    "camera": CameraService,
    "keyboard": KeyboardService,
    "screen": ScreenService,
    "legged": LeggedService,
}
"""Device kind (a driver's ``kind``) -> the service that serves it; ``robot_io.site.build_servers``
looks drivers up here. A new kind is a Service subclass, its command types in
``robot_io.wire`` and one line here."""


# ------------------------------------------------------------------------------------------
# The server
# ------------------------------------------------------------------------------------------


class DeviceServer:
    """Serve one device: ROUTER for commands, PUB for streams, watchdog, limits in the service."""

    def __init__(self, service: Service, command_endpoint: str, stream_endpoint: str | None = None,
                 command_timeout_ms: float = 200.0, keys: CurveKeys | None = None, insecure: bool = False,
                 stream_hwm: int = 100, context: zmq.Context | None = None) -> None:
        if command_timeout_ms <= 0:
            raise ValueError(f"command_timeout_ms must be positive, got {command_timeout_ms}")
        unknown = sorted(service.accepts - COMMAND_TYPES)
        if unknown:
            raise ValueError(f"{type(service).__name__} accepts {unknown[0]!r}, which is not a command type of the "
                             f"wire schema (robot_io.wire.MESSAGE_TYPES)")
        self.service = service
        self.name = service.name
        self._cmd_ep, self._stream_ep = command_endpoint, stream_endpoint
        self.command_timeout_ns = int(command_timeout_ms * 1e6)
        self.keys, self.insecure, self.stream_hwm = keys, insecure, stream_hwm
        self.ctx = context or zmq.Context.instance()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.command_endpoint: str | None = None
        self.stream_endpoint: str | None = None
        # watchdog state (command thread only, read elsewhere for stats)
        self.active = False
        self.tripped = False
        self.owner: str | None = None  # who commands the device while it is active (see the module doc)
        self.last_contact_ns = time.monotonic_ns()  # the owner's last accepted message
        self.stats = {"commands": 0, "errors": 0, "watchdog_trips": 0, "published": 0}
        self.last_trip_ns: int | None = None
        self.stream_error: BaseException | None = None
        self._seq = 0

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "DeviceServer":
        router = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        secure_server_socket(router, self._cmd_ep, self.keys, self.insecure)
        router.bind(self._cmd_ep)
        self.command_endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        pub = None
        if self._stream_ep:
            pub = self.ctx.socket(zmq.PUB)
            pub.setsockopt(zmq.LINGER, 0)
            pub.setsockopt(zmq.SNDHWM, self.stream_hwm)
            secure_server_socket(pub, self._stream_ep, self.keys, self.insecure)
            pub.bind(self._stream_ep)
            self.stream_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.service.open()
        self._threads = [threading.Thread(target=self._command_loop, args=(router,), daemon=True,
                                          name=f"cmd-{self.name}")]
        if pub is not None:
            self._threads.append(threading.Thread(target=self._stream_loop, args=(pub,), daemon=True,
                                                  name=f"stream-{self.name}"))
        for t in self._threads:
            t.start()
        log.info("serving %s %r: commands %s, stream %s", self.service.kind, self.name,
                 self.command_endpoint, self.stream_endpoint)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        try:
            self.service.safe_state()
        finally:
            self.service.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- command thread ---------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _command_loop(self, router: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poll_ms = max(1, min(10, self.command_timeout_ns // 10_000_000))
        grace_ms = max(1, min(10, self.command_timeout_ns // 20_000_000))
        try:
            while not self._stop.is_set():
                if poller.poll(poll_ms):
                    self._serve_one(router)
                if self._owner_silent():
                    # Silence is judged on what has ARRIVED: a thread that was starved of CPU (or
                    # busy in a slow driver call) wakes up late with the owner's heartbeats queued.
                    # Give the I/O thread a moment, answer everything readable, then decide.
                    poller.poll(grace_ms)
                    self._drain(router)
                    self._check_watchdog()
        finally:
            router.close(linger=0)

    def _serve_one(self, router: zmq.Socket, flags: int = 0) -> None:
        frames = router.recv_multipart(flags, copy=False)
        reply = self._handle_frames(frames[1:], frames[0].bytes)
        reply.seq = self._next_seq()
        router.send_multipart([frames[0], *encode(reply)], copy=False)

    def _drain(self, router: zmq.Socket, limit: int = 1000) -> None:
        """Answer every message already readable (non-blocking; at most ``limit``, so a flood
        cannot hold the watchdog off)."""
        for _ in range(limit):
            try:
                self._serve_one(router, zmq.NOBLOCK)
            except zmq.Again:
                return

    def _handle_frames(self, frames, peer: bytes = b"") -> Message:
        """One request -> its reply. ``peer``: the sender's ROUTER routing id (its identity when
        the header carries no ``client`` field)."""
        req_id = None
        try:
            try:
                msg = decode(frames)
            except ProtocolError:
                req_id = peek_req_id(frames[0]) if frames else None  # so the client can match the refusal
                raise
            req_id = msg.get("req_id")
            if msg.type not in COMMAND_TYPES:
                raise ProtocolError("unknown_type", f"{msg.type!r} is not a command; send one of "
                                    f"{sorted(COMMAND_TYPES)}", "type")
            if req_id is None:
                raise ProtocolError("bad_field", "a command needs a req_id (a string or an integer), got nil", "req_id")
            if msg.device and msg.device != self.name:
                raise ProtocolError("unknown_device", f"this endpoint serves {self.name!r}, not {msg.device[:60]!r}",
                                    "device")
            now = time.monotonic_ns()
            deadline = msg.get("deadline_ns")  # an int (wire-checked); absent only on heartbeats
            if deadline is not None and now > deadline:
                raise CommandRefused("deadline_exceeded", f"command arrived {(now - deadline) / 1e6:.1f} ms "
                                     "after its deadline; not applied", "deadline_ns")
            client = msg.get("client")
            sender = f"client:{client}" if client is not None else f"peer:{peer.hex()}"
            is_owner = self.owner is not None and sender == self.owner
            self.stats["commands"] += 1
            meta: dict = {"req_id": req_id}
            arrays: dict = {}
            mtype = msg.type
            if mtype == "heartbeat":
                meta.update(active=self.active, tripped=self.tripped, owner=is_owner)
                reply = Message("heartbeat", self.name, meta=meta)
            elif mtype == "ping":
                arrays = dict(msg.arrays)
                meta["echo_t_mono_ns"] = msg.t_mono_ns
                reply = Message("reply", self.name, arrays, meta)
            elif mtype == "describe":
                meta["description"] = {**self.service.describe(), "command_timeout_ms": self.command_timeout_ns / 1e6,
                                       "stream_endpoint": self.stream_endpoint}
                reply = Message("reply", self.name, arrays, meta)
            elif mtype == "stop":  # the software e-stop: obeyed from anyone
                self.service.safe_state()
                self.active, self.tripped, self.owner = False, True, None
                reply = Message("reply", self.name, arrays, meta)
            else:
                if mtype not in self.service.accepts | SERVER_TYPES:
                    raise CommandRefused("unsupported", f"{self.service.kind} {self.name!r} does not accept {mtype!r} "
                                         f"commands; it accepts {', '.join(sorted(self.service.accepts | SERVER_TYPES))}",
                                         "type")
                motion = mtype in self.service.motion_types
                if motion and self.tripped:
                    raise CommandRefused("safe_state", f"{self.name!r} is in its safe state (watchdog or stop); "
                                         "send reset to re-arm it before moving", "type")
                if (motion or mtype in ("reset", "release")) and self.owner is not None and not is_owner:
                    raise CommandRefused("not_owner", f"{self.name!r} is being commanded by another client; "
                                         f"{mtype!r} is refused until that client sends release or stop, or its "
                                         "watchdog trips (stop is obeyed from anyone)", "client")
                if mtype == "release":
                    if is_owner:
                        self.service.safe_state()
                        self.active, self.owner = False, None
                    meta["released"] = is_owner
                else:
                    arrays, extra = self.service.handle(msg)
                    meta.update(extra)
                    if motion:
                        self.active, self.owner, is_owner = True, sender, True
                    elif mtype == "reset":
                        self.active, self.tripped, self.owner = False, False, None
                reply = Message("reply", self.name, arrays, meta)
            if is_owner:  # only the owner's accepted messages feed the watchdog
                self.last_contact_ns = now
            return reply
        except (ProtocolError, CommandRefused) as e:
            self.stats["errors"] += 1
            log.debug("%s: refused %s (%s): %s", self.name, e.code, e.field, e.message)
            return error_message(self.name, req_id, e.code, e.message, e.field)
        except Exception as e:  # a driver failure: report it to the client, keep serving
            self.stats["errors"] += 1
            log.exception("%s: command failed", self.name)
            return error_message(self.name, req_id, "device_error", f"{type(e).__name__}: {e}")

    def _owner_silent(self) -> bool:
        return self.active and time.monotonic_ns() - self.last_contact_ns > self.command_timeout_ns

    def _check_watchdog(self) -> None:
        if self._owner_silent():
            log.warning("%s: no command or heartbeat from its owner for %.0f ms: safe state", self.name,
                        self.command_timeout_ns / 1e6)
            try:
                self.service.safe_state()
            finally:
                self.active, self.tripped, self.owner = False, True, None
                self.stats["watchdog_trips"] += 1
                self.last_trip_ns = time.monotonic_ns()

    # -- stream thread ----------------------------------------------------------------------
    def _stream_loop(self, pub: zmq.Socket) -> None:
        seq = 0
        stream = self.service.stream(self._stop)
        try:
            for msg in stream:
                seq += 1
                msg.seq = seq
                if msg.type == "state":
                    msg.meta["tripped"] = self.tripped
                pub.send_multipart(encode(msg), copy=False)
                self.stats["published"] += 1
        except BaseException as e:  # surfaced through .stream_error and the log
            self.stream_error = e
            log.exception("%s: stream stopped", self.name)
        finally:
            if hasattr(stream, "close"):
                stream.close()  # run the generator's cleanup in this thread (GL contexts live here)
            pub.close(linger=0)
