"""Environments that training, evaluation and RL roll policies out in.

* ``task_env(client, task)``: a ``robot_io.RobotEnv`` on a bridge client, for one of the sim
  tasks (``hardware.sim_tasks``): reset lays out the task's scene from the seed, the reward is
  the task's success predicate (``rewards.sim_success``), the episode is truncated after the
  task's ``max_steps`` control ticks (``privileged=True``: the observation also carries the
  simulator's object poses, a labelled oracle, ``vla.oracle_env``).
* ``load_env_factory("package.module:make_env")`` / ``make_user_env``: any user gymnasium env with
  the observation layout of DESIGN.md (images / state / instruction), for ``--env``.
* ``VLAPolicy``: wraps a VLA as ``obs -> action chunk`` (numpy) for a RobotEnv.

The env contract, one for ``vla eval``, ``vla rl`` and the RL session (``step_chunk``,
``episode_limit``):

* **Stepping.** An env that declares chunk actions (a ``chunk_actions = True`` attribute, as
  ``robot_io.RobotEnv`` has, or an ``action_space`` of shape ``[H, A]``) gets the whole chunk in one
  ``step``. Any other env steps one action ``[A]``: the chunk is stepped row by row, the rewards are
  summed, and the chunk stops at the first row that terminates or truncates; the rows actually
  executed are the ticks counted.
* **Episode limit** in control ticks: ``--max-episode-ticks`` if given; else the env's own limit
  (a ``max_ticks`` attribute, or for a one-action env its ``TimeLimit`` / ``spec.max_episode_steps`` /
  ``max_episode_steps``); else ``DEFAULT_EPISODE_TICKS`` (200). Whatever the limit, an env that
  truncates itself earlier ends the episode there.
* **Sampling noise.** ``VLAPolicy`` draws the flow sampler's initial noise for the k-th chunk of the
  episode with seed s from ``episode_noise(shape, s, k)``, as the session's base-VLA evaluation
  does: the same checkpoint on the same env and seeds gives the same episodes in both.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from typing import Any, Callable

import numpy as np

from robot_io.gripper import GRIPPER_CHOICES, GRIPPER_COLUMN, GRIPPER_MODES, gripper_mode, snap_opening  # noqa: F401

DEFAULT_EPISODE_TICKS = 200
"""Episode limit (control ticks) of an env that declares none, when no --max-episode-ticks is given."""


def steps_chunks(env) -> bool:
    """True if ``env.step`` takes a whole chunk ``[n, A]`` (see the module docstring); False if it
    steps one action ``[A]``. Raises ``ValueError`` for an action space of any other rank."""
    base = getattr(env, "unwrapped", env)
    if getattr(base, "chunk_actions", False) or getattr(env, "chunk_actions", False):
        return True
    shape = getattr(getattr(env, "action_space", None), "shape", None)
    if shape is None or len(shape) not in (1, 2):
        raise ValueError(f"the env's action_space must be one action [A] or a chunk [H, A] (a Box), got "
                         f"{getattr(env, 'action_space', None)!r}")
    return len(shape) == 2


def declared_tick_limit(env) -> int | None:
    """The env's own episode limit in control ticks, or None: a ``max_ticks`` attribute (any env); for
    a one-action env also a ``TimeLimit`` wrapper, ``spec.max_episode_steps`` or a
    ``max_episode_steps`` attribute (its steps are ticks; a chunk env's steps are not)."""
    layers = []
    e = env
    while e is not None and len(layers) < 64:  # the wrapper chain, outermost first
        layers.append(e)
        e = getattr(e, "env", None)
    for e in layers:
        n = getattr(e, "max_ticks", None)
        if n:
            return int(n)
    if steps_chunks(env):
        return None
    for e in layers:
        n = getattr(e, "_max_episode_steps", None)  # gymnasium.wrappers.TimeLimit
        if n:
            return int(n)
    n = getattr(getattr(env, "spec", None), "max_episode_steps", None)
    if n:
        return int(n)
    for e in layers:
        n = getattr(e, "max_episode_steps", None)
        if isinstance(n, (int, np.integer)) and n > 0:
            return int(n)
    return None


def episode_limit(env, requested: int | None = None) -> int:
    """The one rule for an episode's length in control ticks (module docstring): ``requested``
    (``--max-episode-ticks``), else the env's own limit, else ``DEFAULT_EPISODE_TICKS``. ``env`` None
    (a learner, which has no env) has no limit of its own."""
    if requested is not None:
        if int(requested) <= 0:
            raise ValueError(f"--max-episode-ticks must be positive, got {requested}")
        return int(requested)
    return (declared_tick_limit(env) if env is not None else None) or DEFAULT_EPISODE_TICKS


@dataclasses.dataclass
class ChunkStep:
    """What ``step_chunk`` returns: the env's last observation / flags / info, the summed reward and
    the number of rows (control ticks) executed."""
    obs: Any
    reward: float
    terminated: bool
    truncated: bool
    info: dict
    rows: int


def step_chunk(env, chunk, on_row: Callable[[Any, int, float, dict], None] | None = None,
               chunked: bool | None = None) -> ChunkStep:
    """Execute ``chunk`` ``[n, A]`` on ``env`` by the contract of the module docstring. ``on_row(obs,
    i, reward, info)`` sees every row's result when the env steps one action at a time. ``chunked``:
    ``steps_chunks(env)``, if the caller has it already (a rollout asks once, not every chunk)."""
    chunk = np.asarray(chunk, np.float32)
    if chunk.ndim != 2 or len(chunk) == 0:
        raise ValueError(f"an action chunk is [n, A] with n >= 1, got shape {list(chunk.shape)}")
    if steps_chunks(env) if chunked is None else chunked:
        obs, r, term, trunc, info = env.step(chunk)
        return ChunkStep(obs, float(r), bool(term), bool(trunc), dict(info), len(chunk))
    total = 0.0
    for i, row in enumerate(chunk):
        obs, r, term, trunc, info = env.step(row)
        total += float(r)
        if on_row is not None:
            on_row(obs, i, float(r), info)
        if term or trunc:
            break
    return ChunkStep(obs, total, bool(term), bool(trunc), dict(info), i + 1)


def make_user_env(spec: str, make_env: Callable[..., Any] | None = None):
    """Build ``--env``'s gymnasium env (``spec`` = ``package.module:make_env``) and check the parts of
    the contract that can be checked before an episode: an action space of one action or a chunk."""
    env = (make_env or load_env_factory(spec))()
    for name in ("reset", "step", "action_space"):
        if not hasattr(env, name):
            raise ValueError(f"--env {spec}: make_env() returned {type(env).__name__}, which has no {name!r} "
                             "(a gymnasium env is expected)")
    try:
        steps_chunks(env)
    except ValueError as e:
        raise ValueError(f"--env {spec}: {e}") from None
    return env


def episode_noise(noise_shape, seed: int, k: int, n: int = 1):
    """The flow sampler's initial noise ``[n, *noise_shape]`` for the ``k``-th chunk of the episode
    with seed ``seed`` (the base VLA's own N(0, I), reproducible per episode; distinct for k < 1000):
    ``n`` draws in turn from that chunk's stream, the first of them the one-draw noise."""
    import torch

    g = torch.Generator().manual_seed(int(seed) * 1000 + int(k))
    return torch.cat([torch.randn(1, *noise_shape, generator=g) for _ in range(n)])


def _whole(x, what: str) -> int:
    """``x`` as an int >= 1, or ``ValueError`` naming ``what``."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
        raise ValueError(f"{what} must be a whole number >= 1, got {x!r}")
    return int(x)


def noise_shape_of(model) -> tuple[int, ...] | None:
    """The model's noise shape if it takes the ``noise`` handle, else None (e.g. an ONNX graph
    without a noise input, LeRobot peers)."""
    try:
        shape = tuple(int(x) for x in model.noise_shape)
    except (NotImplementedError, AttributeError):
        return None
    unsupported = model.unsupported_handles() if hasattr(model, "unsupported_handles") else {}
    return None if "noise" in unsupported else shape


def task_env(client, task: str, control_hz: float = 10.0, instruction: str | None = None,
             privileged: bool = False, gripper: str = "raw"):
    """``privileged``: observations also carry the simulator's object poses (``vla.oracle_env``, a
    labelled oracle for diagnostics such as DSRL's ``--encoder oracle``); ``gripper``: the executed opening
    (``robot_io.env.RobotEnv``)."""
    from hardware.sim_tasks import get_task
    from rewards.sim_success import success_reward

    if privileged:
        from vla.oracle_env import PrivilegedTaskEnv as RobotEnv
    else:
        from robot_io.env import RobotEnv

    t = get_task(task)

    def reset_fn(env, seed):
        client.reset(seed=seed, task=t.name)

    env = RobotEnv(client, instruction=instruction or t.instruction, control_hz=control_hz,
                   reward_fn=success_reward(t.name), reset_fn=reset_fn, gripper=gripper)
    env.task = t
    env.max_ticks = t.max_steps
    return env


def load_env_factory(spec: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function (called to build a gymnasium env)."""
    if ":" not in spec:
        raise ValueError(f"--env must look like package.module:make_env, got {spec!r}")
    mod, fn = spec.split(":", 1)
    try:
        module = importlib.import_module(mod)
    except ImportError as e:
        raise ValueError(f"--env {spec}: cannot import {mod!r}: {e}") from e
    if not hasattr(module, fn):
        raise ValueError(f"--env {spec}: module {mod!r} has no {fn!r}")
    return getattr(module, fn)


