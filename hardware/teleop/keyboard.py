"""Keyboard teleop in a plain terminal: works on a local console and over ssh (no X11, no pynput).

On ``connect()`` the terminal is switched to a raw-ish mode (no line buffering, no echo, and no
signal keys, so Ctrl-C arrives as a byte and ends the session cleanly instead of killing the
recorder in the middle of a write). Output processing is left on, so ``print`` still works.
``disconnect()`` -- and an ``atexit`` hook, for a program that dies without disconnecting --
restores the saved mode and discards keys typed but not read, so they never reach the shell.
Over ssh use ``ssh -t`` so the remote side gets a terminal.

Every ``read()`` drains the bytes typed since the last read (``select`` with a zero timeout; stdin
is never put in non-blocking mode, since that flag is shared with stdout on a terminal) and
decodes them, escape sequences included. Holding a key relies on the terminal's autorepeat:
each repeat is one more press. Per tick the presses on each axis are summed and clipped to one
step, so holding ``w`` moves ``step_m`` per tick once autorepeat starts (after the terminal's
initial repeat delay, typically 250-500 ms; the first press moves one step at once).

Run ``python -m hardware.teleop.keyboard --demo`` to try it: it prints the command of every
active tick until Esc / Ctrl-C.
"""

from __future__ import annotations

import argparse
import atexit
import errno
import logging
import os
import select
import sys
import time
from typing import IO, Any

import numpy as np

from hardware.base import DeviceError
from hardware.teleop.base import Teleop, TeleopCommand

log = logging.getLogger(__name__)

# key name -> (index in the action vector, direction)
MOTION_KEYS: dict[str, tuple[int, int]] = {
    "w": (0, +1), "s": (0, -1), "up": (0, +1), "down": (0, -1),
    "a": (1, +1), "d": (1, -1), "left": (1, +1), "right": (1, -1),
    "r": (2, +1), "f": (2, -1), "pageup": (2, +1), "pagedown": (2, -1),
    "q": (5, -1), "e": (5, +1),
}
EVENT_KEYS: dict[str, str] = {
    "enter": "success",
    "backspace": "failure", "x": "failure",
    "z": "rerecord",
    "esc": "stop", "ctrl-c": "stop",
}
SPEED_UP_KEYS = ("+", "=")
SPEED_DOWN_KEYS = ("-", "_")

_CSI_FINAL = {"A": "up", "B": "down", "C": "right", "D": "left"}  # ESC [ A, or ESC [ 1;5 A with modifiers
_CSI_TILDE = {"5": "pageup", "6": "pagedown"}  # ESC [ 5 ~
_SS3 = {"A": "up", "B": "down", "C": "right", "D": "left"}  # ESC O A (application cursor mode)
_SINGLE = {0x0D: "enter", 0x0A: "enter", 0x7F: "backspace", 0x08: "backspace", 0x03: "ctrl-c", 0x20: "space"}

_MAX_BYTES_PER_READ = 1 << 16  # bound on what one read() takes from the terminal


