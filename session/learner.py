"""The learner of the split RL session (``vla rl --role learner``): replay buffers, the agent's
networks and optimisers, the run directory and ``--resume``; never the robot. The wire and its
rules: ``session.protocol``."""

from __future__ import annotations

import collections
import secrets
import threading
import time
from typing import Any

import zmq

from robot_io.security import CurveKeys, secure_server_socket
from robot_io.wire import Message, ProtocolError, encode
from session.config import RLConfig
from session.protocol import (ACTOR_TYPES, EVAL_KINDS, FINISH_GRACE_S, FINISH_QUIET_S, PUSH_EVERY_S, TAKEOVER_S,
                              RemoteRLError, Transition, TransitionSpec, _check_eval, _msg, check_splits,
                              check_transition, error_reply, field, params_message, unpack)


class Learner:
    """The learner's state and its message loop. ``serve()`` runs until the actor's ``bye``;
    ``step()`` is one turn of the loop (tests drive it by hand)."""

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
        # "received" counters run ahead of the learned ones (s.step, s.ticks, s.episode) by the inbox
        self.received, self.recv_episode = s.step, s.episode
        self.durable = s.step if resume else 0
        self.inbox: collections.deque[tuple[str, Any]] = collections.deque()
        self.learner_id = secrets.token_hex(6)
        self.actor_id: str | None = None
        self.actor_ident: bytes | None = None
        self.actor_heard = time.monotonic()
        self.actor_silence_warned = False
        self.pushed_version, self.pushed_at = -1, 0.0
        self.losses: dict[str, float] = {}
        self.final: dict[str, Any] | None = None
        self.summary: dict[str, Any] | None = None
        self.finished = False
        self.finished_acks = 0
        self.base: dict[str, Any] | None = read_base_eval(s, resume)
        self.log = RunLog(cfg.out, s.ticks)
        s.on_update = self.log.update
        self.t0 = time.perf_counter()
        self.bar = None
        self.asynchronous = cfg.updates == "async"

    # -- the loop ---------------------------------------------------------------------------------
    def serve(self, stop: threading.Event | None = None) -> dict[str, Any] | None:
        """Serve until the actor says bye (-> the summary) or ``stop`` is set (-> None)."""
        print(f"learner listening on {self.endpoint} (session {self.cfg.out}, step {self.sess.step}); "
              f"start the actor with: vla rl --role actor --learner {self.endpoint}", flush=True)
        if self.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=self.cfg.total_ticks, initial=min(self.sess.ticks, self.cfg.total_ticks),
                            unit="tick", desc=f"learner {self.cfg.label}")
        try:
            while not self.finished and not (stop is not None and stop.is_set()):
                self.step(0.1)
            if self.finished:  # should the finished ack be lost, the actor's next message gets another
                until = time.monotonic() + FINISH_GRACE_S
                while time.monotonic() < until and not (stop is not None and stop.is_set()):
                    self.step(0.1)
                    if self.finished_acks and time.monotonic() - self.actor_heard > FINISH_QUIET_S:
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
        if self.asynchronous:
            while self.inbox:
                self._process(*self.inbox.popleft())
            if self._round_due():
                self._learn()
            elif self.sess.ticks >= self.cfg.total_ticks:
                self.push_params()  # the last rounds are done: the actor's final evaluation waits for these
            elif time.monotonic() - self.pushed_at > PUSH_EVERY_S:
                self.push_params()
        elif self.inbox:
            self._process(*self.inbox.popleft())
        if self.actor_id is not None and not self.actor_silence_warned and time.monotonic() - self.actor_heard > 60:
            print(f"learner: no word from actor {self.actor_id} for 60 s; waiting for it (or a new one)", flush=True)
            self.actor_silence_warned = True

    def close(self) -> None:
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

    def _ack(self, ident: bytes) -> None:
        self._send(ident, _msg("ack", "learner", learner_id=self.learner_id, received=self.received,
                               learned=self.sess.step, durable=self.durable, version=self.sess.agent.updates,
                               finished=self.finished))
        self.finished_acks += self.finished

    def _receive(self, frames) -> None:
        ident, body = bytes(frames[0].buffer), frames[1:]
        seq = None
        try:
            msg = unpack(body)
            seq = msg.seq if msg.type == "transition" else None
            if msg.type not in ACTOR_TYPES:
                raise ProtocolError("bad_type", f"a learner does not take {msg.type!r} messages", "type")
            actor_id = field(msg, "actor_id", str)
            if msg.type == "hello":
                return self._hello(ident, msg, actor_id)
            if actor_id != self.actor_id:
                raise ProtocolError("not_registered", f"actor {actor_id!r} has not said hello to this learner "
                                    f"(id {self.learner_id})", "actor_id")
            self.actor_ident, self.actor_heard, self.actor_silence_warned = ident, time.monotonic(), False
            getattr(self, f"_on_{msg.type}")(ident, msg)
        except ProtocolError as e:
            if e.code != "not_registered":
                print(f"learner: refused a message: [{e.code}] {e.message}", flush=True)
            extra = {"transition": seq} if seq is not None else {}
            if e.code == "gap":
                extra["expected"] = self.received
            self._send(ident, error_reply(e.code, e.message, e.field, **extra))

    def _hello(self, ident: bytes, msg: Message, actor_id: str) -> None:
        next_seq = field(msg, "next_seq", int)
        if self.actor_id not in (None, actor_id):
            silent = time.monotonic() - self.actor_heard
            if silent < TAKEOVER_S:
                raise ProtocolError("actor_busy", f"actor {self.actor_id} is acting for this learner (heard "
                                    f"{silent:.1f} s ago); one actor per learner", "actor_id")
            print(f"learner: actor {actor_id} takes over from {self.actor_id} (silent {silent:.0f} s)", flush=True)
        if actor_id != self.actor_id:
            print(f"learner: actor {actor_id} connected (it has sent {max(next_seq, 0)} transitions; "
                  f"this learner holds {self.received})", flush=True)
        self.actor_id, self.actor_ident, self.actor_heard = actor_id, ident, time.monotonic()
        s = self.sess
        self._send(ident, _msg("welcome", "learner", learner_id=self.learner_id,
                               config=self.cfg.to_dict(), vla_sha256=s.digest_before,
                               next_seq=self.received, durable=self.durable, episode=self.recv_episode,
                               ticks=self._recv_ticks(), version=s.agent.updates, need_base_eval=self.base is None))
        self.push_params(force=True)

    def _recv_ticks(self) -> int:
        return self.sess.ticks + sum(t.ticks for kind, t in self.inbox if kind == "transition")

    def _on_transition(self, ident: bytes, msg: Message) -> None:
        if msg.seq < self.received:  # a resend of one we have: acknowledge, drop
            return self._ack(ident)
        if msg.seq > self.received:
            raise ProtocolError("gap", f"transition {msg.seq} arrived but the next one expected is "
                                f"{self.received}", "seq")
        t = check_transition(msg, self.spec, episode=self.recv_episode)
        self.inbox.append(("transition", t))
        self.received += 1
        self.recv_episode += int(t.episode_end)
        self._ack(ident)

    def _on_heartbeat(self, ident: bytes, msg: Message) -> None:
        have = field(msg, "params_version", int)
        if have != self.pushed_version and time.monotonic() - self.pushed_at > 1.0:
            self.push_params(force=True)  # the last push was lost (or the actor is new)
        self._ack(ident)

    def _on_eval(self, ident: bytes, msg: Message) -> None:
        ev = {"kind": field(msg, "kind", str, EVAL_KINDS), "episode": field(msg, "episode", int),
              "total_ticks": field(msg, "total_ticks", int), **_check_eval(msg.meta, "")}
        if "max_episode_ticks" in msg.meta:  # the actor's episode limit (optional: older actors do not send it)
            ev["max_episode_ticks"] = field(msg, "max_episode_ticks", int)
            if ev["max_episode_ticks"] < 1:
                raise ProtocolError("bad_field", f"max_episode_ticks {ev['max_episode_ticks']} < 1", "max_episode_ticks")
        self.inbox.append(("eval", ev))
        self._ack(ident)

    def _on_bye(self, ident: bytes, msg: Message) -> None:
        if field(msg, "next_seq", int) != self.received:
            raise ProtocolError("gap", f"bye after {msg['next_seq']} transitions, the learner has "
                                f"{self.received}", "next_seq")
        final = _check_eval(field(msg, "final", dict), "final.")
        if not self.finished and not any(kind == "bye" for kind, _ in self.inbox):  # a resent bye: once
            self.inbox.append(("bye", (ident, final)))
        self._ack(ident)

    # -- processing, in arrival order -------------------------------------------------------------
    def _process(self, kind: str, item: Any) -> None:
        s = self.sess
        if kind == "transition":
            t: Transition = item
            s.store(t.tr)
            s.step += 1
            s.ticks += t.ticks
            if not self.asynchronous:
                self._learn()
            if t.episode_end:
                from session.runner import end_episode

                r = {**t.info, "losses": self.losses}
                self.losses = {}
                if end_episode(s, t.info["seed"], r, log=self.log, save=s.save):  # the actor evaluates
                    self.durable = s.step
                self.push_params()
                if self.bar is not None:
                    self.bar.n = min(s.ticks, self.cfg.total_ticks)
                    self.bar.set_postfix(ep=s.episode, updates=s.agent.updates, queued=len(self.inbox))
        elif kind == "eval":
            self._log_eval(item)
        elif kind == "bye":
            self._finish(*item)

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
        else:
            self.log.evaluation(ev["episode"], ev["total_ticks"], ev)

    def _finish(self, ident: bytes, final: dict[str, Any]) -> None:
        from session.runner import write_summary

        self.final = final
        s = self.sess
        s.save()
        self.durable = s.step
        self.summary = write_summary(s, None if self.base is None else self.base["success_rate"], self.final,
                                     time.perf_counter() - self.t0, role="learner",
                                     params_version=s.agent.updates)
        self.finished = True
        self._ack(ident)
        print(f"learner: session finished at step {s.step} ({s.ticks} ticks, {s.episode} episodes)", flush=True)

    def push_params(self, force: bool = False) -> None:
        """Send the agent's actor parameters to the actor if they changed since the last push."""
        version = self.sess.agent.updates
        if self.actor_ident is None or (version == self.pushed_version and not force):
            return
        self._send(self.actor_ident, params_message(self.learner_id, version, self.sess.step,
                                                    self.sess.agent.actor_parameters()))
        self.pushed_version, self.pushed_at = version, time.monotonic()


def run_learner(cfg: RLConfig, vla, bind: str = "tcp://127.0.0.1:5800", resume: bool = False,
                keys: CurveKeys | None = None, insecure: bool = False, progress: bool = True,
                stop: threading.Event | None = None) -> dict[str, Any] | None:
    """Serve one session as its learner until the actor says bye. -> the summary."""
    return Learner(cfg, vla, bind, resume=resume, keys=keys, insecure=insecure, progress=progress).serve(stop)
