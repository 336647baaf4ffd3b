"""The bridge's wire format: one msgpack header frame, then one raw frame per numpy array.

A message is a ZMQ multipart::

    frame 0: msgpack {v, type, device, seq, t_mono_ns, t_wall_ns,
                      arrays: [{name, dtype, shape}, ...], ...type-specific fields}
    frame 1..N: the raw bytes of each array, C order, in header order (sent zero-copy)

Never pickle. ``decode`` refuses anything malformed with a :class:`ProtocolError` whose
``code`` and ``field`` say exactly what was wrong; servers turn it into an error reply and
keep serving. Message types and their required header fields live in ``MESSAGE_TYPES``: the
one schema of the bridge, shared by servers, clients and the round-trip tests.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Mapping, Sequence

import msgpack
import numpy as np

PROTOCOL_VERSION = 1

# dtypes allowed on the wire (little-endian only, no objects)
WIRE_DTYPES = frozenset({"uint8", "int8", "uint16", "int16", "uint32", "int32", "int64", "uint64",
                         "float16", "float32", "float64", "bool"})

MAX_ARRAYS = 64
MAX_NDIM = 8


@dataclasses.dataclass(frozen=True)
class MessageType:
    name: str
    doc: str
    fields: tuple[str, ...] = ()  # header fields that must be present (besides the common ones)


# The one schema of the bridge. Command types go client -> server over DEALER/ROUTER and carry
# ``req_id`` and ``deadline_ns`` (a time.monotonic_ns() after which the server must not apply
# them); the server answers each with ``reply`` or ``error`` carrying the same ``req_id``.
_TYPES = [
    # streams (PUB/SUB)
    MessageType("state", "Device state sample (arm: q, dq, ee_pos, ee_quat, gripper, ...)."),
    MessageType("frame", "Camera frame: rgb [H,W,3] uint8, optional depth [H,W] float32.", ("index",)),
    MessageType("game_state", "Screen: one displayed frame of the game, stamped when it was shown: `rgb` [H,W,3] "
                "uint8 (ALE: 210 x 160), `index` frames shown since connect, `score` the episode's return so far, "
                "`reward` this frame's, `lives`, `episode_over` (stays true until a reset), `episode`, the `keys` "
                "held and the `action` they made, the `game`.", ("index", "score", "lives", "episode_over")),
    # commands (DEALER -> ROUTER)
    MessageType("ee_delta", "Arm: move the end effector by `action` [7] = dpos(3) m, drot(3) rad "
                "axis-angle, gripper opening (1) in [0,1].", ("req_id", "deadline_ns")),
    MessageType("joint_position", "Arm: go to joint positions `q` [J] rad, optional `gripper` [1].",
                ("req_id", "deadline_ns")),
    MessageType("reset", "Bring the device to its start state and re-arm it after a safe stop "
                "(a simulator re-randomises from `seed`; an arm simulator lays out `task`; a screen restarts its "
                "game from `seed`, switching to the game or test pattern `task` names).", ("req_id", "deadline_ns")),
    MessageType("stop", "Put the device in its safe state now (software e-stop).", ("req_id", "deadline_ns")),
    MessageType("capture", "Camera: capture a frame now and return it in the reply (a screen: the frame shown now "
                "and the game's state, as in `game_state`).", ("req_id", "deadline_ns")),
    MessageType("key_press", "Keyboard: press and hold `keys` (a list of 1..max_keys key names the device "
                "describes) until released.", ("req_id", "deadline_ns", "keys")),
    MessageType("key_release", "Keyboard: release `keys`.", ("req_id", "deadline_ns", "keys")),
    MessageType("key_tap", "Keyboard: press `keys` and release them `hold_ms` later (timed by the microcontroller).",
                ("req_id", "deadline_ns", "keys", "hold_ms")),
    MessageType("key_release_all", "Keyboard: release every key.", ("req_id", "deadline_ns")),
    MessageType("legged_joints", "Legged: track joint targets `q` [12] rad with PD gains `kp` [12] (N m/rad) and "
                "`kd` [12] (N m s/rad), all float32, Unitree order FR, FL, RR, RL x (hip, thigh, calf).",
                ("req_id", "deadline_ns")),
    MessageType("body_velocity", "Legged: walk at `velocity` [3] float32 = (vx m/s forward, vy m/s left, yaw rate "
                "rad/s) in the trunk frame, with the robot's gait controller.", ("req_id", "deadline_ns")),
    MessageType("stand", "Legged: stand up (the deterministic recovery controller) and hold the stand posture.",
                ("req_id", "deadline_ns")),
    MessageType("sit", "Legged: lower into the sit posture and hold it.", ("req_id", "deadline_ns")),
    MessageType("damp", "Legged: damping mode (no position control; the joints resist motion).",
                ("req_id", "deadline_ns")),
    MessageType("describe", "Return the device description, limits and stream layout.", ("req_id", "deadline_ns")),
    MessageType("ping", "Round-trip check; the reply echoes the request.", ("req_id", "deadline_ns")),
    MessageType("heartbeat", "Keep-alive: feeds the device watchdog when it comes from the device's owner "
                "(the reply says `active`, `tripped` and whether the sender is the `owner`).", ("req_id",)),
    MessageType("release", "Owner: hand the device back now: it goes to its safe state without latching "
                "(the next commanding client may take it without a reset).", ("req_id", "deadline_ns")),
    # the policy server (deploy.server <- deploy.runtime.client): same framing, same ROUTER rules
    MessageType("policy_request", "Policy server: one observation -> an action chunk. Arrays `state` float32 [S] "
                "and `image_<camera>` uint8 [H,W,3] per camera the policy reads; `instruction` the prompt, "
                "`tick` the client's control tick the observation was taken at (echoed in the chunk). "
                "`deadline_ns` is on the client's clock: the client discards a late chunk, the server (another "
                "machine's clock) does not compare it.", ("req_id", "deadline_ns", "tick", "instruction")),
    MessageType("chunk", "Policy server's reply: `actions` float32 [H, A], row i meant for tick `tick` + i; "
                "`infer_ns` the model's time, `server_ns` receipt to reply.", ("req_id", "tick")),
    # replies (ROUTER -> DEALER)
    MessageType("reply", "Success: the command actually applied (after clipping) and `clipped` "
                "(names of clipped fields).", ("req_id",)),
    MessageType("error", "Refusal: `code`, `field`, `message`; the device did not move.",
                ("req_id", "code", "message")),
]
MESSAGE_TYPES: dict[str, MessageType] = {t.name: t for t in _TYPES}
COMMAND_TYPES = frozenset(n for n, t in MESSAGE_TYPES.items() if "deadline_ns" in t.fields) | {"heartbeat"}
STREAM_TYPES = frozenset({"state", "frame", "game_state"})
_COMMON = ("v", "type", "device", "seq", "t_mono_ns", "t_wall_ns", "arrays")
_NONE = type(None)
# Exact types of the common header fields. Exact: msgpack gives bool for true/false and Python's
# bool is a subclass of int, so ``isinstance(True, int)`` would let ``v: true`` pass as version 1.
_COMMON_TYPES: dict[str, tuple[type, ...]] = {"v": (int,), "type": (str,), "device": (str,), "seq": (int,),
                                              "t_mono_ns": (int,), "t_wall_ns": (int,), "arrays": (list,)}
HEADER_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "req_id": (str, int, _NONE),  # DeviceClient sends "<pid>-<n>"; nil only in an error reply to an unreadable request
    "deadline_ns": (int,),  # a time.monotonic_ns(); nil is refused (it would skip the deadline)
    "client": (str,),  # the sender's client id (DeviceClient: random hex); see robot_io.server ownership
    "index": (int,),
    "code": (str,),
    "message": (str,),
    "field": (str, _NONE),
    "seed": (int, _NONE),  # reset: nil = the simulator continues its generator
    "task": (str, _NONE),
    "pose": (str, _NONE),  # legged reset: "stand" (default) or "sit" (a simulator starts there)
    "tick": (int,),  # policy_request / chunk: the client's control tick
    "instruction": (str,),  # policy_request: the prompt
    "infer_ns": (int,),  # chunk: the model's time
    "server_ns": (int,),  # chunk: receipt to reply at the server
    "keys": (list,),  # key_press / key_release / key_tap: key names (each checked by the keyboard service)
    "hold_ms": (int,),  # key_tap: how long the keys stay down
    "score": (int,),  # game_state: the episode's return so far
    "reward": (int,),  # game_state: this frame's reward
    "lives": (int,),  # game_state
    "episode_over": (bool,),  # game_state
    "episode": (int,),  # game_state: episodes started since the screen connected
    "game": (str,),  # game_state: the game (or test pattern) shown
}
"""Exact types of the bridge's type-specific header fields, checked by ``decode`` wherever the field
appears (an int field refuses true/false and 1.0; nil only where listed)."""
MAX_ID_CHARS = 128  # longest req_id / client string accepted (they are echoed back)


# ``np.dtype.name`` is computed in Python by numpy on every access (a few microseconds, several
# times per message); the names of the few dtypes allowed on the wire are cached here.
_DTYPE_NAMES: dict[np.dtype, str] = {}


def _dtype_name(dt: np.dtype) -> str:
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = dt.name
        if name in WIRE_DTYPES:  # bounded: only wire dtypes (each in its byte orders) are cached
            _DTYPE_NAMES[dt] = name
    return name


class ProtocolError(ValueError):
    """A message was refused. ``code`` is a stable identifier, ``field`` names the culprit."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"[{code}] {message}")
        self.code, self.field, self.message = code, field, message


