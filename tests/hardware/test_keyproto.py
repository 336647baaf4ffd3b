"""The keyboard rig's serial protocol (hardware/firmware/keyproto.py): round trips, and a decoder
that rejects and counts every kind of damage (generated with hypothesis) and resynchronises at
the next frame; the microcontroller logic shared by the firmware and the emulator."""

from __future__ import annotations

import struct
import zlib

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hardware.firmware import keyproto as kp  # noqa: E402

CODES = sorted(kp.KEY_NAMES)
SETTINGS = settings(max_examples=150, deadline=None)


def example(kind: int) -> kp.Packet:
    return {
        kp.PRESS: kp.Packet(kp.PRESS, 7, (kp.KEYS["LEFT_ARROW"], kp.KEYS["SPACE"])),
        kp.RELEASE: kp.Packet(kp.RELEASE, 8, (kp.KEYS["SPACE"],)),
        kp.TAP: kp.Packet(kp.TAP, 9, (kp.KEYS["A"],), hold_ms=40),
        kp.RELEASE_ALL: kp.Packet(kp.RELEASE_ALL, 10),
        kp.HEARTBEAT: kp.Packet(kp.HEARTBEAT, 0xFFFF),
        kp.ACK: kp.Packet(kp.ACK, 3, acked_seq=9, status=kp.BAD_KEY, t_us=0xFFFFFFFF, held=2),
    }[kind]


@pytest.mark.parametrize("kind", sorted(kp.TYPE_NAMES), ids=lambda k: kp.TYPE_NAMES[k])
def test_round_trip_every_message_type(kind):
    p = example(kind)
    wire = kp.encode(p)
    assert wire[0] == 0 and wire[-1] == 0 and 0 not in wire[1:-1]
    assert len(wire) <= kp.MAX_FRAME + 2
    d = kp.Decoder()
    assert d.feed(wire) == [p]
    byte_by_byte = kp.Decoder()
    assert [q for i in range(len(wire)) for q in byte_by_byte.feed(wire[i:i + 1])] == [p]
    assert d.rejected == byte_by_byte.rejected == 0


def test_the_crc_is_the_zip_crc32_of_the_frame():
    frame = kp.cobs_decode(kp.encode(example(kp.TAP))[1:-1])
    assert struct.unpack("<I", frame[-4:])[0] == zlib.crc32(frame[:-4])
    assert frame[:5] == bytes([kp.VERSION, kp.TAP, 9, 0, 4])  # ver, type, seq (LE), len


packets = st.one_of(
    st.builds(kp.Packet, st.sampled_from([kp.PRESS, kp.RELEASE]), st.integers(0, 0xFFFF),
              st.lists(st.sampled_from(CODES), min_size=1, max_size=kp.MAX_KEYS)),
    st.builds(lambda seq, keys, hold: kp.Packet(kp.TAP, seq, keys, hold_ms=hold), st.integers(0, 0xFFFF),
              st.lists(st.sampled_from(CODES), min_size=1, max_size=kp.MAX_KEYS), st.integers(1, kp.MAX_HOLD_MS)),
    st.builds(kp.Packet, st.sampled_from([kp.RELEASE_ALL, kp.HEARTBEAT]), st.integers(0, 0xFFFF)),
    st.builds(lambda seq, a, s, t, h: kp.Packet(kp.ACK, seq, acked_seq=a, status=s, t_us=t, held=h),
              st.integers(0, 0xFFFF), st.integers(0, 0xFFFF), st.integers(0, 255), st.integers(0, 2**32 - 1),
              st.integers(0, 255)),
)


@SETTINGS
@given(ps=st.lists(packets, min_size=1, max_size=8), data=st.data())
def test_any_packets_survive_any_chunking(ps, data):
    wire = b"".join(kp.encode(p) for p in ps)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    d = kp.Decoder()
    out = []
    for a, b in zip([0, *cuts], [*cuts, len(wire)]):
        out += d.feed(wire[a:b])
    assert out == ps and d.rejected == 0 and d.stats["frames"] == len(ps)


@SETTINGS
@given(p=packets, after=packets, data=st.data())
def test_corrupted_bytes_are_rejected_counted_and_the_next_frame_decodes(p, after, data):
    wire = bytearray(kp.encode(p))
    positions = data.draw(st.lists(st.integers(0, len(wire) - 1), min_size=1, max_size=3, unique=True))
    for i in positions:
        wire[i] ^= data.draw(st.integers(1, 255))  # a different byte, never the same one
    d = kp.Decoder()
    assert d.feed(bytes(wire) + kp.encode(after)) == [after]
    assert d.rejected >= 1 and d.stats["frames"] == 1


