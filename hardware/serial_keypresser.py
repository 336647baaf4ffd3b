"""The keyboard rig's host-side driver (driver ``serial_keypresser``): a ``KeyPresser`` over pyserial.

It speaks ``hardware/firmware/keyproto`` (the schema the RP2040 firmware and the emulated
microcontroller share) on a serial port: the Pico's USB data channel (``/dev/ttyACM1``), a pty
of the emulator, or any ``serial_for_url`` URL. A reader thread decodes the acks; a heartbeat
thread sends a heartbeat every ``heartbeat_ms`` so the microcontroller keeps held keys down
(it releases them all by itself when the heartbeats stop). Each command waits for its ack
(``ack_timeout_s``) and returns a :class:`~hardware.base.KeyAck` with the microcontroller's
clock and the round trip; ``latency()`` summarises the round trips of recent acks (commands
and heartbeats), ``stats()`` the link's counters.
"""

from __future__ import annotations

import collections
import difflib
import logging
import threading
import time
from typing import Any, Iterable

import numpy as np
import serial

from hardware.base import DeviceError, KeyAck, KeyPresser
from hardware.firmware import keyproto as kp

log = logging.getLogger(__name__)


class KeyPresserError(DeviceError):
    """The microcontroller link failed (port, refused command, no ack)."""


class AckTimeout(KeyPresserError, TimeoutError):
    """No ack within ``ack_timeout_s``: the microcontroller is unplugged, hung or on another port."""


