"""The thin robot client of a policy server (``vla serve``): observations out, action chunks in.
numpy, pyzmq and msgpack only (no torch): it runs on a Raspberry Pi next to the robot.

One control tick every ``1 / hz`` seconds on an absolute schedule (tick k is due at
``t0 + k / hz``), as the edge runner does (``deploy.runtime.edge``)::

    until tick k is due   read chunk replies as they arrive; a chunk asked for tick s is blended
                          in (row i meant for tick s + i; rows for ticks already gone are skipped);
                          watch every call's deadline
    send the blended row  (ee_delta); no row for this tick (the queue ran dry): the arm holds, the
                          tick is counted as ``starved``
    queue short?          (``refill`` rows or fewer left after this tick, nothing in flight) observe
                          (arm state newer than the command just sent) and send a ``policy_request``
                          for tick k + 1 -- asynchronously: the arm keeps executing the queue while
                          the server computes

Blending (``ChunkBlender``: ``none | ensemble | crossfade``) decides what runs where an old and a
new chunk overlap; see ``deploy.runtime.blend``.

**Deadlines.** Every call to the server carries one (``deadline_s``): a chunk that comes later is a
miss and is thrown away when it comes. While no request is in flight the client pings the server
every ``deadline_s / 4``, so a dead server is noticed even while the queue is long. A miss with an
empty queue, or ``max_misses`` misses in a row, means the server is gone: the arm is sent ``stop``
(its safe state: it holds and refuses motion until a reset; the same ``safe_stop`` as the edge
runner) and ``ServerGone`` is raised. With ``max_misses = 1`` the arm is safe at most about
``1.25 * deadline_s`` (plus one ``stop`` round trip) after the server dies: a pending call expires
within one deadline, and a silent stretch lasts at most a quarter deadline before a ping goes out.
(Each further allowed miss adds up to one deadline.)
A server's ``error`` reply (a refused observation) raises ``PolicyRefused`` -- also after ``stop``.
Any other exception in the loop (the bridge, Ctrl-C) stops the arm too, then propagates.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import time
from typing import Any, Callable

import numpy as np
import zmq

from deploy.runtime.blend import BLEND_MODES, ChunkBlender, boundary_jumps
from deploy.runtime.edge import EdgeStats, check_chunk, safe_stop
from robot_io.gripper import gripper_mode, snap_opening
from robot_io.security import CurveKeys, SecurityError, is_local_endpoint, secure_client_socket
from robot_io.wire import Message, ProtocolError, decode, encode

log = logging.getLogger(__name__)


class ServerGone(RuntimeError):
    """The policy server did not answer within the deadline (dead, unreachable, or keys refused)."""


class PolicyRefused(RuntimeError):
    """The policy server answered a call with an error reply; ``code`` and ``field`` say why."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"policy server refused: [{code}] {message}" + (f" (field {field!r})" if field else ""))
        self.code, self.field, self.message = code, field, message


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    hz: float = 10.0
    """Control rate (ticks per second); one blended row is sent per tick."""
    seconds: float = 30.0
    """How long to run (0: until Ctrl-C)."""
    blend: str = "crossfade"
    """How overlapping chunks are blended: none | ensemble | crossfade (deploy.runtime.blend)."""
    ensemble_m: float = 0.01
    """``ensemble``: weights exp(-m * i), i = 0 the oldest chunk (ACT's m)."""
    gripper: str = "raw"
    """The executed gripper opening (``robot_io.gripper``): ``raw`` as blended, ``binary`` the blended row's
    opening snapped to 0 / 1 at 0.5 (after the blend, as ``vla eval --gripper binary`` after its ensemble)."""
    refill: int | None = None
    """Ask for the next chunk when this many rows or fewer are left (default: half the chunk)."""
    deadline_s: float = 0.5
    """Deadline of every call to the server (seconds): a later reply is a miss."""
    max_misses: int = 1
    """Missed deadlines in a row that mean the server is gone (a miss with an empty queue always does)."""
    first_deadline_s: float = 30.0
    """Deadline of the first chunk, asked before the clock starts (a server's first call warms it up)."""
    window: int = 100_000
    """Latest per-tick samples kept for percentiles and the blending report (counters cover the run)."""

    def __post_init__(self) -> None:
        if not self.hz > 0:
            raise ValueError(f"hz must be positive, got {self.hz}")
        if self.seconds < 0:
            raise ValueError(f"seconds must be >= 0 (0: until Ctrl-C), got {self.seconds}")
        if self.blend not in BLEND_MODES:
            raise ValueError(f"blend must be one of {', '.join(BLEND_MODES)}, got {self.blend!r}")
        gripper_mode(self.gripper, "gripper")
        if not self.deadline_s > 0:
            raise ValueError(f"deadline_s must be positive, got {self.deadline_s}")
        if not self.first_deadline_s > 0:
            raise ValueError(f"first_deadline_s must be positive, got {self.first_deadline_s}")
        if self.max_misses < 1:
            raise ValueError(f"max_misses must be >= 1, got {self.max_misses}")
        if self.refill is not None and self.refill < 0:
            raise ValueError(f"refill must be >= 0 rows, got {self.refill}")


