"""Run a policy on a robot (any gymnasium env with the DESIGN.md observation layout)."""

from __future__ import annotations

from typing import Callable

import numpy as np


def run_episodes(env, policy: Callable[[dict], np.ndarray], episodes: int = 1, max_steps: int = 100,
                 seed: int = 0, on_step: Callable[[int, dict, float], None] | None = None) -> list[dict]:
    """Roll ``policy`` (obs -> chunk [H, A]) out; each chunk is one env step. Returns per-episode
    summaries (return, steps, success if the env reports it in ``info['success']``)."""
    results = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        ret, success = 0.0, False
        steps = 0
        for steps in range(1, max_steps + 1):
            obs, r, term, trunc, info = env.step(policy(obs))
            ret += r
            success = success or bool(info.get("success", False))
            if on_step is not None:
                on_step(steps, obs, r)
            if term or trunc:
                break
        results.append({"episode": ep, "return": ret, "steps": steps, "success": success})
    return results
