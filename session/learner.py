"""The learner of the split RL session (``vla rl --role learner``, and the learner of ``vla rl --actors N``):
replay buffers, the agent's networks and optimisers, the run directory and ``--resume``; never the robot.
It serves one actor per lane (one lane, or ``cfg.actors``). The wire and its rules: ``session.protocol``."""

from __future__ import annotations

import collections
import dataclasses
import os
import queue
import secrets
import threading
import time
from typing import Any, Callable

import zmq

from robot_io.security import CurveKeys, secure_server_socket
from robot_io.wire import Message, ProtocolError, encode
from session.config import RLConfig
from session.protocol import (ACTOR_LOST_S, ACTOR_TYPES, EVAL_KINDS, FINISH_GRACE_S, FINISH_QUIET_S, PUSH_EVERY_S,
                              TAKEOVER_S, RemoteRLError, Transition, TransitionSpec, _check_eval, _msg, _typed,
                              check_splits, check_transition, error_reply, field, params_message, unpack)


@dataclasses.dataclass
class Lane:
    """One actor's stream of transitions: its own sequence numbers, episodes and acknowledgements. ``received``
    counters run ahead of the ``stored`` ones (learned from) by what waits in the inbox; ``durable``: its
    transitions inside the last checkpoint."""

    slot: int
    received: int = 0
    recv_episode: int = 0
    recv_ticks: int = 0
    episode_start: int = 0
    """``received`` when its current episode began (the transitions of an unfinished episode follow it)."""
    stored: int = 0
    stored_episode: int = 0
    stored_ticks: int = 0
    durable: int = 0
    actor_id: str | None = None
    ident: bytes | None = None
    heard: float = 0.0
    silence_warned: bool = False
    pushed_version: int = -1
    pushed_at: float = 0.0
    bye_queued: bool = False
    said_bye: bool = False
    """Its bye is processed: it has sent everything and acts no more (it may still run the final evaluation)."""
    lost: str | None = None
    """Why it was dropped (its actor died); a dropped lane takes no more transitions."""
    finished_acks: int = 0

    def state(self) -> dict[str, int]:
        """Its counters in a checkpoint (``state.json``): what the checkpoint holds of it."""
        return {"slot": self.slot, "transitions": self.stored, "episodes": self.stored_episode,
                "ticks": self.stored_ticks}

    @classmethod
    def restored(cls, d: dict[str, Any]) -> "Lane":
        n, e, t = int(d["transitions"]), int(d["episodes"]), int(d["ticks"])
        return cls(int(d["slot"]), received=n, recv_episode=e, recv_ticks=t, episode_start=n, stored=n,
                   stored_episode=e, stored_ticks=t, durable=n)