def noise_option(spec: str) -> dict:
    """``--noise`` (``sample`` | ``zero`` | ``mean:N``) -> ``VLAPolicy``'s ``draws`` / ``zero_noise``."""
    spec = str(spec).strip()
    if spec == "sample":
        return {"draws": 1, "zero_noise": False}
    if spec == "zero":
        return {"draws": 1, "zero_noise": True}
    if spec.startswith("mean:"):
        n = spec[5:]
        if n.isdigit() and int(n) >= 1:
            return {"draws": int(n), "zero_noise": False}
    raise ValueError(f"--noise {spec!r}: give sample, zero or mean:N with N >= 1 (e.g. mean:8)")


class BinaryGripper:
    """``policy``'s rows with the gripper opening snapped shut or open (``robot_io.gripper.snap_opening``):
    column :data:`GRIPPER_COLUMN` becomes 1.0 at or above ``threshold`` (0.5) and 0.0 below; the other columns
    pass unchanged. ``reset`` and every other attribute are the wrapped policy's.

    Why: the demonstrations command the gripper fully open or fully shut, but a flow policy puts out openings in
    between near its open / close decision, and temporal ensembling averages chunks that disagree about when to
    close. The simulated Panda's fingers (Menagerie: a position servo, about 100 N/m) squeeze with force in
    proportion to how far the command lies inside the cube, so an opening of 0.45 on a 4.5 cm cube holds it with
    a fifth of the force of 0 and it slides out in the carry (bench/results/vla_sft round 22). The thresholded
    command is what every demonstration did."""

    def __init__(self, policy, threshold: float = 0.5, column: int = GRIPPER_COLUMN) -> None:
        if not (np.isfinite(threshold) and 0.0 < threshold < 1.0):
            raise ValueError(f"gripper threshold must lie in (0, 1), got {threshold}")
        model = getattr(policy, "model", None) or getattr(getattr(policy, "policy", None), "model", None)
        dim = getattr(model, "action_shape", (None, None))[-1]
        if dim is not None and dim <= column:
            raise ValueError(f"--gripper binary snaps column {column} of the arm's ee_delta action (the opening); "
                             f"this VLA's actions have {dim} columns")
        self.policy, self.threshold, self.column = policy, float(threshold), int(column)

    def __getattr__(self, name):  # exec_steps, model, ... : the wrapped policy's
        if name == "policy":
            raise AttributeError(name)
        return getattr(self.policy, name)

    def reset(self, seed: int | None = None) -> None:
        if hasattr(self.policy, "reset"):
            self.policy.reset(seed)

    def __call__(self, obs: dict, *args, **kwargs) -> np.ndarray:
        return snap_opening(self.policy(obs, *args, **kwargs), self.threshold, self.column)


