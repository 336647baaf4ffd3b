"""Strict checks of what the bridge accepts: duplicate arrays and header keys, exact header types
(a bool is not an int), reset seeds and tasks checked before the driver (no traceback), and
error replies that echo the request id whenever it can be read."""

import logging

import msgpack
import numpy as np
import pytest

from robot_io.server import ArmService, DeviceServer
from robot_io.wire import PROTOCOL_VERSION, ProtocolError, decode
from tests.mocks.fake_arm import KinematicArm

FAR = 2**62
GOOD = np.array([0.01, 0, 0, 0, 0, 0, 1], np.float32)
NAN = np.array([0.05, np.nan, 0, 0, 0, 0, 1], np.float32)


def pack_pairs(pairs) -> bytes:
    """A msgpack map from (key, value) pairs, in order, duplicates allowed (packb cannot do that)."""
    assert len(pairs) < 2**16
    return b"\xde" + len(pairs).to_bytes(2, "big") + b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in pairs)


def header_pairs(mtype="ee_delta", arrays=(("action", "float32", [7]),), **over):
    """Header pairs with ``req_id`` first (a reader that stops at damage still finds it)."""
    h = {"req_id": "rq-1", "v": PROTOCOL_VERSION, "type": mtype, "device": "arm", "seq": 1, "t_mono_ns": 1,
         "t_wall_ns": 1, "arrays": [{"name": n, "dtype": d, "shape": s} for n, d, s in arrays], "deadline_ns": FAR,
         "client": "tester"}
    h.update(over)
    return list(h.items())


def ask(sock, frames):
    sock.send_multipart(frames)
    assert sock.poll(2000), "no reply"
    return decode(sock.recv_multipart())


def untouched(arm) -> bool:
    return [c for c in arm.calls if c[0] != "connect"] == []


# -- duplicates ---------------------------------------------------------------------------------
def test_an_array_named_twice_is_refused_so_a_nan_action_never_slips_through(kin_server, raw_dealer):
    srv, arm = kin_server
    frames = [pack_pairs(header_pairs(arrays=[("action", "float32", [7]), ("action", "float32", [7])])),
              NAN.tobytes(), GOOD.tobytes()]
    with pytest.raises(ProtocolError) as e:
        decode(frames)
    assert (e.value.code, e.value.field) == ("duplicate_array", "action")
    r = ask(raw_dealer(srv.command_endpoint), frames)
    assert (r.type, r["code"], r["field"], r["req_id"]) == ("error", "duplicate_array", "action", "rq-1")
    assert untouched(arm), "the device moved on a message with a duplicated array"


def test_a_header_key_named_twice_is_refused(kin_server, raw_dealer):
    srv, arm = kin_server
    # the last one would win: a deadline that passed, then nil (which used to skip the check)
    pairs = header_pairs() + [("deadline_ns", None)]
    r = ask(raw_dealer(srv.command_endpoint), [pack_pairs(pairs), GOOD.tobytes()])
    assert (r.type, r["code"], r["field"]) == ("error", "duplicate_field", "deadline_ns")
    assert r["req_id"] == "rq-1"
    assert untouched(arm)


# -- exact types ----------------------------------------------------------------------------------
TYPED = {  # name: (type, header overrides, expected code, field)
    "v true": ("ee_delta", {"v": True}, "bad_version", "v"),
    "v 1.0": ("ee_delta", {"v": 1.0}, "bad_version", "v"),
    "device nil": ("ee_delta", {"device": None}, "bad_field", "device"),
    "device 0": ("ee_delta", {"device": 0}, "bad_field", "device"),
    "deadline nil": ("ee_delta", {"deadline_ns": None}, "bad_field", "deadline_ns"),
    "deadline true": ("ee_delta", {"deadline_ns": True}, "bad_field", "deadline_ns"),
    "deadline float": ("ee_delta", {"deadline_ns": 1e30}, "bad_field", "deadline_ns"),
    "seq true": ("ee_delta", {"seq": True}, "bad_field", "seq"),
    "t_mono_ns float": ("ee_delta", {"t_mono_ns": 1.5}, "bad_field", "t_mono_ns"),
    "type nil": ("ee_delta", {"type": None}, "unknown_type", "type"),
    "client int": ("ee_delta", {"client": 7}, "bad_field", "client"),
    "client empty": ("ee_delta", {"client": ""}, "bad_field", "client"),
    "seed true": ("reset", {"seed": True}, "bad_field", "seed"),
    "seed 1.0": ("reset", {"seed": 1.0}, "bad_field", "seed"),
    "task int": ("reset", {"task": 5}, "bad_field", "task"),
    "req_id nil": ("ping", {"req_id": None}, "bad_field", "req_id"),
    "req_id too long": ("ping", {"req_id": "x" * 1000}, "bad_field", "req_id"),
}


