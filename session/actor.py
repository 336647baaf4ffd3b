"""The actor of the split RL session (``vla rl --role actor``): the robot env and a copy of the
frozen VLA, next to the robot; it acts with the parameters the learner pushes and streams every
transition to it. The wire and its rules: ``session.protocol``."""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable

import numpy as np
import zmq

from robot_io.security import CurveKeys, secure_client_socket
from robot_io.wire import Message, ProtocolError
from session.config import RLConfig
from session.protocol import (LEARNER_TYPES, MESSAGE_TYPES, LearnerGone, LearnerRefused, RemoteRLError, _msg,
                              check_params, check_splits, field, pack, transition_message, unpack)


@dataclasses.dataclass(frozen=True)
class ActorConfig:
    learner: str
    """The learner's endpoint, e.g. tcp://gpu-box:5800."""
    learner_timeout_s: float = 30.0
    """Stop acting (before the robot moves again) after this long without a word from the learner.
    While the learner is away for less, the actor keeps acting on the last parameters it has."""
    heartbeat_s: float = 0.5
    """Seconds between heartbeats to the learner."""
    resend_s: float = 5.0
    """Resend unacknowledged transitions when the learner's receive count has not moved for this long."""
    max_outbox: int = 10_000
    """Transitions kept for resending (those not yet in a learner checkpoint). When this many are
    waiting, the actor waits at the next episode boundary for the learner to catch up."""
    checkpoint: str | None = None
    """The VLA on this machine (default: the path in the learner's config). Its weights must equal the learner's."""
    robot: str | None = None
    """Site preset or YAML on this machine (default: the learner's config)."""
    keys: CurveKeys | None = None
    """CurveZMQ keys (client secret, server public) for a learner off loopback."""
    slot: int | None = None
    """With several actors (``vla rl --actors N``): this actor's lane, 0..N-1, which fixes its training scenes;
    default: the learner's first free lane."""

    def __post_init__(self) -> None:
        for f in ("learner_timeout_s", "heartbeat_s", "resend_s"):
            if not getattr(self, f) > 0:
                raise ValueError(f"ActorConfig.{f} must be > 0, got {getattr(self, f)}")
        if self.heartbeat_s >= self.learner_timeout_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s}) must be below learner_timeout_s "
                             f"({self.learner_timeout_s})")
        if self.max_outbox < 1:
            raise ValueError(f"ActorConfig.max_outbox must be >= 1, got {self.max_outbox}")
        if self.slot is not None and self.slot < 0:
            raise ValueError(f"ActorConfig.slot must be >= 0, got {self.slot}")


def _optional(msg: Message, name: str, kind: type, default: Any) -> Any:
    """An optional header field (checked when present), else ``default``."""
    return field(msg, name, kind) if name in msg.meta else default