def decode_keys(data: bytes, flush: bool = False) -> tuple[list[str], bytes]:
    """Split terminal input into key names.

    Returns ``(keys, rest)``: ``rest`` is an escape sequence cut off at the end of ``data``
    (or a lone ESC), to be completed by the next bytes. With ``flush=True`` nothing is kept: a
    lone or incomplete ESC is the Esc key. Printable characters are lower-cased (Caps Lock must
    not break teleop); unknown sequences and control bytes come out as ``"unknown"``.
    """
    keys: list[str] = []
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if b != 0x1B:
            if b in _SINGLE:
                keys.append(_SINGLE[b])
            elif 0x21 <= b <= 0x7E:
                keys.append(chr(b).lower())
            else:
                keys.append("unknown")
            i += 1
            continue
        # ESC: a lone Esc key, or the start of CSI (ESC [) / SS3 (ESC O) sequence
        if i + 1 >= n:
            if not flush:
                return keys, data[i:]
            keys.append("esc")
            i += 1
            continue
        nxt = data[i + 1]
        if nxt == ord("["):
            j = i + 2
            while j < n and 0x20 <= data[j] <= 0x3F:  # parameter and intermediate bytes
                j += 1
            if j >= n:
                if not flush:
                    return keys, data[i:]
                keys.append("esc")
                i += 1
                continue
            final = data[j]
            if not 0x40 <= final <= 0x7E:  # malformed: the ESC was a key on its own
                keys.append("esc")
                i += 1
                continue
            params = data[i + 2:j].decode("ascii", "replace")
            if chr(final) in _CSI_FINAL:
                keys.append(_CSI_FINAL[chr(final)])
            elif chr(final) == "~":
                keys.append(_CSI_TILDE.get(params.split(";")[0], "unknown"))
            else:
                keys.append("unknown")
            i = j + 1
        elif nxt == ord("O"):
            if i + 2 >= n:
                if not flush:
                    return keys, data[i:]
                keys.append("esc")
                i += 1
                continue
            keys.append(_SS3.get(chr(data[i + 2]), "unknown"))
            i += 3
        else:  # Esc followed by another key (or Alt+key): Esc, then that key
            keys.append("esc")
            i += 1
    return keys, b""