@pytest.mark.parametrize("case", sorted(TYPED))
def test_header_fields_need_their_exact_type(case, kin_server, raw_dealer, client_for):
    srv, arm = kin_server
    mtype, over, code, field = TYPED[case]
    arrays = (("action", "float32", [7]),) if mtype == "ee_delta" else ()
    frames = [pack_pairs(header_pairs(mtype, arrays, **over)), *([GOOD.tobytes()] if arrays else [])]
    r = ask(raw_dealer(srv.command_endpoint), frames)
    assert r.type == "error", f"{case}: accepted"
    assert (r["code"], r["field"]) == (code, field), r.meta
    assert r["req_id"] == ("rq-1" if "req_id" not in over else None)  # echoed whenever it could be read
    assert untouched(arm), f"{case}: the device was told to do something"
    client_for(srv).ping()  # still serving


# -- reset: seed and task ----------------------------------------------------------------------------
class TaskArm(KinematicArm):
    """A kinematic arm that lays out named tasks (as the simulator does)."""

    def describe(self):
        return {**super().describe(), "tasks": ["pick_red_cube", "place_in_bowl"]}

    def reset(self, seed=None, task=None):
        if seed is not None and seed < 0:
            raise ValueError("a driver would blow up on this")
        self.calls.append(("reset", seed, task))
        with self._lock:
            self._reset_state()
        return self.read_state()


@pytest.fixture
def task_server():
    arm = TaskArm()
    srv = DeviceServer(ArmService("arm", arm), "tcp://127.0.0.1:*", command_timeout_ms=200).start()
    yield srv, arm
    srv.stop()


@pytest.mark.parametrize("meta, code, field, hint", [
    ({"seed": -1}, "bad_field", "seed", "[0, 2**63)"),
    ({"seed": 2**63}, "bad_field", "seed", "[0, 2**63)"),
    ({"seed": 2**64 - 1}, "bad_field", "seed", "[0, 2**63)"),
    ({"task": "pick_red_cub"}, "unknown_task", "task", "Did you mean pick_red_cube"),
    ({"task": "fly"}, "unknown_task", "task", "Known: pick_red_cube, place_in_bowl"),
])
def test_reset_seed_and_task_are_checked_before_the_driver_without_a_traceback(meta, code, field, hint, task_server,
                                                                              raw_dealer, caplog):
    srv, arm = task_server
    caplog.set_level(logging.DEBUG, logger="robot_io")
    r = ask(raw_dealer(srv.command_endpoint), [pack_pairs(header_pairs("reset", (), **meta))])
    assert (r.type, r["code"], r["field"], r["req_id"]) == ("error", code, field, "rq-1"), r.meta
    assert hint in r["message"]
    assert untouched(arm), "a refused reset reached the driver"
    assert not [rec for rec in caplog.records if rec.exc_info or rec.levelno >= logging.WARNING], \
        "refused input must not log a traceback or a warning"
    # a good one goes through
    r = ask(raw_dealer(srv.command_endpoint), [pack_pairs(header_pairs("reset", (), seed=3, task="pick_red_cube"))])
    assert r.type == "reply" and arm.calls[-1] == ("reset", 3, "pick_red_cube")


def test_a_task_is_refused_by_an_arm_without_tasks(kin_server, raw_dealer):
    srv, arm = kin_server
    r = ask(raw_dealer(srv.command_endpoint), [pack_pairs(header_pairs("reset", (), task="pick_red_cube"))])
    assert (r.type, r["code"], r["field"]) == ("error", "unknown_task", "task")
    assert untouched(arm)


