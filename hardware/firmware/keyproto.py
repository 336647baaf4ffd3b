"""The keyboard rig's serial protocol: one schema for the host driver, the firmware and the emulator.

This file runs unchanged on CPython (``hardware.firmware.keyproto``: the host driver
``hardware.serial_keypresser`` and the emulated microcontroller ``hardware.emulated_keyboard_mcu``)
and on CircuitPython (copied next to ``code.py`` on the RP2040's CIRCUITPY drive, imported as
``keyproto``). So it keeps to what CircuitPython has: no typing, dataclasses, enum, abc or
f-strings; only ``binascii`` and ``struct`` from the standard library.

Framing (every message, both directions)::

    0x00  COBS( ver u8 | type u8 | seq u16 | len u8 | payload[len] | crc32 u32 )  0x00

Integers are little-endian. ``crc32`` is ``binascii.crc32`` (the ZIP CRC-32) over everything
before it. COBS removes every zero byte from the frame, so 0x00 only ever delimits frames: a
receiver that lost sync (garbage, a cut cable, a reboot mid-frame) is back in sync at the next
0x00, and the leading 0x00 ends whatever garbage came before a frame. ``seq`` counts each
sender's frames (wrapping at 2**16); the receiver counts gaps.

Message types and payloads (host -> microcontroller unless marked):

    PRESS        n u8, n keycodes u8       press and hold the keys
    RELEASE      n u8, n keycodes u8       release the keys
    TAP          hold_ms u16, n u8, codes  press, release after hold_ms (the microcontroller times it)
    RELEASE_ALL  (empty)                   release every key
    HEARTBEAT    (empty)                   keep-alive
    ACK (mcu ->) acked_seq u16, status u8, t_us u32, held u8
                                           answer to each valid host frame: ``status`` (OK or why
                                           it was refused, nothing applied then), ``t_us`` the
                                           microcontroller's monotonic clock in microseconds
                                           (wrapping at 2**32) when it applied the command,
                                           ``held`` how many keys it holds afterwards

Keycodes are HID usage ids (the values of ``adafruit_hid.keycode.Keycode``); :data:`KEYS` names
those the rig may press. The microcontroller releases every key when it hears nothing valid from
the host for :data:`HEARTBEAT_TIMEOUT_MS` (:class:`Controller`, shared by the firmware and the
emulator); the host sends a heartbeat every :data:`HEARTBEAT_PERIOD_MS`.
"""

import struct
from binascii import crc32

VERSION = 1

PRESS = 1
RELEASE = 2
TAP = 3
RELEASE_ALL = 4
HEARTBEAT = 5
ACK = 6
TYPE_NAMES = {PRESS: "press", RELEASE: "release", TAP: "tap", RELEASE_ALL: "release_all",
              HEARTBEAT: "heartbeat", ACK: "ack"}
HOST_TYPES = (PRESS, RELEASE, TAP, RELEASE_ALL, HEARTBEAT)

# ack status
OK = 0
BAD_KEY = 1  # a keycode not in KEYS
TOO_MANY = 2  # more than MAX_KEYS keys would be held
BAD_TYPE = 3  # a type the microcontroller does not take from the host (an ACK)
STATUS_NAMES = {OK: "ok", BAD_KEY: "bad_key", TOO_MANY: "too_many", BAD_TYPE: "bad_type"}

MAX_KEYS = 6  # a HID boot keyboard reports at most 6 keys at once
MAX_HOLD_MS = 0xFFFF
HEARTBEAT_TIMEOUT_MS = 250  # the microcontroller releases every key after this long without a valid frame
HEARTBEAT_PERIOD_MS = 50  # the host's heartbeat period (5 per timeout: a lost one or two do not matter)
HEADER_SIZE = 5  # ver, type, seq, len
CRC_SIZE = 4
MAX_PAYLOAD = 3 + MAX_KEYS  # TAP: hold_ms, n, codes
MAX_FRAME = 2 + HEADER_SIZE + MAX_PAYLOAD + CRC_SIZE  # COBS-encoded bytes between two delimiters, with margin