class ActorLink:
    """The actor's side of the link: a background thread owns the DEALER socket, sends hello /
    transitions / heartbeats / evals, keeps the outbox for resends, and records what the learner
    says (welcome, acks, newest params, errors). The acting thread only calls the public methods."""

    def __init__(self, cfg: ActorConfig, actor_id: str, context: zmq.Context | None = None) -> None:
        self.cfg, self.actor_id = cfg, actor_id
        self.ctx = context or zmq.Context.instance()
        self._lock = threading.Lock()
        self._outbox: collections.deque[tuple[int, list[bytes]]] = collections.deque()
        self._control: collections.deque[list[bytes]] = collections.deque()
        self.next_seq = -1  # the next new transition's seq (-1 until the first welcome)
        self._send_ptr = 0
        self.welcome: dict[str, Any] | None = None
        self._welcomed = threading.Event()
        self.learner_ids: list[str] = []
        self.learner_id: str | None = None
        self.received = self.learned = self.durable = self.version = 0
        self.finished = False
        self.slot, self.actors = cfg.slot or 0, 1  # this actor's lane of how many (from the welcome)
        self.session_ticks = 0  # ticks the learner took in from every actor
        self.evaluator, self.settled = True, False  # this actor runs the evaluations; the others are done
        self.heard = time.monotonic()
        self.error: Exception | None = None
        self.params: tuple[str, int, Message] | None = None  # newest (learner_id, version, message)
        self._need_hello = True
        self._progress_at = time.monotonic()
        self._rewound: tuple[int, float] = (-1, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rl-actor-link")
        self._thread.start()

    # -- the acting thread's side -----------------------------------------------------------------
    def check(self) -> None:
        """Raise if the learner refused something, sent garbage, or has been silent too long."""
        if self.error is not None:
            raise self.error
        silent = time.monotonic() - self.heard
        if silent > self.cfg.learner_timeout_s:
            raise LearnerGone(
                f"no word from the learner at {self.cfg.learner} for {silent:.1f} s (learner_timeout_s "
                f"{self.cfg.learner_timeout_s:g}); stopping the actor rather than running the robot on stale "
                f"parameters (version {self.version}). {len(self._outbox)} transitions were not checkpointed by "
                "the learner; restart the learner with --resume, then the actor.")

    def wait_welcome(self) -> dict[str, Any]:
        while not self._welcomed.wait(0.05):
            self.check()
        self.check()
        return self.welcome

    def send_transition(self, seq: int, frames: list[bytes]) -> None:
        with self._lock:
            if seq != self.next_seq:
                raise RuntimeError(f"transition {seq} out of order (next is {self.next_seq})")
            self._outbox.append((seq, frames))
            self.next_seq = seq + 1

    def send(self, frames: list[bytes]) -> None:
        """An unsequenced message (eval, bye), sent once the learner has welcomed us."""
        with self._lock:
            self._control.append(frames)

    def pending(self) -> int:
        """Transitions held for resending (not yet in a learner checkpoint)."""
        with self._lock:
            return len(self._outbox)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    # -- the link thread --------------------------------------------------------------------------
    def _socket(self) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IMMEDIATE, 1)  # no queueing for a learner that is not there: the outbox resends
        secure_client_socket(s, self.cfg.keys)
        s.connect(self.cfg.learner)
        return s

    def _run(self) -> None:
        sock = self._socket()
        last_hello = last_hb = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if self._need_hello:
                    if now - last_hello >= 0.5:
                        slot = {} if self.cfg.slot is None else {"slot": self.cfg.slot}
                        self._try_send(sock, pack(_msg("hello", self.actor_id, actor_id=self.actor_id,
                                                       next_seq=self.next_seq,
                                                       params_version=self._have_version(), **slot)))
                        last_hello = now
                else:
                    if now - last_hb >= self.cfg.heartbeat_s:
                        self._try_send(sock, pack(_msg("heartbeat", self.actor_id, actor_id=self.actor_id,
                                                       next_seq=self.next_seq,
                                                       params_version=self._have_version())))
                        last_hb = now
                    self._send_pending(sock, now)
                if sock.poll(20):
                    for _ in range(1000):
                        try:
                            frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._receive(frames)
        except Exception as e:  # the acting thread raises it at its next check
            self.error = e if isinstance(e, RemoteRLError) else RemoteRLError(f"actor link failed: {e!r}")
        finally:
            sock.close(linger=0)

    def _have_version(self) -> int:
        p = self.params
        return p[1] if p is not None and p[0] == self.learner_id else -1

    @staticmethod
    def _try_send(sock: zmq.Socket, frames: list[bytes]) -> bool:
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
            return True
        except zmq.Again:  # not connected, or the learner's queue is full: try again later
            return False

    def _send_pending(self, sock: zmq.Socket, now: float) -> None:
        with self._lock:
            if self.received < self._send_ptr and now - self._progress_at > self.cfg.resend_s:
                self._send_ptr = max(self.received, self._outbox[0][0] if self._outbox else self.received)
                self._progress_at = now
            first = self._outbox[0][0] if self._outbox else self.next_seq
            todo = [self._outbox[i] for i in range(self._send_ptr - first, min(len(self._outbox),
                                                                                self._send_ptr - first + 256))]
            control = list(self._control)
        for seq, frames in todo:
            if not self._try_send(sock, frames):
                return
            with self._lock:
                self._send_ptr = seq + 1
        for frames in control:
            if not self._try_send(sock, frames):
                return
            with self._lock:
                self._control.popleft()

    def _receive(self, frames) -> None:
        try:
            msg = unpack(frames)
            if msg.type not in LEARNER_TYPES:
                raise ProtocolError("bad_type", f"an actor does not take {msg.type!r} messages", "type")
            self.heard = time.monotonic()
            getattr(self, f"_on_{msg.type}")(msg)
        except ProtocolError as e:
            raise LearnerRefused(e.code, f"the learner sent a malformed message: {e.message}", e.field) from None

    def _on_welcome(self, msg: Message) -> None:
        w = {k: msg.meta[k] for k in MESSAGE_TYPES["welcome"].fields}
        lid, start = field(msg, "learner_id", str), field(msg, "next_seq", int)
        for k in ("durable", "episode", "ticks", "version"):
            field(msg, k, int)
        field(msg, "config", dict)
        # the lane (several actors); a learner that does not send them serves one actor
        slot, actors = _optional(msg, "slot", int, 0), _optional(msg, "actors", int, 1)
        if not 0 <= slot < actors:
            raise ProtocolError("bad_field", f"welcome names lane {slot} of {actors}", "slot")
        if self.cfg.slot is not None and slot != self.cfg.slot:
            raise RemoteRLError(f"the learner gave this actor lane {slot}, it asked for {self.cfg.slot}")
        with self._lock:
            if self.welcome is None:  # a fresh actor starts where the learner is
                self.next_seq = self._send_ptr = self.received = start
            else:
                first = self._outbox[0][0] if self._outbox else self.next_seq
                mine = {k: v for k, v in self.welcome["config"].items() if k != "total_ticks"}
                if {k: v for k, v in w["config"].items() if k != "total_ticks"} != mine \
                        or w["vla_sha256"] != self.welcome["vla_sha256"]:
                    raise RemoteRLError(f"the learner at {self.cfg.learner} now serves another session "
                                        "(config or VLA differ); stopping")
                if not first <= start <= self.next_seq:
                    raise RemoteRLError(
                        f"the learner restarted at transition {start}, but this actor holds transitions "
                        f"{first}..{self.next_seq - 1} only: it cannot continue this session without a gap")
                self._send_ptr = self.received = start
            self.durable = w["durable"]
            self._trim()
            if self.welcome is None:
                self.welcome = w
            self.learner_id, self.version = lid, w["version"]
            self.slot, self.actors = slot, actors
            self.session_ticks = _optional(msg, "session_ticks", int, w["ticks"])
            self.evaluator = _optional(msg, "evaluator", bool, slot == 0)
            if lid not in self.learner_ids:
                self.learner_ids.append(lid)
            self._need_hello = False
            self._progress_at = time.monotonic()
        self._welcomed.set()

    def _on_ack(self, msg: Message) -> None:
        if field(msg, "learner_id", str) != self.learner_id:
            return  # from a learner we have not been welcomed by (yet)
        with self._lock:
            received = field(msg, "received", int)
            if received != self.received:
                self.received, self._progress_at = received, time.monotonic()
            self.learned, self.durable = field(msg, "learned", int), field(msg, "durable", int)
            self.version, self.finished = field(msg, "version", int), field(msg, "finished", bool)
            self.session_ticks = _optional(msg, "session_ticks", int, self.session_ticks)
            self.evaluator = _optional(msg, "evaluator", bool, self.evaluator)
            self.settled = _optional(msg, "settled", bool, True)
            self._trim()

    def _on_params(self, msg: Message) -> None:
        lid, version = field(msg, "learner_id", str), field(msg, "version", int)
        field(msg, "step", int)
        if lid != self.learner_id:
            return
        p = self.params
        if p is None or p[0] != lid or version >= p[1]:
            # own the arrays: the received ones are views of ZMQ's buffers
            self.params = (lid, version, dataclasses.replace(msg, arrays={k: np.array(v) for k, v in msg.arrays.items()}))

    def _on_error(self, msg: Message) -> None:
        code, text = str(msg.get("code")), str(msg.get("message"))
        if code == "not_registered":  # a new learner (restart), or another actor took over: introduce ourselves
            self._need_hello = True
        elif code == "gap" and isinstance(msg.get("expected"), int):
            expected = msg["expected"]
            with self._lock:
                first = self._outbox[0][0] if self._outbox else self.next_seq
                if not first <= expected <= self.next_seq:
                    raise RemoteRLError(f"the learner wants transition {expected}, but this actor holds "
                                        f"{first}..{self.next_seq - 1} only")
                if self._rewound[0] != expected or time.monotonic() - self._rewound[1] > 1.0:
                    self._send_ptr, self._rewound = expected, (expected, time.monotonic())
        else:
            seq = msg.get("transition")
            raise LearnerRefused(code, (f"the learner refused transition {seq}: " if seq is not None else
                                        "the learner refused a message: ") + text, msg.get("field"))

    def _trim(self) -> None:  # under the lock: drop what a learner checkpoint holds
        while self._outbox and self._outbox[0][0] < min(self.durable, self._send_ptr):
            self._outbox.popleft()