class KeyboardTeleop(Teleop):
    """End-effector teleop from a terminal keyboard.

    Key map (robot base frame; also printed by :meth:`help_text`):

    ==========================  ===================================================
    w / s, Up / Down            +x / -x by ``step_m``
    a / d, Left / Right         +y / -y
    r / f, Page Up / Page Down  +z / -z
    q / e                       yaw - / + by ``step_rad`` (about z)
    space                       toggle the gripper open / closed
    + (or =) / - (or _)         speed x2 / x0.5 (between ``speed_range``)
    Enter                       event ``success``
    Backspace or x              event ``failure``
    z                           event ``rerecord``
    Esc or Ctrl-C               event ``stop``
    ==========================  ===================================================

    Letters work with Caps Lock on. Per tick the presses of each axis since the last ``read()``
    are summed and clipped to one step (w + s cancel; w + a moves diagonally). ``intervening`` is
    True on ticks where a motion or gripper key was pressed, or always with
    ``always_intervening=True`` (plain demonstration recording). ``begin_episode`` discards keys
    typed between episodes and sets the gripper back to ``initial_gripper``.

    ``stream``: where keys come from, an fd or a file object. Default: stdin, which must be a
    terminal (DeviceError otherwise). A given stream may be a terminal (its mode is set and
    restored like stdin's) or a pipe (tests).
    """

    def __init__(self, name: str = "", *, step_m: float = 0.01, step_rad: float = 0.05,
                 always_intervening: bool = False, initial_gripper: float = 1.0,
                 stream: int | IO[Any] | None = None, speed_range: tuple[float, float] = (0.25, 4.0),
                 esc_timeout_s: float = 0.03) -> None:
        super().__init__(name)
        if step_m <= 0 or step_rad <= 0:
            raise ValueError(f"keyboard teleop: step_m and step_rad must be positive, got {step_m}, {step_rad}")
        if not 0.0 <= initial_gripper <= 1.0:
            raise ValueError(f"keyboard teleop: initial_gripper is an opening in [0, 1], got {initial_gripper}")
        lo, hi = speed_range
        if not 0 < lo <= 1.0 <= hi:
            raise ValueError(f"keyboard teleop: speed_range must satisfy 0 < low <= 1 <= high, got {speed_range}")
        if esc_timeout_s < 0:
            raise ValueError(f"keyboard teleop: esc_timeout_s must be >= 0, got {esc_timeout_s}")
        self.step_m, self.step_rad = float(step_m), float(step_rad)
        self.always_intervening = bool(always_intervening)
        self.initial_gripper = float(initial_gripper)
        self.speed_range = (float(lo), float(hi))
        self.esc_timeout_s = float(esc_timeout_s)
        self._stream = stream
        self._fd: int | None = None
        self._saved_attrs: list | None = None
        self._pending = b""
        self._eof = False
        self.speed = 1.0
        self.gripper = self.initial_gripper

    # ---------------------------------------------------------------- lifecycle

    def _connect(self) -> None:
        self._fd = self._resolve_fd()
        self._pending, self._eof, self.speed, self.gripper = b"", False, 1.0, self.initial_gripper
        if os.isatty(self._fd):
            import termios  # POSIX only; imported here so the module imports everywhere

            self._saved_attrs = termios.tcgetattr(self._fd)
            mode = termios.tcgetattr(self._fd)
            mode[0] &= ~termios.IXON  # iflag: Ctrl-S / Ctrl-Q are keys, not flow control
            mode[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN)  # lflag
            mode[6][termios.VMIN], mode[6][termios.VTIME] = 1, 0
            try:
                termios.tcsetattr(self._fd, termios.TCSAFLUSH, mode)  # also drops keys typed before connect
            except termios.error as e:
                self._saved_attrs = None
                raise DeviceError(f"keyboard teleop {self.name!r}: cannot set the terminal mode: {e}") from e
            atexit.register(self._restore_tty)

    def _disconnect(self) -> None:
        self._restore_tty()
        atexit.unregister(self._restore_tty)
        self._fd = None

    def _resolve_fd(self) -> int:
        if self._stream is not None:
            return self._stream if isinstance(self._stream, int) else self._stream.fileno()
        try:
            fd = sys.stdin.fileno()
        except (AttributeError, OSError, ValueError):  # stdin closed, replaced, or None
            fd = -1
        if fd < 0 or not os.isatty(fd):
            raise DeviceError(
                f"keyboard teleop {self.name!r} needs an interactive terminal, but stdin is not a tty "
                "(piped, redirected, or run as a service). Run it in a terminal (over ssh: `ssh -t`), "
                "or pass stream= explicitly.")
        return fd

    def _restore_tty(self) -> None:
        if self._saved_attrs is None or self._fd is None:
            return
        import termios

        saved, self._saved_attrs = self._saved_attrs, None
        try:
            termios.tcsetattr(self._fd, termios.TCSAFLUSH, saved)  # flush: unread keys never reach the shell
        except termios.error as e:  # the terminal is gone (ssh hung up): nothing left to restore
            log.warning("keyboard teleop %r: could not restore the terminal mode: %s", self.name, e)

    # ---------------------------------------------------------------- reading

    def _drain(self, timeout: float) -> bytes:
        """Bytes available on the terminal, waiting up to ``timeout`` s for the first one."""
        if self._eof:
            return b""
        chunks, total = [], 0
        while total < _MAX_BYTES_PER_READ:
            ready, _, _ = select.select([self._fd], [], [], timeout)
            if not ready:
                break
            try:
                chunk = os.read(self._fd, 4096)
            except OSError as e:
                if e.errno != errno.EIO:  # EIO: the terminal hung up
                    raise DeviceError(f"keyboard teleop {self.name!r}: reading the terminal failed: {e}") from e
                chunk = b""
            if not chunk:
                self._eof = True
                log.warning("keyboard teleop %r: the terminal closed; ending the session (stop)", self.name)
                break
            chunks.append(chunk)
            total += len(chunk)
            timeout = 0.0
        return b"".join(chunks)

    def _read_keys(self) -> list[str]:
        was_eof = self._eof
        keys, rest = decode_keys(self._pending + self._drain(0.0))
        self._pending = b""
        if rest:  # a lone ESC, or a sequence cut in two: wait briefly for its tail
            more = self._drain(self.esc_timeout_s)
            more_keys, self._pending = decode_keys(rest + more, flush=not more)
            keys += more_keys
        if self._eof and not was_eof:
            keys.append("ctrl-c")  # a closed terminal ends the session like Ctrl-C
        return keys

    def read(self, obs: dict | None = None, privileged: dict | None = None) -> TeleopCommand:
        self._require_connected()
        presses = np.zeros(6)
        events: set[str] = set()
        active = False
        for key in self._read_keys():
            if key in MOTION_KEYS:
                axis, sign = MOTION_KEYS[key]
                presses[axis] += sign
                active = True
            elif key == "space":
                self.gripper = 0.0 if self.gripper > 0.5 else 1.0
                active = True
            elif key in EVENT_KEYS:
                events.add(EVENT_KEYS[key])
            elif key in SPEED_UP_KEYS:
                self.speed = min(self.speed * 2.0, self.speed_range[1])
            elif key in SPEED_DOWN_KEYS:
                self.speed = max(self.speed * 0.5, self.speed_range[0])
        steps = np.clip(presses, -1.0, 1.0)  # autorepeat: at most one step per axis per tick
        action = np.empty(7, np.float32)
        action[:3] = steps[:3] * self.step_m * self.speed
        action[3:6] = steps[3:] * self.step_rad * self.speed
        action[6] = self.gripper
        return TeleopCommand(action, frozenset(events), self.always_intervening or active)

    def begin_episode(self, task: str | None = None, seed: int | None = None, instruction: str = "") -> None:
        """Discard keys typed between episodes (a second Enter must not end the next one) and set the
        gripper back to ``initial_gripper``."""
        if self._connected:
            self._drain(0.0)
            self._pending = b""
        self.gripper = self.initial_gripper

    # ---------------------------------------------------------------- description

    def help_text(self) -> str:
        return "\n".join([
            f"Keyboard teleop ({self.step_m * 1000:g} mm, {self.step_rad:g} rad per tick; hold a key to keep moving):",
            "  w / s  or  Up / Down            +x / -x",
            "  a / d  or  Left / Right         +y / -y",
            "  r / f  or  Page Up / Page Down  +z / -z",
            "  q / e                           yaw - / +",
            "  space                           toggle gripper open / closed",
            "  + / -                           speed x2 / x0.5",
            "  Enter                           success (end episode)",
            "  Backspace or x                  failure (end episode)",
            "  z                               re-record this episode",
            "  Esc or Ctrl-C                   stop the session",
        ])

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "step_m": self.step_m, "step_rad": self.step_rad,
                "always_intervening": self.always_intervening}


