"""Bridge clients: commands (DEALER), stream readers (SUB) and the composed RobotClient.

* :class:`DeviceClient` sends one typed command and waits for its reply, with a request id and
  a deadline; an ``error`` reply raises :class:`CommandError` carrying the server's code and
  field. Optionally a heartbeat thread keeps the server's watchdog fed. Every request carries
  the client's id (header ``client``, random per DeviceClient and shared with its heartbeat
  thread): the server's ownership key, so the heartbeats of the client that moves a device are
  the ones that keep it active. ``close()`` hands an owned device back (``release``).
* :class:`StreamReader` subscribes to a device's stream on a background thread, in one of two
  modes: ``latest`` keeps only the newest message (for control loops), ``record`` keeps every
  message in order in a bounded queue and counts sequence gaps (for recorders).

  Why not ZMQ_CONFLATE for ``latest``: libzmq's CONFLATE does not support multipart messages,
  and our messages are multipart (header + raw array frames, zero copy). A reader thread with a
  small receive high-water mark that always keeps the newest decoded message gives the same
  latest-only behaviour without giving up zero-copy frames.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
import time
from typing import Any

import numpy as np
import zmq

from robot_io.security import CurveKeys, secure_client_socket
from robot_io.wire import Message, ProtocolError, decode, encode

log = logging.getLogger(__name__)


class BridgeError(RuntimeError):
    """Base class of client-side bridge errors."""


class CommandError(BridgeError):
    """The server refused a command. ``code`` and ``field`` say why (see robot_io.wire)."""

    def __init__(self, device: str, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{device}: [{code}] {message}")
        self.device, self.code, self.field, self.message = device, code, field, message


class BridgeTimeout(BridgeError, TimeoutError):
    """No reply in time: the server is down, unreachable, or refused our keys."""


_req_counter = itertools.count(1)


class DeviceClient:
    """Commands to one device. Not thread-safe by design except through its internal lock."""

    # replies to these never make this client a device's owner (see robot_io.server)
    _READ_ONLY = frozenset({"ping", "describe", "capture", "heartbeat"})

    def __init__(self, endpoint: str, device: str = "", timeout_s: float = 1.0, keys: CurveKeys | None = None,
                 heartbeat_hz: float | None = None, context: zmq.Context | None = None,
                 client_id: str | None = None) -> None:
        self.endpoint, self.device, self.timeout_s, self.keys = endpoint, device, float(timeout_s), keys
        self.client_id = client_id or os.urandom(8).hex()  # our identity at the server; the heartbeat shares it
        self._may_own = False  # a command other than a read was accepted since the last reset/stop/release
        self.ctx = context or zmq.Context.instance()
        self._lock = threading.Lock()
        self._sock = self._make_socket()
        self._seq = 0
        self._hb_stop = threading.Event()
        self._hb_thread = None
        if heartbeat_hz:
            self.start_heartbeat(heartbeat_hz)

    def _make_socket(self) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        secure_client_socket(s, self.keys)
        s.connect(self.endpoint)
        return s

    def request(self, mtype: str, arrays: dict[str, np.ndarray] | None = None, timeout_s: float | None = None,
                **meta: Any) -> Message:
        """Send a command, return the server's ``reply``; raise CommandError / BridgeTimeout."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        req_id = f"{os.getpid()}-{next(_req_counter)}"
        now = time.monotonic_ns()
        meta = {"req_id": req_id, "deadline_ns": now + int(timeout_s * 1e9), "client": self.client_id, **meta}
        if mtype == "heartbeat":
            meta.pop("deadline_ns")
        with self._lock:
            self._seq += 1
            # the deadline covers the send too: a socket with no live connection to a peer (the server refused our
            # CurveZMQ keys, or is not there yet) blocks in send, which once held a caller for good
            self._sock.setsockopt(zmq.SNDTIMEO, max(1, int(timeout_s * 1000)))
            try:
                self._sock.send_multipart(encode(Message(mtype, self.device, arrays or {}, meta, seq=self._seq,
                                                         t_mono_ns=now)), copy=False)
            except zmq.Again:
                self._sock.close(linger=0)
                self._sock = self._make_socket()
                raise BridgeTimeout(
                    f"{self.device or self.endpoint}: could not send {mtype!r} within {timeout_s:.3f} s to "
                    f"{self.endpoint}: no connection (server down, wrong endpoint, or CurveZMQ keys refused)") from None
            deadline = time.monotonic() + timeout_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self._sock.poll(int(left * 1000) + 1):
                    # Drop the socket: a late reply must not be mistaken for the next request's.
                    self._sock.close(linger=0)
                    self._sock = self._make_socket()
                    raise BridgeTimeout(
                        f"{self.device or self.endpoint}: no reply to {mtype!r} within {timeout_s:.3f} s from "
                        f"{self.endpoint} (server down, wrong endpoint, or CurveZMQ keys refused)")
                reply = decode(self._sock.recv_multipart(copy=False))
                if reply.get("req_id") != req_id:
                    log.debug("dropping stale reply %s", reply.get("req_id"))
                    continue
                break
        if reply.type == "error":
            raise CommandError(reply.device or self.device, reply["code"], reply["message"], reply.get("field"))
        if mtype not in self._READ_ONLY:
            self._may_own = mtype not in ("reset", "stop", "release")
        return reply

    # convenience wrappers ----------------------------------------------------------------
    def ping(self, timeout_s: float | None = None) -> float:
        """Round-trip time in seconds."""
        t0 = time.perf_counter()
        self.request("ping", timeout_s=timeout_s)
        return time.perf_counter() - t0

    def describe(self) -> dict:
        return self.request("describe")["description"]

    def release(self, timeout_s: float | None = None) -> bool:
        """Hand the device back: if this client owns it, it goes to its safe state (no latch) and
        the next commanding client may take it. Returns whether this client was the owner."""
        return bool(self.request("release", timeout_s=timeout_s).get("released"))

    # heartbeat -------------------------------------------------------------------------------
    def start_heartbeat(self, hz: float) -> None:
        if self._hb_thread is not None:
            return
        self._hb_stop.clear()
        self._hb_thread = threading.Thread(target=self._heartbeat_loop, args=(hz,), daemon=True,
                                           name=f"heartbeat-{self.device}")
        self._hb_thread.start()

    def _heartbeat_loop(self, hz: float) -> None:
        """Heartbeats on a fixed cadence, pipelined: the next one does not wait for the previous
        reply. Under CPU load a round trip takes several scheduler wake-ups in a row (each end's
        I/O thread, the server's command thread, this thread), and waiting for each reply
        stretched the gaps between heartbeats past the server's timeout (false watchdog trips).
        Replies are read as they come; a run of unanswered heartbeats is logged."""
        # its own socket (zmq sockets must not be shared between threads), with this client's id:
        # the server counts these heartbeats as the owner's
        sock = self._make_socket()
        sock.setsockopt(zmq.SNDHWM, 16)  # a server that is down does not pile up heartbeats here
        period = 1.0 / hz
        unanswered = 0  # heartbeats sent since the last reply
        seq = 0
        next_t = time.monotonic()
        try:
            while True:
                while sock.poll(0):
                    reply = decode(sock.recv_multipart(copy=False))
                    if reply.type == "error":
                        log.warning("%s: heartbeat refused: [%s] %s", self.device, reply.get("code"),
                                    reply.get("message"))
                    unanswered = 0
                per_s = max(1, round(hz))  # a second without an answer is news; then every 10 s
                if unanswered == per_s or (unanswered and unanswered % (10 * per_s) == 0):
                    log.warning("%s: %d heartbeat(s) unanswered", self.device, unanswered)
                seq += 1
                now = time.monotonic_ns()
                meta = {"req_id": f"{os.getpid()}-hb-{seq}", "client": self.client_id}
                try:
                    sock.send_multipart(encode(Message("heartbeat", self.device, {}, meta, seq=seq, t_mono_ns=now)),
                                        zmq.NOBLOCK)
                except zmq.Again:  # queue full: the server is not reading
                    pass
                unanswered += 1
                next_t += period
                wait = next_t - time.monotonic()
                if wait <= 0:  # late (a busy machine): carry on from now rather than send a burst
                    next_t, wait = time.monotonic(), 0.0
                if self._hb_stop.wait(wait):
                    break
        except ProtocolError as e:  # the server answered garbage: loudly, and stop pretending to be alive
            log.error("%s: undecodable heartbeat reply, heartbeats stopped: %s", self.device, e)
        finally:
            sock.close(linger=0)

    def stop_heartbeat(self) -> None:
        self._hb_stop.set()
        if self._hb_thread is not None and self._hb_thread is not threading.current_thread():
            self._hb_thread.join(timeout=2)
        self._hb_thread = None

    def close(self) -> None:
        """Stop the heartbeat, hand back a device this client may own (``release``, best effort:
        if the server does not answer, its watchdog puts the device in its safe state), close."""
        self.stop_heartbeat()
        if self._may_own and not self._sock.closed:
            try:
                self.release(timeout_s=min(self.timeout_s, 0.5))
            except (BridgeError, ProtocolError) as e:
                log.debug("%s: release on close failed: %s", self.device or self.endpoint, e)
            self._may_own = False
        self._sock.close(linger=0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class StreamReader:
    """Background SUB reader. ``mode='latest'`` keeps the newest message; ``mode='record'`` keeps
    all of them in order (bounded by ``max_queue``) and counts messages lost to sequence gaps."""

    def __init__(self, endpoint: str, mode: str = "latest", keys: CurveKeys | None = None,
                 max_queue: int = 10_000, context: zmq.Context | None = None, name: str = "") -> None:
        if mode not in ("latest", "record"):
            raise ValueError(f"StreamReader mode must be 'latest' or 'record', got {mode!r}")
        self.endpoint, self.mode, self.name = endpoint, mode, name or endpoint
        self.ctx = context or zmq.Context.instance()
        self.keys = keys
        self._latest: Message | None = None
        self._queue: collections.deque[Message] = collections.deque()
        self.max_queue = max_queue
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self.received = 0
        self.lost = 0  # sequence gaps seen on the wire (dropped by a full queue upstream)
        self.overflow = 0  # messages we dropped because our own queue was full (record mode)
        self.decode_errors = 0
        self._last_seq: int | None = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"sub-{self.name}")
        self._thread.start()
        self._ready.wait(2.0)

    def _run(self) -> None:
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        # latest: tiny queue so the newest sample is never far behind; record: lossless up to 1000 msgs
        sock.setsockopt(zmq.RCVHWM, 2 if self.mode == "latest" else 1000)
        secure_client_socket(sock, self.keys)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self.endpoint)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if not sock.poll(50):
                    continue
                frames = sock.recv_multipart(copy=False)
                try:
                    msg = decode(frames)
                except ProtocolError as e:
                    self.decode_errors += 1
                    log.warning("%s: undecodable stream message: %s", self.name, e)
                    continue
                msg.meta["recv_t_mono_ns"] = time.monotonic_ns()
                if self._last_seq is not None and msg.seq > self._last_seq + 1:
                    self.lost += msg.seq - self._last_seq - 1
                self._last_seq = msg.seq
                with self._cond:
                    self.received += 1
                    self._latest = msg
                    if self.mode == "record":
                        if len(self._queue) >= self.max_queue:
                            self._queue.popleft()
                            self.overflow += 1
                        self._queue.append(msg)
                    self._cond.notify_all()
        except BaseException as e:  # surfaced via .error and get()/next()
            self.error = e
            log.exception("%s: reader stopped", self.name)
        finally:
            sock.close(linger=0)

    def latest(self, timeout_s: float = 1.0, newer_than_ns: int = 0) -> Message:
        """Newest message (optionally one stamped after ``newer_than_ns``); waits up to timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._latest is None or self._latest.t_mono_ns <= newer_than_ns:
                left = deadline - time.monotonic()
                if self.error is not None:
                    raise BridgeError(f"{self.name}: reader failed: {self.error}")
                if left <= 0:
                    raise BridgeTimeout(f"{self.name}: no stream message within {timeout_s:.3f} s from {self.endpoint}")
                self._cond.wait(left)
            return self._latest

    def next(self, timeout_s: float = 1.0) -> Message | None:
        """Record mode: the next message in order, or None on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._queue:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._queue.popleft()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
