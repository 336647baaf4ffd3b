"""One learner, several actors (``cfg.actors``: the lanes of ``session.protocol``), on the toy method and env of
this folder (no VLA, no robot, no Ray: seconds): each actor's transitions reach the replay buffer exactly once
and in its order, the actors' scenes are disjoint, one actor evaluates, and a learner restarted from its last
checkpoint (``--resume``) tells each actor where to resend from, per actor."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import numpy as np
import torch

from session.actor import ActorConfig, run_actor
from session.config import RLConfig
from session.learner import Learner
from session.runner import actor_episode, episode_seed
from tests.session.test_toy_method import StubVLA, toy  # noqa: F401  (toy: the registry fixture)
from tests.session.test_toy_method import _cfg as _toy_cfg
from tests.session.toy_env import make_env


def _cfg(out, total_ticks: int) -> RLConfig:
    """The toy session of test_toy_method with two actors (evaluations every 2 session episodes)."""
    return dataclasses.replace(_toy_cfg(out, actors=2), total_ticks=total_ticks)


def _in_order(buffer_rows: np.ndarray, sent: list[np.ndarray]) -> list[int]:
    """Where each of ``sent`` (one actor's rows, in its order) sits in the buffer; they must all be there, in order."""
    where, at = [], 0
    for row in sent:
        while at < len(buffer_rows) and not np.array_equal(buffer_rows[at], row):
            at += 1
        assert at < len(buffer_rows), f"transition {len(where)} of the actor is not in the buffer (after {where[-1:]})"
        where.append(at)
        at += 1
    return where


def _actors(endpoint: str, slots, sent: dict[int, list], res: dict, timeout_s: float = 30) -> list[threading.Thread]:
    """Actors on the toy env in threads, one per lane of ``slots``: their summaries (or errors) go to ``res``,
    what they sent to ``sent``. Each waits at its first transition until all have one (toy episodes take
    milliseconds: one actor could otherwise spend the whole budget before another starts)."""
    start = threading.Barrier(len(slots))

    def record(slot: int, seq: int, tr: dict) -> None:
        if not sent[slot]:
            start.wait(timeout=30)
        sent[slot].append((seq, tr))

    def act(slot: int) -> None:
        try:
            res[slot] = run_actor(ActorConfig(learner=endpoint, learner_timeout_s=timeout_s, heartbeat_s=0.1,
                                              resend_s=0.5, slot=slot),
                                  make_env=lambda cfg: make_env(), load_vla=lambda cfg: StubVLA(), progress=False,
                                  on_transition=lambda seq, tr: record(slot, seq, tr))
        except BaseException as e:  # the test thread reports it
            res[slot] = e

    threads = [threading.Thread(target=act, args=(i,), daemon=True) for i in slots]
    for th in threads:
        th.start()
    return threads


def test_two_actors_feed_one_learner_with_disjoint_scenes(toy, tmp_path):
    torch.set_num_threads(1)
    cfg = _cfg(tmp_path / "run", total_ticks=96)
    ln = Learner(cfg, StubVLA(), bind="tcp://127.0.0.1:*", progress=False)
    out: dict = {}
    th = threading.Thread(target=lambda: out.update(summary=ln.serve()), daemon=True)
    th.start()
    sent: dict[int, list] = {0: [], 1: []}
    res: dict = {}
    for a in _actors(ln.endpoint, (0, 1), sent, res):
        a.join(timeout=60)
    th.join(timeout=30)
    assert not th.is_alive() and all(isinstance(r, dict) for r in res.values()), res
    s = out["summary"]
    # every transition of each actor is in the replay buffer once, in its order; nothing else is
    online = ln.sess.online
    assert len(online) == s["steps"] == len(sent[0]) + len(sent[1]) and min(map(len, sent.values())) > 0
    rows = online.action[: len(online)]
    places = [_in_order(rows, [tr["action"] for _, tr in sent[i]]) for i in (0, 1)]
    assert sorted(places[0] + places[1]) == list(range(len(online)))
    assert [seq for seq, _ in sent[1]] == list(range(len(sent[1])))  # each lane numbers its own transitions
    # the scenes: actor i plays session episodes i, i + 2, ...; logged with the actor that played them
    eps = [json.loads(x) for x in open(tmp_path / "run/episodes.jsonl")]
    for i in (0, 1):
        mine = [e["seed"] for e in eps if e["actor"] == i]
        assert mine == res[i]["seeds"] == [episode_seed(cfg, actor_episode(k, i, 2)) for k in range(len(mine))]
    assert not set(res[0]["seeds"]) & set(res[1]["seeds"])
    assert s["ticks"] >= 96 and sum(r["ticks"] for r in res.values()) == s["ticks"]
    # actor 0 evaluates (base, periodic, final); actor 1 said bye without
    assert res[0]["final_success_rate"] is not None and res[1]["final_success_rate"] is None
    assert s["final_success_rate"] == res[0]["final_success_rate"] and s["base_success_rate"] is not None
    state = json.loads((tmp_path / "run/checkpoint/state.json").read_text())
    assert [lane["transitions"] for lane in state["lanes"]] == [len(sent[0]), len(sent[1])]
    assert [a["transitions"] for a in s["actors"]] == [len(sent[0]), len(sent[1])]


def test_a_restarted_learner_takes_each_actors_transitions_from_its_own_checkpointed_count(toy, tmp_path):
    """The learner stops dead (no save: what a SIGKILL leaves) once it has checkpointed an episode and both actors
    have sent transitions past it; a learner resumed from that checkpoint on the same endpoint welcomes each actor
    at its lane's count in the checkpoint, and each resends from there: every transition once, in its order."""
    torch.set_num_threads(1)
    cfg = _cfg(tmp_path / "run", total_ticks=160)
    first = Learner(cfg, StubVLA(), bind="tcp://127.0.0.1:*", progress=False)
    endpoint = first.endpoint
    stop = threading.Event()
    th = threading.Thread(target=lambda: first.serve(stop), daemon=True)
    th.start()
    sent: dict[int, list] = {0: [], 1: []}
    res: dict = {}
    actors = _actors(endpoint, (0, 1), sent, res, timeout_s=60)
    state = tmp_path / "run/checkpoint/state.json"

    def past_a_checkpoint() -> bool:
        assert not res, res
        try:
            lanes = json.loads(state.read_text())["lanes"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return False
        return all(len(sent[i]) > lanes[i]["transitions"] for i in (0, 1))

    deadline = time.monotonic() + 60
    while not past_a_checkpoint():
        assert time.monotonic() < deadline, "no checkpoint with both actors past it"
        time.sleep(0.005)
    stop.set()  # the learner stops dead: its inbox and anything after the checkpoint are lost
    th.join(timeout=10)
    saved = json.loads(state.read_text())["lanes"]
    from session.protocol import RemoteRLError

    for _ in range(100):  # the stopped learner's socket lets go of the port within its linger
        try:
            second = Learner(RLConfig.from_json(str(tmp_path / "run/rl_config.json")), StubVLA(), bind=endpoint,
                             resume=True, progress=False)
            break
        except RemoteRLError as e:
            assert "in use" in str(e)
            time.sleep(0.05)
    assert [(lane.received, lane.durable) for lane in second.lanes] == [(d["transitions"],) * 2 for d in saved]
    out: dict = {}
    th2 = threading.Thread(target=lambda: out.update(summary=second.serve()), daemon=True)
    th2.start()
    for a in actors:
        a.join(timeout=90)
    th2.join(timeout=30)
    assert not th2.is_alive() and all(isinstance(r, dict) for r in res.values()), res
    assert all(len(r["learners"]) == 2 for r in res.values())  # both actors were welcomed by both learners
    online = second.sess.online
    assert len(online) == len(sent[0]) + len(sent[1]) == out["summary"]["steps"]
    rows = online.action[: len(online)]
    places = [_in_order(rows, [tr["action"] for _, tr in sent[i]]) for i in (0, 1)]
    assert sorted(places[0] + places[1]) == list(range(len(online)))  # once each, nothing lost, nothing twice
    eps = [json.loads(x) for x in open(tmp_path / "run/episodes.jsonl")]
    assert [e["episode"] for e in eps] == list(range(len(eps)))
    for i in (0, 1):  # each actor's episodes logged once, in its order
        assert [e["seed"] for e in eps if e["actor"] == i] == res[i]["seeds"]


def test_a_dropped_actor_leaves_the_others_data_and_the_final_evaluation_passes_on(toy, tmp_path):
    """Actor 0 (the evaluator) goes quiet mid-episode and is dropped (what ``session.pool`` does when Ray reports
    its process dead): its unfinished episode is not logged, actor 1 (which joins after) acts the rest of the
    budget, runs the final evaluation, and its every transition is in the replay buffer; a hello from the dropped
    actor is refused."""
    import zmq

    from session.actor import Actor
    from session.protocol import _msg, pack, unpack

    torch.set_num_threads(1)
    cfg = _cfg(tmp_path / "run", total_ticks=96)
    ln = Learner(cfg, StubVLA(), bind="tcp://127.0.0.1:*", progress=False)
    out: dict = {}
    th = threading.Thread(target=lambda: out.update(summary=ln.serve()), daemon=True)
    th.start()
    sent: dict[int, list] = {0: [], 1: []}
    res: dict = {}
    gate, stalled = threading.Event(), threading.Event()
    victim = Actor(ActorConfig(learner=ln.endpoint, learner_timeout_s=30, heartbeat_s=0.1, slot=0))
    seen = {"episode": -1}

    def record(seq, tr):  # actor 0 stalls after the first macro-step of an episode (4 of 16 ticks: unfinished)
        sent[0].append((seq, tr))
        first = victim.sess.episode != seen["episode"]
        seen["episode"] = victim.sess.episode
        if first and not tr["done"]:
            until = time.monotonic() + 10
            while victim.link.received <= seq and time.monotonic() < until:  # the learner has it
                time.sleep(0.01)
            victim.link.close()  # it goes quiet: no heartbeat, no transition
            stalled.set()
            gate.wait(60)
            raise SystemExit

    def run_victim():
        try:
            victim.on_transition = record
            victim.prepare(StubVLA(), make_env(), progress=False)
            victim.run(progress=False)
        except BaseException as e:
            res[0] = e

    threading.Thread(target=run_victim, daemon=True).start()
    assert stalled.wait(60), res
    _actors(ln.endpoint, (1,), sent, res)  # actor 1 joins the session now
    ln.drop_actor(0, "killed by the test")
    deadline = time.monotonic() + 10
    while ln.lanes[0].lost is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(ln.endpoint)
    try:  # the dropped actor may not come back
        sock.send_multipart(pack(_msg("hello", victim.actor_id, actor_id=victim.actor_id, next_seq=len(sent[0]),
                                      params_version=-1, slot=0)))
        assert sock.poll(5000)
        reply = unpack(sock.recv_multipart())
        assert reply.type == "error" and reply["code"] == "actor_dropped"
    finally:
        sock.close()
    th.join(timeout=60)
    gate.set()
    assert not th.is_alive() and isinstance(res.get(1), dict), res
    s = out["summary"]
    assert s["actors"][0]["lost"] == "killed by the test" and s["actors"][1]["lost"] is None
    assert res[1]["final_success_rate"] is not None and s["final_success_rate"] == res[1]["final_success_rate"]
    lane0 = ln.lanes[0]
    assert lane0.received == len(sent[0]) > lane0.episode_start and lane0.recv_episode == victim.sess.episode
    eps = [json.loads(x) for x in open(tmp_path / "run/episodes.jsonl")]
    assert [e["seed"] for e in eps if e["actor"] == 1] == res[1]["seeds"]
    assert len([e for e in eps if e["actor"] == 0]) == lane0.recv_episode  # the unfinished one is not logged
    online = ln.sess.online
    assert len(online) == len(sent[0]) + len(sent[1]) == s["steps"]
    _in_order(online.action[: len(online)], [tr["action"] for _, tr in sent[1]])
    assert s["ticks"] >= 96
