import msgpack
import numpy as np
import pytest

from robot_io.wire import MESSAGE_TYPES, PROTOCOL_VERSION, Message, ProtocolError, check_array, decode, encode


def example(mtype: str) -> Message:
    meta = {f: None for f in MESSAGE_TYPES[mtype].fields}
    meta.update({k: v for k, v in {"req_id": "r-1", "deadline_ns": 123, "index": 7, "code": "bad_shape",
                                    "message": "m", "tick": 3, "instruction": "pick", "keys": ["SPACE", "LEFT_ARROW"],
                                    "hold_ms": 30, "score": -3, "lives": 5,
                                    "episode_over": False}.items() if k in meta})
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "img": np.full((4, 5, 3), 9, np.uint8),
              "empty": np.zeros((0, 7), np.float64), "flag": np.array([True, False])}
    return Message(mtype, "arm", arrays, meta, seq=42)


@pytest.mark.parametrize("mtype", sorted(MESSAGE_TYPES))
def test_round_trip_every_message_type(mtype):
    msg = example(mtype)
    frames = [bytes(f) for f in encode(msg)]
    assert len(frames) == 1 + len(msg.arrays)
    out = decode(frames)
    assert out.type == mtype and out.device == "arm" and out.seq == 42 and out.v == PROTOCOL_VERSION
    assert out.meta == msg.meta
    assert out.t_mono_ns > 0 and out.t_wall_ns > 0
    assert list(out.arrays) == list(msg.arrays)
    for k, a in msg.arrays.items():
        assert out.arrays[k].dtype == a.dtype and out.arrays[k].shape == a.shape
        np.testing.assert_array_equal(out.arrays[k], a)


def test_non_contiguous_and_big_endian_arrays_survive():
    a = np.arange(20, dtype=">f8").reshape(4, 5)[:, ::2]
    out = decode([bytes(f) for f in encode(Message("state", arrays={"x": a}))])
    np.testing.assert_array_equal(out.arrays["x"], a)
    assert out.arrays["x"].dtype == np.dtype("<f8")


def _hdr(**kw):
    h = {"v": PROTOCOL_VERSION, "type": "ping", "device": "arm", "seq": 1, "t_mono_ns": 1, "t_wall_ns": 1,
         "arrays": [], "req_id": "x", "deadline_ns": 2**62}
    h.update(kw)
    return msgpack.packb(h)


@pytest.mark.parametrize("frames, code, field", [
    ([_hdr(v=99)], "bad_version", "v"),
    ([_hdr(type="teleport")], "unknown_type", "type"),
    ([b"\xc1\x00garbage"], "bad_header", None),
    ([msgpack.packb([1, 2, 3])], "bad_header", None),
    ([_hdr(arrays=[{"name": "q", "dtype": "float32", "shape": [7]}])], "truncated", "arrays"),
    ([_hdr(arrays=[{"name": "q", "dtype": "float32", "shape": [7]}]), b"\0" * 27], "truncated", "q"),
    ([_hdr(arrays=[{"name": "q", "dtype": "object", "shape": [7]}]), b"\0" * 28], "bad_dtype", "q"),
    ([_hdr(arrays=[{"name": "q", "dtype": "float32", "shape": [-1]}]), b""], "bad_shape", "q"),
    ([msgpack.packb({"v": 1, "type": "ping"})], "bad_header", "device"),
    ([], "truncated", None),
])
def test_decode_refuses_malformed(frames, code, field):
    with pytest.raises(ProtocolError) as e:
        decode(frames)
    assert e.value.code == code
    if field:
        assert e.value.field == field


def test_check_array_names_the_problem():
    m = Message("ee_delta", arrays={"action": np.array([0, 0, np.nan, 0, 0, 0, 1], np.float32)})
    with pytest.raises(ProtocolError, match="action.*non-finite.*2") as e:
        check_array(m, "action", "float32", (7,))
    assert e.value.code == "non_finite"
    with pytest.raises(ProtocolError, match="must be float32, got float64"):
        check_array(Message("ee_delta", arrays={"action": np.zeros(7)}), "action", "float32", (7,))
    with pytest.raises(ProtocolError, match=r"shape \[7\], got \[6\]"):
        check_array(Message("ee_delta", arrays={"action": np.zeros(6, np.float32)}), "action", "float32", (7,))
    with pytest.raises(ProtocolError, match="needs array 'action'"):
        check_array(Message("ee_delta"), "action", "float32", (7,))