_req_ids = itertools.count(1)


class PolicyLink:
    """A DEALER socket to a policy server. Blocking ``call`` (describe, ping, the first chunk) and
    asynchronous ``send`` + ``poll`` share it; replies are matched by request id, a reply to a call
    the client gave up on is dropped (counted in ``late``).

    Off loopback the link refuses to connect without CurveZMQ keys (``keys``: ``client_secret`` and
    ``server_public``, e.g. the bridge's site keys) unless ``insecure`` is passed explicitly."""

    def __init__(self, endpoint: str, keys: CurveKeys | None = None, insecure: bool = False,
                 context: zmq.Context | None = None) -> None:
        has_keys = keys is not None and keys.client_secret is not None
        if not has_keys and not is_local_endpoint(endpoint) and not insecure:
            raise SecurityError(f"refusing to talk to the policy server at {endpoint} without CurveZMQ keys: "
                                "observations and actions would cross the network unauthenticated. Pass --keys DIR "
                                "(`vla bridge keys --out DIR`; the server runs with the same DIR) or a site file with "
                                "a security section, or --insecure if you really mean it.")
        self.endpoint, self.keys = endpoint, keys if has_keys else None
        self.ctx = context or zmq.Context.instance()
        self.client_id = os.urandom(8).hex()
        self._sock = self.ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 8)  # a dead server does not pile up our observations
        secure_client_socket(self._sock, self.keys)
        self._sock.connect(endpoint)
        self._seq = 0
        self.pending: dict[str, dict[str, Any]] = {}  # req_id -> {type, sent, deadline, tick}
        self.late = 0  # replies that came after their deadline (dropped)
        self.last_contact = time.monotonic()

    # -- sending --------------------------------------------------------------------------------
    def send(self, mtype: str, deadline_s: float, arrays: dict[str, np.ndarray] | None = None, **meta: Any) -> str:
        """Send one call without waiting; returns its request id (see ``poll``)."""
        req_id = f"{os.getpid()}-p{next(_req_ids)}"
        now_ns = time.monotonic_ns()
        self._seq += 1
        msg = Message(mtype, "policy", arrays or {}, {"req_id": req_id, "deadline_ns": now_ns + int(deadline_s * 1e9),
                                                      "client": self.client_id, **meta}, seq=self._seq, t_mono_ns=now_ns)
        try:
            self._sock.send_multipart(encode(msg), zmq.NOBLOCK, copy=False)
        except zmq.Again:  # the send queue is full: the server is not reading; the deadline will say so
            log.debug("policy link: send queue full, %s not sent", mtype)
        now = time.monotonic()
        self.pending[req_id] = {"type": mtype, "sent": now, "deadline": now + deadline_s, "timeout": deadline_s,
                                "tick": meta.get("tick")}
        return req_id

    def request_chunk(self, obs: dict, tick: int, deadline_s: float, cameras: list[str] | None = None) -> str:
        """Send ``policy_request`` for the observation of ``tick`` (only ``cameras``, if given)."""
        arrays = {"state": np.asarray(obs["state"], np.float32)}
        for cam, img in obs["images"].items():
            if cameras is None or cam in cameras:
                arrays[f"image_{cam}"] = np.asarray(img)
        return self.send("policy_request", deadline_s, arrays, tick=int(tick), instruction=str(obs["instruction"]))

    # -- receiving ------------------------------------------------------------------------------
    def poll(self, timeout_s: float) -> list[tuple[Message, dict[str, Any]]]:
        """Wait up to ``timeout_s`` for replies; returns ``(reply, its pending entry)`` for each reply
        to a call still pending (an error reply included: the caller raises it)."""
        out = []
        if not self._sock.poll(max(0, int(timeout_s * 1000))):
            return out
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return out
            try:
                reply = decode(frames)
            except ProtocolError as e:  # a server that answers garbage is not a server we can trust
                raise PolicyRefused("bad_reply", f"undecodable reply from {self.endpoint}: {e}") from None
            self.last_contact = time.monotonic()
            entry = self.pending.pop(reply.get("req_id"), None)
            if entry is None:
                self.late += 1
                log.debug("policy link: dropping a late reply (%s)", reply.get("req_id"))
                continue
            out.append((reply, entry))

    def expired(self, now: float | None = None) -> list[dict[str, Any]]:
        """Pending calls whose deadline passed (removed from ``pending``: a reply to them is late)."""
        now = time.monotonic() if now is None else now
        gone = [r for r, e in self.pending.items() if e["deadline"] <= now]
        return [self.pending.pop(r) for r in gone]

    def next_deadline(self) -> float | None:
        return min((e["deadline"] for e in self.pending.values()), default=None)

    def call(self, mtype: str, timeout_s: float, arrays: dict[str, np.ndarray] | None = None, **meta: Any) -> Message:
        """Blocking call: the reply, or ``ServerGone`` after ``timeout_s``, or ``PolicyRefused``."""
        req_id = self.send(mtype, timeout_s, arrays, **meta)
        while True:
            left = self.pending[req_id]["deadline"] - time.monotonic()
            if left <= 0:
                self.pending.pop(req_id, None)
                raise ServerGone(f"the policy server at {self.endpoint} did not answer {mtype!r} within "
                                 f"{timeout_s:.3f} s (not running, unreachable, or CurveZMQ keys refused)")
            for reply, entry in self.poll(left):
                if reply.type == "error":
                    raise PolicyRefused(reply["code"], reply["message"], reply.get("field"))
                if reply.get("req_id") == req_id:
                    return reply

    def describe(self, timeout_s: float) -> dict:
        """The server's description: policy name, cameras, state_dim, horizon, action_dim, ..."""
        return dict(self.call("describe", timeout_s)["description"])

    def close(self) -> None:
        self._sock.close(linger=0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ClientStats(EdgeStats):
    """The edge runner's counters (rate, deadline misses of ticks, latency) plus the server's side:
    requests, missed call deadlines, late replies, starved ticks, request round trip and the
    server's inference time, and the executed rows with the chunks behind each (for the blending
    report)."""

    def __init__(self, hz: float, window: int = 100_000) -> None:
        super().__init__(hz, window)
        self.requests = self.replies = self.call_misses = self.pings = self.starved = 0
        self.request_s: collections.deque[float] = collections.deque(maxlen=window)
        self.server_infer_s: collections.deque[float] = collections.deque(maxlen=window)
        self.overlap: collections.deque[int] = collections.deque(maxlen=window)
        self.rows: collections.deque[np.ndarray | None] = collections.deque(maxlen=window)
        self.sources: collections.deque[tuple[int, ...]] = collections.deque(maxlen=window)

    def summary(self) -> dict[str, Any]:
        def pct(xs, q):
            return float(np.percentile(np.asarray(xs) * 1e3, q)) if xs else None

        s = super().summary()
        rows = np.stack([r if r is not None else np.full(7, np.nan, np.float32) for r in self.rows]) if self.rows \
            else np.zeros((0, 7), np.float32)
        s.update({
            "requests": self.requests, "replies": self.replies, "call_deadline_misses": self.call_misses,
            "pings": self.pings, "starved_ticks": self.starved,
            "request_ms": {"p50": pct(self.request_s, 50), "p99": pct(self.request_s, 99),
                           "max": pct(self.request_s, 100)},
            "server_inference_ms": {"p50": pct(self.server_infer_s, 50), "p99": pct(self.server_infer_s, 99)},
            "overlap_rows": {"mean": float(np.mean(self.overlap)) if self.overlap else None,
                             "min": int(min(self.overlap)) if self.overlap else None},
            # change between consecutive commands, at chunk boundaries vs within chunks: the whole
            # action, and the arm's motion alone (dpos, drot: the gripper's open / close is a step by design)
            "jump": boundary_jumps(rows, list(self.sources)),
            "jump_arm": boundary_jumps(rows, list(self.sources), slice(0, 6)),
        })
        return s


def run_client(robot, link: PolicyLink, instruction: str, cfg: ClientConfig = ClientConfig(),
               horizon: int | None = None, cameras: list[str] | None = None,
               stop_flag: Callable[[], bool] | None = None,
               on_tick: Callable[[int, np.ndarray | None, tuple[int, ...]], None] | None = None) -> dict[str, Any]:
    """Drive ``robot`` (a ``robot_io.RobotClient``: ``observe``, ``ee_delta``, ``stop``) with the
    chunks of the policy server behind ``link`` at ``cfg.hz`` for ``cfg.seconds``; returns the
    stats summary. ``horizon``: the server's chunk length (for the default ``refill``; default: the
    first chunk's); ``cameras``: the cameras the policy reads (default: every camera observed);
    ``on_tick(k, row, chunk ids)`` after each executed tick (row None: starved).
    Raises ``ServerGone`` / ``PolicyRefused`` / anything else only after sending the arm ``stop``."""
    stats = ClientStats(cfg.hz, cfg.window)
    blender = ChunkBlender(cfg.blend, cfg.ensemble_m)
    period = stats.period
    ping_every = cfg.deadline_s / 4
    misses = 0  # consecutive
    k = 0  # the tick being served (read by the reply handler)
    t_sent_ns = 0
    inflight: str | None = None  # the pending policy_request

    def handle(reply: Message, entry: dict[str, Any]) -> None:
        nonlocal misses, inflight
        misses = 0
        if reply.type == "error":
            raise PolicyRefused(reply["code"], reply["message"], reply.get("field"))
        if entry["type"] != "policy_request":
            return
        inflight = None
        if reply.type != "chunk":
            raise PolicyRefused("bad_reply", f"a policy_request was answered with {reply.type!r}, not 'chunk'", "type")
        chunk = check_chunk(reply.arrays.get("actions", np.zeros((0, 0), np.float32)), "the server's chunk")
        if reply["tick"] != entry["tick"]:
            raise PolicyRefused("bad_reply", f"chunk for tick {reply['tick']} answers the request of tick {entry['tick']}",
                                "tick")
        stats.replies += 1
        if entry["tick"] > 0:  # the first chunk (before the clock starts) includes the server's warm-up
            stats.request_s.append(time.monotonic() - entry["sent"])
        if reply.get("infer_ns") is not None:
            stats.server_infer_s.append(reply["infer_ns"] / 1e9)
        stats.overlap.append(blender.remaining(k))  # rows of the old plan left when the new one lands
        blender.add(chunk, start=entry["tick"], arrival=k)

    def serve_until(t_due: float) -> None:
        """Read replies and watch deadlines until ``t_due`` (perf_counter time)."""
        nonlocal misses, inflight
        while True:
            now = time.monotonic()
            for entry in link.expired(now):
                misses += 1
                stats.call_misses += 1
                if entry["type"] == "policy_request":
                    inflight = None
                left = blender.remaining(k)
                log.warning("policy server: no reply to %s within %.3f s (%d in a row, %d rows queued)",
                            entry["type"], entry["timeout"], misses, left)
                if left == 0 or misses >= cfg.max_misses:
                    raise ServerGone(f"the policy server at {link.endpoint} did not answer {entry['type']!r} within "
                                     f"its deadline of {entry['timeout']:.3f} s ({misses} miss(es) in a row, {left} "
                                     "row(s) queued): it is gone (not running, unreachable, or CurveZMQ keys refused)")
            if not link.pending and now - link.last_contact >= ping_every:
                link.send("ping", cfg.deadline_s)
                stats.pings += 1
            wait = t_due - time.perf_counter()
            nd = link.next_deadline()
            if nd is not None:
                wait = min(wait, nd - time.monotonic())
            if not link.pending:
                wait = min(wait, link.last_contact + ping_every - time.monotonic())
            if wait <= 0 and t_due <= time.perf_counter():
                for reply, entry in link.poll(0):
                    handle(reply, entry)
                return
            for reply, entry in link.poll(max(wait, 0.0)):
                handle(reply, entry)

    try:
        # the first chunk, before the clock starts (the server's first call may be slow: warm-up)
        obs = robot.observe(instruction)
        first = link.request_chunk(obs, 0, cfg.first_deadline_s, cameras)
        stats.requests += 1
        inflight = first
        while inflight is not None:
            serve_until(time.perf_counter() + cfg.deadline_s / 10)
        horizon = horizon or blender.remaining(0)
        refill = cfg.refill if cfg.refill is not None else horizon // 2
        t0 = time.perf_counter()
        n_ticks = round(cfg.seconds * cfg.hz) if cfg.seconds else float("inf")  # ticks due in the run
        while k < n_ticks and not (stop_flag is not None and stop_flag()):
            due = t0 + k * period
            serve_until(due)
            row, src = blender.action(k)
            if row is not None and cfg.gripper == "binary":
                row = snap_opening(row)
            if row is None:
                stats.starved += 1  # the queue ran dry: send nothing, the arm holds its last target
            else:
                t_sent_ns = time.monotonic_ns()
                reply = robot.ee_delta(row)
                stats.clipped += bool(reply.get("clipped"))
            stats.tick(due, time.perf_counter())
            if inflight is None and blender.remaining(k + 1) <= refill:
                # the state after this tick's command: the new plan starts at the next tick
                obs = robot.observe(instruction, newer_than_ns=t_sent_ns, cameras_newer_than_ns=0)
                inflight = link.request_chunk(obs, k + 1, cfg.deadline_s, cameras)
                stats.requests += 1
            stats.rows.append(row)
            stats.sources.append(src)
            if on_tick is not None:
                on_tick(k, row, src)
            k += 1
            behind = time.perf_counter() - (t0 + k * period)
            if behind > 0:  # overran the next tick: skip the ticks already missed, keep the phase
                skip = min(int(behind // period) + 1, n_ticks - k)
                stats.skipped += skip
                for _ in range(int(skip)):  # no command: the next one is compared with the last one sent
                    stats.rows.append(None)
                    stats.sources.append(())
                k += skip
    except BaseException as e:
        log.error("policy client: %s: %s -- putting the arm in its safe state", type(e).__name__, e)
        safe_stop(robot)
        raise
    safe_stop(robot)
    out = stats.summary()
    out.update(blend=cfg.blend, deadline_s=cfg.deadline_s, refill=refill, horizon=horizon, late_replies=link.late)
    return out
