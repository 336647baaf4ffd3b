"""The policy server (deploy.server) and its thin client (deploy.runtime.client): the request / reply
round trip over the bridge's wire format, refusals that name the field while the server keeps
serving, chunk blending that removes the jump at chunk boundaries, deadlines."""

from __future__ import annotations

import textwrap
import time

import numpy as np
import pytest
import zmq

from deploy.runtime.blend import ChunkBlender, boundary_jumps
from deploy.runtime.client import ClientConfig, PolicyLink, PolicyRefused, ServerGone, run_client
from deploy.server import PolicyServer
from robot_io.wire import Message, decode, encode
from tests.deploy.fake_policy import OffsetSource


@pytest.fixture
def offset_server():
    srv = PolicyServer(OffsetSource(), "tcp://127.0.0.1:*").start()
    yield srv
    srv.stop()


def _obs(cams=("front",), size=16, state=None):
    return {"images": {c: np.full((size, size, 3), 7, np.uint8) for c in cams},
            "state": np.zeros(8, np.float32) if state is None else state, "instruction": "test"}


def test_round_trip_through_the_wire(offset_server):
    with PolicyLink(offset_server.endpoint) as link:
        desc = link.describe(5.0)
        assert desc["horizon"] == 10 and desc["action_dim"] == 7 and desc["policy"] == "offset"
        link.request_chunk(_obs(), tick=12, deadline_s=5.0)
        deadline = time.monotonic() + 5
        got = []
        while not got and time.monotonic() < deadline:
            got = link.poll(0.5)
        (reply, entry), = got
    assert reply.type == "chunk" and reply["tick"] == 12 and entry["tick"] == 12
    chunk = reply.arrays["actions"]
    assert chunk.dtype == np.float32 and chunk.shape == (10, 7)
    np.testing.assert_allclose(chunk, OffsetSource.base(12 + np.arange(10)) + 0.004, atol=1e-7)
    assert reply["infer_ns"] > 0 and reply["server_ns"] >= reply["infer_ns"]


def test_round_trip_with_the_tiny_compact_vla_steered_by_dsrl(tmp_path):
    """Any VLA behind vla.models' interface, loaded as `vla serve` loads it, plus the RL hook: a DSRL
    agent's noise actor (its mean) chooses the sampler's noise, so the served chunk is exactly the
    agent's deterministic chunk (an unsteered sampler draws random noise and would not match)."""
    torch = pytest.importorskip("torch")
    from deploy.server import load_source
    from policies.common.sac_config import SACConfig
    from policies.dsrl import DSRLAgent, DSRLConfig
    from tests.conftest import save_tiny_vla
    from vla.models import load_vla

    ckpt = save_tiny_vla(str(tmp_path / "vla"), extra={"instructions": ["pick up the red cube"]})
    agent = DSRLAgent(load_vla(ckpt), DSRLConfig(sac=SACConfig(hidden=(32, 32), num_critics=2)), seed=3)
    with torch.no_grad():  # a trained-looking actor: its mean depends on the observation
        agent.sac.actor.mean.weight.normal_(0, 0.3)
    (tmp_path / "rl").mkdir()
    torch.save(agent.state_dict(), tmp_path / "rl" / "agent.pt")
    source = load_source(ckpt, rl_run=str(tmp_path / "rl"), device="cpu")
    assert source.warmup() > 0  # what `vla serve` does before it binds
    obs = _obs(("front", "wrist"), 64, state=np.linspace(-1, 1, 8).astype(np.float32))
    obs["instruction"] = "pick up the red cube"
    with PolicyServer(source, "tcp://127.0.0.1:*") as srv, PolicyLink(srv.endpoint) as link:
        desc = link.describe(5.0)
        assert desc["cameras"] == ["front", "wrist"] and desc["instructions"] == ["pick up the red cube"]
        assert desc["steered"] and "dsrl" in desc["policy"]
        reply = link.call("policy_request", 120.0, {"state": obs["state"], **{f"image_{c}": v for c, v in
                                                                              obs["images"].items()}},
                          tick=3, instruction=obs["instruction"])
    chunk = reply.arrays["actions"]
    assert reply.type == "chunk" and reply["tick"] == 3 and chunk.shape == (desc["horizon"], 7)
    loaded = source.noise.agent
    batch = {"images": {c: v[None] for c, v in obs["images"].items()}, "state": obs["state"][None],
             "instruction": [obs["instruction"]]}
    with torch.no_grad():
        feat = source.vla.embed(batch)
        want = loaded.chunk(feat, loaded.act(feat, np.random.default_rng(0), warmup=False, deterministic=True))
    np.testing.assert_allclose(chunk, want[0].numpy(), atol=1e-5)