# HID usage ids (USB HID Usage Tables, keyboard page 0x07), as in adafruit_hid.keycode.Keycode.
KEYS = {}
for _i, _c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZ"):
    KEYS[_c] = 0x04 + _i
for _i, _c in enumerate("1234567890"):
    KEYS[_c] = 0x1E + _i
for _i in range(12):
    KEYS["F" + str(_i + 1)] = 0x3A + _i
KEYS.update({"ENTER": 0x28, "ESCAPE": 0x29, "BACKSPACE": 0x2A, "TAB": 0x2B, "SPACE": 0x2C,
             "RIGHT_ARROW": 0x4F, "LEFT_ARROW": 0x50, "DOWN_ARROW": 0x51, "UP_ARROW": 0x52,
             "LEFT_CONTROL": 0xE0, "LEFT_SHIFT": 0xE1, "LEFT_ALT": 0xE2})
KEY_NAMES = {}
for _name in KEYS:
    KEY_NAMES[KEYS[_name]] = _name


class Packet:
    """One decoded message. ``kind`` is a type constant; the other fields are those its type carries
    (``keys``: a tuple of keycodes; ACK: ``acked_seq``, ``status``, ``t_us``, ``held``)."""

    def __init__(self, kind, seq=0, keys=(), hold_ms=0, acked_seq=0, status=OK, t_us=0, held=0):
        self.kind = kind
        self.seq = seq
        self.keys = tuple(keys)
        self.hold_ms = hold_ms
        self.acked_seq = acked_seq
        self.status = status
        self.t_us = t_us
        self.held = held

    def _fields(self):
        return (self.kind, self.seq, self.keys, self.hold_ms, self.acked_seq, self.status, self.t_us, self.held)

    def __eq__(self, other):
        return isinstance(other, Packet) and self._fields() == other._fields()

    def __repr__(self):
        return "Packet(%s, seq=%d, keys=%r, hold_ms=%d, acked_seq=%d, status=%d, t_us=%d, held=%d)" % (
            TYPE_NAMES.get(self.kind, str(self.kind)), self.seq, self.keys, self.hold_ms, self.acked_seq,
            self.status, self.t_us, self.held)


# -- COBS ------------------------------------------------------------------------------------


def cobs_encode(data):
    """Consistent Overhead Byte Stuffing: ``data`` -> bytes without any 0x00."""
    out = bytearray(b"\x00")
    code_at = 0
    code = 1
    for b in data:
        if b == 0:
            out[code_at] = code
            code_at = len(out)
            out.append(0)
            code = 1
        else:
            out.append(b)
            code += 1
            if code == 0xFF:
                out[code_at] = code
                code_at = len(out)
                out.append(0)
                code = 1
    out[code_at] = code
    return bytes(out)


def cobs_decode(data):
    """Inverse of :func:`cobs_encode`; None when ``data`` is not a valid COBS block (a code byte
    of 0, or one that points past the end: a corrupted or cut frame)."""
    out = bytearray()
    i = 0
    n = len(data)
    while i < n:
        code = data[i]
        end = i + code
        if code == 0 or end > n:
            return None
        out.extend(data[i + 1:end])
        i = end
        if code < 0xFF and i < n:
            out.append(0)
    return bytes(out)


# -- encoding --------------------------------------------------------------------------------


def _key_payload(keys):
    if not 1 <= len(keys) <= MAX_KEYS:
        raise ValueError("a key message carries 1..%d keys, got %d" % (MAX_KEYS, len(keys)))
    for k in keys:
        if not 0 <= k <= 0xFF:
            raise ValueError("keycode %r is not a byte" % (k,))
    return bytes([len(keys)]) + bytes(keys)


def payload(packet):
    """The payload bytes of ``packet`` (ValueError when a field does not fit its type)."""
    kind = packet.kind
    if kind in (PRESS, RELEASE):
        return _key_payload(packet.keys)
    if kind == TAP:
        if not 1 <= packet.hold_ms <= MAX_HOLD_MS:
            raise ValueError("tap hold_ms must be 1..%d, got %r" % (MAX_HOLD_MS, packet.hold_ms))
        return struct.pack("<H", packet.hold_ms) + _key_payload(packet.keys)
    if kind in (RELEASE_ALL, HEARTBEAT):
        return b""
    if kind == ACK:
        return struct.pack("<HBIB", packet.acked_seq & 0xFFFF, packet.status, packet.t_us & 0xFFFFFFFF,
                           packet.held)
    raise ValueError("unknown message type %r" % (kind,))