def gripper_option(spec: str, auto: bool = False) -> str:
    """``--gripper`` (``raw`` | ``binary``, and ``auto`` where ``auto``) checked by name."""
    return gripper_mode(spec, "--gripper", auto=auto)


def checkpoint_gripper(path: str) -> str | None:
    """The executed gripper opening a checkpoint was measured with: a checkpoint directory's ``config.json``
    ``execution.gripper``, an exported ``.onnx`` graph's ``gripper`` metadata; None where it names none (a
    checkpoint made elsewhere or before the field existed). A bad value is refused, naming the file and field."""
    if os.path.isfile(path):
        from vla.models.onnx_vla import is_onnx_file

        if not is_onnx_file(path):
            return None
        import onnxruntime as ort

        from deploy.runtime.onnx_policy import read_metadata  # checks the field

        return read_metadata(ort.InferenceSession(path, providers=["CPUExecutionProvider"])).get("gripper")
    cfg = os.path.join(path, "config.json")
    if not os.path.isfile(cfg):
        return None
    with open(cfg) as f:
        d = json.load(f)
    ex = d.get("execution") if isinstance(d, dict) else None
    if ex is None:
        return None
    if not isinstance(ex, dict):
        raise ValueError(f"{cfg}: 'execution' must be a mapping such as {{\"gripper\": \"binary\"}}, got "
                         f"{type(ex).__name__}")
    if ex.get("gripper") is None:
        return None
    return gripper_mode(ex["gripper"], f"{cfg}: execution.gripper")