def test_zero_noise_serves_the_deterministic_chunk_vla_eval_measures(tmp_path):
    """`vla serve --noise zero`: every chunk starts the sampler from 0, as `vla eval --noise zero` does, so the same
    observation gets the same chunk; the default draws afresh. With a DSRL run the actor chooses: refused."""
    torch = pytest.importorskip("torch")
    from deploy.server import load_source
    from tests.conftest import save_tiny_vla

    ckpt = save_tiny_vla(str(tmp_path / "vla"), extra={"instructions": ["pick up the red cube"],
                                                       "execution": {"gripper": "binary"}})
    obs = _obs(("front", "wrist"), 64, state=np.linspace(-1, 1, 8).astype(np.float32))
    obs["instruction"] = "pick up the red cube"
    zero, sample = load_source(ckpt, device="cpu", noise="zero"), load_source(ckpt, device="cpu")
    assert zero.describe()["noise"] == "zero" and not zero.describe()["steered"]
    assert sample.describe()["noise"] == "sample"
    assert sample.describe()["gripper"] == "binary"  # the checkpoint's execution.gripper: a client's auto
    a, b = zero(obs), zero(obs)
    np.testing.assert_array_equal(a, b)
    batch = {"images": {c: v[None] for c, v in obs["images"].items()}, "state": obs["state"][None],
             "instruction": [obs["instruction"]]}
    with torch.no_grad():
        want = zero.vla.sample_actions(batch, noise=torch.zeros(1, *zero.vla.noise_shape))[0].numpy()
    np.testing.assert_allclose(a, want, atol=1e-6)
    assert not np.allclose(sample(obs), sample(obs))
    with pytest.raises(ValueError, match="--noise zero and --rl-run"):
        load_source(ckpt, rl_run=str(tmp_path / "rl"), device="cpu", noise="zero")
    with pytest.raises(ValueError, match="noise must be"):
        load_source(ckpt, device="cpu", noise="mean:4")


def _raw(sock, header: dict, arrays: dict | None = None) -> Message:
    meta = {"req_id": "r1", "deadline_ns": time.monotonic_ns() + 10**10, "tick": 0, "instruction": "x", **header}
    mtype = meta.pop("type", "policy_request")
    sock.send_multipart(encode(Message(mtype, "policy", arrays or {}, meta)))
    assert sock.poll(5000), "the server did not answer"
    return decode(sock.recv_multipart())


GOOD = {"state": np.zeros(8, np.float32), "image_front": np.zeros((8, 8, 3), np.uint8)}