class KeyRefused(KeyPresserError):
    """The microcontroller refused a command (``status``: a ``keyproto.STATUS_NAMES`` value); nothing was applied."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


class _Pending:
    __slots__ = ("kind", "t_send_ns", "event", "ack", "t_ack_ns")

    def __init__(self, kind: int, t_send_ns: int) -> None:
        self.kind, self.t_send_ns, self.event = kind, t_send_ns, threading.Event()
        self.ack: kp.Packet | None = None
        self.t_ack_ns = 0


class SerialKeyPresser(KeyPresser):
    """Presses keys through the rig's microcontroller on serial port ``port``.

    ``port``: a device path or a pyserial URL. ``ack_timeout_s``: how long a command waits for
    its ack. ``heartbeat_ms``: the heartbeat period (keep it well under the firmware's
    ``keyproto.HEARTBEAT_TIMEOUT_MS``). ``latency_window``: how many recent round trips
    ``latency()`` keeps.
    """

    key_names = tuple(kp.KEYS)
    max_keys = kp.MAX_KEYS
    max_pending = 256  # unanswered frames remembered at most (older ones count as lost)

    def __init__(self, name: str = "keyboard", port: str = "", baudrate: int = 115200, ack_timeout_s: float = 0.2,
                 heartbeat_ms: float = kp.HEARTBEAT_PERIOD_MS, latency_window: int = 1000) -> None:
        super().__init__(name)
        if not port and type(self) is SerialKeyPresser:
            raise ValueError(f"keyboard {name!r}: port is required (e.g. /dev/ttyACM1, the Pico's data channel)")
        if ack_timeout_s <= 0 or heartbeat_ms <= 0:
            raise ValueError(f"keyboard {name!r}: ack_timeout_s and heartbeat_ms must be positive")
        if heartbeat_ms * 2 > kp.HEARTBEAT_TIMEOUT_MS:
            raise ValueError(f"keyboard {name!r}: heartbeat_ms={heartbeat_ms} must be at most half the firmware's "
                             f"heartbeat timeout ({kp.HEARTBEAT_TIMEOUT_MS} ms), or held keys drop on a late beat")
        self.port, self.baudrate = port, int(baudrate)
        self.ack_timeout_s, self.heartbeat_s = float(ack_timeout_s), heartbeat_ms / 1000.0
        self._serial: serial.SerialBase | None = None
        self._write_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._pending_lock = threading.Lock()
        self._seq = 0
        self._pressed: frozenset[str] = frozenset()
        self._rtts: collections.deque[int] = collections.deque(maxlen=int(latency_window))
        self._decoder = kp.Decoder()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.link_error: BaseException | None = None
        self.last_ack_ns: int | None = None
        self.last_ack: KeyAck | None = None
        self._counts = {"sent": 0, "acked": 0, "ack_timeouts": 0, "refused": 0, "lost": 0, "stray_acks": 0}

    # -- lifecycle --------------------------------------------------------------------------
    def _open_port(self) -> serial.SerialBase:
        try:
            return serial.serial_for_url(self.port, baudrate=self.baudrate, timeout=0.02, write_timeout=0.5)
        except (serial.SerialException, ValueError) as e:
            raise KeyPresserError(f"keyboard {self.name!r}: cannot open serial port {self.port!r}: {e}") from None

    def _connect(self) -> None:
        self._serial = self._open_port()
        self._serial.reset_input_buffer()  # stale acks from an earlier session are not ours
        self._decoder = kp.Decoder()
        self._stop.clear()
        self.link_error = None
        self._threads = [threading.Thread(target=self._read_loop, daemon=True, name=f"keys-rx-{self.name}"),
                         threading.Thread(target=self._heartbeat_loop, daemon=True, name=f"keys-hb-{self.name}")]
        self._threads[0].start()
        try:  # proves the link and starts from a clean keyboard
            self._send(kp.RELEASE_ALL)
        except KeyPresserError as e:
            self._shutdown()
            raise KeyPresserError(f"keyboard {self.name!r}: no microcontroller answering on {self.port!r}: {e}") from None
        self._threads[1].start()

    def _disconnect(self) -> None:
        try:
            self.release_all()
        except KeyPresserError as e:  # going away anyway: the firmware's heartbeat timeout releases them
            log.warning("keyboard %s: release_all on disconnect failed: %s", self.name, e)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=2)
        if self._serial is not None:
            self._serial.close()
        self._serial = None

    # -- commands ---------------------------------------------------------------------------
    def _codes(self, keys: str | Iterable[str]) -> tuple[int, ...]:
        names = [keys] if isinstance(keys, str) else list(keys)
        if not 1 <= len(names) <= kp.MAX_KEYS:
            raise ValueError(f"keyboard {self.name!r}: give 1..{kp.MAX_KEYS} keys at once, got {len(names)}")
        for k in names:
            if k not in kp.KEYS:
                close = difflib.get_close_matches(str(k), kp.KEYS, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"keyboard {self.name!r}: unknown key {k!r}{hint} Known: {', '.join(kp.KEYS)}")
        return tuple(dict.fromkeys(kp.KEYS[k] for k in names))

    def press(self, keys) -> KeyAck:
        self._require_connected()
        codes = self._codes(keys)
        ack = self._send(kp.PRESS, codes)
        self._pressed = self._pressed | {kp.KEY_NAMES[c] for c in codes}
        return ack

    def release(self, keys) -> KeyAck:
        self._require_connected()
        codes = self._codes(keys)
        ack = self._send(kp.RELEASE, codes)
        self._pressed = self._pressed - {kp.KEY_NAMES[c] for c in codes}
        return ack

    def tap(self, keys, hold_ms: int = 30) -> KeyAck:
        self._require_connected()
        codes = self._codes(keys)
        if type(hold_ms) is not int or not 1 <= hold_ms <= kp.MAX_HOLD_MS:
            raise ValueError(f"keyboard {self.name!r}: hold_ms must be an integer in 1..{kp.MAX_HOLD_MS}, got {hold_ms!r}")
        ack = self._send(kp.TAP, codes, hold_ms)
        self._pressed = self._pressed - {kp.KEY_NAMES[c] for c in codes}  # the microcontroller lets go by itself
        return ack

    def release_all(self) -> KeyAck:
        self._require_connected()
        ack = self._send(kp.RELEASE_ALL)
        self._pressed = frozenset()
        return ack

    @property
    def pressed(self) -> frozenset[str]:
        return self._pressed

    def _write(self, kind: int, codes: tuple[int, ...] = (), hold_ms: int = 0) -> tuple[int, _Pending]:
        if self._serial is None:
            raise KeyPresserError(f"keyboard {self.name!r}: the serial port is closed")
        if self.link_error is not None:
            raise KeyPresserError(f"keyboard {self.name!r}: the serial link failed: {self.link_error}")
        with self._write_lock:
            self._seq = (self._seq + 1) & 0xFFFF
            seq = self._seq
            frame = kp.encode(kp.Packet(kind, seq, codes, hold_ms=hold_ms))
            pending = _Pending(kind, time.monotonic_ns())
            with self._pending_lock:
                if len(self._pending) >= self.max_pending:  # bounded: the oldest unanswered frame is lost
                    self._pending.pop(next(iter(self._pending)))
                    self._counts["lost"] += 1
                self._pending[seq] = pending
            try:
                self._serial.write(frame)
            except (serial.SerialException, OSError) as e:
                with self._pending_lock:
                    self._pending.pop(seq, None)
                raise KeyPresserError(f"keyboard {self.name!r}: write to {self.port!r} failed: {e}") from None
            self._counts["sent"] += 1
        return seq, pending

    def _send(self, kind: int, codes: tuple[int, ...] = (), hold_ms: int = 0) -> KeyAck:
        seq, pending = self._write(kind, codes, hold_ms)
        if not pending.event.wait(self.ack_timeout_s):
            with self._pending_lock:
                self._pending.pop(seq, None)
            self._counts["ack_timeouts"] += 1
            raise AckTimeout(f"keyboard {self.name!r}: no ack to {kp.TYPE_NAMES[kind]} (seq {seq}) within "
                             f"{self.ack_timeout_s * 1000:.0f} ms on {self.port!r}")
        ack = pending.ack
        assert ack is not None
        if ack.status != kp.OK:
            self._counts["refused"] += 1
            status = kp.STATUS_NAMES.get(ack.status, str(ack.status))
            raise KeyRefused(f"keyboard {self.name!r}: the microcontroller refused {kp.TYPE_NAMES[kind]} "
                             f"{[kp.KEY_NAMES.get(c, c) for c in codes]}: {status}", status)
        return KeyAck(seq=seq, mcu_t_us=ack.t_us, rtt_ns=pending.t_ack_ns - pending.t_send_ns, held=ack.held)

    # -- threads ----------------------------------------------------------------------------
    def _read_loop(self) -> None:
        port = self._serial
        try:
            while not self._stop.is_set():
                data = port.read(max(1, port.in_waiting))
                if not data:
                    continue
                now = time.monotonic_ns()
                for p in self._decoder.feed(data):
                    if p.kind != kp.ACK:
                        continue
                    with self._pending_lock:
                        pending = self._pending.pop(p.acked_seq, None)
                    if pending is None:
                        self._counts["stray_acks"] += 1  # late (after its timeout) or not ours
                        continue
                    pending.ack, pending.t_ack_ns = p, now
                    self._counts["acked"] += 1
                    self._rtts.append(now - pending.t_send_ns)
                    self.last_ack_ns = now
                    self.last_ack = KeyAck(p.acked_seq, p.t_us, now - pending.t_send_ns, p.held)
                    pending.event.set()
        except (serial.SerialException, OSError, TypeError) as e:  # pyserial raises TypeError on a port closed under it
            if not self._stop.is_set():
                self.link_error = e
                log.error("keyboard %s: reading %s failed, link down: %s", self.name, self.port, e)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self._write(kp.HEARTBEAT)
            except KeyPresserError as e:
                log.error("keyboard %s: heartbeat failed, stopping heartbeats: %s", self.name, e)
                return
            with self._pending_lock:  # heartbeats nobody waits for: forget those far past their ack time
                old = time.monotonic_ns() - int(1e9)
                for seq in [s for s, p in self._pending.items() if p.kind == kp.HEARTBEAT and p.t_send_ns < old]:
                    del self._pending[seq]
                    self._counts["lost"] += 1

    # -- reporting --------------------------------------------------------------------------
    def latency(self) -> dict[str, float]:
        """Round trip (send -> ack) of the recent acks, in ms: p50, p99, max, and their count."""
        r = np.asarray(self._rtts, np.float64) / 1e6
        if r.size == 0:
            return {"count": 0}
        return {"count": int(r.size), "p50_ms": float(np.percentile(r, 50)), "p99_ms": float(np.percentile(r, 99)),
                "max_ms": float(r.max())}

    def stats(self) -> dict[str, int]:
        """Frames sent / acked, ack timeouts, refusals, lost and stray acks, and the decoder's
        rejection counters (``rx_<kind>``)."""
        return {**self._counts, **{f"rx_{k}": v for k, v in self._decoder.stats.items()}}

    def describe(self) -> dict[str, Any]:
        d = {**super().describe(), "port": self.port, "heartbeat_ms": self.heartbeat_s * 1000,
             "firmware_timeout_ms": kp.HEARTBEAT_TIMEOUT_MS, "protocol_version": kp.VERSION}
        if self.is_connected:
            d["latency"] = self.latency()
            d["link_ok"] = self.link_error is None
        return d