def resolve_gripper(spec: str, checkpoint: str | None) -> str:
    """``--gripper`` made concrete: ``auto`` is what ``checkpoint`` names (:func:`checkpoint_gripper`), else
    ``raw``; ``raw`` / ``binary`` stand."""
    spec = gripper_option(spec, auto=True)
    if spec != "auto":
        return spec
    return (checkpoint_gripper(checkpoint) if checkpoint else None) or "raw"


class VLAPolicy:
    """``obs (one env observation) -> float32 [n, A]``: the first ``exec_steps`` rows of the VLA's
    chunk. ``noise`` / ``token`` / ``instruction`` overrides are the RL handles; ``token`` given here
    holds one behaviour token (ExToken) for every call that names none.

    Without a ``noise`` override each chunk comes from one N(0, I) draw (the episode's, after
    ``reset(seed)``). ``draws`` N > 1: the chunk is the mean of N draws' chunks, one embedding of the
    observation shared by all (draw 0 is the single-draw policy's); ``zero_noise``: the sampler
    starts from 0 (the flow's most central chunk), deterministic."""

    def __init__(self, model, exec_steps: int | None = None, token: int | None = None, draws: int = 1,
                 zero_noise: bool = False) -> None:
        self.model = model
        self.token = token
        h = model.action_shape[0]
        self.exec_steps = exec_steps or h
        if not 1 <= self.exec_steps <= h:
            raise ValueError(f"exec_steps must be in [1, {h}] (the chunk length), got {exec_steps}")
        self.noise_shape = noise_shape_of(model)
        _whole(draws, "draws")
        if (draws > 1 or zero_noise) and self.noise_shape is None:
            raise ValueError("noise zero / mean:N (draws > 1, zero_noise) needs a VLA whose sampler takes its starting "
                             "noise; this one does not (an exported graph without a noise input, a LeRobot peer)")
        if draws > 1 and hasattr(model, "require_handles"):
            model.require_handles("embed", "sample_actions_from_embedding")  # mean:N shares one embedding
        if draws > 1 and zero_noise:
            raise ValueError("draws > 1 averages noise draws; zero_noise has one: choose one")
        self.draws, self.zero_noise = int(draws), bool(zero_noise)
        self.reset(None)

    def reset(self, seed: int | None = None) -> None:
        """A new episode: with a ``seed`` the sampler's noise of its k-th chunk is
        ``episode_noise(noise_shape, seed, k)``; without, the model draws its own."""
        self._seed, self._k = seed, 0

    @staticmethod
    def batch(obs: dict, instruction: str | None = None) -> dict:
        return {"images": {c: np.asarray(img)[None] for c, img in obs["images"].items()},
                "state": np.asarray(obs["state"], np.float32)[None],
                "instruction": [instruction if instruction is not None else obs["instruction"]]}

    def __call__(self, obs: dict, noise=None, token=None, instruction: str | None = None) -> np.ndarray:
        import torch

        if noise is not None:
            noise = torch.as_tensor(np.asarray(noise, np.float32)).reshape(1, *self.model.noise_shape)
        elif self.zero_noise:
            noise = torch.zeros(1, *self.noise_shape)
        elif self.draws > 1:
            k, self._k = self._k, self._k + 1
            return self._mean_of_draws(obs, k, token, instruction)
        elif self._seed is not None and self.noise_shape is not None:
            noise = episode_noise(self.noise_shape, self._seed, self._k)
        self._k += 1
        with torch.no_grad():
            chunk = self.model.sample_actions(self.batch(obs, instruction), noise=noise,
                                              token=self.token if token is None else token)
        return chunk[0, : self.exec_steps].cpu().numpy().astype(np.float32)

    def _mean_of_draws(self, obs: dict, k: int, token, instruction) -> np.ndarray:
        import torch

        if self._seed is not None:
            noise = episode_noise(self.noise_shape, self._seed, k, self.draws)
        else:
            noise = torch.randn(self.draws, *self.noise_shape)
        with torch.no_grad():
            emb = self.model.embed(self.batch(obs, instruction))
            chunks = self.model.sample_actions_from_embedding(emb.expand(self.draws, -1), noise=noise,
                                                              token=self.token if token is None else token)
        return chunks.mean(0)[: self.exec_steps].cpu().numpy().astype(np.float32)