@pytest.mark.parametrize("header, arrays, code, field", [
    ({}, {"image_front": GOOD["image_front"]}, "missing_field", "state"),
    ({}, {**GOOD, "state": np.zeros(8, np.float64)}, "bad_dtype", "state"),
    ({}, {**GOOD, "state": np.zeros(6, np.float32)}, "bad_shape", "state"),
    ({}, {**GOOD, "state": np.array([0, 0, np.nan, 0, 0, 0, 0, 0], np.float32)}, "non_finite", "state"),
    ({}, {"state": GOOD["state"]}, "missing_field", "image_front"),
    ({}, {**GOOD, "image_front": np.zeros((8, 8), np.uint8)}, "bad_shape", "image_front"),
    ({}, {**GOOD, "image_front": np.zeros((8, 8, 3), np.float32)}, "bad_dtype", "image_front"),
    ({"tick": -1}, GOOD, "bad_field", "tick"),
    ({"tick": 1.5}, GOOD, "bad_field", "tick"),
    ({"instruction": 3}, GOOD, "bad_field", "instruction"),
    ({"instruction": "x" * 2000}, GOOD, "bad_field", "instruction"),
    ({"type": "ee_delta"}, GOOD, "unknown_type", "type"),
])
def test_malformed_request_gets_an_error_naming_the_field_and_the_server_keeps_serving(header, arrays, code, field):
    srv = PolicyServer(OffsetSource(cameras=["front"]), "tcp://127.0.0.1:*").start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(srv.endpoint)
    try:
        err = _raw(sock, header, arrays)
        assert err.type == "error" and err["code"] == code and err["field"] == field, err.meta
        assert err["req_id"] == "r1"
        sock.send_multipart([b"\xc1garbage"])  # not even msgpack
        assert sock.poll(5000)
        assert decode(sock.recv_multipart())["code"] == "bad_header"
        ok = _raw(sock, {"req_id": "r2", "tick": 4}, GOOD)  # the server still serves
        assert ok.type == "chunk" and ok["req_id"] == "r2" and ok["tick"] == 4
    finally:
        sock.close()
        srv.stop()


class _Failing(OffsetSource):
    def __call__(self, obs):
        if obs["tick"] == 1:
            raise RuntimeError("CUDA out of memory")
        if obs["tick"] == 2:
            return np.full((10, 7), np.nan, np.float32)
        return super().__call__(obs)


def test_a_failing_model_is_an_error_reply_not_a_dead_server():
    with PolicyServer(_Failing(), "tcp://127.0.0.1:*") as srv, PolicyLink(srv.endpoint) as link:
        with pytest.raises(PolicyRefused, match="CUDA out of memory") as e:
            link.call("policy_request", 5.0, {"state": np.zeros(8, np.float32)}, tick=1, instruction="x")
        assert e.value.code == "policy_error"
        with pytest.raises(PolicyRefused, match="NaN") as e:
            link.call("policy_request", 5.0, {"state": np.zeros(8, np.float32)}, tick=2, instruction="x")
        assert e.value.field == "actions"
        ok = link.call("policy_request", 5.0, {"state": np.zeros(8, np.float32)}, tick=3, instruction="x")
        assert ok.type == "chunk" and ok["tick"] == 3


# -- blending -------------------------------------------------------------------------------------
def _simulate(mode: str, horizon: int = 10, refill: int = 5, latency: int = 2, ticks: int = 120):
    """The client's schedule without the network: a request when `refill` rows are left, its chunk
    `latency` ticks later, from OffsetSource. -> (rows [T, 7], sources)."""
    src, bl = OffsetSource(horizon), ChunkBlender(mode)
    bl.add(src({"tick": 0}), 0, 0)
    pending, rows, sources = None, [], []
    for k in range(ticks):
        if pending is not None and k >= pending + latency:
            bl.add(src({"tick": pending}), pending, k)
            pending = None
        if pending is None and bl.remaining(k) <= refill:
            pending = k
        row, s = bl.action(k)
        rows.append(row)
        sources.append(s)
    return np.stack(rows), sources


def test_blending_removes_the_jump_at_chunk_boundaries():
    jumps = {m: boundary_jumps(*_simulate(m)) for m in ("none", "ensemble", "crossfade")}
    plan_gap = 2 * 0.004 * np.sqrt(7)  # consecutive plans differ by 2 * offset in each of 7 dims
    within = jumps["none"]["within"]["max"]
    assert within < 0.2 * plan_gap  # the trajectory itself is smooth
    # without blending every boundary jumps by the whole disagreement of the plans
    assert jumps["none"]["boundary"]["n"] >= 15
    assert jumps["none"]["boundary"]["max"] == pytest.approx(plan_gap, abs=within)
    # ensemble: two half-size steps (the new chunk joins the mean, the old one leaves it)
    assert jumps["ensemble"]["boundary"]["max"] == pytest.approx(plan_gap / 2, abs=within)
    # crossfade over the 3-row overlap: steps of a quarter of the gap
    assert jumps["crossfade"]["boundary"]["max"] == pytest.approx(plan_gap / 4, abs=within)