def encode(packet):
    """``packet`` -> the bytes to write on the serial line (delimiters included)."""
    body = payload(packet)
    frame = struct.pack("<BBHB", VERSION, packet.kind, packet.seq & 0xFFFF, len(body)) + body
    frame += struct.pack("<I", crc32(frame) & 0xFFFFFFFF)
    return b"\x00" + cobs_encode(frame) + b"\x00"


# -- decoding --------------------------------------------------------------------------------

REJECTIONS = ("cobs", "truncated", "bad_length", "crc", "version", "type", "payload", "oversize")
"""What the decoder counts, one counter per kind of rejected frame:
cobs (not a valid COBS block), truncated (shorter than its header or its announced length),
bad_length (longer than announced), crc (checksum mismatch), version (another protocol version),
type (unknown message type), payload (a payload that does not fit its type), oversize (more than
MAX_FRAME bytes without a delimiter: dropped up to the next 0x00)."""


class Decoder:
    """Feed it bytes as they arrive (any chunking); it returns the valid packets and counts the
    rest in ``stats`` (one counter per name in :data:`REJECTIONS`, plus ``frames`` decoded and
    ``gaps``: frames whose ``seq`` did not follow the previous one, i.e. frames lost on the way)."""

    def __init__(self, max_frame=MAX_FRAME):
        self.max_frame = max_frame
        self._buf = bytearray()
        self._dropping = False
        self._last_seq = None
        self.stats = {"frames": 0, "gaps": 0}
        for name in REJECTIONS:
            self.stats[name] = 0

    @property
    def rejected(self):
        """Total rejected frames, all kinds."""
        return sum(self.stats[name] for name in REJECTIONS)

    def feed(self, data):
        out = []
        data = bytes(data)
        i = 0
        n = len(data)
        while i < n:
            z = data.find(b"\x00", i)
            if z < 0:
                piece, i, end = data[i:], n, False
            else:
                piece, i, end = data[i:z], z + 1, True
            if not self._dropping and piece:
                self._buf.extend(piece)
                if len(self._buf) > self.max_frame:
                    self.stats["oversize"] += 1
                    self._dropping = True
                    self._buf = bytearray()
            if end:
                if self._buf and not self._dropping:
                    packet = self._frame(bytes(self._buf))
                    if packet is not None:
                        out.append(packet)
                self._buf = bytearray()
                self._dropping = False
        return out

    def _reject(self, why):
        self.stats[why] += 1
        return None

    def _frame(self, block):
        frame = cobs_decode(block)
        if frame is None:
            return self._reject("cobs")
        if len(frame) < HEADER_SIZE + CRC_SIZE:
            return self._reject("truncated")
        size = HEADER_SIZE + frame[4] + CRC_SIZE
        if len(frame) < size:
            return self._reject("truncated")
        if len(frame) > size:
            return self._reject("bad_length")
        if struct.unpack("<I", frame[-CRC_SIZE:])[0] != crc32(frame[:-CRC_SIZE]) & 0xFFFFFFFF:
            return self._reject("crc")
        ver, kind, seq, length = struct.unpack("<BBHB", frame[:HEADER_SIZE])
        if ver != VERSION:
            return self._reject("version")
        if kind not in TYPE_NAMES:
            return self._reject("type")
        packet = _parse(kind, seq, frame[HEADER_SIZE:HEADER_SIZE + length])
        if packet is None:
            return self._reject("payload")
        if self._last_seq is not None and seq != (self._last_seq + 1) & 0xFFFF:
            self.stats["gaps"] += 1
        self._last_seq = seq
        self.stats["frames"] += 1
        return packet


def _keys(body):
    if len(body) < 1 or not 1 <= body[0] <= MAX_KEYS or len(body) != 1 + body[0]:
        return None
    return tuple(body[1:])