@dataclasses.dataclass
class Message:
    type: str
    device: str = ""
    arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    seq: int = 0
    t_mono_ns: int = 0
    t_wall_ns: int = 0
    v: int = PROTOCOL_VERSION

    def __getitem__(self, key: str) -> Any:
        return self.meta[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(key, default)


def encode(msg: Message) -> list:
    """Message -> list of frames (header bytes, then array buffers, zero-copy where contiguous)."""
    specs, frames = [], []
    for name, arr in msg.arrays.items():
        a = np.asarray(arr)
        dtype_name = _dtype_name(a.dtype)
        if dtype_name not in WIRE_DTYPES:
            raise ProtocolError("bad_dtype", f"array {name!r} has dtype {a.dtype} which cannot go on the wire", name)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        specs.append({"name": name, "dtype": dtype_name, "shape": list(a.shape)})
        frames.append(memoryview(a.reshape(-1).view(np.uint8)) if a.size else b"")
    header = {
        "v": msg.v,
        "type": msg.type,
        "device": msg.device,
        "seq": msg.seq,
        "t_mono_ns": msg.t_mono_ns or time.monotonic_ns(),
        "t_wall_ns": msg.t_wall_ns or time.time_ns(),
        "arrays": specs,
    }
    for k, val in msg.meta.items():
        if k in header:
            raise ProtocolError("bad_header", f"meta field {k!r} collides with a header field", k)
        header[k] = val
    return [msgpack.packb(header, use_bin_type=True), *frames]


def _buf(frame) -> memoryview:
    # zmq.Frame (copy=False) exposes .buffer; bytes / memoryview pass through
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


class _DuplicateKey(ValueError):
    pass


def _unique_map(pairs: list) -> dict:
    """msgpack ``object_pairs_hook``: a map that names a key twice is refused (with a plain dict
    the last one would silently win, e.g. ``deadline_ns: 1, deadline_ns: nil``)."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _DuplicateKey(dup)
    return d


def _type_names(allowed: tuple[type, ...]) -> str:
    return " or ".join("nil" if t is _NONE else {"str": "string", "int": "integer", "list": "list"}.get(
        t.__name__, t.__name__) for t in allowed)


def _check_type(header: dict, k: str, allowed: tuple[type, ...], mtype: str = "") -> None:
    val = header[k]
    if type(val) not in allowed:  # exact: a bool is not an int here
        raise ProtocolError("bad_field", f"{mtype + ' ' if mtype else ''}header field {k!r} must be "
                            f"{_type_names(allowed)}, got {type(val).__name__} {val!r:.60}", k)


def decode(frames: Sequence, types: Mapping[str, MessageType] | None = None,
           version: int = PROTOCOL_VERSION, field_types: Mapping[str, tuple[type, ...]] | None = None) -> Message:
    """Frames -> Message, or ProtocolError naming the problem (``field``: the header field or array
    at fault; ``"header"`` when frame 0 is not a msgpack map). Array frames are read zero-copy
    (read-only views of the received buffers).

    ``types`` / ``version``: the schema and version to check against (default: the bridge's
    ``MESSAGE_TYPES`` and ``PROTOCOL_VERSION``). Other links that use this framing, such as the
    RL actor-learner link (``session.protocol``), pass their own. ``field_types``: exact types of
    type-specific header fields, checked where present (default: the bridge's
    ``HEADER_FIELD_TYPES`` with the bridge's schema, none with another schema)."""
    if types is None:
        types = MESSAGE_TYPES
        field_types = HEADER_FIELD_TYPES if field_types is None else field_types
    if not frames:
        raise ProtocolError("truncated", "empty multipart message", "header")
    try:
        header = msgpack.unpackb(_buf(frames[0]), raw=False, strict_map_key=True, object_pairs_hook=_unique_map)
    except _DuplicateKey as e:
        raise ProtocolError("duplicate_field", f"header names field {e.args[0]!r} more than once",
                            e.args[0] if isinstance(e.args[0], str) else "header") from None
    except Exception as e:  # msgpack raises several exception types for garbage
        raise ProtocolError("bad_header", f"frame 0 is not a msgpack header ({type(e).__name__}: {e})",
                            "header") from None
    if not isinstance(header, dict):
        raise ProtocolError("bad_header", f"header must be a map, got {type(header).__name__}", "header")
    v = header.get("v")
    if type(v) is not int or v != version:
        raise ProtocolError("bad_version", f"unsupported protocol version {v!r:.40} (this end speaks "
                            f"v{version} as an integer)", "v")
    for k in _COMMON:
        if k not in header:
            raise ProtocolError("bad_header", f"header is missing field {k!r}", k)
    mtype = header["type"]
    spec = types.get(mtype) if type(mtype) is str else None
    if spec is None:
        raise ProtocolError("unknown_type", f"unknown message type {mtype!r:.60}; known: "
                            f"{', '.join(sorted(types))}", "type")
    for k in spec.fields:
        if k not in header:
            raise ProtocolError("bad_header", f"{mtype!r} message is missing field {k!r}", k)
    for k, allowed in _COMMON_TYPES.items():
        _check_type(header, k, allowed)
    if field_types:
        for k, allowed in field_types.items():
            if k in header:
                _check_type(header, k, allowed, mtype)
                if type(header[k]) is str and k in ("req_id", "client") and not 0 < len(header[k]) <= MAX_ID_CHARS:
                    raise ProtocolError("bad_field", f"header field {k!r} must be 1..{MAX_ID_CHARS} characters, "
                                        f"got {len(header[k])}", k)
    specs = header["arrays"]
    if len(specs) > MAX_ARRAYS:
        raise ProtocolError("bad_header", "header field 'arrays' must be a list of at most "
                            f"{MAX_ARRAYS} array specs", "arrays")
    if len(frames) != 1 + len(specs):
        raise ProtocolError("truncated", f"header announces {len(specs)} array frame(s) but "
                            f"{len(frames) - 1} arrived", "arrays")
    arrays = {}
    for i, s in enumerate(specs):
        if not (type(s) is dict and type(s.get("name")) is str and s["name"]):
            raise ProtocolError("bad_header", f"array spec {i} must be a map with a non-empty string 'name'",
                                "arrays")
        name, dtype, shape = s["name"], s.get("dtype"), s.get("shape")
        if name in arrays:  # the last one would win: a NaN action followed by a valid one would pass
            raise ProtocolError("duplicate_array", f"array {name!r} appears more than once", name)
        if type(dtype) is not str or dtype not in WIRE_DTYPES:
            raise ProtocolError("bad_dtype", f"array {name!r} has unsupported dtype {dtype!r:.40}", name)
        if (type(shape) is not list or len(shape) > MAX_NDIM
                or not all(type(d) is int and d >= 0 for d in shape)):
            raise ProtocolError("bad_shape", f"array {name!r} has an invalid shape {shape!r:.60}", name)
        dt = np.dtype(dtype)
        buf = _buf(frames[1 + i])
        expected = dt.itemsize * math.prod(shape)  # exact (shape holds validated non-negative ints)
        if buf.nbytes != expected:
            raise ProtocolError("truncated", f"array {name!r} {dtype}{shape} needs {expected} bytes, "
                                f"frame has {buf.nbytes}", name)
        arrays[name] = np.frombuffer(buf, dtype=dt).reshape(shape) if expected else np.zeros(shape, dt)
    meta = {k: val for k, val in header.items() if k not in _COMMON}
    return Message(type=mtype, device=header["device"], arrays=arrays, meta=meta, seq=header["seq"],
                   t_mono_ns=header["t_mono_ns"], t_wall_ns=header["t_wall_ns"], v=v)


def check_array(msg: Message, name: str, dtype: str, shape: tuple[int, ...], finite: bool = True,
                required: bool = True) -> np.ndarray | None:
    """Validate one array of a command; raise ProtocolError naming it when it is wrong."""
    if name not in msg.arrays:
        if required:
            raise ProtocolError("missing_field", f"{msg.type!r} needs array {name!r} ({dtype}{list(shape)})", name)
        return None
    a = msg.arrays[name]
    if _dtype_name(a.dtype) != dtype:
        raise ProtocolError("bad_dtype", f"array {name!r} must be {dtype}, got {a.dtype.name}", name)
    if tuple(a.shape) != tuple(shape):
        raise ProtocolError("bad_shape", f"array {name!r} must have shape {list(shape)}, got {list(a.shape)}", name)
    if finite and a.dtype.kind == "f" and not np.isfinite(a).all():
        bad = np.flatnonzero(~np.isfinite(a)).tolist()
        raise ProtocolError("non_finite", f"array {name!r} has non-finite values at flat index {bad}", name)
    return a


def peek_req_id(frame) -> str | int | None:
    """The ``req_id`` of a header that ``decode`` refused, read leniently so the error reply can
    still carry it: frame 0 is read key by key as far as it is valid msgpack (a truncated or
    partly garbled map still yields the pairs before the damage). None unless exactly one
    well-typed ``req_id`` was found."""
    try:
        up = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=1 << 20)
        up.feed(_buf(frame))
        n = up.read_map_header()
    except Exception:  # not a map, or not msgpack at all
        return None
    found = []
    try:
        for _ in range(n):
            k, val = up.unpack(), up.unpack()
            if k == "req_id":
                found.append(val)
    except Exception:  # damaged from here on: keep what was read before
        pass
    ok = [r for r in found if (type(r) is str and 0 < len(r) <= MAX_ID_CHARS) or type(r) is int]
    return ok[0] if len(found) == 1 and ok else None


def error_message(device: str, req_id: Any, code: str, message: str, field: str | None = None) -> Message:
    return Message("error", device, meta={"req_id": req_id, "code": code, "message": message, "field": field})
