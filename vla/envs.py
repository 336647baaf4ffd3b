"""Environments that training, evaluation and RL roll policies out in.

* ``task_env(client, task)``: a ``robot_io.RobotEnv`` on a bridge client, for one of the sim
  tasks (``hardware.sim_tasks``): reset lays out the task's scene from the seed, the reward is
  the task's success predicate (``rewards.sim_success``), the episode is truncated after the
  task's ``max_steps`` control ticks (``privileged=True``: the observation also carries the
  simulator's object poses, a labelled oracle, ``vla.oracle_env``).
* ``load_env_factory("package.module:make_env")``: any user gymnasium env with the observation
  layout of DESIGN.md (images / state / instruction), for ``--env``.
* ``VLAPolicy``: wraps a VLA as ``obs -> action chunk`` (numpy) for a RobotEnv.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import numpy as np


def task_env(client, task: str, control_hz: float = 10.0, instruction: str | None = None,
             privileged: bool = False):
    """``privileged``: observations also carry the simulator's object poses (``vla.oracle_env``, a
    labelled oracle for diagnostics such as DSRL's ``--encoder oracle``)."""
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
                   reward_fn=success_reward(t.name), reset_fn=reset_fn)
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


class VLAPolicy:
    """``obs (one env observation) -> float32 [n, A]``: the first ``exec_steps`` rows of the VLA's
    chunk. ``noise`` / ``token`` / ``instruction`` overrides are the RL handles."""

    def __init__(self, model, exec_steps: int | None = None) -> None:
        self.model = model
        h = model.action_shape[0]
        self.exec_steps = exec_steps or h
        if not 1 <= self.exec_steps <= h:
            raise ValueError(f"exec_steps must be in [1, {h}] (the chunk length), got {exec_steps}")

    @staticmethod
    def batch(obs: dict, instruction: str | None = None) -> dict:
        return {"images": {c: np.asarray(img)[None] for c, img in obs["images"].items()},
                "state": np.asarray(obs["state"], np.float32)[None],
                "instruction": [instruction if instruction is not None else obs["instruction"]]}

    def __call__(self, obs: dict, noise=None, token=None, instruction: str | None = None) -> np.ndarray:
        import torch

        if noise is not None:
            noise = torch.as_tensor(np.asarray(noise, np.float32)).reshape(1, *self.model.noise_shape)
        with torch.no_grad():
            chunk = self.model.sample_actions(self.batch(obs, instruction), noise=noise, token=token)
        return chunk[0, : self.exec_steps].cpu().numpy().astype(np.float32)


class TemporalEnsemble:
    """ACT's temporal ensembling (Zhao et al., 2023): query the VLA at every tick and execute one
    row, the weighted mean of what every chunk still covering this tick predicted for it, with
    weights ``exp(-m * i)``, ``i = 0`` the oldest prediction (ACT: m = 0.01, close to a plain mean).
    Averaging overlapping chunks smooths the chunk boundaries and, for a sampled (flow) policy,
    averages out the noise draws. ``reset()`` at every episode start (``run_episode`` does)."""

    exec_steps = 1

    def __init__(self, policy: VLAPolicy, m: float = 0.01) -> None:
        if not (np.isfinite(m) and m >= 0):
            raise ValueError(f"temporal ensemble weight m must be >= 0, got {m}")
        if policy.exec_steps != policy.model.action_shape[0]:
            raise ValueError("TemporalEnsemble needs the policy's whole chunk (VLAPolicy with exec_steps=None)")
        self.policy, self.m = policy, float(m)
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        self._chunks: list[tuple[int, np.ndarray]] = []
        self._t = 0

    def __call__(self, obs: dict) -> np.ndarray:
        chunk = self.policy(obs)
        self._chunks.append((self._t, chunk))
        self._chunks = [(t0, c) for t0, c in self._chunks if self._t - t0 < len(c)]
        rows = np.stack([c[self._t - t0] for t0, c in self._chunks])  # oldest first
        w = np.exp(-self.m * np.arange(len(rows)))
        self._t += 1
        return (w[:, None] * rows).sum(0, keepdims=True).astype(np.float32) / w.sum()


class ChunkDriver:
    """Per-tick actions from a VLA's chunks, for a recorder that steps one action per tick (DAgger,
    ``vla record --dagger``): re-plans every ``exec_steps`` ticks. With probability ``beta`` per
    chunk it yields None for that chunk's ticks instead, which hands those ticks to the expert
    (DAgger's mixture policy). ``reset(seed)`` at every episode start."""

    def __init__(self, policy: VLAPolicy, beta: float = 0.0, seed: int = 0) -> None:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1] (the share of chunks the expert drives), got {beta}")
        self.policy, self.beta, self._seed = policy, float(beta), int(seed)
        self.reset(0)

    def reset(self, seed: int) -> None:
        self._queue: list = []
        self._rng = np.random.default_rng([0xDA66, self._seed, int(seed)])

    def __call__(self, obs: dict) -> np.ndarray | None:
        if not self._queue:
            if self.beta > 0 and self._rng.random() < self.beta:
                self._queue = [None] * self.policy.exec_steps
            else:
                self._queue = list(self.policy(obs))
        return self._queue.pop(0)