class Learner:
    """The learner's state and its message loop. ``serve()`` runs until the session is over (the actors'
    byes, the final evaluation's among them); ``step()`` is one turn of the loop (tests drive it by hand)."""

    def __init__(self, cfg: RLConfig, vla, bind: str = "tcp://127.0.0.1:5800", resume: bool = False,
                 keys: CurveKeys | None = None, insecure: bool = False, progress: bool = True,
                 context: zmq.Context | None = None) -> None:
        from session.runner import RunLog, Session, open_session, read_base_eval, start_run

        check_splits(cfg)
        self.cfg, self.progress = cfg, progress
        # the socket first: a refused bind (no keys off loopback, port in use) leaves the run untouched
        self.sock = (context or zmq.Context.instance()).socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 2000)  # let the last ack (finished) out on close
        try:
            secure_server_socket(self.sock, bind, keys, insecure)
            self.sock.bind(bind)
        except zmq.ZMQError as e:
            self.sock.close(linger=0)
            raise RemoteRLError(f"the learner cannot listen on {bind}: {e}") from None
        except BaseException:
            self.sock.close(linger=0)
            raise
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        start_run(cfg, resume)
        self.sess = Session(cfg, None, vla, progress=progress)
        open_session(self.sess, resume)
        s = self.sess
        self.spec = TransitionSpec.of(s.agent)
        self.lanes = self._restore_lanes(resume)
        self.multi = len(self.lanes) > 1
        self.by_actor: dict[str, Lane] = {}
        self.dropped: dict[str, str] = {}  # actor id -> why: they may not come back
        self._drops: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
        self.inbox: collections.deque[tuple[str, Any]] = collections.deque()
        self.queued = 0  # transitions in the inbox
        self.learner_id = secrets.token_hex(6)
        self.pushed_version = -1
        self.losses: dict[str, float] = {}
        self.final: dict[str, Any] | None = None
        self.final_queued = False
        self.summary: dict[str, Any] | None = None
        self.finished = False
        self.base: dict[str, Any] | None = read_base_eval(s, resume)
        self.log = RunLog(cfg.out, s.ticks)
        s.on_update = self.log.update
        self.t0 = time.perf_counter()
        self.bar = None
        self.asynchronous = cfg.updates == "async"

    def _restore_lanes(self, resume: bool) -> list[Lane]:
        s, n = self.sess, max(self.cfg.actors, 1)
        saved = s.extra_state.get("lanes") if resume else None
        if saved is None:  # a new session, or a checkpoint of a one-actor session (its counters are the session's)
            lanes = [Lane(i) for i in range(n)]
            if resume:
                lanes[0] = Lane.restored({"slot": 0, "transitions": s.step, "episodes": s.episode, "ticks": s.ticks})
            return lanes
        if len(saved) != n:
            raise RemoteRLError(f"{self.cfg.out}: the checkpoint holds {len(saved)} actors' counters, the session "
                                f"has {n} actors")
        return [Lane.restored(d) for d in saved]

    # -- counters over every lane (one lane: the actor's) ------------------------------------------
    @property
    def received(self) -> int:
        return sum(lane.received for lane in self.lanes)

    @property
    def session_ticks(self) -> int:
        """Control ticks taken in from every actor (learned or waiting): the session's budget counts these."""
        return sum(lane.recv_ticks for lane in self.lanes)

    @property
    def finished_acks(self) -> int:
        return sum(lane.finished_acks for lane in self.lanes)

    @property
    def actor_id(self) -> str | None:
        return self.lanes[0].actor_id

    def evaluator(self) -> Lane | None:
        """The lane whose actor runs the evaluations (base, periodic, final): the lowest one not dropped."""
        return next((lane for lane in self.lanes if lane.lost is None), None)

    def settled(self, lane: Lane) -> bool:
        """Every other actor has said bye (or was dropped), every transition taken in is learned from and no
        update round is owed: ``lane``'s final evaluation would see the session's last policy."""
        return (all(o.said_bye or o.lost for o in self.lanes if o is not lane)
                and not self.queued and not self._round_due())

    # -- the loop ---------------------------------------------------------------------------------
    def serve(self, stop: threading.Event | None = None, watch: Callable[[], None] | None = None,
              announce: str | None = None) -> dict[str, Any] | None:
        """Serve until the session is over (-> the summary) or ``stop`` is set (-> None). ``watch`` is called
        every turn (``session.pool``: the Ray actors' health); ``announce``: the line printed at the start."""
        print(announce or f"learner listening on {self.endpoint} (session {self.cfg.out}, step {self.sess.step}); "
              f"start the actor with: vla rl --role actor --learner {self.endpoint}", flush=True)
        if self.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=self.cfg.total_ticks, initial=min(self.sess.ticks, self.cfg.total_ticks),
                            unit="tick", desc=f"learner {self.cfg.label}")
        try:
            while not self.finished and not (stop is not None and stop.is_set()):
                self.step(0.1)
                if watch is not None:
                    watch()
            if self.finished:  # should a finished ack be lost, the actor's next message gets another
                until = time.monotonic() + FINISH_GRACE_S
                while time.monotonic() < until and not (stop is not None and stop.is_set()):
                    self.step(0.1)
                    now = time.monotonic()
                    live = [lane for lane in self.lanes if lane.lost is None and lane.ident is not None]
                    if all(lane.finished_acks and now - lane.heard > FINISH_QUIET_S for lane in live):
                        break
        finally:
            self.close()
        return self.summary

    def step(self, timeout_s: float = 0.0) -> None:
        """Take in every waiting message (waiting up to ``timeout_s`` when there is nothing to
        learn), then learn from one queued item (``updates`` lockstep), or store every queued item
        and run one update round if one is due (``updates`` async)."""
        busy = bool(self.inbox) or self._round_due()
        timeout_ms = 0 if busy else int(timeout_s * 1000)
        for _ in range(10_000):
            if not self.sock.poll(timeout_ms):
                break
            self._receive(self.sock.recv_multipart(copy=False))
            timeout_ms = 0
        while not self._drops.empty():
            self._drop(*self._drops.get())
        if self.asynchronous:
            while self.inbox:
                self._process(*self.inbox.popleft())
            if self._round_due():
                self._learn()
            elif self.sess.ticks >= self.cfg.total_ticks:
                self.push_params()  # the last rounds are done: the actor's final evaluation waits for these
            elif time.monotonic() - max((lane.pushed_at for lane in self.lanes), default=0.0) > PUSH_EVERY_S:
                self.push_params()
        elif self.inbox:
            self._process(*self.inbox.popleft())
        now = time.monotonic()
        for lane in self.lanes:
            if lane.actor_id is None or lane.lost or self.finished:
                continue
            silent = now - lane.heard
            if self.multi and silent > ACTOR_LOST_S:
                self._drop(lane.slot, f"no word from it for {silent:.0f} s")
            elif not lane.silence_warned and silent > 60:
                print(f"learner: no word from actor {lane.actor_id} for 60 s; waiting for it (or a new one)",
                      flush=True)
                lane.silence_warned = True
        if not self.finished and all(lane.lost for lane in self.lanes):
            why = "; ".join(dict.fromkeys(lane.lost for lane in self.lanes))  # each reason once
            raise RemoteRLError(f"every actor of this session is gone ({why}); " + (
                f"`vla rl --resume {self.cfg.out}` continues from the last checkpoint"
                if os.path.isdir(self.sess.ckpt_dir) else "no checkpoint yet: start the session again"))

    def drop_actor(self, slot: int, why: str) -> None:
        """Drop actor ``slot`` (its process died): thread-safe; done at the learner's next turn. Its unfinished
        episode is not counted or logged; the transitions it sent stay in the replay buffer (they are the robot's
        real experience); the session goes on with the other actors."""
        self._drops.put((slot, why))

    def _drop(self, slot: int, why: str) -> None:
        lane = self.lanes[slot]
        if lane.lost is not None or self.finished:
            return
        lane.lost = why
        if lane.actor_id is not None:
            self.by_actor.pop(lane.actor_id, None)
            self.dropped[lane.actor_id] = why
        partial = lane.received - lane.episode_start
        left = sum(o.lost is None for o in self.lanes)
        print(f"learner: actor {slot} ({lane.actor_id or 'never connected'}) is gone: {why}. "
              + (f"Its unfinished episode {lane.recv_episode} ({partial} transitions, kept in the replay buffer) is "
                 "not counted. " if partial else "")
              + f"{left} actor(s) go on.", flush=True)

    def close(self) -> None:
        if self.sock.closed:
            return
        if self.bar is not None:
            self.bar.close()
        self.log.close()
        self.sock.close()

    # -- receiving: check, acknowledge, queue -----------------------------------------------------
    def _send(self, ident: bytes, msg: Message) -> None:
        try:
            self.sock.send_multipart([ident, *encode(msg)], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # the actor's queue is full or it is gone; acks are superseded, params re-pushed
            pass

    def _ack(self, lane: Lane) -> None:
        ev = self.evaluator()
        self._send(lane.ident, _msg("ack", "learner", learner_id=self.learner_id, received=lane.received,
                                    learned=lane.stored, durable=lane.durable, version=self.sess.agent.updates,
                                    finished=self.finished, session_ticks=self.session_ticks,
                                    evaluator=ev is lane, settled=self.settled(lane)))
        lane.finished_acks += self.finished

    def _receive(self, frames) -> None:
        ident, body = bytes(frames[0].buffer), frames[1:]
        seq, lane = None, None
        try:
            msg = unpack(body)
            seq = msg.seq if msg.type == "transition" else None
            if msg.type not in ACTOR_TYPES:
                raise ProtocolError("bad_type", f"a learner does not take {msg.type!r} messages", "type")
            actor_id = field(msg, "actor_id", str)
            if msg.type == "hello":
                return self._hello(ident, msg, actor_id)
            lane = self.by_actor.get(actor_id)
            if lane is None:
                raise ProtocolError("not_registered", f"actor {actor_id!r} has not said hello to this learner "
                                    f"(id {self.learner_id})", "actor_id")
            lane.ident, lane.heard, lane.silence_warned = ident, time.monotonic(), False
            getattr(self, f"_on_{msg.type}")(lane, msg)
        except ProtocolError as e:
            if e.code != "not_registered":
                print(f"learner: refused a message: [{e.code}] {e.message}", flush=True)
            extra = {"transition": seq} if seq is not None else {}
            if e.code == "gap" and lane is not None:
                extra["expected"] = lane.received
            self._send(ident, error_reply(e.code, e.message, e.field, **extra))

    def _hello(self, ident: bytes, msg: Message, actor_id: str) -> None:
        next_seq = field(msg, "next_seq", int)
        if actor_id in self.dropped:
            raise ProtocolError("actor_dropped", f"actor {actor_id} was dropped from this session "
                                f"({self.dropped[actor_id]}); start a new one", "actor_id")
        lane = self.by_actor.get(actor_id)
        if lane is None:
            lane = self._free_lane(msg, actor_id)
        s = self.sess
        if lane.actor_id != actor_id:
            print(f"learner: actor {actor_id} connected" + (f" as actor {lane.slot} of {len(self.lanes)}"
                                                            if self.multi else "")
                  + f" (it has sent {max(next_seq, 0)} transitions; this learner holds {lane.received})", flush=True)
            if lane.actor_id is not None:
                self.by_actor.pop(lane.actor_id, None)
        lane.actor_id, lane.ident, lane.heard, lane.lost = actor_id, ident, time.monotonic(), None
        self.by_actor[actor_id] = lane
        ev = self.evaluator()
        self._send(ident, _msg("welcome", "learner", learner_id=self.learner_id,
                               config=self.cfg.to_dict(), vla_sha256=s.digest_before,
                               next_seq=lane.received, durable=lane.durable, episode=lane.recv_episode,
                               ticks=lane.recv_ticks, version=s.agent.updates,
                               need_base_eval=self.base is None and ev is lane, slot=lane.slot,
                               actors=len(self.lanes), session_ticks=self.session_ticks, evaluator=ev is lane))
        self.push_params(force=True, lanes=[lane])

    def _free_lane(self, msg: Message, actor_id: str) -> Lane:
        """The lane a new actor takes: the one its hello names (``slot``), else the first without an actor.
        A lane whose actor was heard within ``TAKEOVER_S`` is busy; after that a new actor takes it over (an
        actor restarted after a crash)."""
        if "slot" in msg.meta:
            slot = _typed(msg.meta["slot"], "slot", int, mtype="hello")
            if not 0 <= slot < len(self.lanes):
                raise ProtocolError("bad_field", f"slot {slot}: this session has actors 0..{len(self.lanes) - 1}",
                                    "slot")
            lane = self.lanes[slot]
        else:
            lane = next((lane for lane in self.lanes if lane.actor_id is None and lane.lost is None), self.lanes[0])
        if lane.actor_id is not None and lane.lost is None:
            silent = time.monotonic() - lane.heard
            if silent < TAKEOVER_S:
                raise ProtocolError("actor_busy", f"actor {lane.actor_id} is acting for this learner (heard "
                                    f"{silent:.1f} s ago); one actor per learner" if not self.multi else
                                    f"actor {lane.slot} of this session is {lane.actor_id} (heard {silent:.1f} s "
                                    "ago)", "actor_id")
            print(f"learner: actor {actor_id} takes over from {lane.actor_id} (silent {silent:.0f} s)", flush=True)
        return lane

    def _on_transition(self, lane: Lane, msg: Message) -> None:
        if msg.seq < lane.received:  # a resend of one we have: acknowledge, drop
            return self._ack(lane)
        if msg.seq > lane.received:
            raise ProtocolError("gap", f"transition {msg.seq} arrived but the next one expected is "
                                f"{lane.received}", "seq")
        if lane.said_bye or lane.bye_queued:
            raise ProtocolError("bad_field", f"transition {msg.seq} after the actor's bye", "seq")
        t = check_transition(msg, self.spec, episode=lane.recv_episode)
        self.inbox.append(("transition", (lane, t)))
        self.queued += 1
        lane.received += 1
        lane.recv_ticks += t.ticks
        if t.episode_end:
            lane.recv_episode += 1
            lane.episode_start = lane.received
        self._ack(lane)

    def _on_heartbeat(self, lane: Lane, msg: Message) -> None:
        have = field(msg, "params_version", int)
        if have != lane.pushed_version and time.monotonic() - lane.pushed_at > 1.0:
            self.push_params(force=True, lanes=[lane])  # the last push was lost (or the actor is new)
        self._ack(lane)

    def _on_eval(self, lane: Lane, msg: Message) -> None:
        ev = {"kind": field(msg, "kind", str, EVAL_KINDS), "episode": field(msg, "episode", int),
              "total_ticks": field(msg, "total_ticks", int), **_check_eval(msg.meta, "")}
        if "max_episode_ticks" in msg.meta:  # the actor's episode limit (optional: older actors do not send it)
            ev["max_episode_ticks"] = field(msg, "max_episode_ticks", int)
            if ev["max_episode_ticks"] < 1:
                raise ProtocolError("bad_field", f"max_episode_ticks {ev['max_episode_ticks']} < 1", "max_episode_ticks")
        self.inbox.append(("eval", ev))
        self._ack(lane)

    def _on_bye(self, lane: Lane, msg: Message) -> None:
        if field(msg, "next_seq", int) != lane.received:
            raise ProtocolError("gap", f"bye after {msg['next_seq']} transitions, the learner has "
                                f"{lane.received}", "next_seq")
        final = field(msg, "final", dict)
        # several actors: those that do not evaluate say bye with an empty final evaluation
        final = None if self.multi and not final else _check_eval(final, "final.")
        if final is None:
            if not lane.bye_queued:
                self.inbox.append(("bye", (lane, None)))
                lane.bye_queued = True
        elif not self.finished and not self.final_queued:  # a resent bye: once
            self.inbox.append(("bye", (lane, final)))
            self.final_queued = lane.bye_queued = True
        self._ack(lane)

    # -- processing, in arrival order -------------------------------------------------------------
    def _process(self, kind: str, item: Any) -> None:
        s = self.sess
        if kind == "transition":
            lane, t = item  # Lane, Transition
            self.queued -= 1
            s.store(t.tr)
            s.step += 1
            s.ticks += t.ticks
            lane.stored += 1
            lane.stored_ticks += t.ticks
            if not self.asynchronous:
                self._learn()
            if t.episode_end:
                from session.runner import end_episode

                lane.stored_episode += 1
                r = {**t.info, "losses": self.losses, **({"actor": lane.slot} if self.multi else {})}
                self.losses = {}
                end_episode(s, t.info["seed"], r, log=self.log, save=self.save)  # the actor evaluates
                self.push_params()
                if self.bar is not None:
                    self.bar.n = min(s.ticks, self.cfg.total_ticks)
                    self.bar.set_postfix(ep=s.episode, updates=s.agent.updates, queued=len(self.inbox))
        elif kind == "eval":
            self._log_eval(item)
        elif kind == "bye":
            lane, final = item
            lane.said_bye = True
            if final is not None:
                self._finish(lane, final)

    def save(self) -> None:
        """A checkpoint: the session's (``Session.save``) with every actor's counters; what it holds of each
        actor becomes that actor's ``durable``."""
        s = self.sess
        s.extra_state["lanes"] = [lane.state() for lane in self.lanes]
        s.save()
        for lane in self.lanes:
            lane.durable = lane.stored

    def _round_due(self) -> bool:
        """``updates`` async: is an update round owed? One per stored macro-step after warm-up, as
        lockstep would take (``agent.updates`` counts them), and none once the session's ticks are in."""
        s = self.sess
        return (self.asynchronous and s.ticks < self.cfg.total_ticks and s.step >= self.cfg.warmup_steps
                and len(s.online) >= 2 and s.agent.updates < s.step - self.cfg.warmup_steps + 1)

    def _learn(self) -> None:
        losses = self.sess.learn()
        if losses:
            self.losses = losses

    def _log_eval(self, ev: dict[str, Any]) -> None:
        if ev["kind"] == "base":
            if self.base is None:
                from session.runner import write_base_eval

                self.base = write_base_eval(self.sess, ev)
        elif self.multi:  # the evaluating actor counts its own episodes: log it at the session's counters
            self.log.evaluation(max(self.sess.episode - 1, 0), self.sess.ticks, ev)
        else:
            self.log.evaluation(ev["episode"], ev["total_ticks"], ev)

    def _finish(self, lane: Lane, final: dict[str, Any]) -> None:
        from session.runner import write_summary

        self.final = final
        s = self.sess
        self.save()
        extra = {"actors": [{**o.state(), "lost": o.lost} for o in self.lanes]} if self.multi else {}
        self.summary = write_summary(s, None if self.base is None else self.base["success_rate"], self.final,
                                     time.perf_counter() - self.t0, role="learner",
                                     params_version=s.agent.updates, **extra)
        self.finished = True
        for o in self.lanes:  # every actor still there hears it now (the others at their next message)
            if o.lost is None and o.ident is not None:
                self._ack(o)
        print(f"learner: session finished at step {s.step} ({s.ticks} ticks, {s.episode} episodes)", flush=True)

    def push_params(self, force: bool = False, lanes: list[Lane] | None = None) -> None:
        """Send the agent's actor parameters to every actor (``lanes``: these) that lacks them."""
        version = self.sess.agent.updates
        todo = [lane for lane in (self.lanes if lanes is None else lanes)
                if lane.ident is not None and lane.lost is None and (force or lane.pushed_version != version)]
        if not todo:
            return
        msg = params_message(self.learner_id, version, self.sess.step, self.sess.agent.actor_parameters())
        now = time.monotonic()
        for lane in todo:
            self._send(lane.ident, msg)
            lane.pushed_version, lane.pushed_at = version, now
        self.pushed_version = version


def run_learner(cfg: RLConfig, vla, bind: str = "tcp://127.0.0.1:5800", resume: bool = False,
                keys: CurveKeys | None = None, insecure: bool = False, progress: bool = True,
                stop: threading.Event | None = None) -> dict[str, Any] | None:
    """Serve one session as its learner until the actor says bye. -> the summary."""
    return Learner(cfg, vla, bind, resume=resume, keys=keys, insecure=insecure, progress=progress).serve(stop)