def test_crossfade_weights_and_stale_rows():
    bl = ChunkBlender("crossfade")
    bl.add(np.zeros((6, 1)), start=0, arrival=0)
    bl.add(np.ones((6, 1)), start=2, arrival=3)  # rows for ticks 2 (stale: arrived before tick 3) .. 7
    out = [bl.action(t)[0][0] for t in range(8)]
    # overlap ticks 3, 4, 5 (the old chunk ends at 6): weights 1/4, 2/4, 3/4, then the new one alone
    np.testing.assert_allclose(out, [0, 0, 0, 0.25, 0.5, 0.75, 1, 1])
    assert bl.action(8) == (None, ()) and bl.remaining(8) == 0  # nothing covers tick 8: the queue ran dry


def test_ensemble_is_acts_weighted_mean():
    bl = ChunkBlender("ensemble", m=0.5)
    bl.add(np.zeros((4, 1)), 0, 0)
    bl.add(np.ones((4, 1)), 1, 1)
    w = np.exp(-0.5 * np.arange(2))
    assert bl.action(1)[0][0] == pytest.approx(w[1] / w.sum())
    assert bl.action(4)[0][0] == 1.0


# -- the client loop against a bridge arm ---------------------------------------------------------
@pytest.fixture
def kinematic_robot(tmp_path):
    from robot_io.robot import RobotClient
    from robot_io.server import ArmService, DeviceServer
    from tests.mocks.fake_arm import KinematicArm

    arm = KinematicArm()
    srv = DeviceServer(ArmService("arm", arm), "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", command_timeout_ms=1000)
    srv.start()
    site = tmp_path / "kin.yaml"
    site.write_text(textwrap.dedent(f"""\
        name: kin
        robot: {{arm: arm, cameras: []}}
        devices:
          arm: {{driver: sim_franka, command: "{srv.command_endpoint}", stream: "{srv.stream_endpoint}"}}
        """))
    with RobotClient(str(site), sync=False, timeout_s=10) as robot:
        robot.reset(1)
        yield robot, arm
    srv.stop()


def test_client_loop_blends_the_served_chunks(kinematic_robot, offset_server):
    """The whole client (asynchronous requests, deadlines, blending) against the fake server: the
    executed actions jump at chunk boundaries without blending and do not with crossfade."""
    robot, arm = kinematic_robot
    res = {}
    for mode in ("none", "crossfade"):
        with PolicyLink(offset_server.endpoint) as link:
            res[mode] = run_client(robot, link, "test", ClientConfig(hz=10, seconds=2.5, blend=mode, deadline_s=5.0),
                                   horizon=10)
        assert arm.safe, "the client stops the arm at the end"
        robot.reset(1)
    plan_gap = 2 * 0.004 * np.sqrt(7)
    for mode, s in res.items():
        # every due tick is executed or skipped (a starved machine skips many: boundaries that straddle a
        # skipped tick are not compared, so only at least one compared boundary is required)
        assert s["ticks"] + s["skipped_ticks"] == 25 and s["replies"] >= 2 and s["call_deadline_misses"] == 0, s
        assert s["jump"]["boundary"]["n"] >= 1, s["jump"]
    assert res["none"]["jump"]["boundary"]["max"] > 0.8 * plan_gap
    # crossfade: the new plan takes over in steps of at most half the disagreement (overlap >= 1 row)
    assert res["crossfade"]["jump"]["boundary"]["max"] < 0.6 * plan_gap


def test_no_server_at_all_stops_the_arm_within_the_first_deadline(kinematic_robot):
    from tests.net import free_ports

    robot, arm = kinematic_robot
    robot.ee_delta(np.zeros(7, np.float32))  # the arm is active
    assert not arm.safe
    with PolicyLink(f"tcp://127.0.0.1:{free_ports(1)[0]}") as link:
        t0 = time.monotonic()
        with pytest.raises(ServerGone, match="gone"):
            run_client(robot, link, "test", ClientConfig(deadline_s=0.3, first_deadline_s=0.3))
    assert time.monotonic() - t0 < 0.3 + 1.0
    assert arm.safe


