"""The policy server (``vla serve``): any VLA (+ an RL module) on a GPU box, action chunks for thin
robot clients (``deploy.runtime.client``, no torch) over the bridge's wire format.

One ROUTER socket, one thread, the bridge's framing (``robot_io.wire``: msgpack header + raw
numpy frames)::

    policy_request  arrays state float32 [S], image_<camera> uint8 [H, W, 3] per camera the policy
                    reads; header tick (the client's control tick), instruction, req_id, deadline_ns
      -> chunk      arrays actions float32 [H, A]; header tick (echoed), infer_ns, server_ns
    ping            -> reply (the client's liveness check while its queue is long)
    describe        -> reply with ``description``: policy name, cameras, state_dim, horizon, action_dim
    anything wrong  -> error reply naming the field (``code``, ``field``, ``message``); the server
                       keeps serving

Every readable message is read before the model runs, and of several ``policy_request`` s queued by
one client only the newest is computed (the others get ``superseded``): a client that gave up on a
late chunk and asked again is not served a backlog. ``deadline_ns`` is on the client's clock
(another machine's): the server does not compare it with its own; the client drops late chunks.

What computes the chunk is a *source*: ``describe() -> dict`` and ``__call__(obs) -> [H, A]`` with
``obs = {"images": {camera: HxWx3 uint8}, "state": float32 [S], "instruction": str, "tick": int}``.
``VLASource`` wraps any VLA behind ``vla.models``' interface (``load_vla``: the compact flow VLA,
the LeRobot pi0 / SmolVLA adapters). The RL hook is a *noise provider*: a callable
``obs -> noise [1, *vla.noise_shape]`` that replaces the sampler's initial Gaussian (DESIGN.md: DSRL
steers here). ``DSRLNoise`` is DSRL's noise actor (its mean by default); any other callable with
that signature steers the same way.

This module imports torch only inside ``VLASource`` / ``DSRLNoise`` / ``load_source``: a server
around another source starts without it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import numpy as np
import zmq

from robot_io.security import CurveKeys, secure_server_socket
from robot_io.wire import Message, ProtocolError, check_array, decode, encode, error_message, peek_req_id

log = logging.getLogger(__name__)

MAX_IMAGE_SIDE = 4096
MAX_INSTRUCTION_CHARS = 1024


class VLASource:
    """Chunks from a VLA (``sample_actions``), optionally steered by a noise provider (the RL hook)."""

    def __init__(self, vla, noise: Callable[[dict], Any] | None = None, name: str = "vla",
                 instructions: list[str] | None = None, gripper: str | None = None) -> None:
        self.vla, self.noise, self.name = vla, noise, name
        self.instructions = list(instructions or [])  # what the checkpoint was trained on (a client's default)
        self.gripper = gripper  # the executed opening the checkpoint names (a client's --gripper auto), or None

    def describe(self) -> dict[str, Any]:
        cfg = getattr(self.vla, "cfg", None)
        h, a = (int(x) for x in self.vla.action_shape)
        return {"policy": self.name, "horizon": h, "action_dim": a,
                "cameras": list(cfg.cameras) if cfg is not None and hasattr(cfg, "cameras") else None,
                "state_dim": int(cfg.state_dim) if cfg is not None and hasattr(cfg, "state_dim") else None,
                "steered": self.noise is not None and not isinstance(self.noise, ZeroNoise),
                "noise": ("sample" if self.noise is None else "zero" if isinstance(self.noise, ZeroNoise) else "rl"),
                "instructions": self.instructions, "gripper": self.gripper}

    def warmup(self) -> float:
        """One chunk for a blank observation (the declared cameras at 96 px, zero state, the first
        training instruction): loads what loads lazily (the text encoder, CUDA kernels) before a
        client's first call has a deadline on it. Returns its seconds; a VLA that does not declare
        its cameras and state size is not warmed up (0)."""
        d = self.describe()
        if d["cameras"] is None or d["state_dim"] is None:
            return 0.0
        t0 = time.perf_counter()
        self({"images": {c: np.zeros((96, 96, 3), np.uint8) for c in d["cameras"]},
              "state": np.zeros(d["state_dim"], np.float32),
              "instruction": self.instructions[0] if self.instructions else ""})
        return time.perf_counter() - t0

    def __call__(self, obs: dict) -> np.ndarray:
        import torch

        batch = {"images": {c: np.asarray(v)[None] for c, v in obs["images"].items()},
                 "state": np.asarray(obs["state"], np.float32)[None], "instruction": [obs["instruction"]]}
        with torch.no_grad():
            noise = None
            if self.noise is not None:  # the RL hook, on the VLA's device
                noise = torch.as_tensor(self.noise(obs), dtype=torch.float32).to(_device(self.vla))
            chunk = self.vla.sample_actions(batch, noise=noise)
        return chunk[0].float().cpu().numpy()


class DSRLNoise:
    """The DSRL agent's noise actor as the sampler's initial noise: ``w = pi^W(vla.embed(obs))``,
    reshaped to the noise shape. ``deterministic`` (default): the actor's mean; else a sample. It
    embeds the observation once more than the base VLA does (the actor reads the VLA's features)."""

    def __init__(self, agent, deterministic: bool = True) -> None:
        if agent.cfg.variant == "action":
            raise ValueError("a DSRL agent of variant 'action' outputs the chunk itself, not noise: it cannot steer "
                             "the served VLA (train with --variant na or sac)")
        self.agent, self.deterministic = agent, deterministic
        self.rng = np.random.default_rng(0)

    def __call__(self, obs: dict):
        aobs = self.agent.observe(obs)  # the VLA's features (on its device) ...
        w = self.agent.act({k: aobs[k].cpu() for k in self.agent.obs_spec}, self.rng, warmup=False,
                           deterministic=self.deterministic)  # ... read by the actor (on the CPU)
        return self.agent.w_to_noise(w)


def _device(module):
    p = next(iter(module.parameters()), None) if hasattr(module, "parameters") else None
    return p.device if p is not None else "cpu"


class ZeroNoise:
    """The sampler starts from 0 for every chunk (``vla serve --noise zero``): the flow's most central chunk,
    deterministic; what ``vla eval --noise zero`` measures (bench/results/vla_sft round 19: +11 points on the
    shipped base at 50 scenes)."""

    def __init__(self, shape) -> None:
        self.shape = (1, *(int(x) for x in shape))

    def __call__(self, obs: dict) -> np.ndarray:
        return np.zeros(self.shape, np.float32)


def load_source(checkpoint: str, rl_run: str | None = None, device: str = "auto",
                rl_sample: bool = False, noise: str = "sample") -> VLASource:
    """A VLA checkpoint (or ``vla train`` run directory), optionally steered by a ``vla rl`` run's
    DSRL agent, on ``device`` (auto: cuda when available). ``noise``: the sampler's starting noise without a
    DSRL agent, ``sample`` (one N(0, I) draw per chunk, the policy as trained) or ``zero`` (deterministic)."""
    if noise not in ("sample", "zero"):
        raise ValueError(f"noise must be 'sample' or 'zero', got {noise!r}")
    if noise == "zero" and rl_run:
        raise ValueError("--noise zero and --rl-run both choose the sampler's noise: the DSRL agent's actor does "
                         "when a run is given (its mean unless --rl-sample); drop one")
    import json
    import os

    import torch

    from vla.models import load_vla, resolve_checkpoint

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    ckpt = resolve_checkpoint(checkpoint)
    vla = load_vla(ckpt).eval()
    provider = None
    name = os.path.basename(os.path.normpath(checkpoint))
    if noise == "zero":
        provider = ZeroNoise(vla.noise_shape)
        name += " (zero noise)"
    if rl_run:
        from deploy.export import load_dsrl_agent

        provider = DSRLNoise(load_dsrl_agent(vla, rl_run), deterministic=not rl_sample)
        name += f" + dsrl {os.path.basename(os.path.normpath(rl_run))}"  # its actor runs on the CPU
    if device != "cpu":
        vla.to(device)
    with open(os.path.join(ckpt, "config.json")) as f:
        instructions = json.load(f).get("instructions") or []
    from vla.envs import checkpoint_gripper

    return VLASource(vla, provider, name, instructions, gripper=checkpoint_gripper(ckpt))


class PolicyServer:
    """Serve ``source`` on ``bind`` (a ROUTER). ``start()`` binds (``endpoint`` is then the bound
    address, e.g. for ``tcp://127.0.0.1:*``) and serves on a thread; ``serve()`` serves in the
    calling thread until ``stop()`` (or Ctrl-C). Off loopback it needs CurveZMQ keys (``keys``:
    ``server_secret`` + ``authorized_clients``) unless ``insecure``."""

    def __init__(self, source, bind: str, keys: CurveKeys | None = None, insecure: bool = False,
                 context: zmq.Context | None = None) -> None:
        self.source, self.bind_endpoint = source, bind
        self.keys, self.insecure = keys, insecure
        self.ctx = context or zmq.Context.instance()
        self.description = dict(source.describe())
        self.endpoint: str | None = None
        self.stats = {"requests": 0, "chunks": 0, "errors": 0, "superseded": 0}
        self._sock: zmq.Socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0

    # -- lifecycle ------------------------------------------------------------------------------
    def bind(self) -> str:
        s = self.ctx.socket(zmq.ROUTER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a client that went away: its reply is dropped
        secure_server_socket(s, self.bind_endpoint, self.keys, self.insecure)
        s.bind(self.bind_endpoint)
        self._sock = s
        self.endpoint = s.getsockopt_string(zmq.LAST_ENDPOINT)
        log.info("policy server: %s on %s", self.description.get("policy"), self.endpoint)
        return self.endpoint

    def start(self) -> "PolicyServer":
        if self._sock is None:
            self.bind()
        self._thread = threading.Thread(target=self.serve, daemon=True, name="policy-server")
        self._thread.start()
        return self

    def serve(self) -> None:
        if self._sock is None:
            self.bind()
        try:
            while not self._stop.is_set():
                if self._sock.poll(100):
                    self._serve_ready()
        finally:
            self._sock.close(linger=0)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- serving --------------------------------------------------------------------------------
    def _send(self, peer, reply: Message) -> None:
        self._seq += 1
        reply.seq = self._seq
        self._sock.send_multipart([peer, *encode(reply)], copy=False)

    def _serve_ready(self) -> None:
        """Answer everything readable; compute the newest policy_request of each client."""
        todo: dict[str, tuple[Any, Message, int]] = {}  # sender -> (peer, request, receipt ns)
        for _ in range(1000):  # bounded: a flood cannot starve the model forever
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            t_recv = time.monotonic_ns()
            peer, body = frames[0], frames[1:]
            try:
                msg = self._parse(body)
                if msg.type == "policy_request":
                    sender = f"client:{msg.get('client')}" if msg.get("client") else f"peer:{peer.bytes.hex()}"
                    if sender in todo:  # the client asked again: the older observation is stale
                        old_peer, old, _ = todo[sender]
                        self.stats["superseded"] += 1
                        self._send(old_peer, error_message("policy", old["req_id"], "superseded",
                                                           "a newer policy_request from this client replaced it"))
                    todo[sender] = (peer, msg, t_recv)
                else:
                    self._send(peer, self._answer(msg))
            except ProtocolError as e:
                self.stats["errors"] += 1
                log.debug("refused: [%s] %s (%s)", e.code, e.message, e.field)
                req_id = peek_req_id(body[0]) if body else None
                self._send(peer, error_message("policy", req_id, e.code, e.message, e.field))
        for peer, msg, t_recv in todo.values():
            self._send(peer, self._compute(msg, t_recv))

    def _parse(self, body) -> Message:
        msg = decode(body)
        if msg.type not in ("policy_request", "ping", "describe"):
            raise ProtocolError("unknown_type", f"a policy server answers policy_request, ping and describe, "
                                f"not {msg.type!r}", "type")
        if msg.get("req_id") is None:
            raise ProtocolError("bad_field", "a request needs a req_id (a string or an integer), got nil", "req_id")
        self.stats["requests"] += 1
        return msg

    def _answer(self, msg: Message) -> Message:
        meta: dict[str, Any] = {"req_id": msg["req_id"]}
        if msg.type == "ping":
            meta["echo_t_mono_ns"] = msg.t_mono_ns
        else:
            meta["description"] = self.description
        return Message("reply", "policy", {}, meta)

    def _observation(self, msg: Message) -> dict:
        """The request's observation, checked: every error names the field."""
        d = self.description
        if d.get("state_dim") is not None:
            state = check_array(msg, "state", "float32", (d["state_dim"],))
        else:
            state = check_array(msg, "state", "float32", msg.arrays["state"].shape if "state" in msg.arrays else (0,))
            if state.ndim != 1:
                raise ProtocolError("bad_shape", f"array 'state' must be a vector, got shape {list(state.shape)}", "state")
        cams = d.get("cameras")
        if cams is None:
            cams = [n[len("image_"):] for n in msg.arrays if n.startswith("image_")]
        images = {}
        for cam in cams:
            name = f"image_{cam}"
            img = msg.arrays.get(name)
            if img is None:
                raise ProtocolError("missing_field", f"the policy reads camera {cam!r}: send array {name!r} "
                                    f"(uint8 [H, W, 3])", name)
            if img.dtype != np.uint8:
                raise ProtocolError("bad_dtype", f"array {name!r} must be uint8, got {img.dtype.name}", name)
            if img.ndim != 3 or img.shape[2] != 3 or not (0 < img.shape[0] <= MAX_IMAGE_SIDE
                                                           and 0 < img.shape[1] <= MAX_IMAGE_SIDE):
                raise ProtocolError("bad_shape", f"array {name!r} must be [H, W, 3] with 1 <= H, W <= "
                                    f"{MAX_IMAGE_SIDE}, got {list(img.shape)}", name)
            images[cam] = img
        instruction = msg["instruction"]
        if len(instruction) > MAX_INSTRUCTION_CHARS:
            raise ProtocolError("bad_field", f"instruction has {len(instruction)} characters (at most "
                                f"{MAX_INSTRUCTION_CHARS})", "instruction")
        if msg["tick"] < 0:
            raise ProtocolError("bad_field", f"tick must be >= 0, got {msg['tick']}", "tick")
        return {"images": images, "state": state, "instruction": instruction, "tick": msg["tick"]}

    def _compute(self, msg: Message, t_recv: int) -> Message:
        req_id = msg["req_id"]
        try:
            obs = self._observation(msg)
        except ProtocolError as e:
            self.stats["errors"] += 1
            return error_message("policy", req_id, e.code, e.message, e.field)
        t0 = time.monotonic_ns()
        try:
            chunk = np.asarray(self.source(obs), np.float32)
        except Exception as e:  # the model failed on this observation: report it, keep serving
            self.stats["errors"] += 1
            log.exception("policy failed on request %s", req_id)
            return error_message("policy", req_id, "policy_error", f"{type(e).__name__}: {e}")
        t1 = time.monotonic_ns()
        h, a = self.description["horizon"], self.description["action_dim"]
        if chunk.shape != (h, a) or not np.isfinite(chunk).all():
            self.stats["errors"] += 1
            return error_message("policy", req_id, "policy_error", f"the policy returned a chunk of shape "
                                 f"{list(chunk.shape)} (expected [{h}, {a}]) or with NaN / inf; nothing to send",
                                 "actions")
        self.stats["chunks"] += 1
        return Message("chunk", "policy", {"actions": chunk},
                       {"req_id": req_id, "tick": msg["tick"], "infer_ns": t1 - t0,
                        "server_ns": time.monotonic_ns() - t_recv})
