"""Recorded demonstrations into an RL session's demo (offline) buffer (``vla rl --demos DATASET``).

A method whose critic reads executed chunks (DSRL-NA's ``Q^A(s, a)``, residual RL's ``Q(s, base + delta)``)
learns from demonstrations directly, though they have no noise or residual behind them: the demo buffer is
sampled 50 / 50 with the online one (RLPD), as operator interventions already are.

A LeRobot episode of ``T`` recorded ticks (frame ``k``: the observation before tick ``k`` and the
action the robot applied on it, see ``vla.data.recording``) becomes ``ceil(T / n)`` macro-step
transitions of ``n = exec_steps`` ticks, as the session would have stored them had an operator
driven the whole episode:

    obs        frame ``i n``: the VLA's features (encoder ``cnn``: also its cameras and state)
    chunk      actions ``i n .. i n + n - 1`` normalised like the VLA's actions; the last chunk is
               padded by repeating its last action (as an operator's short chunk is)
    next_obs   frame ``(i + 1) n``; for the last macro-step the last recorded frame (the state after
               the final tick is not recorded; a success is terminal, so it is never bootstrapped from)
    reward     1 on the last macro-step of an episode that ``meta/vla_episodes.jsonl`` marks
               successful (the recorder ends an episode on the success predicate), else 0
    done       that same success (a failed episode ends by truncation, which is not terminal)
    action     zeros (no noise or residual behind it; the critics read ``chunk``, never a demo's ``action``)
    intervention  True

Only episodes whose instruction is the session's enter (the features, and so the critic, are
conditioned on the instruction); the others are counted and skipped.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch


def demo_transitions(agent, roots: list[str] | tuple[str, ...], instruction: str,
                     progress: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """-> (transitions for the session's demo buffer, a report: datasets, episodes, successes,
    transitions, skipped_other_instruction). ``agent``: the method's agent (its ``vla``, ``embed``, ``observe_with``,
    ``obs_spec``, ``exec_steps``, ``action_dim``, ``cameras``)."""
    from vla.data.demos import load_demos
    from vla.data.episode_log import EPISODE_LOG_PATH, read_outcomes

    if "privileged" in agent.obs_spec:
        raise ValueError("--demos with --encoder oracle: recorded demos carry no simulator state for the oracle's "
                         "critic to read; drop --demos or use --encoder vla")
    vla = agent.vla
    n = agent.exec_steps
    cameras, image_size = _frames_to_load(vla, agent)
    outcomes: dict[str, dict[int, bool]] = {}
    for root in roots:
        root = os.path.abspath(root)
        try:
            outcomes[root] = read_outcomes(root)
        except FileNotFoundError as e:
            raise ValueError(f"--demos {root}: {e}") from None
    episodes = load_demos([os.path.abspath(r) for r in roots], image_size, cameras=cameras, progress=progress)
    trs: list[dict[str, Any]] = []
    report = {"datasets": [os.path.abspath(r) for r in roots], "episodes": 0, "successes": 0, "transitions": 0,
              "skipped_other_instruction": 0}
    zeros = np.zeros(agent.action_dim, np.float32)
    for ep in episodes:
        if ep.instruction != instruction:
            report["skipped_other_instruction"] += 1
            continue
        if ep.episode_index not in outcomes[ep.dataset]:
            raise ValueError(f"--demos {ep.dataset}: {EPISODE_LOG_PATH} has no outcome for episode "
                             f"{ep.episode_index}; the reward of a demo comes from it")
        success = outcomes[ep.dataset][ep.episode_index]
        t = len(ep)
        starts = list(range(0, t, n))
        nexts = [min(s + n, t - 1) for s in starts]
        idx = sorted(set(starts) | set(nexts))
        pos = {k: i for i, k in enumerate(idx)}
        batch = {"images": {c: ep.images[c][idx] for c in ep.images}, "state": ep.state[idx],
                 "instruction": [instruction] * len(idx)}
        feat = agent.embed(batch)
        seen: dict[int, dict[str, np.ndarray]] = {}

        def aobs(k: int) -> dict[str, np.ndarray]:
            # once per frame: a macro-step's next_obs is the same arrays as the next one's obs, as in a session
            # (an agent whose view draws noise, e.g. residual RL's sampled base chunk, must not draw it twice)
            if k not in seen:
                o = {"images": {c: ep.images[c][k] for c in ep.images}, "state": ep.state[k]}
                view = agent.observe_with(o, feat[pos[k]: pos[k] + 1])
                seen[k] = {name: view[name][0].numpy() for name in agent.obs_spec}
            return seen[k]

        for j, (s, s2) in enumerate(zip(starts, nexts)):
            rows = ep.action[s: s + n]
            if len(rows) < n:
                rows = np.concatenate([rows, np.repeat(rows[-1:], n - len(rows), 0)])
            chunk_n = vla.clip_normalized_actions(vla.normalize_actions(torch.from_numpy(rows))).numpy().astype(np.float32)
            last = j == len(starts) - 1
            # rows: the ticks between the two frames (the value target's per-tick discount); a failed demo's
            # last step is cut by the recording's end, not by a terminal state (the target's time limit)
            trs.append(dict(obs=aobs(s), action=zeros, reward=float(last and success), next_obs=aobs(s2),
                            done=bool(last and success), chunk=chunk_n, intervention=True,
                            rows=np.asarray(max(s2 - s, 1), np.int32), truncated=bool(last and not success)))
        report["episodes"] += 1
        report["successes"] += int(success)
    report["transitions"] = len(trs)
    if not trs:
        raise ValueError(f"--demos: no episode of {report['datasets']} has the session's instruction "
                         f"{instruction!r} ({report['skipped_other_instruction']} episode(s) have another)")
    return trs, report


def _frames_to_load(vla, agent) -> tuple[list[str] | None, int | None]:
    """(cameras, image size) at which to load the recorded frames, so that the VLA's features of
    them are those it computes online from the env's frames, at the least memory.

    * A backbone whose config names its cameras and one square ``image_size`` it resizes every frame
      to before anything else (the compact VLA) gets only those cameras, resized to that size up
      front; unless it crops first (``crops``): then the recorded frames, which it crops and resizes
      as at inference (a resize before its crop would change what it sees).
    * Any other backbone (the LeRobot adapters: their processors resize and pad to the policy's own
      resolution; no ``cfg``) gets the recorded frames of every camera, as the env hands them over
      online.

    Encoder ``cnn`` adds its own cameras (``observe_with`` resizes them to ``image_size`` itself);
    ``None`` cameras: every camera of the dataset."""
    vcfg = getattr(vla, "cfg", None)
    vla_cameras = tuple(getattr(vcfg, "cameras", ()) or ())
    size = getattr(vcfg, "image_size", None)
    cameras = list(dict.fromkeys([*vla_cameras, *agent.cameras]))
    if not vla_cameras or not isinstance(size, int) or getattr(vcfg, "crops", ()):
        # the recorded frames; every camera unless the VLA names its own (then those + the encoder's)
        return (cameras if vla_cameras else None), None
    return cameras, size