def test_the_sim_arm_lists_its_tasks_and_refuses_bad_resets_quietly(caplog):
    pytest.importorskip("mujoco")
    from hardware.sim_franka import SimFranka
    from hardware.sim_tasks import TASKS
    from robot_io.client import CommandError, DeviceClient

    srv = DeviceServer(ArmService("arm", SimFranka("arm", realtime=False)), "tcp://127.0.0.1:*").start()
    caplog.set_level(logging.DEBUG, logger="robot_io")
    try:
        with DeviceClient(srv.command_endpoint, "arm", 10.0) as c:
            assert c.describe()["tasks"] == sorted(TASKS)
            before = c.request("capture").arrays
            for meta, field in [({"seed": -1}, "seed"), ({"seed": 0, "task": "pick_red_cub"}, "task")]:
                with pytest.raises(CommandError) as e:
                    c.request("reset", **meta)
                assert e.value.field == field and e.value.code != "device_error"
            after = c.request("capture").arrays
            for k in ("q", "ee_pos", "objects"):
                np.testing.assert_array_equal(after[k], before[k])
            c.request("reset", seed=0, task="pick_red_cube")
    finally:
        srv.stop()
    assert not [rec for rec in caplog.records if rec.exc_info or rec.levelno >= logging.WARNING]


# -- the request id of refused messages -----------------------------------------------------------
def _cut_after_req_id() -> bytes:
    full = pack_pairs(header_pairs())
    return full[:len(full) // 2]  # past the req_id pair, before the end of the map


ECHO = {  # frames -> (code, field, echoed req_id)
    "truncated header": (lambda: [_cut_after_req_id(), GOOD.tobytes()], "bad_header", "header", "rq-1"),
    "garbage after req_id": (lambda: [pack_pairs(header_pairs())[:3 + len(msgpack.packb("req_id"))
                                                                 + len(msgpack.packb("rq-1"))] + b"\xc1\xc1",
                                      GOOD.tobytes()], "bad_header", "header", "rq-1"),
    "bad version": (lambda: [pack_pairs(header_pairs(v=2)), GOOD.tobytes()], "bad_version", "v", "rq-1"),
    "missing frame": (lambda: [pack_pairs(header_pairs())], "truncated", "arrays", "rq-1"),
    "extra frame": (lambda: [pack_pairs(header_pairs()), GOOD.tobytes(), b"x"], "truncated", "arrays", "rq-1"),
    "int req_id": (lambda: [pack_pairs(header_pairs(req_id=42, v=True)), GOOD.tobytes()], "bad_version", "v", 42),
    "two req_ids": (lambda: [pack_pairs(header_pairs() + [("req_id", "rq-2")]), GOOD.tobytes()],
                    "duplicate_field", "req_id", None),
    "not a map": (lambda: [msgpack.packb(["req_id", "rq-1"])], "bad_header", "header", None),
    "random bytes": (lambda: [b"\x93\xa6req_id\xa4rq-1\xff"], "bad_header", "header", None),
}


@pytest.mark.parametrize("case", sorted(ECHO))
def test_error_replies_echo_the_request_id_whenever_it_can_be_read(case, kin_server, raw_dealer):
    srv, arm = kin_server
    make, code, field, req_id = ECHO[case]
    r = ask(raw_dealer(srv.command_endpoint), make())
    assert (r.type, r["code"], r["field"]) == ("error", code, field), r.meta
    assert r["req_id"] == req_id
    assert untouched(arm)


def test_peek_req_id_reads_only_well_typed_unique_ids():
    from robot_io.wire import peek_req_id

    assert peek_req_id(pack_pairs([("req_id", "a"), ("v", 1)])) == "a"
    assert peek_req_id(pack_pairs([("v", 1), ("req_id", 7)])) == 7
    assert peek_req_id(pack_pairs([("req_id", True)])) is None
    assert peek_req_id(pack_pairs([("req_id", 1.5)])) is None
    assert peek_req_id(pack_pairs([("req_id", "a"), ("req_id", "a")])) is None
    assert peek_req_id(b"") is None and peek_req_id(b"\xc1") is None