# -- CurveZMQ and the command lines ---------------------------------------------------------------
def test_off_loopback_needs_curve_keys_on_both_ends(tmp_path):
    from robot_io.security import SecurityError, keys_from_dir, make_keys
    from tests.net import free_ports

    port = free_ports(1)[0]
    with pytest.raises(SecurityError, match="--insecure"):
        PolicyServer(OffsetSource(), f"tcp://0.0.0.0:{port}").bind()
    with pytest.raises(SecurityError, match="--keys"):
        PolicyLink("tcp://192.0.2.1:5700")  # off loopback, no keys: refused before connecting
    make_keys(str(tmp_path / "keys"))
    keys = keys_from_dir(str(tmp_path / "keys"))
    with PolicyServer(OffsetSource(), f"tcp://0.0.0.0:{port}", keys=keys) as srv:
        with PolicyLink(f"tcp://127.0.0.1:{port}", keys) as link:
            assert link.describe(5.0)["policy"] == "offset"
        with PolicyLink(f"tcp://127.0.0.1:{port}") as plain, pytest.raises(ServerGone):
            plain.describe(0.5)  # without the keys the server never hears it
        assert srv.stats["chunks"] == 0


def test_help_teaches():
    from deploy.runtime.client_cli import build_parser
    from vla.cli import build_parser as vla_parser

    text = build_parser().format_help()
    for s in ("examples:", "vla-client --server", "crossfade", "ensemble", "safe state", "--deadline", "CurveZMQ"):
        assert s in text, s
    sub = vla_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    assert "examples:" in sub and "vla serve --checkpoint" in sub and "--rl-run" in sub


class _GripperSource(OffsetSource):
    """OffsetSource whose gripper opening alternates 0.3 / 0.7 from chunk to chunk: blended rows lie in
    between, around the 0.5 threshold. It names ``binary`` as its checkpoint's executed opening."""

    def describe(self) -> dict:
        return {**super().describe(), "gripper": "binary"}

    def __call__(self, obs: dict) -> np.ndarray:
        chunk = super().__call__(obs)
        chunk[:, 6] = 0.3 if self.calls % 2 else 0.7
        return chunk


def test_the_client_snaps_the_blended_opening_when_binary(kinematic_robot):
    """`vla-client --gripper binary`: every opening sent to the arm is 0 or 1, after the crossfade (raw sends
    the blend's in-between values); the other columns are the raw run's rows."""
    robot, arm = kinematic_robot
    srv = PolicyServer(_GripperSource(), "tcp://127.0.0.1:*").start()
    try:
        assert PolicyLink(srv.endpoint).describe(5.0)["gripper"] == "binary"
        sent = {}
        for mode in ("raw", "binary"):
            arm.calls.clear()
            rows = []
            with PolicyLink(srv.endpoint) as link:
                run_client(robot, link, "test", ClientConfig(hz=10, seconds=2.0, blend="crossfade", deadline_s=5.0,
                                                             gripper=mode),
                           horizon=10, on_tick=lambda k, row, src: rows.append(row))
            sent[mode] = np.array([c[3] for c in arm.motion_calls() if c[0] == "ee_pose"], np.float64)
            executed = np.array([r for r in rows if r is not None])
            assert len(executed) >= 5
            if mode == "binary":
                assert set(np.unique(executed[:, 6])) <= {0.0, 1.0}
            robot.reset(1)
        assert set(np.unique(np.round(sent["binary"], 6))) <= {0.0, 1.0}
        assert ((sent["raw"] > 0.31) & (sent["raw"] < 0.69)).any(), "the raw crossfade should blend the openings"
    finally:
        srv.stop()
    with pytest.raises(ValueError, match="gripper"):
        ClientConfig(gripper="half")