@SETTINGS
@given(p=packets, after=packets, data=st.data())
def test_truncated_frames_are_rejected_counted_and_the_next_frame_decodes(p, after, data):
    wire = kp.encode(p)
    cut = data.draw(st.integers(2, len(wire) - 2))  # keep the leading 0x00 and at least one byte
    d = kp.Decoder()
    assert d.feed(wire[:cut] + kp.encode(after)) == [after]
    assert d.rejected == 1 and d.stats["frames"] == 1
    # cut inside the COBS block but re-stuffed (a sender that stopped mid-frame): the length says so
    frame = kp.cobs_decode(wire[1:-1])
    short = frame[:data.draw(st.integers(0, len(frame) - 1))]
    d2 = kp.Decoder()
    assert d2.feed(b"\0" + kp.cobs_encode(short) + b"\0" + kp.encode(after)) == [after]
    assert d2.rejected == 1
    assert d2.stats["truncated"] + d2.stats["crc"] + d2.stats["bad_length"] == d2.rejected


@SETTINGS
@given(p=packets, bad=st.integers(0, 2**32 - 1), after=packets)
def test_wrong_crcs_are_rejected_and_counted(p, bad, after):
    frame = kp.cobs_decode(kp.encode(p)[1:-1])
    good = struct.unpack("<I", frame[-4:])[0]
    if bad == good:
        bad ^= 1
    wire = b"\0" + kp.cobs_encode(frame[:-4] + struct.pack("<I", bad)) + b"\0"
    d = kp.Decoder()
    assert d.feed(wire + kp.encode(after)) == [after]
    assert d.stats["crc"] == 1 and d.rejected == 1


@SETTINGS
@given(garbage=st.binary(max_size=300), after=st.lists(packets, min_size=1, max_size=3))
def test_after_any_garbage_valid_frames_decode(garbage, after):
    d = kp.Decoder()
    out = d.feed(garbage + b"".join(kp.encode(p) for p in after))
    assert out[-len(after):] == after  # garbage never hides a valid frame that follows it


def _frame(ver=kp.VERSION, kind=kp.PRESS, seq=1, body=b"\x01\x04", length=None) -> bytes:
    head = struct.pack("<BBHB", ver, kind, seq, len(body) if length is None else length) + body
    return b"\0" + kp.cobs_encode(head + struct.pack("<I", zlib.crc32(head))) + b"\0"


@pytest.mark.parametrize("wire, why", [
    (b"\0\x05\x01\x02\0", "cobs"),  # code byte points past the end
    (_frame()[:-3] + b"\0", "cobs"),
    (b"\0" + kp.cobs_encode(b"\x01\x01\x00") + b"\0", "truncated"),  # shorter than a header + crc
    (_frame(length=5), "truncated"),
    (_frame(length=1), "bad_length"),
    (_frame(ver=2), "version"),
    (_frame(kind=99), "type"),
    (_frame(body=b"\x02\x04"), "payload"),  # announces 2 keys, carries 1
    (_frame(body=b"\x00"), "payload"),  # no keys
    (_frame(kind=kp.TAP, body=b"\x00\x00\x01\x04"), "payload"),  # hold 0 ms
    (_frame(kind=kp.HEARTBEAT, body=b"\x01"), "payload"),
    (_frame(kind=kp.ACK, body=b"\x01" * 7), "payload"),
    (b"\x07" * (kp.MAX_FRAME + 1) + b"\0", "oversize"),
])
def test_each_kind_of_rejection_has_its_counter(wire, why):
    d = kp.Decoder()
    ok = kp.encode(example(kp.PRESS))
    assert d.feed(wire + ok) == [example(kp.PRESS)]
    assert d.stats[why] == 1 and d.rejected == 1, d.stats


def test_an_endless_frame_is_dropped_up_to_the_next_delimiter_without_growing():
    d = kp.Decoder()
    for _ in range(100):
        assert d.feed(b"\x55" * 1000) == []
        assert len(d._buf) <= kp.MAX_FRAME
    assert d.feed(kp.encode(example(kp.TAP))) == [example(kp.TAP)]
    assert d.stats["oversize"] == 1


def test_lost_frames_show_as_sequence_gaps():
    d = kp.Decoder()
    wire = [kp.encode(kp.Packet(kp.HEARTBEAT, s)) for s in (0xFFFE, 0xFFFF, 0, 1, 3, 4, 9)]
    assert len(d.feed(b"".join(wire))) == 7
    assert d.stats["gaps"] == 2  # 1 -> 3 and 4 -> 9; the wrap 0xFFFF -> 0 is not a gap


