"""Behaviour cloning of a pixel policy from a PRIVILEGED RAM teacher, with DAgger rounds.

The student is the Nature CNN of ``policies.dqn.dqn`` read as action logits (a ``DQN`` object, so
``evaluate``, ``DQN.from_checkpoint``, ``vla rig agent`` and DQN fine-tuning take it as it is).
The teacher (``policies.dqn.teacher``) reads the game's RAM at each decision, the student sees
only pictures, stacked as DQN stacks them (``FrameStack``: grey, 84 x 84, the last 4).

DAgger (Ross et al. 2011): round 0 plays the teacher and records (pictures, teacher's action);
every later round plays the *student* (``beta`` of the decisions go to the teacher instead) and
records the teacher's label for every picture the student met, the data aggregate, and the
student is trained on all of it. The env is any env with the picture layout and an ``ale``
attribute the teacher reads: ``AleEnv`` (emulation) or ``hardware.virtual_rig.VirtualRig`` (the
rig: there the teacher labels the game's present state while the student sees the camera's
delayed, tilted, noisy frame, so DAgger on the rig is also fine-tuning on the rig).

Run directory (``dagger(...)``)::

    RUN/bc_config.json            the settings
    RUN/rounds.jsonl              one line per round: samples, teacher / student game scores, loss, accuracy
    RUN/checkpoint/model.pt       the student after the last finished round (written to a temporary
                                  file and renamed: a kill leaves the previous round's student)
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from policies.dqn.config import DQNConfig
from policies.dqn.dqn import DQN
from policies.dqn.preprocess import FrameStack, obs_picture


@dataclasses.dataclass(frozen=True)
class BCConfig:
    rounds: int = 4
    """DAgger rounds after the teacher's round 0."""
    round0_steps: int = 20_000
    """Decisions the teacher plays in round 0."""
    round_steps: int = 10_000
    """Decisions the student plays (labelled by the teacher) in each later round."""
    beta: float = 0.0
    """Share of the later rounds' decisions handed to the teacher (DAgger's mixing)."""
    train_steps: int = 1500
    """Gradient steps after each round, on all the data so far."""
    batch_size: int = 128
    learning_rate: float = 5e-4
    max_samples: int = 120_000
    """Oldest samples are dropped beyond this many (uint8 [4, 84, 84] each: 28 KB)."""
    episode_steps: int = 4500
    """Cap of a collected game, decisions (18000 frames: Nature's 5-minute evaluation cap)."""
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def collect(env, teacher, student: DQN | None, steps: int, beta: float, rng: np.random.Generator,
            episode_steps: int, seed: int, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Play ``steps`` decisions (whole games, the last cut at ``steps``): the teacher acts where
    ``student`` is None or with probability ``beta``, else the student's argmax. Every decision is
    stored with the teacher's label. -> {obs [N, 4, 84, 84] uint8, label [N] int64, scores, agree}."""
    stack = FrameStack()
    obs_l, lab_l, scores, agree, n_student = [], [], [], 0, 0
    ep = 0
    while len(lab_l) < steps:
        obs, _ = env.reset(seed=seed * 1_000_003 + ep)
        teacher.reset()
        s = stack.reset(obs_picture(obs))
        score, t = 0.0, 0
        while True:
            label = int(teacher(env.ale.getRAM()))
            a = label
            if student is not None and rng.random() >= beta:
                a = student.act(s, 0.0, rng)
                agree += int(a == label)
                n_student += 1
            obs_l.append(s)
            lab_l.append(label)
            obs, r, term, trunc, _ = env.step(a)
            s = stack.push(obs_picture(obs))
            score += float(r)
            t += 1
            if progress is not None:
                progress(1)
            if term or trunc or t >= episode_steps or len(lab_l) >= steps:
                break
        if term or trunc or t >= episode_steps:  # a finished (or capped) game; the cut last one is not a score
            scores.append(score)
        ep += 1
    return {"obs": np.stack(obs_l), "label": np.asarray(lab_l, np.int64), "scores": scores,
            "agree": agree / n_student if n_student else None}


def train_steps(agent: DQN, obs: np.ndarray, label: np.ndarray, steps: int, batch_size: int,
                rng: np.random.Generator) -> dict[str, float]:
    """``steps`` cross-entropy steps of the student's logits on the teacher's labels."""
    net, opt = agent.q_network, agent.optimizer
    net.train()
    losses, accs = [], []
    for _ in range(steps):
        idx = rng.integers(0, len(label), batch_size)
        x = torch.from_numpy(obs[idx])
        y = torch.from_numpy(label[idx])
        logits = net(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
        accs.append(float((logits.argmax(1) == y).float().mean().item()))
    net.eval()
    k = max(1, steps // 5)
    return {"loss": float(np.mean(losses[-k:])), "accuracy": float(np.mean(accs[-k:]))}


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(total: int, desc: str, progress: bool):
    """A tqdm bar, or nothing at all (tqdm's lock leaks a semaphore in each worker process of a pool)."""
    if not progress:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False, unit="step")


def save_student(agent: DQN, out: str) -> None:
    os.makedirs(os.path.join(out, "checkpoint"), exist_ok=True)
    path = os.path.join(out, "checkpoint", "model.pt")
    agent.sync_target()
    torch.save(agent.state_dict(), path + ".tmp")
    os.replace(path + ".tmp", path)


def dagger(make_env: Callable[[int], Any], make_teacher: Callable[[], Any], cfg: BCConfig, out: str | None = None,
           agent: DQN | None = None, progress: bool = True, log: Callable[[str], None] = print) -> tuple[DQN, list]:
    """Round 0 (the teacher plays, unless ``agent`` is given: then DAgger continues from that student,
    e.g. an emulation student fine-tuned on the rig) and ``cfg.rounds`` DAgger rounds. ``make_env(seed)``
    -> the env to collect in. Returns the student and the rounds' log."""
    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)
    env, teacher = make_env(cfg.seed), make_teacher()
    start = agent is not None
    if agent is None:
        agent = DQN(env.action_space.n, DQNConfig(learning_rate=cfg.learning_rate), tuple(env.action_names))
    for g in agent.optimizer.param_groups:
        g["lr"] = cfg.learning_rate
    agent.q_network.eval()
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "bc_config.json"), "w") as f:
            json.dump(cfg.to_dict(), f, indent=2)
    obs = np.zeros((0, 4, 84, 84), np.uint8)
    label = np.zeros((0,), np.int64)
    rounds = []
    for r in range(0 if not start else 1, cfg.rounds + 1):
        t0 = time.time()
        n = cfg.round0_steps if r == 0 else cfg.round_steps
        bar = _bar(n, f"round {r} ({'teacher' if r == 0 else 'student'})", progress)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one picture at a time: more threads only wait on each other
        try:
            d = collect(env, teacher, None if r == 0 else agent, n, cfg.beta, rng, cfg.episode_steps,
                        seed=cfg.seed * 1000 + r, progress=bar.update)
        finally:
            torch.set_num_threads(threads)
        bar.close()
        obs = np.concatenate([obs, d["obs"]])[-cfg.max_samples:]
        label = np.concatenate([label, d["label"]])[-cfg.max_samples:]
        t1 = time.time()
        fit = train_steps(agent, obs, label, cfg.train_steps, cfg.batch_size, rng)
        row = {"round": r, "player": "teacher" if r == 0 else "student", "samples": int(len(label)),
               "scores": d["scores"], "mean_score": float(np.mean(d["scores"])) if d["scores"] else None,
               "student_agrees": d["agree"], **fit, "collect_s": round(t1 - t0, 1),
               "train_s": round(time.time() - t1, 1)}
        rounds.append(row)
        log(f"round {r}: {row['player']} scored {row['mean_score']} over {len(d['scores'])} games; "
            f"{len(label)} samples; loss {fit['loss']:.3f}, accuracy {fit['accuracy']:.3f}")
        if out:
            with open(os.path.join(out, "rounds.jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")
            save_student(agent, out)
    return agent, rounds
