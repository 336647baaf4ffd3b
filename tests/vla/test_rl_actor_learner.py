"""`vla rl --role learner | actor`: the wire of the actor-learner link, a loopback session on the
fast sim Franka, parameter pushes, the actor's learner timeout, and a learner SIGKILL + --resume
that the actor survives."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import pytest

from robot_io.wire import ProtocolError
from session.actor import Actor, ActorConfig
from session.learner import Learner
from session.protocol import (MESSAGE_TYPES, PROTOCOL_VERSION, LearnerGone, TransitionSpec, _msg, check_transition, field,
                              pack, transition_message, unpack)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = dict(max_episode_ticks=16, warmup_steps=2, utd=1, batch_size=8, num_critics=2, hidden=(32,), eval_every=0,
             eval_episodes=1, videos=0)
SPEC = TransitionSpec(obs={"feat": ((6,), np.float32)}, action_dim=14, chunk_shape=(2, 7))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, timeout_s: float, what: str, tick=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        tick() if tick is not None else time.sleep(0.01)


def _transition(spec: TransitionSpec, seq: int = 0, episode: int = 0, end: bool = False, rng=None, **over):
    rng = rng or np.random.default_rng(seq)
    feat_dim = spec.obs["feat"][0][0]
    tr = dict(obs={"feat": rng.standard_normal(feat_dim).astype(np.float32)},
              action=rng.uniform(-1, 1, spec.action_dim).astype(np.float32), reward=0.0,
              next_obs={"feat": rng.standard_normal(feat_dim).astype(np.float32)}, done=False,
              chunk=rng.uniform(-1, 1, spec.chunk_shape).astype(np.float32), intervention=False)
    tr.update(over)
    info = {"seed": 7, "success": False, "ticks": 16, "steps": 2, "return": 0.0, "interventions": 0}
    return tr, transition_message("actor-x", seq, episode, tr, 8, end, info, 0)


# -- the wire, no torch ---------------------------------------------------------------------------
_EXAMPLES = {
    "hello": dict(actor_id="a", next_seq=-1, params_version=-1),
    "heartbeat": dict(actor_id="a", next_seq=3, params_version=2),
    "eval": dict(actor_id="a", kind="periodic", episode=4, total_ticks=80, successes=1, episodes=2, params_version=9),
    "bye": dict(actor_id="a", next_seq=12, final={"successes": 1, "episodes": 2, "params_version": 4}),
    "welcome": dict(learner_id="l", config={"task": "pick_red_cube", "hidden": [32]}, vla_sha256="ab" * 32,
                    next_seq=4, durable=2, episode=1, ticks=32, version=3, need_base_eval=True),
    "ack": dict(learner_id="l", received=5, learned=4, durable=2, version=3, finished=False),
    "error": dict(code="gap", message="transition 9 arrived", field="seq", expected=5),
}


@pytest.mark.parametrize("mtype", sorted(MESSAGE_TYPES))
def test_every_message_type_round_trips(mtype):
    if mtype == "transition":
        _, msg = _transition(SPEC, seq=5, end=True)
    elif mtype == "params":
        msg = _msg("params", "learner", {"trunk.0.weight": np.ones((3, 2), np.float32)}, learner_id="l", version=2,
                   step=7)
    else:
        msg = _msg(mtype, "x", **_EXAMPLES[mtype])
    out = unpack(pack(msg))
    assert out.type == mtype and out.v == PROTOCOL_VERSION and out.seq == msg.seq
    assert out.meta == msg.meta
    assert set(out.arrays) == set(msg.arrays)
    for k in msg.arrays:
        np.testing.assert_array_equal(out.arrays[k], msg.arrays[k])
        assert out.arrays[k].dtype == msg.arrays[k].dtype
    for f in MESSAGE_TYPES[mtype].fields:
        assert f in out.meta
    if mtype == "transition":
        t = check_transition(out, SPEC, episode=0)
        assert t.seq == 5 and t.episode_end and t.info["seed"] == 7 and t.ticks == 8


def _header_edit(frames, **kw):
    h = msgpack.unpackb(frames[0])
    h.update(kw)
    return [msgpack.packb(h), *frames[1:]]


def test_wire_refuses_other_versions_types_and_fields_by_name():
    _, msg = _transition(SPEC)
    frames = pack(msg)
    with pytest.raises(ProtocolError) as e:
        unpack(_header_edit(frames, v=PROTOCOL_VERSION + 1))
    assert e.value.field == "v"
    with pytest.raises(ProtocolError) as e:
        unpack(_header_edit(frames, type="transitions"))
    assert e.value.code == "unknown_type" and e.value.field == "type"
    with pytest.raises(ProtocolError) as e:  # a bridge message type is not one of this link's
        unpack(_header_edit(frames, type="ee_delta"))
    assert e.value.field == "type"
    with pytest.raises(ProtocolError) as e:
        check_transition(unpack(_header_edit(frames, done=1)), SPEC)
    assert e.value.field == "done"
    with pytest.raises(ProtocolError) as e:
        field(unpack(_header_edit(frames, reward=float("inf"))), "reward", float)
    assert e.value.code == "non_finite" and e.value.field == "reward"


def test_a_time_limit_cut_and_the_rows_cross_the_wire_and_a_contradiction_is_refused():
    """The value target's facts (issue 61): ``truncated`` travels as a bool and ``rows`` is the message's ticks; a
    step both terminal and cut by the time limit, or a non-bool ``truncated``, is refused naming the field."""
    tr, msg = _transition(SPEC, end=True, truncated=True)
    t = check_transition(unpack(pack(msg)), SPEC, episode=0)
    assert t.tr["truncated"] is True and t.tr["rows"] == 8 and t.tr["rows"].dtype == np.int32
    frames = pack(msg)
    for bad in (1, "yes", None):
        with pytest.raises(ProtocolError) as e:
            check_transition(unpack(_header_edit(frames, truncated=bad)), SPEC)
        assert e.value.field == "truncated"
    with pytest.raises(ProtocolError) as e:
        check_transition(unpack(_header_edit(frames, done=True)), SPEC)
    assert e.value.field == "truncated"


def test_an_agents_episode_log_crosses_the_wire_and_a_malformed_one_is_refused_by_name():
    """``episode_info.agent`` (``Agent.episode_log``: SARL's prompt sequence) is carried when it is plain JSON
    data with string keys; anything else (generated: other types, non-finite numbers) is refused naming it."""
    log = {"sarl_steps": [{"prompt": "pick up the red cube", "chunks": 3, "subgoals": ["lifted_red"]}],
           "sarl/prompts_per_episode": 1.0}
    tr, msg = _transition(SPEC, end=True)
    info = {"seed": 7, "success": False, "ticks": 16, "steps": 2, "return": 0.0, "interventions": 0, "agent": log}
    out = check_transition(unpack(pack(transition_message("actor-x", 0, 0, tr, 8, True, info, 0))), SPEC, episode=0)
    assert out.info["agent"] == log
    frames = pack(msg)
    base = msgpack.unpackb(frames[0])["episode_info"]
    rng = np.random.default_rng(0)
    bad_values = [[1, 2], "text", 3, None, {1: "x"}, {"x": float("nan")}, {"x": float("inf")}, {"x": b"\x00"}]
    for _ in range(20):
        bad = bad_values[int(rng.integers(len(bad_values)))]
        with pytest.raises(ProtocolError) as e:
            check_transition(unpack(_header_edit(frames, episode_info={**base, "agent": bad})), SPEC)
        assert e.value.field in ("episode_info.agent", "header" if bad == {1: "x"} else None), bad  # int keys: msgpack


# -- with a learner -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_vla(tmp_path_factory) -> str:
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    return save_tiny_vla(str(tmp_path_factory.mktemp("vla") / "ckpt"))


def _cfg(tiny_vla, out, **kw):
    from session.config import RLConfig

    return RLConfig.flat(checkpoint=tiny_vla, out=str(out), task="pick_red_cube",
                         total_ticks=kw.pop("total_ticks", 48), **{**SMALL, **kw})


@pytest.fixture
def learner(tiny_vla, tmp_path):
    from vla.models import load_vla

    ln = Learner(_cfg(tiny_vla, tmp_path / "run"), load_vla(tiny_vla), bind="tcp://127.0.0.1:*", progress=False)
    yield ln
    ln.close()


def _dealer(endpoint):
    import zmq

    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def _exchange(learner, sock, frames):
    """Send ``frames`` as the actor, let the learner take them in, return its replies."""
    sock.send_multipart(frames)
    replies = []
    deadline = time.monotonic() + 5
    while not replies and time.monotonic() < deadline:
        learner.step(0.01)
        while sock.poll(50):
            replies.append(unpack(sock.recv_multipart()))
    return replies


def test_malformed_transitions_are_refused_naming_the_field_and_nothing_is_added(learner):
    spec = learner.spec
    sock = _dealer(learner.endpoint)
    try:
        welcome = _exchange(learner, sock, pack(_msg("hello", "actor-x", actor_id="actor-x", next_seq=-1,
                                                     params_version=-1)))
        assert welcome[0].type == "welcome" and welcome[0]["next_seq"] == 0
        while sock.poll(200):
            sock.recv_multipart()  # the parameters that follow the welcome
        good, good_msg = _transition(spec)

        def with_array(name, value):
            _, m = _transition(spec)
            m.arrays[name] = value
            return pack(m)

        def without(name):
            _, m = _transition(spec)
            del m.arrays[name]
            return pack(m)

        good_frames = pack(good_msg)
        bad = {  # the field the error must name -> (frames, code)
            "feat": (with_array("feat", good["obs"]["feat"].astype(np.float64)), "bad_dtype"),
            "action": (with_array("action", np.full(spec.action_dim, np.nan, np.float32)), "non_finite"),
            "chunk": (with_array("chunk", np.zeros((spec.chunk_shape[0] + 1, spec.chunk_shape[1]), np.float32)),
                      "bad_shape"),
            "next_feat": (without("next_feat"), "missing_field"),
            "reward": (_header_edit(good_frames, reward=float("nan")), "non_finite"),
            "intervention": (_header_edit(good_frames, intervention=1), "bad_field"),
            "episode": (_header_edit(good_frames, episode=3), "bad_field"),
            "episode_info": (_header_edit(pack(_transition(spec, end=True)[1]), episode_info={"seed": 1}),
                             "missing_field"),
            "v": (_header_edit(good_frames, v=PROTOCOL_VERSION + 1), "bad_version"),
            "type": (_header_edit(good_frames, type="transitionz"), "unknown_type"),
            "seq": (pack(_transition(spec, seq=3)[1]), "gap"),
            "actor_id": (_header_edit(good_frames, actor_id="someone-else"), "not_registered"),
        }
        for name, (frames, code) in bad.items():
            replies = _exchange(learner, sock, frames)
            assert len(replies) == 1 and replies[0].type == "error", (name, replies)
            err = replies[0]
            assert err["code"] == code and (err["field"] == name or err["field"].startswith(name + ".")), \
                (name, err.meta)
            if code == "gap":
                assert err["expected"] == 0
            assert learner.received == 0 and not learner.inbox and len(learner.sess.online) == 0, name
        # a second actor is refused while the first one is acting
        other = _dealer(learner.endpoint)
        try:
            busy = _exchange(learner, other, pack(_msg("hello", "actor-y", actor_id="actor-y", next_seq=-1,
                                                       params_version=-1)))
            assert busy[0].type == "error" and busy[0]["code"] == "actor_busy" and busy[0]["field"] == "actor_id"
        finally:
            other.close()
        # the well-formed one is taken in and stored as sent
        ack = _exchange(learner, sock, pack(good_msg))
        assert ack[0].type == "ack" and ack[0]["received"] == 1
        learner.step(0)
        assert len(learner.sess.online) == 1 and learner.sess.step == 1
        np.testing.assert_array_equal(learner.sess.online.obs["feat"][0], good["obs"]["feat"])
        np.testing.assert_array_equal(learner.sess.online.extras["chunk"][0], good["chunk"])
        # a resend of it is a duplicate: acknowledged, not stored twice
        ack = _exchange(learner, sock, pack(good_msg))
        assert ack[0].type == "ack" and ack[0]["received"] == 1 and len(learner.sess.online) == 1
    finally:
        sock.close()


def test_a_parameter_push_changes_the_actors_policy_at_the_episode_boundary(learner, tiny_vla):
    import torch

    from vla.models import load_vla

    actor = Actor(ActorConfig(learner=learner.endpoint, learner_timeout_s=2.0, heartbeat_s=0.1))
    try:
        _wait(lambda: actor.link.welcome is not None and actor.link.params is not None, 10, "welcome",
              tick=lambda: learner.step(0.01))
        actor.prepare(load_vla(tiny_vla), env=None, progress=False)
        assert actor.params_version == 0
        agent, rng = actor.sess.agent, np.random.default_rng(0)
        feat = torch.randn(4, agent.feat_dim, generator=torch.Generator().manual_seed(0))
        w0 = agent.act(feat, rng, warmup=False, deterministic=True)
        # the learner's policy moves on (as after an update round) and it pushes version 1
        lagent = learner.sess.agent
        with torch.no_grad():
            lagent.sac.actor.mean.bias.add_(0.7)
        lagent.updates += 1
        learner.push_params()
        _wait(lambda: actor.link.params[1] == 1, 10, "params v1", tick=lambda: learner.step(0.01))
        # received, but not used before the episode boundary
        torch.testing.assert_close(agent.act(feat, rng, warmup=False, deterministic=True), w0)
        assert actor.apply_newest_params() and actor.params_version == 1
        w1 = agent.act(feat, rng, warmup=False, deterministic=True)
        assert not torch.allclose(w0, w1)
        torch.testing.assert_close(w1, lagent.act(feat, rng, warmup=False, deterministic=True))
        # the learner goes silent: the actor's guard (run before every macro-step) stops it in time
        learner.close()
        actor.sess.guard()
        t0 = time.monotonic()
        with pytest.raises(LearnerGone, match="no word from the learner"):
            while True:
                actor.sess.guard()
                time.sleep(0.02)
        assert 1.0 < time.monotonic() - t0 < 4.0
    finally:
        actor.close()


def test_a_learner_off_loopback_needs_keys(tiny_vla, tmp_path):
    from robot_io.security import SecurityError, make_keys
    from vla.models import load_vla
    from session.protocol import curve_keys

    with pytest.raises(SecurityError, match="without CurveZMQ keys"):
        Learner(_cfg(tiny_vla, tmp_path / "run"), load_vla(tiny_vla), bind="tcp://*:0", progress=False)
    assert not (tmp_path / "run").exists()  # refused before touching the run directory
    keys = curve_keys(str(tmp_path / "keys"))
    make_keys(str(tmp_path / "keys"))  # what `vla bridge keys --out DIR` writes is what --keys DIR reads
    assert all(os.path.exists(p) for p in (keys.server_secret, keys.server_public, keys.client_secret,
                                           keys.authorized_clients))


def test_an_actor_without_a_learner_gives_up_after_its_timeout():
    actor = Actor(ActorConfig(learner=f"tcp://127.0.0.1:{free_port()}", learner_timeout_s=0.5, heartbeat_s=0.1))
    t0 = time.monotonic()
    try:
        with pytest.raises(LearnerGone, match="stopping the actor"):
            actor.connect()
    finally:
        actor.close()
    assert time.monotonic() - t0 < 3


# -- sessions on the sim Franka -------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim_client(tmp_path_factory):
    from robot_io.bridge_process import running_bridge
    from robot_io.robot import RobotClient
    from robot_io.site import load_site

    site = load_site("sim-franka-fast")
    with running_bridge(site, str(tmp_path_factory.mktemp("bridge") / "bridge.log")):
        client = RobotClient(site)
        try:
            yield client
        finally:
            client.close()


def _operator(obs, ctx):  # takes over on the second macro-step of every episode
    if ctx["step_in_episode"] == 1:
        return np.tile(np.array([0.0, 0.0, 0.01, 0, 0, 0, 1.0], np.float32), (8, 1))
    return None


def _assert_buffer_holds(buf, sent):
    n = len(sent)
    assert len(buf) == n
    for name, get in [("feat", lambda t: t["obs"]["feat"]), ("next_feat", lambda t: t["next_obs"]["feat"])]:
        np.testing.assert_array_equal(np.stack([get(t) for t in sent]),
                                      (buf.obs if name == "feat" else buf.next_obs)["feat"][:n], err_msg=name)
    np.testing.assert_array_equal(np.stack([t["action"] for t in sent]), buf.action[:n])
    np.testing.assert_array_equal(np.array([t["reward"] for t in sent], np.float32), buf.reward[:n])
    np.testing.assert_array_equal(np.array([t["done"] for t in sent]), buf.done[:n])
    np.testing.assert_array_equal(np.stack([t["chunk"] for t in sent]), buf.extras["chunk"][:n])
    np.testing.assert_array_equal(np.array([t["intervention"] for t in sent]), buf.extras["intervention"][:n])


@pytest.mark.e2e  # actor and learner on the sim bridge
def test_loopback_session_learner_buffers_hold_exactly_the_actors_transitions(tiny_vla, tmp_path, sim_client):
    from vla.envs import task_env
    from vla.models import load_vla
    from session.actor import run_actor

    ln = Learner(_cfg(tiny_vla, tmp_path / "run"), load_vla(tiny_vla), bind="tcp://127.0.0.1:*", progress=False)
    dropped: list = []  # the first "finished" ack is lost on the way: the actor must still hear the end
    send = ln._send
    ln._send = lambda ident, msg: (dropped.append(msg) if msg.type == "ack" and msg.get("finished") and not dropped
                                   else send(ident, msg))
    out: dict = {}
    th = threading.Thread(target=lambda: out.update(summary=ln.serve()), daemon=True)
    th.start()
    sent: list[tuple[int, dict]] = []
    summary = run_actor(ActorConfig(learner=ln.endpoint, learner_timeout_s=20, heartbeat_s=0.1),
                        make_env=lambda cfg: task_env(sim_client, cfg.task), load_vla=lambda cfg: load_vla(tiny_vla),
                        operator=_operator, progress=False, on_transition=lambda seq, tr: sent.append((seq, tr)))
    th.join(timeout=30)
    assert not th.is_alive()
    assert summary["ticks"] == 48 and summary["episodes"] == 3 and len(summary["learners"]) == 1
    assert len(dropped) == 1 and ln.finished_acks >= 2
    assert [seq for seq, _ in sent] == list(range(6))  # 2 macro-steps of 8 ticks per episode
    s = out["summary"]
    assert s["steps"] == 6 and s["episodes"] == 3 and s["ticks"] == 48 and s["vla_weights_unchanged"]
    assert s["base_success_rate"] is not None and s["final_success_rate"] is not None
    trs = [tr for _, tr in sent]
    _assert_buffer_holds(ln.sess.online, trs)  # NA: interventions go to the online buffer too
    flagged = [tr for tr in trs if tr["intervention"]]
    assert len(flagged) == 3 and [i for i, tr in enumerate(trs) if tr["intervention"]] == [1, 3, 5]
    _assert_buffer_holds(ln.sess.demo, flagged)
    # the checkpoint the learner left holds the same
    from policies.common.replay import ReplayBuffer

    _assert_buffer_holds(ReplayBuffer.load(tmp_path / "run/checkpoint/online.npz"), trs)
    eps = [json.loads(x) for x in open(tmp_path / "run/episodes.jsonl")]
    assert [e["episode"] for e in eps] == [0, 1, 2] and [e["interventions"] for e in eps] == [1, 1, 1]
    assert json.loads((tmp_path / "run/checkpoint/state.json").read_text())["step"] == 6


@pytest.mark.e2e  # a learner process killed and resumed
def test_learner_sigkill_and_resume_the_actor_survives_and_resends(tiny_vla, tmp_path, sim_client):
    from vla.envs import task_env
    from vla.models import load_vla
    from session.actor import run_actor

    out = tmp_path / "run"
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "OMP_NUM_THREADS": "1"}
    new = ["--checkpoint", tiny_vla, "--task", "pick_red_cube", "--out", str(out), "--total-ticks", "64",
           "--max-episode-ticks", "16", "--warmup-steps", "2", "--utd", "1", "--batch-size", "8", "--num-critics", "2",
           "--eval-every", "0", "--eval-episodes", "1", "--threads", "1"]

    def start_learner(args, log, on_cue=False):
        """`vla rl --role learner ARGS` in a new process; ``on_cue``: imports done now, the command
        runs when a line arrives on stdin (the restart then costs no interpreter start-up)."""
        argv = ["rl", "--role", "learner", "--bind", endpoint, *args]
        code = ("import sys, torch, torch._dynamo, torch.utils.tensorboard, matplotlib.pyplot, vla.cli, "
                "session.runner, session.learner, vla.models\n"
                f"sys.stdin.readline()\nsys.exit(vla.cli.main({argv!r}))")
        return subprocess.Popen([sys.executable, "-c", code] if on_cue else [sys.executable, "-m", "vla.cli", *argv],
                                cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                stdin=subprocess.PIPE if on_cue else None, start_new_session=True)

    first = start_learner(new, tmp_path / "learner1.log")
    second = start_learner(["--resume", str(out)], tmp_path / "learner2.log", on_cue=True)
    sent: list[dict] = []
    res: dict = {}

    def act():
        try:
            res["summary"] = run_actor(
                ActorConfig(learner=endpoint, learner_timeout_s=90, heartbeat_s=0.2, resend_s=1.0),
                make_env=lambda cfg: task_env(sim_client, cfg.task), load_vla=lambda cfg: load_vla(tiny_vla),
                progress=False, on_transition=lambda seq, tr: sent.append(tr))
        except BaseException as e:  # the test thread reports it
            res["error"] = e

    th = threading.Thread(target=act, daemon=True)
    th.start()
    state = out / "checkpoint" / "state.json"
    try:
        def mid_episode_after_a_checkpoint():
            assert first.poll() is None, (tmp_path / "learner1.log").read_text()[-3000:]
            assert "error" not in res, res
            try:
                st = json.loads(state.read_text())
            except (FileNotFoundError, json.JSONDecodeError):  # none yet, or being swapped in
                return False
            # the actor has sent transitions the checkpoint does not hold: they must be resent
            return st["episode"] >= 1 and len(sent) > st["step"]

        _wait(mid_episode_after_a_checkpoint, 120, "a checkpointed episode and a transition past it",
              tick=lambda: time.sleep(0.01))
        os.killpg(first.pid, signal.SIGKILL)  # no cleanup, no last save
        first.wait(timeout=30)
        saved = tmp_path / "saved"
        shutil.copytree(out / "checkpoint", saved)
        s = json.loads((saved / "state.json").read_text())
        sent_at_kill = len(sent)
        assert s["step"] == 2 * s["episode"] and s["step"] < sent_at_kill < 8
        second.stdin.write(b"go\n")  # vla rl --role learner --resume RUN, on the same endpoint
        second.stdin.close()
        th.join(timeout=150)
        assert not th.is_alive() and "error" not in res, res
        assert second.wait(timeout=60) == 0, (tmp_path / "learner2.log").read_text()[-3000:]
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    log2 = (tmp_path / "learner2.log").read_text()
    assert f"resumed {out} at episode {s['episode']}, step {s['step']}" in log2
    told = re.search(r"connected \(it has sent (\d+) transitions; this learner holds (\d+)\)", log2)
    assert told and int(told[2]) == s["step"] and int(told[1]) >= sent_at_kill  # so it resent from step
    summary = res["summary"]
    assert summary["ticks"] == 64 and len(summary["learners"]) == 2  # welcomed by both learners
    from policies.common.replay import ReplayBuffer

    # every transition exactly once, in order: the ones past the checkpoint were resent
    assert len(sent) == 8
    _assert_buffer_holds(ReplayBuffer.load(out / "checkpoint/online.npz"), sent)
    before = ReplayBuffer.load(saved / "online.npz")
    np.testing.assert_array_equal(before.action[: s["step"]], np.stack([t["action"] for t in sent[: s["step"]]]))
    final = json.loads((out / "summary.json").read_text())
    assert final["steps"] == 8 and final["ticks"] == 64 and final["vla_weights_unchanged"]
    eps = [json.loads(x) for x in open(out / "episodes.jsonl")]
    assert [e["episode"] for e in eps] == list(range(4))  # none lost, none logged twice
    assert "session finished at step 8" in log2


def test_cli_roles_explain_themselves(capsys):
    from vla.cli import build_parser, main

    with pytest.raises(SystemExit):
        build_parser().parse_args(["rl", "--help"])
    out = capsys.readouterr().out
    assert "--role learner --bind tcp://*:5800" in out and "--role actor --learner tcp://" in out
    assert main(["rl", "--role", "actor"]) == 2
    assert "--role actor needs --learner" in capsys.readouterr().err
    assert main(["rl", "--role", "actor", "--learner", "tcp://127.0.0.1:1", "--task", "pick_red_cube"]) == 2
    assert "give --task to the learner" in capsys.readouterr().err
    assert main(["rl", "--role", "local", "--learner", "tcp://127.0.0.1:1"]) == 2
    assert "--learner is for --role actor" in capsys.readouterr().err


def test_cnn_encoder_is_refused_by_the_split_session(tmp_path, capsys):
    """Transitions on the wire carry VLA features, not camera frames: --encoder cnn stays in-process."""
    from vla.cli import main
    from session.config import RLConfig
    from session.protocol import RemoteRLError

    assert main(["rl", "--role", "learner", "--encoder", "cnn", "--checkpoint", "x", "--task", "pick_red_cube",
                 "--out", str(tmp_path / "run")]) == 2
    assert "--encoder cnn runs with --role local only" in capsys.readouterr().err
    cfg = RLConfig.flat(checkpoint="x", out=str(tmp_path / "run"), task="pick_red_cube", encoder="cnn")
    with pytest.raises(RemoteRLError, match="in-process only"):  # e.g. --resume of a cnn session as a learner
        Learner(cfg, None, bind="tcp://127.0.0.1:*", progress=False)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="encoder must be one of"):
        RLConfig.flat(checkpoint="x", out="o", task="pick_red_cube", encoder="resnet")


@pytest.mark.e2e  # actor and learner on the sim bridge
def test_async_updates_the_robot_acts_at_its_own_rate_and_the_learner_never_outruns_lockstep(
        tiny_vla, tmp_path, sim_client):
    """--updates async: a learner whose update rounds are slow (0.4 s each) does not hold the actor back: the
    session's ticks are all spent while the learner has done fewer rounds than lockstep would; it never does more
    (one per macro-step after warm-up), and the actor's final evaluation uses the learner's last parameters."""
    from session.actor import run_actor
    from vla.envs import task_env
    from vla.models import load_vla

    ln = Learner(_cfg(tiny_vla, tmp_path / "run", total_ticks=160, updates="async"), load_vla(tiny_vla),
                 bind="tcp://127.0.0.1:*", progress=False)
    update = ln.sess.agent.update
    rounds_at: list[int] = []  # the stored macro-steps when each round ran

    def slow_update(*a, **kw):
        rounds_at.append(ln.sess.step)
        time.sleep(0.4)
        return update(*a, **kw)

    ln.sess.agent.update = slow_update
    out: dict = {}
    th = threading.Thread(target=lambda: out.update(summary=ln.serve()), daemon=True)
    th.start()
    summary = run_actor(ActorConfig(learner=ln.endpoint, learner_timeout_s=20, heartbeat_s=0.1),
                        make_env=lambda cfg: task_env(sim_client, cfg.task), load_vla=lambda cfg: load_vla(tiny_vla),
                        progress=False)
    th.join(timeout=30)
    assert not th.is_alive()
    s = out["summary"]
    steps, warmup = s["steps"], SMALL["warmup_steps"]
    assert summary["ticks"] == s["ticks"] == 160 and steps == 20
    assert s["updates"] == "async" and s["update_rounds"] == len(rounds_at) >= 1
    assert s["update_rounds"] < steps - warmup + 1  # the actor did not wait for the rounds lockstep owes
    assert all(n - warmup + 1 >= i + 1 for i, n in enumerate(rounds_at))  # never ahead of the data
    assert summary["params_version"] == s["update_rounds"]  # the final evaluation's parameters are the last ones
    eps = [json.loads(x) for x in open(tmp_path / "run/episodes.jsonl")]
    assert [e["update_rounds"] for e in eps] == sorted(e["update_rounds"] for e in eps)
    assert all(e["wall_s"] >= 0 for e in eps)


def test_async_updates_need_the_split_session(tiny_vla, tmp_path, capsys):
    from session.runner import run_session
    from vla.cli import main

    assert main(["rl", "--updates", "async", "--checkpoint", tiny_vla, "--task", "pick_red_cube",
                 "--out", str(tmp_path / "run")]) == 2
    assert "--role learner" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--role learner"):
        run_session(_cfg(tiny_vla, tmp_path / "run2", updates="async"), env=None, vla=None, progress=False)
    assert not (tmp_path / "run").exists() and not (tmp_path / "run2").exists()
    with pytest.raises(ValueError, match="updates must be one of lockstep, async"):
        _cfg(tiny_vla, tmp_path / "run3", updates="threads")