class TemporalEnsemble:
    """ACT's temporal ensembling (Zhao et al., 2023): query the VLA at every tick and execute one
    row, the weighted mean of what every chunk still covering this tick predicted for it, with
    weights ``exp(-m * i)``, ``i = 0`` the oldest prediction (ACT: m = 0.01, close to a plain mean).
    Averaging overlapping chunks smooths the chunk boundaries and, for a sampled (flow) policy,
    averages out the noise draws. ``reset()`` at every episode start (``run_episode`` does).

    ``window``: average only the newest ``window`` predictions for the tick (default: every chunk
    that still covers it): less lag behind the arm, less smoothing across plans. On the shipped base
    the full mean wins by far (bench/results/vla_sft round 19: 61/100, newest 4: 28, newest 2: 18)."""

    exec_steps = 1

    def __init__(self, policy: VLAPolicy, m: float = 0.01, window: int | None = None) -> None:
        if not (np.isfinite(m) and m >= 0):
            raise ValueError(f"temporal ensemble weight m must be >= 0, got {m}")
        if policy.exec_steps != policy.model.action_shape[0]:
            raise ValueError("TemporalEnsemble needs the policy's whole chunk (VLAPolicy with exec_steps=None)")
        self.policy, self.m = policy, float(m)
        self.window = None if window is None else _whole(window, "temporal ensemble window")
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        if hasattr(self.policy, "reset"):  # the episode's noise seeds (VLAPolicy)
            self.policy.reset(seed)
        self._chunks: list[tuple[int, np.ndarray]] = []
        self._t = 0

    def __call__(self, obs: dict) -> np.ndarray:
        chunk = self.policy(obs)
        self._chunks.append((self._t, chunk))
        self._chunks = [(t0, c) for t0, c in self._chunks if self._t - t0 < len(c)]
        rows = np.stack([c[self._t - t0] for t0, c in self._chunks])  # oldest first
        if self.window is not None:
            rows = rows[-self.window:]
        w = np.exp(-self.m * np.arange(len(rows)))
        self._t += 1
        return (w[:, None] * rows).sum(0, keepdims=True).astype(np.float32) / w.sum()


