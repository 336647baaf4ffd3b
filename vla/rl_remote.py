"""Distributed online RL (``vla rl --role learner | actor``): the actor next to the robot, the
learner on a GPU box (or the same machine), over ZMQ -- the actor / learner split of SERL and
HIL-SERL.

Roles
-----
* **learner** (:func:`run_learner`, :class:`Learner`): owns the replay buffers, the agent's networks
  and optimisers, the run directory (config, checkpoints, ``episodes.jsonl`` / ``evals.jsonl``,
  TensorBoard, learning curve, ``summary.json``) and ``--resume``. It never touches the robot. It
  binds one ROUTER socket (off loopback: CurveZMQ keys, as the bridge).
* **actor** (:func:`run_actor`, :class:`Actor`): owns the robot env and its own copy of the frozen
  VLA. It takes the session's config from the learner, refuses to act if its VLA's weights differ
  from the learner's (SHA-256 of the state dict), rolls the VLA + DSRL noise policy out (with
  operator interventions) and streams every transition to the learner. It acts with the newest
  policy parameters the learner pushed, switching only at episode boundaries, and runs the
  evaluations (base, every ``eval_every`` episodes, final), reporting them to the
  learner. One DEALER socket, owned by a background thread (:class:`ActorLink`).

Both sides run the code of the in-process mode (``vla.rl.Session``): the actor's rollout is
``Session.run_episode`` with ``record`` sending instead of learning; the learner's learning is
``Session.store`` / ``learn`` and its checkpoints ``Session.save`` / ``load``.

The wire
--------
The framing of ``robot_io.wire`` (frame 0 a msgpack header ``{v, type, device, seq, t_mono_ns,
t_wall_ns, arrays, ...}``, then one raw frame per numpy array; never pickle) with this link's own
schema :data:`MESSAGE_TYPES` and version :data:`PROTOCOL_VERSION`. A message with another ``v``,
an unknown ``type``, a missing or mistyped field, an array of the wrong dtype or shape, or a
non-finite value is refused with an ``error`` whose ``field`` names the culprit; nothing is stored
and the learner keeps serving. ``device`` is the sender (an actor id, or ``learner``).

actor -> learner::

    hello       actor_id, next_seq (-1: a fresh actor), params_version   -> welcome, then params
    transition  actor_id; header seq = the transition's index in the session (0, 1, 2, ...);
                episode, ticks (control ticks executed), reward, done, intervention, episode_end,
                params_version (the policy that acted), episode_info (with episode_end: seed,
                success, ticks, steps, return, interventions);
                arrays feat f32[D], next_feat f32[D], action f32[d] (the noise w),
                chunk f32[E, A] (the executed chunk, normalised)          -> ack, or error
    heartbeat   actor_id, next_seq, params_version                       -> ack
    eval        actor_id, kind (base | periodic), episode, total_ticks, successes, episodes,
                params_version                                           -> ack
    bye         actor_id, next_seq, final {successes, episodes, params_version}: every transition
                is sent and the final evaluation done (resent every few seconds until the learner
                answers)         -> ack with finished=true after the final checkpoint and summary

learner -> actor::

    welcome     learner_id, config (the RLConfig as a map), vla_sha256, next_seq, durable,
                episode, ticks, version, need_base_eval
    ack         learner_id, received, learned, durable, version, finished
    params      learner_id, version, step; arrays: the actor network's state_dict (f32)
    error       code, field, message, transition (the refused one's seq), expected (code gap)

Sequence numbers and acknowledgements (go-back-N)
-------------------------------------------------
The learner accepts transition ``seq == received`` only: a smaller one is a duplicate (acked and
dropped), a larger one a gap (``error`` code ``gap`` with ``expected``; the actor resends from
there). ``received`` counts transitions taken in, ``learned`` those stored and learned from,
``durable`` those inside the last checkpoint. The actor keeps every transition not yet
``durable`` in a bounded outbox (``max_outbox``; when full it waits at the next episode boundary,
with the robot idle, for the learner to catch up) and resends from ``received`` if that stops
moving for ``resend_s``.

A learner restart (SIGKILL, then ``--resume``) comes back with a new ``learner_id`` at its last
checkpoint. It answers the actor's next message with ``error`` code ``not_registered``; the actor
says hello again, and the welcome's ``next_seq`` (the checkpoint's step) is where it resends
from. Transitions past the checkpoint are not lost: the actor still holds them. Meanwhile the
actor keeps acting with the last parameters it has; the new learner's parameters replace them at
the next episode boundary, whatever their version.

Liveness: the actor sends a heartbeat every ``heartbeat_s``; every learner message counts as a
sign of life. An actor that has heard nothing for ``learner_timeout_s`` stops acting before the
next macro-step moves the robot (:class:`LearnerGone`); ``vla rl --role actor`` then puts the
robot in its safe state (software stop) and exits. The learner answers between update rounds,
so ``learner_timeout_s`` must exceed one update round and a checkpoint save.

End: the actor stops when an ack says ``finished`` (sent once the learner has checkpointed after
the bye). That ack may be lost (a ROUTER drops what it cannot deliver), so the learner keeps
answering for up to ``FINISH_GRACE_S`` after finishing, until the actor has been quiet for
``FINISH_QUIET_S``; the actor's next heartbeat or resent bye gets another finished ack.

Parameters: ``version`` is the agent's update-round count (``agent.updates``). The learner pushes
them on every welcome and after each learned episode whose updates changed them, and pushes
again when a heartbeat shows the actor lacks the last push (a lost message).

Learning schedule: one update round per received transition once warm-up is over -- the update-
to-data ratio of the in-process mode. Transitions are taken in (acked) at once, then learned in
order; a checkpoint at an episode boundary holds exactly the first ``step`` transitions, the agent
after their updates, the counters and the RNG state, as in the in-process mode.

Limits: one actor per learner. A hello from another actor id is refused (``actor_busy``, the new
actor stops) while the registered actor was heard from within ``TAKEOVER_S``; after that the new
one takes over (an actor restarted after a crash), and the transitions of an episode the previous
actor left half-way stay in the buffer. Evaluations are
reported once: those logged after the learner's last checkpoint are lost if it restarts. Videos
are written in the local mode only. The agent trains on the CPU (as in the local mode). Only
``encoder = vla`` sessions split: transitions carry VLA features, not the camera frames
``encoder = cnn`` replays (both roles refuse such a session).

This module imports no torch at import time (``vla.cli`` imports it for its error types).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable

import numpy as np
import zmq

from robot_io.security import CurveKeys, secure_client_socket, secure_server_socket
from robot_io.wire import Message, MessageType, ProtocolError, check_array, decode, encode
from vla.rl_config import RLConfig

PROTOCOL_VERSION = 1
"""Version of the actor-learner link (header ``v``); a message with another is refused."""

_TYPES = [
    # actor -> learner
    MessageType("hello", "An actor introduces itself (again after a learner restart).",
                ("actor_id", "next_seq", "params_version")),
    MessageType("transition", "One macro-step: header seq = its index in the session; arrays feat, next_feat, "
                "action, chunk.", ("actor_id", "episode", "ticks", "reward", "done", "intervention", "episode_end",
                                   "params_version")),
    MessageType("heartbeat", "The actor is alive; the ack says how far the learner is.",
                ("actor_id", "next_seq", "params_version")),
    MessageType("eval", "An evaluation the actor ran (kind base or periodic).",
                ("actor_id", "kind", "episode", "total_ticks", "successes", "episodes", "params_version")),
    MessageType("bye", "The actor has sent everything; `final`: its final evaluation.",
                ("actor_id", "next_seq", "final")),
    # learner -> actor
    MessageType("welcome", "The session: config, VLA hash, counters, where to (re)send from.",
                ("learner_id", "config", "vla_sha256", "next_seq", "durable", "episode", "ticks", "version",
                 "need_base_eval")),
    MessageType("ack", "How far the learner is: received, learned, durable (checkpointed); newest version.",
                ("learner_id", "received", "learned", "durable", "version", "finished")),
    MessageType("params", "The actor network's state_dict as float32 arrays, with its version.",
                ("learner_id", "version", "step")),
    MessageType("error", "Refusal: code, field, message (expected: the seq the learner wants, code gap).",
                ("code", "message")),
]
MESSAGE_TYPES: dict[str, MessageType] = {t.name: t for t in _TYPES}
ACTOR_TYPES = frozenset({"hello", "transition", "heartbeat", "eval", "bye"})
LEARNER_TYPES = frozenset({"welcome", "ack", "params", "error"})
EVAL_KINDS = ("base", "periodic")
TAKEOVER_S = 10.0
"""A hello from another actor is refused (``actor_busy``) while the registered one was heard within this."""
FINISH_GRACE_S = 12.0
"""After the session finished, the learner keeps answering (finished acks) for at most this long
(longer than the actor's 5 s bye resend, so a lost finished ack is always followed by another)..."""
FINISH_QUIET_S = 3.0
"""...or, once it has sent a finished ack, until the actor has been quiet this long: an actor that
has heard ``finished`` closes its link and stops heart-beating, while one whose ack was lost keeps
sending (heartbeats every ``heartbeat_s``, its bye every 5 s) and gets another answer each time.
Counting acks sent instead was not enough: a ROUTER drops what it cannot deliver without saying
so, and a learner that stopped after two "sent" acks left its actor waiting into LearnerGone."""
EPISODE_INFO = {"seed": int, "success": bool, "ticks": int, "steps": int, "return": float, "interventions": int}


# -- errors ---------------------------------------------------------------------------------------
class RemoteRLError(RuntimeError):
    """The actor-learner link failed in a way the user must act on."""


class LearnerGone(RemoteRLError):
    """No word from the learner for longer than the actor's ``learner_timeout_s``."""


class LearnerRefused(RemoteRLError):
    """The learner refused what the actor sent (``code`` / ``field`` say why), or sent garbage."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"[{code}] {message}" + (f" (field {field!r})" if field else ""))
        self.code, self.field, self.message = code, field, message


# -- message construction and checks (both sides) -------------------------------------------------
def _msg(mtype: str, sender: str, arrays: dict[str, np.ndarray] | None = None, seq: int = 0, **meta: Any) -> Message:
    return Message(mtype, sender, arrays or {}, meta, seq=seq, v=PROTOCOL_VERSION)


def pack(msg: Message) -> list[bytes]:
    """Message -> frames (bytes, so an outbox can resend them)."""
    return [bytes(f) for f in encode(msg)]


def unpack(frames) -> Message:
    """Frames -> Message checked against this link's schema (ProtocolError naming the problem)."""
    return decode(frames, MESSAGE_TYPES, PROTOCOL_VERSION)


def field(msg: Message, name: str, kind: type, choices: tuple | None = None) -> Any:
    """A header field of ``kind`` (int, bool, float, str, dict); ProtocolError naming it otherwise."""
    if name not in msg.meta:
        raise ProtocolError("missing_field", f"{msg.type!r} needs field {name!r}", name)
    return _typed(msg.meta[name], name, kind, choices, msg.type)


def _typed(v: Any, name: str, kind: type, choices: tuple | None = None, mtype: str = "") -> Any:
    ok = {int: isinstance(v, int) and not isinstance(v, bool),
          bool: isinstance(v, bool),
          float: isinstance(v, (int, float)) and not isinstance(v, bool),
          str: isinstance(v, str),
          dict: isinstance(v, dict)}[kind]
    if not ok:
        raise ProtocolError("bad_field", f"{mtype + ' ' if mtype else ''}field {name!r} must be {kind.__name__}, "
                            f"got {type(v).__name__} {v!r:.60}", name)
    if kind is float and not math.isfinite(v):
        raise ProtocolError("non_finite", f"field {name!r} is not finite ({v})", name)
    if choices is not None and v not in choices:
        raise ProtocolError("bad_field", f"field {name!r} must be one of {list(choices)}, got {v!r}", name)
    return float(v) if kind is float else v


@dataclasses.dataclass(frozen=True)
class TransitionSpec:
    """Array shapes of one transition on the wire: features D, noise d, executed chunk [E, A]."""

    feat_dim: int
    noise_dim: int
    exec_steps: int
    action_dim: int

    @classmethod
    def of(cls, agent) -> "TransitionSpec":
        return cls(agent.feat_dim, agent.noise_dim, agent.exec_steps, agent.a)


@dataclasses.dataclass
class Transition:
    """A checked ``transition`` message: ``tr`` is what ``Session.store`` takes."""

    seq: int
    episode: int
    ticks: int
    episode_end: bool
    params_version: int
    tr: dict[str, Any]
    info: dict[str, Any] | None


def transition_message(actor_id: str, seq: int, episode: int, tr: dict[str, Any], ticks: int, episode_end: bool,
                       info: dict[str, Any] | None, params_version: int) -> Message:
    """The wire form of one transition ``tr`` (the dict ``Session.record`` gets)."""
    arrays = {"feat": tr["obs"]["feat"], "next_feat": tr["next_obs"]["feat"], "action": tr["action"],
              "chunk": tr["chunk"]}
    meta = {"actor_id": actor_id, "episode": int(episode), "ticks": int(ticks), "reward": float(tr["reward"]),
            "done": bool(tr["done"]), "intervention": bool(tr["intervention"]), "episode_end": bool(episode_end),
            "params_version": int(params_version)}
    if episode_end:
        meta["episode_info"] = {k: kind(info[k]) for k, kind in EPISODE_INFO.items()}
    return _msg("transition", actor_id, {k: np.asarray(v) for k, v in arrays.items()}, seq=int(seq), **meta)


def check_transition(msg: Message, spec: TransitionSpec, episode: int | None = None) -> Transition:
    """Every field of a ``transition`` checked (type, dtype, shape, finiteness), or ProtocolError
    naming the first wrong one. ``episode``: the index the learner expects."""
    if msg.type != "transition":
        raise ProtocolError("bad_type", f"expected a transition, got {msg.type!r}", "type")
    if msg.seq < 0:
        raise ProtocolError("bad_field", f"transition seq must be >= 0, got {msg.seq}", "seq")
    unknown = set(msg.arrays) - {"feat", "next_feat", "action", "chunk"}
    if unknown:
        raise ProtocolError("unknown_field", f"transition has unknown array(s) {sorted(unknown)}", sorted(unknown)[0])
    feat = check_array(msg, "feat", "float32", (spec.feat_dim,))
    next_feat = check_array(msg, "next_feat", "float32", (spec.feat_dim,))
    action = check_array(msg, "action", "float32", (spec.noise_dim,))
    chunk = check_array(msg, "chunk", "float32", (spec.exec_steps, spec.action_dim))
    ep = field(msg, "episode", int)
    if episode is not None and ep != episode:
        raise ProtocolError("bad_field", f"transition {msg.seq} says episode {ep}, the learner is at episode "
                            f"{episode}", "episode")
    ticks = field(msg, "ticks", int)
    if ticks < 1:
        raise ProtocolError("bad_field", f"field 'ticks' must be >= 1, got {ticks}", "ticks")
    reward = field(msg, "reward", float)
    done, intervention = field(msg, "done", bool), field(msg, "intervention", bool)
    end, version = field(msg, "episode_end", bool), field(msg, "params_version", int)
    info = None
    if end:
        raw = field(msg, "episode_info", dict)
        info = {}
        for k, kind in EPISODE_INFO.items():
            if k not in raw:
                raise ProtocolError("missing_field", f"episode_info needs {k!r}", f"episode_info.{k}")
            info[k] = _typed(raw[k], f"episode_info.{k}", kind)
    # copies: the received frames are read-only views of ZMQ's buffers
    tr = dict(obs={"feat": feat.copy()}, action=action.copy(), reward=reward, next_obs={"feat": next_feat.copy()},
              done=done, chunk=chunk.copy(), intervention=intervention)
    return Transition(msg.seq, ep, ticks, end, version, tr, info)


def _check_eval(d: dict, prefix: str) -> dict[str, Any]:
    """successes, episodes, params_version of an evaluation report (ProtocolError naming the field)."""
    out = {}
    for k in ("successes", "episodes", "params_version"):
        if k not in d:
            raise ProtocolError("missing_field", f"evaluation report needs {prefix + k!r}", prefix + k)
        out[k] = _typed(d[k], prefix + k, int)
    if not 0 <= out["successes"] <= out["episodes"] or out["episodes"] < 1:
        raise ProtocolError("bad_field", f"{out['successes']} successes of {out['episodes']} episodes",
                            prefix + "successes")
    out["success_rate"] = out["successes"] / out["episodes"]
    return out


def params_message(learner_id: str, version: int, step: int, state_dict: dict) -> Message:
    arrays = {k: v.detach().cpu().float().contiguous().numpy() for k, v in state_dict.items()}
    return _msg("params", "learner", arrays, learner_id=learner_id, version=int(version), step=int(step))


def check_params(msg: Message, reference: dict) -> dict[str, np.ndarray]:
    """The arrays of a ``params`` message, checked against ``reference`` (the actor network's own
    state_dict): same names, float32, same shapes, finite. -> {name: array (a copy)}."""
    missing, unknown = set(reference) - set(msg.arrays), set(msg.arrays) - set(reference)
    if missing:
        raise ProtocolError("missing_field", f"params lack array(s) {sorted(missing)}", sorted(missing)[0])
    if unknown:
        raise ProtocolError("unknown_field", f"params have unknown array(s) {sorted(unknown)}", sorted(unknown)[0])
    return {k: check_array(msg, k, "float32", tuple(reference[k].shape)).copy() for k in reference}


def error_reply(code: str, message: str, field_: str | None = None, **extra: Any) -> Message:
    return _msg("error", "learner", code=code, message=message, field=field_, **extra)


def curve_keys(keys_dir: str | None) -> CurveKeys | None:
    """The CurveZMQ key set ``vla bridge keys --out DIR`` writes: the learner uses the server
    secret and ``authorized_clients/``, the actor ``client.key_secret`` and ``server.key``."""
    if not keys_dir:
        return None
    j = lambda n: os.path.join(keys_dir, n)  # noqa: E731
    return CurveKeys(server_secret=j("server.key_secret"), server_public=j("server.key"),
                     client_secret=j("client.key_secret"), authorized_clients=j("authorized_clients"))


def _check_link_carries(cfg: RLConfig) -> None:
    """The link's transitions carry VLA features (``feat``), not camera frames: refuse other encoders."""
    if cfg.encoder != "vla":
        raise RemoteRLError(f"encoder {cfg.encoder!r} runs in-process only (vla rl --role local): the actor / learner "
                            "link carries the VLA's features, not camera frames")


# -- learner --------------------------------------------------------------------------------------
class Learner:
    """The learner's state and its message loop. ``serve()`` runs until the actor's ``bye``;
    ``step()`` is one turn of the loop (tests drive it by hand)."""

    def __init__(self, cfg: RLConfig, vla, bind: str = "tcp://127.0.0.1:5800", resume: bool = False,
                 keys: CurveKeys | None = None, insecure: bool = False, progress: bool = True,
                 context: zmq.Context | None = None) -> None:
        from vla.rl import RunLog, Session, open_session, read_base_eval, start_run

        _check_link_carries(cfg)
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
        self.t0 = time.perf_counter()
        self.bar = None

    # -- the loop ---------------------------------------------------------------------------------
    def serve(self, stop: threading.Event | None = None) -> dict[str, Any] | None:
        """Serve until the actor says bye (-> the summary) or ``stop`` is set (-> None)."""
        print(f"learner listening on {self.endpoint} (session {self.cfg.out}, step {self.sess.step}); "
              f"start the actor with: vla rl --role actor --learner {self.endpoint}", flush=True)
        if self.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=self.cfg.total_ticks, initial=min(self.sess.ticks, self.cfg.total_ticks),
                            unit="tick", desc=f"learner {self.cfg.method}-{self.cfg.variant}")
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
        learn), then learn from one queued item."""
        timeout_ms = 0 if self.inbox else int(timeout_s * 1000)
        for _ in range(10_000):
            if not self.sock.poll(timeout_ms):
                break
            self._receive(self.sock.recv_multipart(copy=False))
            timeout_ms = 0
        if self.inbox:
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
                               config=dataclasses.asdict(self.cfg), vla_sha256=s.digest_before,
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
            losses = s.learn()
            if losses:
                self.losses = losses
            if t.episode_end:
                r = {**t.info, "losses": self.losses}
                self.log.episode(s.episode, t.info["seed"], r, s.ticks, s.step)
                s.episode += 1
                self.losses = {}
                if s.episode % self.cfg.checkpoint_every == 0:
                    s.save()
                    self.durable = s.step
                self.push_params()
                if self.bar is not None:
                    self.bar.n = min(s.ticks, self.cfg.total_ticks)
                    self.bar.set_postfix(ep=s.episode, updates=s.agent.updates, queued=len(self.inbox))
        elif kind == "eval":
            self._log_eval(item)
        elif kind == "bye":
            self._finish(*item)

    def _log_eval(self, ev: dict[str, Any]) -> None:
        if ev["kind"] == "base":
            if self.base is None:
                from vla.rl import write_base_eval

                self.base = write_base_eval(self.sess, ev)
        else:
            self.log.evaluation(ev["episode"], ev["total_ticks"], ev)

    def _finish(self, ident: bytes, final: dict[str, Any]) -> None:
        from vla.rl import write_summary

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
        """Send the actor network's parameters to the actor if they changed since the last push."""
        version = self.sess.agent.updates
        if self.actor_ident is None or (version == self.pushed_version and not force):
            return
        self._send(self.actor_ident, params_message(self.learner_id, version, self.sess.step,
                                                    self.sess.agent.sac.actor.state_dict()))
        self.pushed_version, self.pushed_at = version, time.monotonic()


