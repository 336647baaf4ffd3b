"""Property-based fuzz of the bridge's wire decoder and command path, against the simulated
Franka (fast mode: its physics only advances when a motion command is applied, so a refused
message must leave its state bit for bit as it was).

Every generated message is a well-formed command damaged by one to three mutations (a wrong type
per header field, a missing or duplicated field, duplicated arrays, a wrong dtype or shape,
non-finite values, missing / extra / short frames, random or truncated header bytes, bools for
ints, nils, unknown types and devices, bad reset seeds and tasks). Properties: the server answers
each with an ``error`` that has a code and names a field (exactly the damaged one when there is
one mutation), echoes the request id whenever the header still carries it readably, never calls
the arm, and keeps serving. A few hundred cases run by default; ``-m slow`` runs 10,000.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hardware.sim_tasks import TASKS  # noqa: E402  (numpy only)
from robot_io.server import MAX_SEED, ArmService, DeviceServer  # noqa: E402
from robot_io.wire import COMMAND_TYPES, PROTOCOL_VERSION, WIRE_DTYPES, decode  # noqa: E402

FAR = 2**62
MOTION = ("ee_delta", "joint_position")
BASE_TYPES = ("ee_delta", "joint_position", "reset", "ping", "heartbeat", "describe", "capture", "stop", "release")
ARM_CALLS = ("command_ee_pose", "command_joint_positions", "reset", "hold", "step")


def pack_pairs(pairs) -> bytes:
    """A msgpack map from (key, value) pairs in order, duplicates allowed."""
    return b"\xde" + len(pairs).to_bytes(2, "big") + b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in pairs)


SPECS = object()  # sentinel value in a header pair: replaced by the array specs when the frames are built


class Case:
    """A command under construction: header pairs (req_id first), arrays, and what is expected."""

    def __init__(self, mtype: str, req_id: str) -> None:
        self.mtype, self.req_id = mtype, req_id
        self.pairs = [("req_id", req_id), ("v", PROTOCOL_VERSION), ("type", mtype), ("device", "arm"), ("seq", 1),
                      ("t_mono_ns", 1), ("t_wall_ns", 1), ("arrays", SPECS), ("client", "fuzzer")]
        if mtype != "heartbeat":
            self.pairs.append(("deadline_ns", FAR))
        self.arrays: list[tuple[dict, bytes]] = []  # (spec, bytes)
        if mtype == "ee_delta":
            self.add_array("action", np.array([0.01, 0, 0, 0, 0, 0, 1], np.float32))
        elif mtype == "joint_position":
            self.add_array("q", np.zeros(7, np.float32))
        elif mtype == "reset":
            self.pairs += [("seed", 0), ("task", "pick_red_cube")]
        self.pristine = set(range(len(self.arrays)))  # arrays no mutation has touched yet
        self.mutations: list[str] = []
        self.fields: list[str] = []  # the field each mutation damaged (None: not known in advance)
        self.echo = True  # the req_id pair stays readable
        self.frames_override: list[bytes] | None = None
        self.extra_frames: list[bytes] = []
        self.drop_frames = 0

    def add_array(self, name: str, a: np.ndarray) -> None:
        self.arrays.append(({"name": name, "dtype": a.dtype.name, "shape": list(a.shape)}, a.tobytes()))

    def keys(self) -> list[str]:
        return [k for k, _ in self.pairs]

    def set(self, key: str, value) -> None:
        self.pairs = [(k, value if k == key else v) for k, v in self.pairs]
        if key not in self.keys():
            self.pairs.append((key, value))

    def frames(self) -> list[bytes]:
        if self.frames_override is not None:
            return self.frames_override
        pairs = [(k, [s for s, _ in self.arrays] if v is SPECS else v) for k, v in self.pairs]
        data = [b for _, b in self.arrays]
        if self.drop_frames:
            data = data[:-self.drop_frames]
        return [pack_pairs(pairs), *data, *self.extra_frames]


# -- values of the wrong type -------------------------------------------------------------------------
INT = st.integers(-2**63, 2**64 - 1)  # what msgpack can carry
ANY = st.one_of(st.none(), st.booleans(), INT, st.floats(allow_nan=True), st.text(max_size=20),
                st.binary(max_size=20), st.lists(INT, max_size=3),
                st.dictionaries(st.text(max_size=5), INT, max_size=2))
NOT_INT = ANY.filter(lambda x: type(x) is not int)
NOT_STR = ANY.filter(lambda x: type(x) is not str)
BAD_ID = st.one_of(ANY.filter(lambda x: type(x) not in (str, int)), st.just(""), st.text(min_size=129, max_size=200))
WRONG = {  # header field -> values it must refuse (whatever the message type)
    "v": ANY.filter(lambda x: not (type(x) is int and x == PROTOCOL_VERSION)),
    "type": st.one_of(NOT_STR, st.text(max_size=20).filter(lambda t: t not in COMMAND_TYPES),
                      st.sampled_from(["state", "frame", "reply", "error"])),
    "device": st.one_of(NOT_STR, st.text(min_size=1, max_size=20).filter(lambda t: t != "arm")),
    "seq": NOT_INT, "t_mono_ns": NOT_INT, "t_wall_ns": NOT_INT,
    "arrays": ANY.filter(lambda x: type(x) is not list),
    "deadline_ns": st.one_of(NOT_INT, st.integers(-2**63, 10**9)),  # nil, bool, float, ... or long past
    "req_id": BAD_ID, "client": st.one_of(NOT_STR, st.just(""), st.text(min_size=129, max_size=200)),
    "seed": ANY.filter(lambda x: type(x) not in (int, type(None))),
    "task": ANY.filter(lambda x: type(x) not in (str, type(None))),
    "index": NOT_INT, "code": NOT_STR, "message": NOT_STR,
}
REQUIRED = ("v", "type", "device", "seq", "t_mono_ns", "t_wall_ns", "arrays", "req_id", "deadline_ns")
BAD_SHAPES = st.one_of(st.just([]), st.just([6]), st.just([8]), st.just([1, 7]), st.just([7, 1]), st.just([0]))
BAD_SPEC_SHAPES = st.one_of(st.lists(st.integers(-5, -1), min_size=1, max_size=2), st.just([True] * 7),
                            st.just([7.0]), st.just("7"), st.none(), st.just([1] * 9))


@st.composite
def mutate(draw, c: Case) -> None:
    kinds = ["wrong_type", "wrong_type", "missing", "duplicate_key", "duplicate_array", "frames", "header_bytes"]
    if c.mtype in MOTION and c.pristine:
        kinds += ["bad_dtype", "bad_shape", "non_finite", "missing_array", "bad_spec_shape"] * 2
    if c.mtype == "reset":
        kinds += ["bad_seed", "bad_task"] * 2
    kind = draw(st.sampled_from(kinds))
    c.mutations.append(kind)
    field = None
    if kind == "wrong_type":
        field = draw(st.sampled_from(sorted(WRONG)))
        value = draw(WRONG[field])
        c.set(field, value)
        if field == "req_id":
            c.echo = False
        if field == "type" and value in ("frame", "error"):  # a schema type: its own required fields come first
            field = None
    elif kind == "missing":
        present = [k for k in REQUIRED if k in c.keys()]
        field = draw(st.sampled_from(present))
        c.pairs = [(k, v) for k, v in c.pairs if k != field]
        c.echo &= field != "req_id"
    elif kind == "duplicate_key":
        field = draw(st.sampled_from(c.keys()))
        value = dict(c.pairs)[field] if draw(st.booleans()) else draw(ANY)
        c.pairs.insert(draw(st.integers(0, len(c.pairs))), (field, value))
        c.echo &= field != "req_id"
    elif kind == "duplicate_array":
        name = c.arrays[0][0]["name"] if c.arrays else draw(st.sampled_from(["action", "q", "x"]))
        if not c.arrays:
            c.add_array(name, np.zeros(3, np.float32))
        c.add_array(name, draw(st.sampled_from([np.full(7, np.nan, np.float32), np.zeros(7, np.float32),
                                                 np.zeros(2, np.uint8)])))
        c.pristine = set()  # removing one of the two later would make the message valid again
        field = name
    elif kind == "frames":
        how = draw(st.sampled_from(["extra", "drop", "short"] if c.arrays else ["extra"]))
        if how == "extra":
            c.extra_frames += draw(st.lists(st.binary(max_size=32), min_size=1, max_size=3))
        elif how == "drop":
            c.drop_frames = draw(st.integers(1, len(c.arrays)))
        else:
            i = draw(st.integers(0, len(c.arrays) - 1))
            c.pristine.discard(i)
            spec, data = c.arrays[i]
            cut = draw(st.integers(0, max(0, len(data) - 1)))
            c.arrays[i] = (spec, data[:cut] + (draw(st.binary(min_size=len(data) + 1, max_size=len(data) + 8))
                                               if draw(st.booleans()) else b""))
            field = spec["name"]
        field = field or "arrays"
        if how == "short" and len(c.mutations) == 1:
            field = spec["name"]
    elif kind == "header_bytes":
        frames = c.frames()
        how = draw(st.sampled_from(["random", "truncate", "not_a_map", "empty"]))
        if how == "random":
            head = draw(st.binary(min_size=1, max_size=80))
        elif how == "truncate":
            prefix = len(pack_pairs([("req_id", c.req_id)]))  # map header + the req_id pair
            cut = draw(st.integers(0, len(frames[0]) - 1))
            head = frames[0][:cut]
            c.echo &= cut >= prefix and c.keys()[:1] == ["req_id"] and "req_id" not in c.keys()[1:]
        elif how == "not_a_map":
            head = msgpack.packb(draw(st.one_of(st.lists(INT, max_size=3), INT, st.text())))
        else:
            head = b""
        if how != "truncate":
            c.echo = False
        c.frames_override = [head, *frames[1:]]
        field = "header"
    elif kind in ("bad_dtype", "bad_shape", "non_finite", "missing_array", "bad_spec_shape"):
        i = draw(st.sampled_from(sorted(c.pristine)))
        c.pristine.discard(i)
        spec, data = c.arrays[i]
        a = np.frombuffer(data, np.dtype(spec["dtype"])).reshape(spec["shape"])
        field = spec["name"]
        if kind == "bad_dtype":
            dt = draw(st.sampled_from(sorted(WIRE_DTYPES - {"float32"}) + ["object", "float128", ">f4", "<f4", "f4"]))
            if dt in WIRE_DTYPES:
                with np.errstate(invalid="ignore"):
                    c.arrays[i] = ({**spec, "dtype": dt}, a.astype(dt).tobytes())
            else:
                c.arrays[i] = ({**spec, "dtype": dt}, data)
        elif kind == "bad_shape":
            shape = draw(BAD_SHAPES)
            c.arrays[i] = ({**spec, "shape": shape}, np.zeros(shape, np.float32).tobytes())
        elif kind == "bad_spec_shape":
            c.arrays[i] = ({**spec, "shape": draw(BAD_SPEC_SHAPES)}, data)
        elif kind == "non_finite":
            b = a.copy()
            b[draw(st.integers(0, b.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
            c.arrays[i] = (spec, b.tobytes())
        else:
            del c.arrays[i]
            c.pristine = set()  # indices moved
    elif kind == "bad_seed":
        field = "seed"
        c.set("seed", draw(st.one_of(st.integers(-2**63, -1), st.integers(MAX_SEED + 1, 2**64 - 1))))
    elif kind == "bad_task":
        field = "task"
        c.set("task", draw(st.text(max_size=30).filter(lambda t: t not in TASKS)))
    c.fields.append(field)


@st.composite
def malformed(draw) -> Case:
    c = Case(draw(st.sampled_from(BASE_TYPES)), f"fz-{draw(st.integers(0, 10**6 - 1)):06d}")
    for _ in range(draw(st.sampled_from([1, 1, 1, 1, 2, 3]))):  # mostly one: then the field named is checked
        if c.frames_override is not None:  # the header bytes are gone: nothing left to damage
            break
        draw(mutate(c))
    return c


# -- the server under fuzz ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim_arm_server():
    pytest.importorskip("mujoco")
    from hardware.sim_franka import SimFranka

    arm = SimFranka("arm", realtime=False)
    srv = DeviceServer(ArmService("arm", arm), "tcp://127.0.0.1:*", command_timeout_ms=200).start()
    from robot_io.client import DeviceClient

    with DeviceClient(srv.command_endpoint, "arm", 10.0) as c:
        c.request("reset", seed=0, task="pick_red_cube")
    calls = {name: 0 for name in ARM_CALLS}
    for name in ARM_CALLS:  # count every call that could move or reset the arm from here on
        method = getattr(arm, name)

        def counted(*a, _m=method, _n=name, **kw):
            calls[_n] += 1
            return _m(*a, **kw)

        setattr(arm, name, counted)
    yield srv, arm, calls
    srv.stop()


def _state(arm):
    s = arm.read_state()
    return np.concatenate([s.q, s.ee_pos, s.ee_quat, [s.gripper], s.extras["objects"].ravel(), s.extras["sim_time"]])


def _fuzz(sim_arm_server, raw_dealer, client_for, n: int, derandomize: bool) -> None:
    srv, arm, calls = sim_arm_server
    sock = raw_dealer(srv.command_endpoint)
    before = _state(arm)
    seen: dict[str, int] = {}

    @settings(max_examples=n, deadline=None, database=None, derandomize=derandomize,
              suppress_health_check=list(HealthCheck))
    @given(case=malformed())
    def run(case: Case) -> None:
        sock.send_multipart(case.frames())
        assert sock.poll(5000), f"no reply to {case.mutations}"
        r = decode(sock.recv_multipart())
        what = f"{case.mtype} {case.mutations} {case.fields}: {r.meta}"
        assert r.type == "error", f"accepted: {what}"
        assert isinstance(r["code"], str) and r["code"] and r["code"] != "device_error", what
        assert isinstance(r.get("field"), str) and r["field"], f"no field named: {what}"
        if len(case.fields) == 1 and case.fields[0] is not None:
            assert r["field"] == case.fields[0], f"wrong field: {what}"
        if case.echo:
            assert r["req_id"] == case.req_id, f"request id not echoed: {what}"
        assert not any(calls.values()), f"the arm was called: {calls} after {what}"
        seen[r["code"]] = seen.get(r["code"], 0) + 1

    run()
    np.testing.assert_array_equal(_state(arm), before, err_msg="the arm's state changed")
    assert srv.stats["errors"] >= n
    c = client_for(srv)  # still serving, and still obeying
    assert c.ping() < 1.0
    c.request("ee_delta", {"action": np.array([0.0, 0, 0, 0, 0, 0, 1], np.float32)})
    assert calls["command_ee_pose"] == 1
    print(f"\nfuzz: {sum(seen.values())} malformed messages refused, codes {dict(sorted(seen.items()))}")


def test_fuzz_malformed_commands_are_refused_naming_the_field(sim_arm_server, raw_dealer, client_for):
    _fuzz(sim_arm_server, raw_dealer, client_for, n=600, derandomize=True)


@pytest.mark.slow
def test_fuzz_10k_malformed_commands_are_refused_naming_the_field(sim_arm_server, raw_dealer, client_for):
    _fuzz(sim_arm_server, raw_dealer, client_for, n=10_000, derandomize=False)