def test_encode_refuses_what_the_schema_cannot_carry():
    with pytest.raises(ValueError, match="1..6 keys"):
        kp.encode(kp.Packet(kp.PRESS, 1, ()))
    with pytest.raises(ValueError, match="1..6 keys"):
        kp.encode(kp.Packet(kp.PRESS, 1, CODES[:7]))
    with pytest.raises(ValueError, match="hold_ms"):
        kp.encode(kp.Packet(kp.TAP, 1, (4,), hold_ms=0))
    with pytest.raises(ValueError, match="unknown message type"):
        kp.encode(kp.Packet(42, 1))


# -- the microcontroller logic (shared by code.py and the emulator) --------------------------


class FakeKeyboard:
    def __init__(self):
        self.held, self.log = set(), []

    def press(self, *codes):
        self.held |= set(codes)
        self.log.append(("press", codes))

    def release(self, *codes):
        self.held -= set(codes)
        self.log.append(("release", codes))

    def release_all(self):
        self.held.clear()
        self.log.append(("release_all", ()))


class Clock:
    def __init__(self):
        self.t = 1_000_000

    def __call__(self):
        return self.t


def acks(controller, *ps):
    return kp.Decoder().feed(controller.feed(b"".join(kp.encode(p) for p in ps)))


def test_controller_presses_releases_taps_and_acks_with_its_clock():
    kb, clock = FakeKeyboard(), Clock()
    c = kp.Controller(kb, clock, timeout_ms=250)
    a, left = kp.KEYS["A"], kp.KEYS["LEFT_ARROW"]
    (ack,) = acks(c, kp.Packet(kp.PRESS, 1, (a, left)))
    assert ack.kind == kp.ACK and ack.acked_seq == 1 and ack.status == kp.OK and ack.t_us == clock.t and ack.held == 2
    assert kb.held == {a, left}
    clock.t += 10_000
    (ack,) = acks(c, kp.Packet(kp.RELEASE, 2, (a,)))
    assert kb.held == {left} and ack.t_us == clock.t and ack.held == 1
    (ack,) = acks(c, kp.Packet(kp.TAP, 3, (a,), hold_ms=30))
    assert kb.held == {left, a}
    clock.t += 29_000
    c.tick()
    assert a in kb.held
    clock.t += 1_000
    c.tick()
    assert kb.held == {left}
    (ack,) = acks(c, kp.Packet(kp.RELEASE_ALL, 4))
    assert kb.held == set() and ack.held == 0 and kb.log[-1] == ("release_all", ())


def test_controller_refuses_unknown_keys_and_too_many_without_pressing():
    kb = FakeKeyboard()
    c = kp.Controller(kb, Clock())
    (ack,) = acks(c, kp.Packet(kp.PRESS, 1, (kp.KEYS["A"], 0x99)))
    assert ack.status == kp.BAD_KEY and kb.log == []
    (ack,) = acks(c, kp.Packet(kp.PRESS, 2, CODES[:6]))
    assert ack.status == kp.OK
    (ack,) = acks(c, kp.Packet(kp.TAP, 3, (CODES[6],), hold_ms=5))
    assert ack.status == kp.TOO_MANY and kb.held == set(CODES[:6])
    (ack,) = acks(c, kp.Packet(kp.ACK, 4))
    assert ack.status == kp.BAD_TYPE
    assert c.stats == {"applied": 1, "refused": 3, "timeouts": 0}


def test_controller_releases_everything_when_the_host_goes_quiet():
    kb, clock = FakeKeyboard(), Clock()
    c = kp.Controller(kb, clock, timeout_ms=250)
    acks(c, kp.Packet(kp.PRESS, 1, (kp.KEYS["SPACE"],)))
    for i in range(10):  # heartbeats keep it held
        clock.t += 200_000
        acks(c, kp.Packet(kp.HEARTBEAT, 2 + i))
        c.tick()
    assert kb.held == {kp.KEYS["SPACE"]}
    clock.t += 250_000
    c.tick()
    assert kb.held == {kp.KEYS["SPACE"]}  # not yet: exactly the timeout
    clock.t += 1
    c.tick()
    assert kb.held == set() and c.stats["timeouts"] == 1 and c.last_contact_us is None
    c.tick()
    assert c.stats["timeouts"] == 1  # once, not on every tick
    garbage = b"\x00\x13\x37\x00"
    clock.t += 1
    assert c.feed(garbage) == b"" and c.last_contact_us is None  # garbage is no sign of life