class ChunkDriver:
    """Per-tick actions from a VLA's chunks, for a recorder that steps one action per tick (DAgger,
    ``vla record --dagger``): re-plans every ``exec_steps`` ticks (every tick for a
    :class:`TemporalEnsemble`). With probability ``beta`` per chunk it yields None for that chunk's
    ticks instead, which hands those ticks to the expert (DAgger's mixture policy); the policy still
    plans them, so its noise draws and ensemble history follow the ticks.

    ``handover_at_close``: from the first tick whose action closes the gripper (command < 0.5) to the
    episode's end the expert drives (None every tick): the policy's own approach and descent are
    labelled, and the grasp, its retries and the lift are the expert's own from where the policy
    brought the arm, instead of labels on a grasp the policy carries on with. ``reset(seed)`` at every
    episode start.

    ``prompt_fn``: ``() -> str``, called every tick, the instruction the policy is prompted with instead of the
    observation's (``vla record --dagger-prompts subskills``: the sub-skill the expert reads off this state, so the
    policy runs a task as a sequence of sub-skill prompts and visits its own hand-over states, a dropped cube's
    "pick up ..." again included). When it changes, the queued rows and the policy's history (a temporal
    ensemble's chunks made under the previous prompt) are dropped and the policy re-plans at once."""

    def __init__(self, policy: VLAPolicy, beta: float = 0.0, seed: int = 0, handover_at_close: bool = False,
                 prompt_fn: Callable[[], str] | None = None) -> None:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1] (the share of chunks the expert drives), got {beta}")
        self.policy, self.beta, self._seed = policy, float(beta), int(seed)
        self.handover_at_close = bool(handover_at_close)
        self.prompt_fn = prompt_fn
        self.reset(0)

    def reset(self, seed: int) -> None:
        if hasattr(self.policy, "reset"):  # the episode's noise seeds (VLAPolicy)
            self.policy.reset(seed)
        self._queue: list = []
        self._rng = np.random.default_rng([0xDA66, self._seed, int(seed)])
        self.handed_over_at: int | None = None
        """The episode tick from which the expert drives (``handover_at_close``), else None."""
        self._t = 0
        self._episode_seed = int(seed)
        self.prompt: str | None = None
        """``prompt_fn``: the instruction the policy was last prompted with."""
        self.prompts: list[list] = []
        """``prompt_fn``: ``[tick, instruction]`` at each change of prompt in this episode."""

    def __call__(self, obs: dict) -> np.ndarray | None:
        t, self._t = self._t, self._t + 1
        if self.handed_over_at is not None:
            return None
        if self.prompt_fn is not None:
            prompt = self.prompt_fn()
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError(f"ChunkDriver.prompt_fn must return a non-empty instruction, got {prompt!r}")
            if prompt != self.prompt:
                if self.prompt is not None and hasattr(self.policy, "reset"):
                    # a temporal ensemble must not average chunks made under the previous prompt
                    self.policy.reset(self._episode_seed)
                self._queue, self.prompt = [], prompt
                self.prompts.append([t, prompt])
            obs = {**obs, "instruction": prompt}
        if not self._queue:
            # the policy plans every time, also for the expert's chunks: a policy that keeps a history (a
            # TemporalEnsemble, one row per tick) stays in step with the episode's ticks
            rows = list(self.policy(obs))
            expert = self.beta > 0 and self._rng.random() < self.beta
            self._queue = [None] * len(rows) if expert else rows
        act = self._queue.pop(0)
        if self.handover_at_close and act is not None and float(np.asarray(act).reshape(-1)[-1]) < 0.5:
            self.handed_over_at, self._queue = t, []
            return None
        return act
