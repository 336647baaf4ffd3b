"""The actor / learner link of the RL session: distributed online RL (``vla rl --role learner | actor``): the actor next to the robot, the
learner on a GPU box (or the same machine), over ZMQ -- the actor / learner split of SERL and
HIL-SERL.

Roles
-----
* **learner** (:func:`session.learner.run_learner`, :class:`session.learner.Learner`): owns the replay buffers, the agent's networks
  and optimisers, the run directory (config, checkpoints, ``episodes.jsonl`` / ``evals.jsonl``,
  TensorBoard, learning curve, ``summary.json``) and ``--resume``. It never touches the robot. It
  binds one ROUTER socket (off loopback: CurveZMQ keys, as the bridge).
* **actor** (:func:`session.actor.run_actor`, :class:`session.actor.Actor`): owns the robot env
  and its own copy of the frozen VLA. It takes the session's config from the learner, refuses to
  act if its VLA's weights differ from the learner's (SHA-256 of the state dict), rolls the VLA +
  the agent's policy out (with operator interventions) and streams every transition to the learner. It acts with the newest
  policy parameters the learner pushed, switching only at episode boundaries, and runs the
  evaluations (base, every ``eval_every`` episodes, final), reporting them to the
  learner. One DEALER socket, owned by a background thread (:class:`ActorLink`).

Both sides run the code of the in-process mode (``session.runner.Session``): the actor's rollout
is ``Session.run_episode`` with ``record`` sending instead of learning; the learner's learning is
``Session.store`` / ``learn`` and its checkpoints ``Session.save`` / ``load``; both end an episode
with ``session.runner.end_episode``. Nothing here names a method: a transition's arrays are the
agent's ``obs_spec`` (see ``TransitionSpec``), the pushed parameters its ``actor_parameters()``.

The wire
--------
The framing of ``robot_io.wire`` (frame 0 a msgpack header ``{v, type, device, seq, t_mono_ns,
t_wall_ns, arrays, ...}``, then one raw frame per numpy array; never pickle) with this link's own
schema :data:`MESSAGE_TYPES` and version :data:`PROTOCOL_VERSION`. A message with another ``v``,
an unknown ``type``, a missing or mistyped field, an array of the wrong dtype or shape, or a
non-finite value is refused with an ``error`` whose ``field`` names the culprit; nothing is stored
and the learner keeps serving. ``device`` is the sender (an actor id, or ``learner``).

actor -> learner::

    hello       actor_id, next_seq (-1: a fresh actor), params_version, slot (optional: the actor's
                lane, 0..N-1, with several actors)                        -> welcome, then params
    transition  actor_id; header seq = the transition's index in the actor's lane (0, 1, 2, ...;
                with one actor, its index in the session); episode (the lane's episode index),
                ticks (control ticks executed), reward, done, truncated, intervention, episode_end,
                params_version (the policy that acted), episode_info (with episode_end: seed,
                success, ticks, steps, return, interventions);
                arrays: K and next_K for every key K of the agent's obs_spec (its dtype and
                shape), action f32[d] (the agent's action), chunk f32[E, A] (the executed
                chunk, normalised)                                         -> ack, or error
    heartbeat   actor_id, next_seq, params_version                       -> ack
    eval        actor_id, kind (base | periodic), episode, total_ticks, successes, episodes,
                params_version, max_episode_ticks (optional: the actor's episode limit)  -> ack
    bye         actor_id, next_seq, final {successes, episodes, params_version}: every transition
                is sent and the final evaluation done (resent every few seconds until the learner
                answers)         -> ack with finished=true after the final checkpoint and summary;
                with several actors, one that does not evaluate says bye with final {} (it sent
                everything and acts no more) and waits for the finished ack

learner -> actor::

    welcome     learner_id, config (the RLConfig as a map), vla_sha256, next_seq, durable,
                episode, ticks, version, need_base_eval (the lane's counters); slot, actors (its lane
                of how many), session_ticks, evaluator (see ack)
    ack         learner_id, received, learned, durable, version, finished (the lane's counters);
                session_ticks (ticks taken in from every actor: the budget counts these),
                evaluator (this actor runs the evaluations: the lowest lane not dropped),
                settled (every other actor said bye, everything is learned from)
    params      learner_id, version, step; arrays: the agent's actor_parameters() (f32)
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

Several actors (``vla rl --actors N``, ``session.pool``: Ray actors, each with its own robot): the
learner serves N lanes, one per actor. Everything above holds per lane: an actor's sequence
numbers, episodes, acknowledgements, resends, ``durable`` and its outbox are its own, and a
checkpoint's ``state.json`` holds every lane's counters (``lanes``), so a restarted learner tells
each actor where to resend from and a resumed session gives each new actor its lane's counters.
Transitions enter the replay buffer in arrival order, interleaved across actors; parameters are
pushed to every actor. Actor i plays the training scenes of session episodes i, i + N, ...
(``session.runner.actor_episode``): the actors' seeds are disjoint. The session's tick budget
counts every actor's ticks (``session_ticks``); each actor stops at its next episode boundary
once it is spent, so the session may run up to one episode per actor past it. The evaluations
(base, every ``ceil(eval_every / N)`` of its own episodes, final) are run by one actor, the
lowest lane not dropped; the final one once every other actor has said bye (``settled``). An
actor whose process dies is dropped (``Learner.drop_actor``: Ray reports it; or silence for
``ACTOR_LOST_S``): its unfinished episode is not counted or logged, the transitions it sent of
it stay in the replay buffer (real experience, as after a takeover), its hello is refused
afterwards (``actor_dropped``), and the other actors go on; if the evaluator is dropped, the next
lane evaluates.

Limits: one actor per lane. A hello from another actor id is refused (``actor_busy``, the new
actor stops) while the registered actor was heard from within ``TAKEOVER_S``; after that the new
one takes over (an actor restarted after a crash), and the transitions of an episode the previous
actor left half-way stay in the buffer. Evaluations are
reported once: those logged after the learner's last checkpoint are lost if it restarts. Videos
are written in the local mode only. The agent trains on the CPU (as in the local mode). A method
may refuse to split a configuration (``Agent.split_refusal``; both roles then refuse the session).

This module (the wire: schema, messages, checks, errors) imports no torch; ``session.learner`` and
``session.actor`` hold the two roles.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np

from robot_io.security import CurveKeys
from robot_io.wire import Message, MessageType, ProtocolError, check_array, decode, encode

PROTOCOL_VERSION = 2
"""Version of the actor-learner link (header ``v``); a message with another is refused. 2: a transition says whether
a time limit cut the episode after it (``truncated``, issue 61)."""

_TYPES = [
    # actor -> learner
    MessageType("hello", "An actor introduces itself (again after a learner restart).",
                ("actor_id", "next_seq", "params_version")),
    MessageType("transition", "One macro-step: header seq = its index in the session; arrays: the observation "
                "fields K and next_K, action, chunk.", ("actor_id", "episode", "ticks", "reward", "done", "truncated", "intervention",
                                   "episode_end", "params_version")),
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
ACTOR_LOST_S = 60.0
"""Several actors: one not heard from for this long is dropped (its heartbeats come every ``heartbeat_s``
from a thread of their own, whatever it is doing); the others go on."""
FINISH_GRACE_S = 12.0
"""After the session finished, the learner keeps answering (finished acks) for at most this long
(longer than the actor's 5 s bye resend, so a lost finished ack is always followed by another)..."""
PUSH_EVERY_S = 1.0
"""``updates`` async: the learner pushes new parameters at least this often (and at every episode end); the
actor loads the newest at its next episode boundary."""
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
    """Array shapes of one transition on the wire: the agent's observation ``obs`` ({name: (shape,
    dtype)}, sent as ``name`` and ``next_name``), its action ``action_dim``, the executed chunk
    ``chunk_shape`` [E, A]."""

    obs: dict
    action_dim: int
    chunk_shape: tuple[int, int]

    def __post_init__(self) -> None:
        obs = {k: (tuple(int(x) for x in shape), np.dtype(dtype).name) for k, (shape, dtype) in self.obs.items()}
        clash = [k for k in obs if k in ("action", "chunk") or k.startswith("next_")]
        if clash:
            raise ValueError(f"observation field(s) {clash} clash with the transition's own arrays; rename them")
        object.__setattr__(self, "obs", obs)
        object.__setattr__(self, "chunk_shape", tuple(int(x) for x in self.chunk_shape))

    @classmethod
    def of(cls, agent) -> "TransitionSpec":
        return cls(agent.obs_spec, int(agent.action_dim), tuple(agent.chunk_shape))

    @property
    def arrays(self) -> list[str]:
        return [*self.obs, *(f"next_{k}" for k in self.obs), "action", "chunk"]


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
    arrays = {**tr["obs"], **{f"next_{k}": v for k, v in tr["next_obs"].items()}, "action": tr["action"],
              "chunk": tr["chunk"]}
    meta = {"actor_id": actor_id, "episode": int(episode), "ticks": int(ticks), "reward": float(tr["reward"]),
            "done": bool(tr["done"]), "truncated": bool(tr.get("truncated", False)),
            "intervention": bool(tr["intervention"]), "episode_end": bool(episode_end),
            "params_version": int(params_version)}
    if episode_end:
        meta["episode_info"] = {k: kind(info[k]) for k, kind in EPISODE_INFO.items()}
        if info.get("agent"):  # the agent's own episode log (Agent.episode_log): logged, never acted on
            meta["episode_info"]["agent"] = info["agent"]
    return _msg("transition", actor_id, {k: np.asarray(v) for k, v in arrays.items()}, seq=int(seq), **meta)


def check_transition(msg: Message, spec: TransitionSpec, episode: int | None = None) -> Transition:
    """Every field of a ``transition`` checked (type, dtype, shape, finiteness), or ProtocolError
    naming the first wrong one. ``episode``: the index the learner expects."""
    if msg.type != "transition":
        raise ProtocolError("bad_type", f"expected a transition, got {msg.type!r}", "type")
    if msg.seq < 0:
        raise ProtocolError("bad_field", f"transition seq must be >= 0, got {msg.seq}", "seq")
    unknown = set(msg.arrays) - set(spec.arrays)
    if unknown:
        raise ProtocolError("unknown_field", f"transition has unknown array(s) {sorted(unknown)}", sorted(unknown)[0])
    obs = {k: check_array(msg, k, dtype, shape) for k, (shape, dtype) in spec.obs.items()}
    next_obs = {k: check_array(msg, f"next_{k}", dtype, shape) for k, (shape, dtype) in spec.obs.items()}
    action = check_array(msg, "action", "float32", (spec.action_dim,))
    chunk = check_array(msg, "chunk", "float32", spec.chunk_shape)
    ep = field(msg, "episode", int)
    if episode is not None and ep != episode:
        raise ProtocolError("bad_field", f"transition {msg.seq} says episode {ep}, the learner is at episode "
                            f"{episode}", "episode")
    ticks = field(msg, "ticks", int)
    if ticks < 1:
        raise ProtocolError("bad_field", f"field 'ticks' must be >= 1, got {ticks}", "ticks")
    reward = field(msg, "reward", float)
    done, intervention = field(msg, "done", bool), field(msg, "intervention", bool)
    truncated = field(msg, "truncated", bool)
    if done and truncated:
        raise ProtocolError("bad_field", "a transition is terminal (done) or cut by a time limit (truncated), not both",
                            "truncated")
    end, version = field(msg, "episode_end", bool), field(msg, "params_version", int)
    info = None
    if end:
        raw = field(msg, "episode_info", dict)
        info = {}
        for k, kind in EPISODE_INFO.items():
            if k not in raw:
                raise ProtocolError("missing_field", f"episode_info needs {k!r}", f"episode_info.{k}")
            info[k] = _typed(raw[k], f"episode_info.{k}", kind)
        if "agent" in raw:
            agent = raw["agent"]
            if not isinstance(agent, dict) or not all(isinstance(k, str) for k in agent):
                raise ProtocolError("bad_field", "episode_info.agent must be a map with string keys",
                                    "episode_info.agent")
            try:
                json.dumps(agent, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise ProtocolError("bad_field", f"episode_info.agent is not plain JSON data: {e}",
                                    "episode_info.agent") from None
            info["agent"] = agent
    # copies: the received frames are read-only views of ZMQ's buffers
    tr = dict(obs={k: v.copy() for k, v in obs.items()}, action=action.copy(), reward=reward,
              next_obs={k: v.copy() for k, v in next_obs.items()}, done=done, chunk=chunk.copy(),
              intervention=intervention, rows=np.asarray(ticks, np.int32), truncated=truncated)
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
    """The arrays of a ``params`` message, checked against ``reference`` (the agent's own
    ``actor_parameters()``): same names, float32, same shapes, finite. -> {name: array (a copy)}."""
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


def check_splits(cfg) -> None:
    """Refuse (RemoteRLError) a session whose method cannot split it into actor / learner
    (``Agent.split_refusal``: e.g. transitions the link does not carry)."""
    from policies import get_method

    reason = get_method(cfg.method)[0].split_refusal(cfg.agent)
    if reason:
        raise RemoteRLError(reason)