def run_learner(cfg: RLConfig, vla, bind: str = "tcp://127.0.0.1:5800", resume: bool = False,
                keys: CurveKeys | None = None, insecure: bool = False, progress: bool = True,
                stop: threading.Event | None = None) -> dict[str, Any] | None:
    """Serve one session as its learner until the actor says bye. -> the summary."""
    return Learner(cfg, vla, bind, resume=resume, keys=keys, insecure=insecure, progress=progress).serve(stop)


# -- actor ----------------------------------------------------------------------------------------
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

    def __post_init__(self) -> None:
        for f in ("learner_timeout_s", "heartbeat_s", "resend_s"):
            if not getattr(self, f) > 0:
                raise ValueError(f"ActorConfig.{f} must be > 0, got {getattr(self, f)}")
        if self.heartbeat_s >= self.learner_timeout_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s}) must be below learner_timeout_s "
                             f"({self.learner_timeout_s})")
        if self.max_outbox < 1:
            raise ValueError(f"ActorConfig.max_outbox must be >= 1, got {self.max_outbox}")


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
                        self._try_send(sock, pack(_msg("hello", self.actor_id, actor_id=self.actor_id,
                                                       next_seq=self.next_seq,
                                                       params_version=self._have_version())))
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
        _check_link_carries(cfg)
        over = {k: getattr(self.cfg, k) for k in ("checkpoint", "robot") if getattr(self.cfg, k)}
        self.rl_cfg = dataclasses.replace(cfg, **over)
        return self.rl_cfg

    def prepare(self, vla, env=None, operator=None, progress: bool = True) -> None:
        """Build the acting session, check the VLA against the learner's, take the first parameters."""
        from vla.rl import Session, weights_digest

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
        self.sess = Session(self.rl_cfg, env, vla, operator=operator, progress=progress, sink=self._sink,
                            guard=self.link.check)
        s = self.sess
        s.step, s.ticks, s.episode = w["next_seq"], w["ticks"], w["episode"]
        while not self.apply_newest_params():  # the welcome is followed by the parameters
            self.link.check()
            time.sleep(0.01)

    def apply_newest_params(self) -> bool:
        """Load the newest parameters received (from a new learner: whatever their version) into the
        actor network. -> whether any are in use. Called at episode boundaries only."""
        import torch

        p = self.link.params
        if p is not None and (p[0], p[1]) != self.params_key:
            actor_net = self.sess.agent.sac.actor
            try:
                arrays = check_params(p[2], actor_net.state_dict())
            except ProtocolError as e:
                raise LearnerRefused(e.code, f"the learner sent bad parameters (version {p[1]}): {e.message}",
                                     e.field) from None
            actor_net.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
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
                                 params_version=self.params_version)))

    def run(self, progress: bool = True) -> dict[str, Any]:
        """Act until the session's tick budget is spent, then the final evaluation. -> a summary."""
        from tqdm import tqdm

        from vla.rl import episode_seed

        s, cfg, link = self.sess, self.rl_cfg, self.link
        if link.welcome["need_base_eval"]:
            self._send_eval("base", s.evaluate(cfg.eval_episodes, cfg.eval_seed_start, base=True))
        bar = tqdm(total=cfg.total_ticks, initial=min(s.ticks, cfg.total_ticks), unit="tick",
                   desc=f"actor {cfg.method}-{cfg.variant}", disable=not progress)
        t0, waited = time.perf_counter(), False
        try:
            while s.ticks < cfg.total_ticks:
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
                r = s.run_episode(episode_seed(cfg, s.episode))
                s.episode += 1
                if cfg.eval_every and s.episode % cfg.eval_every == 0:
                    self._send_eval("periodic", s.evaluate(cfg.eval_episodes, cfg.eval_seed_start))
                bar.n = min(s.ticks, cfg.total_ticks)
                bar.set_postfix(ep=s.episode, succ=int(r["success"]), params=self.params_version)
        finally:
            bar.close()
        # the final evaluation uses the policy after every transition was learned from
        while not (link.learned >= s.step and self.params_key == (link.learner_id, link.version)):
            link.check()
            self.apply_newest_params()
            time.sleep(0.02)
        final = s.evaluate(cfg.eval_episodes, cfg.eval_seed_start)
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
        return {"episodes": s.episode, "steps": s.step, "ticks": s.ticks, "final_success_rate": final["success_rate"],
                "params_version": self.params_version, "learners": list(link.learner_ids),
                "wall_s": time.perf_counter() - t0}

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