# -------------------------------------------------------------------- demo


def format_command(tick: int, cmd: TeleopCommand) -> str:
    """One parseable line per tick: ``tick=3 action=+0.0100,... events=stop intervening=1``."""
    action = ",".join(f"{v:+.4f}" for v in cmd.action)
    events = ",".join(sorted(cmd.events)) or "-"
    return f"tick={tick} action={action} events={events} intervening={int(cmd.intervening)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hardware.teleop.keyboard",
                                     description="Keyboard teleop in this terminal.")
    parser.add_argument("--demo", action="store_true",
                        help="read keys and print each active tick's command until Esc / Ctrl-C")
    parser.add_argument("--ticks", type=int, default=0, help="stop after this many ticks (0: until stop)")
    parser.add_argument("--hz", type=float, default=10.0, help="control rate of the demo loop")
    parser.add_argument("--step-m", type=float, default=0.01, help="translation step per tick, metres")
    parser.add_argument("--step-rad", type=float, default=0.05, help="rotation step per tick, rad")
    parser.add_argument("--all", action="store_true", help="print idle ticks too")
    args = parser.parse_args(argv)
    if args.hz <= 0:
        parser.error("--hz must be positive")
    teleop = KeyboardTeleop(step_m=args.step_m, step_rad=args.step_rad)
    if not args.demo:
        print(teleop.help_text())
        print("\nRun with --demo to try it.")
        return 0
    try:
        teleop.connect()
    except DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        print(teleop.help_text())
        print("ready", flush=True)
        period, next_t, tick = 1.0 / args.hz, time.monotonic(), 0
        while not args.ticks or tick < args.ticks:
            cmd = teleop.read()
            if args.all or cmd.intervening or cmd.events:
                print(format_command(tick, cmd), flush=True)
            if "stop" in cmd.events:
                break
            tick += 1
            next_t += period
            time.sleep(max(0.0, next_t - time.monotonic()))
    finally:
        teleop.disconnect()
    print("bye", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
