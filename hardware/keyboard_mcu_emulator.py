"""An emulated keyboard-rig microcontroller on a pty pair (no hardware, no USB).

It runs the firmware's own logic (``keyproto.Controller``, the code ``code.py`` runs on the
RP2040) behind the slave end of a pseudo-terminal: a host opens :attr:`EmulatedMicrocontroller.port`
exactly like the Pico's ``/dev/ttyACM1``. Instead of a USB HID keyboard it keeps the set of
held keys (``pressed``) and calls ``on_change(pressed)`` when it changes (the host screen will
listen there). It acks with its own monotonic clock and releases every key when the host's
heartbeats stop, like the firmware.

Run it on its own (one process of the emulated rig) with::

    python -m hardware.keyboard_mcu_emulator [--timeout-ms 250] [--link PATH] [--hid ENDPOINT]

which prints the pty path to give the host driver (``serial_keypresser``, ``port:``; ``--link``
also makes a symlink to it at a fixed path, like a udev rule), then logs each change of the held
keys until SIGTERM / Ctrl-C. ``--hid`` pushes each change (a msgpack list of key names) to a host
screen listening there (``ale_screen`` with ``keys: hid_socket``): the USB HID side of the Pico.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import sys
import threading
import time
import tty
from typing import Callable

from hardware.firmware import keyproto as kp

log = logging.getLogger(__name__)


class _HeldKeys:
    """The ``adafruit_hid`` Keyboard API over a set of held keycodes (thread-safe to read)."""

    def __init__(self, on_change: Callable[[frozenset[str]], None] | None) -> None:
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self.on_change = on_change
        self.events = 0

    def _changed(self, before: frozenset[str]) -> None:
        self.events += 1
        now = self.names()
        if self.on_change is not None and now != before:
            self.on_change(now)

    def press(self, *codes: int) -> None:
        before = self.names()
        with self._lock:
            self._held.update(codes)
        self._changed(before)

    def release(self, *codes: int) -> None:
        before = self.names()
        with self._lock:
            self._held.difference_update(codes)
        self._changed(before)

    def release_all(self) -> None:
        before = self.names()
        with self._lock:
            self._held.clear()
        self._changed(before)

    def names(self) -> frozenset[str]:
        with self._lock:
            return frozenset(kp.KEY_NAMES[c] for c in self._held)


class EmulatedMicrocontroller:
    """The rig's microcontroller on a pty. ``start()`` it, give ``port`` to the host driver,
    ``stop()`` it (or use it as a context manager). ``poll_s``: how often it checks taps and the
    heartbeat timeout when no byte arrives."""

    def __init__(self, timeout_ms: int = kp.HEARTBEAT_TIMEOUT_MS, poll_s: float = 0.005,
                 on_change: Callable[[frozenset[str]], None] | None = None) -> None:
        if timeout_ms <= 0 or poll_s <= 0:
            raise ValueError("timeout_ms and poll_s must be positive")
        self.timeout_ms, self.poll_s = int(timeout_ms), float(poll_s)
        self.keyboard = _HeldKeys(on_change)
        self.controller = kp.Controller(self.keyboard, lambda: time.monotonic_ns() // 1000, self.timeout_ms)
        self.port: str | None = None
        self._master = self._slave = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.acks_dropped = 0  # acks nobody read (no host on the port): dropped, never buffered without bound
        self.error: BaseException | None = None

    @property
    def pressed(self) -> frozenset[str]:
        """The keys held now (names)."""
        return self.keyboard.names()

    def start(self) -> "EmulatedMicrocontroller":
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)  # bytes as they are: no echo, no CR/LF translation, no line buffering
        os.set_blocking(self._master, False)
        # The slave end stays open here too, so the master never reads EOF/EIO when a host closes
        # (or dies holding) the port: the emulator keeps running and times the silence out.
        self.port = os.ttyname(self._slave)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name="keyboard-mcu")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        for fd in (self._master, self._slave):
            if fd >= 0:
                os.close(fd)
        self._master = self._slave = -1

    def __enter__(self) -> "EmulatedMicrocontroller":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def stats(self) -> dict[str, int]:
        return {**self.controller.stats, **{f"rx_{k}": v for k, v in self.controller.decoder.stats.items()},
                "acks_dropped": self.acks_dropped, "key_events": self.keyboard.events}

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select([self._master], [], [], self.poll_s)
                if readable:
                    try:
                        data = os.read(self._master, 4096)
                    except BlockingIOError:
                        data = b""
                    if data:
                        acks = self.controller.feed(data)
                        if acks:
                            self._write(acks)
                self.controller.tick()
        except BaseException as e:  # surfaced through .error and the log; the held keys are let go
            self.error = e
            log.exception("emulated microcontroller stopped")
            self.keyboard.release_all()

    def _write(self, data: bytes) -> None:
        try:
            n = os.write(self._master, data)
        except BlockingIOError:
            n = 0
        if n < len(data):  # the pty is full: nobody reads the host end
            self.acks_dropped += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Emulated keyboard-rig microcontroller on a pty.")
    ap.add_argument("--timeout-ms", type=int, default=kp.HEARTBEAT_TIMEOUT_MS,
                    help="release every key after this long without a valid frame from the host")
    ap.add_argument("--link", default=None, metavar="PATH", help="also make a symlink to the pty here")
    ap.add_argument("--hid", default=None, metavar="ENDPOINT",
                    help="push each change of the held keys to the host screen listening here (zmq PUSH)")
    ap.add_argument("--quiet", action="store_true", help="do not log each change of the held keys")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(asctime)s %(message)s")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    push = None
    if args.hid:
        import msgpack
        import zmq

        push = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.setsockopt(zmq.SNDHWM, 100)
        push.connect(args.hid)
    push_lock = threading.Lock()

    def on_change(keys: frozenset) -> None:
        log.info("held: %s", sorted(keys))
        if push is not None:
            with push_lock:
                try:
                    push.send(msgpack.packb(sorted(keys)), zmq.NOBLOCK)
                except zmq.Again:  # no host listening: a report lost, as on an unplugged cable
                    log.warning("hid: no host listening at %s; report dropped", args.hid)

    mcu = EmulatedMicrocontroller(args.timeout_ms, on_change=on_change)
    with mcu:
        if args.link:
            if os.path.islink(args.link):
                os.unlink(args.link)
            elif os.path.exists(args.link):
                print(f"--link {args.link} exists and is not a symlink; not replacing it", file=sys.stderr)
                return 2
            os.symlink(mcu.port, args.link)
        print(mcu.port, flush=True)
        try:
            while not done.wait(0.5) and mcu.error is None:
                pass
        except KeyboardInterrupt:
            print("stopped (Ctrl-C)", file=sys.stderr)
        finally:
            if args.link and os.path.islink(args.link):
                os.unlink(args.link)
            if push is not None:
                push.close(linger=0)
    return 1 if mcu.error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