class Actor:
    """The actor: ``connect()`` (the learner's welcome -> the session's RLConfig), ``prepare(vla,
    env)``, then ``run()``. :func:`run_actor` does all three."""

    def __init__(self, cfg: ActorConfig, on_transition: Callable[[int, dict[str, Any]], None] | None = None,
                 context: zmq.Context | None = None) -> None:
        self.cfg, self.on_transition = cfg, on_transition
        self.actor_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.link = ActorLink(cfg, self.actor_id, context)
        self.rl_cfg: RLConfig | None = None
        self.sess = None
        self.params_key: tuple[str, int] | None = None  # (learner_id, version) of the parameters in use

    def connect(self) -> RLConfig:
        """Wait for the learner's welcome (LearnerGone after ``learner_timeout_s``) -> the session's
        config, with this machine's ``checkpoint`` / ``robot`` if given."""
        w = self.link.wait_welcome()
        cfg = RLConfig.from_dict(w["config"])
        check_splits(cfg)
        over = {k: getattr(self.cfg, k) for k in ("checkpoint", "robot") if getattr(self.cfg, k)}
        self.rl_cfg = dataclasses.replace(cfg, **over)
        return self.rl_cfg

    def prepare(self, vla, env=None, operator=None, progress: bool = True) -> None:
        """Build the acting session, check the VLA against the learner's, take the first parameters."""
        from session.runner import Session, weights_digest

        if self.rl_cfg is None:
            self.connect()
        w = self.link.welcome
        digest = weights_digest(vla)
        if digest != w["vla_sha256"]:
            raise RemoteRLError(f"this actor's VLA ({self.rl_cfg.checkpoint}, sha256 {digest[:12]}) differs from the "
                                f"learner's (sha256 {w['vla_sha256'][:12]}): both sides must load the same checkpoint")
        if self.rl_cfg.threads:
            import torch

            torch.set_num_threads(self.rl_cfg.threads)
        cfg = self.rl_cfg
        if self.link.actors > 1 and cfg.eval_every:  # one of N actors evaluates: every eval_every session episodes
            cfg = dataclasses.replace(cfg, eval_every=math.ceil(cfg.eval_every / self.link.actors))
        slot = self.link.slot  # actor 0 draws from the session's seed, the others from streams of their own
        seed = None if slot == 0 else int(np.random.SeedSequence((cfg.seed, slot)).generate_state(1)[0])
        self.sess = Session(cfg, env, vla, operator=operator, progress=progress, sink=self._sink,
                            guard=self.link.check, seed=seed)
        s = self.sess
        s.step, s.ticks, s.episode = w["next_seq"], w["ticks"], w["episode"]
        while not self.apply_newest_params():  # the welcome is followed by the parameters
            self.link.check()
            time.sleep(0.01)

    def apply_newest_params(self) -> bool:
        """Load the newest parameters received (from a new learner: whatever their version) into the
        agent (``load_actor_parameters``). -> whether any are in use. Called at episode boundaries only."""
        import torch

        p = self.link.params
        if p is not None and (p[0], p[1]) != self.params_key:
            agent = self.sess.agent
            try:
                arrays = check_params(p[2], agent.actor_parameters())
            except ProtocolError as e:
                raise LearnerRefused(e.code, f"the learner sent bad parameters (version {p[1]}): {e.message}",
                                     e.field) from None
            agent.load_actor_parameters({k: torch.from_numpy(v) for k, v in arrays.items()})
            self.params_key = (p[0], p[1])
        return self.params_key is not None

    def _sink(self, tr: dict[str, Any], ticks: int, episode_end: bool, info: dict[str, Any]) -> None:
        """``Session.record`` hands each transition here (before counting it): to the learner."""
        s = self.sess
        self.link.send_transition(s.step, pack(transition_message(
            self.actor_id, s.step, s.episode, tr, ticks, episode_end, info, self.params_version)))
        if self.on_transition is not None:
            self.on_transition(s.step, tr)

    @property
    def params_version(self) -> int:
        return -1 if self.params_key is None else self.params_key[1]

    def _send_eval(self, kind: str, ev: dict[str, Any]) -> None:
        s = self.sess
        self.link.send(pack(_msg("eval", self.actor_id, actor_id=self.actor_id, kind=kind, episode=s.episode - 1,
                                 total_ticks=s.ticks, successes=int(ev["successes"]), episodes=int(ev["episodes"]),
                                 max_episode_ticks=int(s.max_ticks), params_version=self.params_version)))

    def run_on_robot(self, vla, client, make_env: Callable[[], Any], progress: bool = True) -> dict[str, Any]:
        """``prepare`` + ``run`` on the robot behind ``client`` (``make_env()`` builds the env over it). When the
        learner goes away the robot is put in its safe state at once, not only when the bridge's watchdog fires;
        ``client`` is closed in every case."""
        from robot_io.client import BridgeError

        try:
            self.prepare(vla, make_env(), progress=progress)
            return self.run(progress=progress)
        except LearnerGone:
            try:
                client.stop()
            except BridgeError as e:
                print(f"actor: could not stop the robot: {e}", flush=True)
            raise
        finally:
            client.close()

    def run(self, progress: bool = True) -> dict[str, Any]:
        """Act until the session's tick budget is spent, then the final evaluation (or, one of several
        actors that does not evaluate, wait for the session's end). -> a summary."""
        from tqdm import tqdm

        from session.runner import actor_episode, end_episode, episode_seed

        s, cfg, link = self.sess, self.rl_cfg, self.link
        if link.welcome["need_base_eval"]:
            self._send_eval("base", s.evaluate(cfg.eval_episodes, cfg.eval_seed_start, base=True))
        bar = tqdm(total=cfg.total_ticks, initial=min(s.ticks, cfg.total_ticks), unit="tick",
                   desc=f"actor {cfg.label}" + (f" {link.slot}" if link.actors > 1 else ""), disable=not progress)
        t0, waited = time.perf_counter(), False
        seeds: list[int] = []
        try:
            while max(s.ticks, link.session_ticks) < cfg.total_ticks:  # every actor's ticks count
                while link.pending() >= self.cfg.max_outbox:  # the learner is far behind: wait, robot idle
                    if not waited:
                        print(f"actor: {link.pending()} transitions not yet checkpointed by the learner; "
                              "waiting for it to catch up", flush=True)
                        waited = True
                    link.check()
                    time.sleep(0.05)
                waited = False
                link.check()
                self.apply_newest_params()
                per_scene = s.agent.episodes_per_scene
                seed = episode_seed(cfg, actor_episode(s.episode, link.slot, link.actors, per_scene), per_scene)
                seeds.append(seed)
                r = s.run_episode(seed)
                # the learner logs and checkpoints it (from the transitions); the actor evaluates
                end_episode(s, seed, r, report_eval=(lambda ep, ticks, ev: self._send_eval("periodic", ev))
                            if link.evaluator else None)
                bar.n = min(max(s.ticks, link.session_ticks), cfg.total_ticks)
                bar.set_postfix(ep=s.episode, succ=int(r["success"]), params=self.params_version)
        finally:
            bar.close()
        out = {"episodes": s.episode, "steps": s.step, "ticks": s.ticks, "slot": link.slot, "seeds": seeds}
        if not self._final_turn():  # another actor ran the final evaluation
            return {**out, "final_success_rate": None, "params_version": self.params_version,
                    "learners": list(link.learner_ids), "wall_s": time.perf_counter() - t0}
        final = s.evaluate(cfg.eval_episodes, cfg.eval_seed_start)
        lines = s.agent.report(final["per_episode"])
        if lines and progress:
            print("final evaluation:\n" + "\n".join(lines), flush=True)
        bye = pack(_msg("bye", self.actor_id, actor_id=self.actor_id, next_seq=s.step, final={
            "successes": int(final["successes"]), "episodes": int(final["episodes"]),
            "params_version": self.params_version}))
        sent_to, sent_at = None, 0.0
        while not link.finished:  # resent to a restarted learner, or when lost
            link.check()
            if link.learner_id != sent_to or time.monotonic() - sent_at > 5.0:
                link.send(bye)
                sent_to, sent_at = link.learner_id, time.monotonic()
            time.sleep(0.02)
        return {**out, "final_success_rate": final["success_rate"], "params_version": self.params_version,
                "learners": list(link.learner_ids), "wall_s": time.perf_counter() - t0}

    def _final_turn(self) -> bool:
        """Wait for this actor's turn at the final evaluation: the evaluator's once every other actor has said
        bye and the learner has learned from every transition and pushed the last parameters (-> True). An
        actor that does not evaluate says bye at once and waits for the session's end (-> False), unless the
        evaluator is dropped and the turn passes to it."""
        s, link = self.sess, self.link
        bye = pack(_msg("bye", self.actor_id, actor_id=self.actor_id, next_seq=s.step, final={}))
        sent_to, sent_at = None, 0.0
        while not (link.evaluator and link.settled and link.learned >= s.step
                   and self.params_key == (link.learner_id, link.version)):
            link.check()
            if link.finished:
                return False
            if not link.evaluator and (link.learner_id != sent_to or time.monotonic() - sent_at > 5.0):
                link.send(bye)  # resent to a restarted learner, or when lost
                sent_to, sent_at = link.learner_id, time.monotonic()
            self.apply_newest_params()
            time.sleep(0.02)
        return True

    def close(self) -> None:
        self.link.close()


def run_actor(cfg: ActorConfig, make_env: Callable[[RLConfig], Any], load_vla: Callable[[RLConfig], Any],
              operator=None, progress: bool = True,
              on_transition: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Connect to the learner, build the env and the VLA for its session (``make_env(rl_cfg)``,
    ``load_vla(rl_cfg)``), act until the session is over. -> the actor's summary."""
    actor = Actor(cfg, on_transition=on_transition)
    try:
        rl_cfg = actor.connect()
        actor.prepare(load_vla(rl_cfg), make_env(rl_cfg), operator=operator, progress=progress)
        return actor.run(progress=progress)
    finally:
        actor.close()