def _parse(kind, seq, body):
    if kind in (PRESS, RELEASE):
        keys = _keys(body)
        return None if keys is None else Packet(kind, seq, keys)
    if kind == TAP:
        if len(body) < 2:
            return None
        hold_ms = struct.unpack("<H", body[:2])[0]
        keys = _keys(body[2:])
        return None if keys is None or hold_ms == 0 else Packet(kind, seq, keys, hold_ms=hold_ms)
    if kind in (RELEASE_ALL, HEARTBEAT):
        return Packet(kind, seq) if len(body) == 0 else None
    if len(body) != 8:  # ACK
        return None
    acked_seq, status, t_us, held = struct.unpack("<HBIB", body)
    return Packet(ACK, seq, acked_seq=acked_seq, status=status, t_us=t_us, held=held)


# -- the microcontroller's side --------------------------------------------------------------


class Controller:
    """The microcontroller's logic, shared by ``code.py`` (a real ``adafruit_hid`` Keyboard) and the
    emulated microcontroller (a keyboard that records the held keys).

    ``keyboard``: an object with ``press(*codes)``, ``release(*codes)``, ``release_all()`` (the
    ``adafruit_hid.keyboard.Keyboard`` API). ``now_us``: a function returning a monotonic time in
    integer microseconds. Call :meth:`feed` with the bytes read from the host (it returns the acks
    to write back) and :meth:`tick` often: it releases taps when their time is up, and every key
    when no valid frame came for ``timeout_ms``.
    """

    def __init__(self, keyboard, now_us, timeout_ms=HEARTBEAT_TIMEOUT_MS):
        self.keyboard = keyboard
        self.now_us = now_us
        self.timeout_us = int(timeout_ms) * 1000
        self.decoder = Decoder()
        self.pressed = set()
        self.taps = {}  # keycode -> time (us) to release it
        self.last_contact_us = None  # None: no host, or timed out since
        self.seq = 0
        self.stats = {"applied": 0, "refused": 0, "timeouts": 0}

    def feed(self, data):
        out = bytearray()
        for packet in self.decoder.feed(data):
            out.extend(self.apply(packet))
        return bytes(out)

    def apply(self, packet):
        """Apply one valid packet from the host; return the encoded ack."""
        now = self.now_us()
        status = OK if packet.kind in HOST_TYPES else BAD_TYPE
        if status == OK:
            self.last_contact_us = now
        codes = packet.keys
        if status == OK and codes:
            for c in codes:
                if c not in KEY_NAMES:
                    status = BAD_KEY
            if status == OK and packet.kind in (PRESS, TAP):
                new = [c for c in codes if c not in self.pressed]
                if len(self.pressed) + len(new) > MAX_KEYS:
                    status = TOO_MANY
        if status == OK:
            kind = packet.kind
            if kind == PRESS or kind == TAP:
                self.keyboard.press(*codes)
                for c in codes:
                    self.pressed.add(c)
                    if kind == TAP:
                        self.taps[c] = now + packet.hold_ms * 1000
                    elif c in self.taps:
                        del self.taps[c]  # a press holds the key: a pending tap no longer releases it
            elif kind == RELEASE:
                self.keyboard.release(*codes)
                for c in codes:
                    self.pressed.discard(c)
                    if c in self.taps:
                        del self.taps[c]
            elif kind == RELEASE_ALL:
                self._release_all()
            self.stats["applied"] += 1
        else:
            self.stats["refused"] += 1
        self.seq = (self.seq + 1) & 0xFFFF
        return encode(Packet(ACK, self.seq, acked_seq=packet.seq, status=status, t_us=now, held=len(self.pressed)))

    def _release_all(self):
        self.keyboard.release_all()
        self.pressed = set()
        self.taps = {}

    def tick(self):
        """Release due taps; release everything when the host has been silent too long."""
        now = self.now_us()
        if self.taps:
            due = [c for c in self.taps if now >= self.taps[c]]
            if due:
                self.keyboard.release(*due)
                for c in due:
                    self.pressed.discard(c)
                    del self.taps[c]
        if self.last_contact_us is not None and now - self.last_contact_us > self.timeout_us:
            self._release_all()
            self.last_contact_us = None
            self.stats["timeouts"] += 1
