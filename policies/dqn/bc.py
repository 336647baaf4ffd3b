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

Two things the plain recipe lacked, each measured on Breakout / Pong seed 0 with 4 rounds
(bench/results/README.md, rig study): ``epsilon`` (every round, the teacher's too, plays 5% random
keys as the evaluation does, labels unchanged): without it the student met none of the states one
random key leads to and fell out of them at evaluation (Breakout: 8 / 14 / 13% human-normalised
after 3 / 5 / 7 rounds without it, 36% after 4 with it), and its greedy rounds were spent pressing
LEFT / RIGHT on a board with no ball in play (4,280 of a game's 4,500 decisions labelled FIRE); ``aux_weight`` (a training-only head reads the teacher's RAM ball
and paddle positions out of the student's hidden layer): without it the Pong student stayed at
chance (cross-entropy ln 3) through 15,000 gradient steps, with it Pong reaches 46% (Breakout 46%).

Two more for fine-tuning on the rig (``bench/rig_gap.py``'s fixes): ``action_history`` (the student also
reads its own last actions: the rig's picture predates the last key, so the pictures alone are not the
state the teacher labels) and ``cotrain_steps`` (emulation samples kept beside the few thousand rig
samples, a share of every batch). And ``label_at_key``: the teacher labels the state its key will meet
(``env.ram_at_key()``), not the present one. On the rig a key lands a tick or more after the picture's
decision; the teacher tuned in emulation, where keys act at once, reading the present RAM there plays Pong at
41% human-normalised instead of 66%, and at 65% given the state at its key's tick (10 games each).

Run directory (``dagger(...)``)::

    RUN/bc_config.json            the settings
    RUN/rounds.jsonl              one line per round: samples, teacher / student game scores, loss, accuracy
    RUN/checkpoint/model.pt       the student after the last finished round (written to a temporary
                                  file and renamed: a kill leaves the previous round's student)
    RUN/rounds/NN/model.pt        round NN's student (``keep_rounds``: a budget curve scores each)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from policies.dqn.config import DQNConfig
from policies.dqn.dqn import DQN
from policies.dqn.preprocess import ActionHistory, FrameStack, obs_picture


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
    epsilon: float = 0.05
    """Share of every round's decisions (the teacher's too) replaced by a uniformly random action while
    collecting; the stored label stays the teacher's. The evaluation plays at epsilon 0.05 (Nature), and
    a student that never met the states one random key leads to falls out of them (noise injection,
    as DART, Laskey et al. 2017). 0: collect without it."""
    aux_weight: float = 1.0
    """Weight of an auxiliary loss during training only: a linear head on the student's hidden layer
    regresses the teacher's RAM quantities (``features``: ball and paddle positions, now and one
    decision earlier). The student never sees RAM; the extra targets make its features find the
    few-pixel ball and paddle that the action labels alone leave it at chance on Pong. 0: off (and
    for a teacher without ``features``)."""
    action_history: int = 0
    """The student's own last actions as an input beside the pictures (``DQNConfig.action_history``; 0:
    pictures only). A student given to ``dagger`` with a shorter history is widened to this one
    (``DQN.with_action_history``: it acts as before until trained). On the rig the camera's picture
    predates the last key (~57 ms of capture + key latency, about one decision) while the teacher labels
    the game's present state: the last key is what the picture cannot show."""
    cotrain_steps: int = 0
    """Decisions collected once, before the first round, in ``dagger``'s ``cotrain_env`` (e.g. emulation while
    the rounds play on the rig): the starting student plays (``epsilon`` as the rounds), the teacher labels.
    They are kept apart from the rounds' data and every training batch draws ``cotrain_share`` of its
    samples from them (co-training on the source domain beside the target's: the rounds alone hold a few
    thousand rig samples against the tens of thousands the student learnt the game from). 0: off."""
    cotrain_share: float = 0.5
    """Share of each batch drawn from the co-training samples (when there are any)."""
    label_at_key: bool = False
    """The teacher reads ``env.ram_at_key()`` (the game's state at the tick where a key sent now takes
    effect; PRIVILEGED) instead of the present RAM, for the label and the auxiliary targets. In emulation
    the two are the same; on the rig the key meets a later state than the one the decision is made in.
    The co-training samples (emulation) keep the present RAM."""
    train_steps: int = 1500
    """Gradient steps after each round, on all the data so far."""
    batch_size: int = 128
    learning_rate: float = 5e-4
    max_samples: int = 120_000
    """Oldest samples are dropped beyond this many (uint8 [4, 84, 84] each: 28 KB)."""
    episode_steps: int = 4500
    """Cap of a collected game, decisions (18000 frames: Nature's 5-minute evaluation cap)."""
    seed: int = 0
    keep_rounds: bool = False
    """Keep each round's student as ``RUN/rounds/NN/model.pt`` beside the last one (``checkpoint/``), so
    that a budget curve can score every round with full evaluations (26 MB each). False: the last only."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def collect(env, teacher, student: DQN | None, steps: int, beta: float, rng: np.random.Generator,
            episode_steps: int, seed: int, progress: Callable[[int], None] | None = None,
            epsilon: float = 0.0, history: int = 0, label_at_key: bool = False) -> dict[str, Any]:
    """Play ``steps`` decisions (whole games, the last cut at ``steps``): the teacher acts where
    ``student`` is None or with probability ``beta``, else the student's argmax; then, with probability
    ``epsilon``, a random action replaces it. Every decision is stored with the teacher's label.
    -> {obs [N, 4, 84, 84] uint8, label [N] int64, prev [N, h] int64 (the actions played before each
    decision, -1: none yet; h = the student's ``action_history``, or ``history`` without a student), aux
    [N, 2k] float32 (the teacher's ``features`` now and one decision earlier; k = 0 for a teacher without
    them), scores, agree (the student's argmax against the label)}. ``label_at_key``: the teacher reads
    ``env.ram_at_key()`` (``BCConfig.label_at_key``)."""
    if label_at_key and not callable(getattr(env, "ram_at_key", None)):
        raise ValueError(f"label_at_key needs an env with ram_at_key(); {type(env).__name__} has none")
    stack = FrameStack()
    hist = ActionHistory(student.cfg.action_history if student is not None else history)
    feats = getattr(teacher, "features", None)
    obs_l, lab_l, prev_l, aux_l, scores, agree, n_student = [], [], [], [], [], 0, 0
    ep = 0
    while len(lab_l) < steps:
        obs, _ = env.reset(seed=seed * 1_000_003 + ep)
        teacher.reset()
        s, hp = stack.reset(obs_picture(obs)), hist.reset()
        score, t, prev = 0.0, 0, None
        while True:
            ram = env.ram_at_key() if label_at_key else env.ale.getRAM()
            if feats is not None:
                f = np.asarray(feats(ram), np.float32)
                aux_l.append(np.concatenate([f, f if prev is None else prev]))
                prev = f
            label = int(teacher(ram))
            a = label
            if student is not None and rng.random() >= beta:
                a = student.act(s, 0.0, rng, hp)
                agree += int(a == label)
                n_student += 1
            if epsilon > 0 and rng.random() < epsilon:
                a = int(rng.integers(env.action_space.n))
            obs_l.append(s)
            lab_l.append(label)
            prev_l.append(hp)
            obs, r, term, trunc, _ = env.step(a)
            s, hp = stack.push(obs_picture(obs)), hist.push(a)
            score += float(r)
            t += 1
            if progress is not None:
                progress(1)
            if term or trunc or t >= episode_steps or len(lab_l) >= steps:
                break
        if term or trunc or t >= episode_steps:  # a finished (or capped) game; the cut last one is not a score
            scores.append(score)
        ep += 1
    aux = np.stack(aux_l) if aux_l else np.zeros((len(lab_l), 0), np.float32)
    return {"obs": np.stack(obs_l), "label": np.asarray(lab_l, np.int64),
            "prev": np.stack(prev_l).astype(np.int64).reshape(len(lab_l), hist.k), "aux": aux, "scores": scores,
            "agree": agree / n_student if n_student else None}


class AuxHead(torch.nn.Module):
    """A linear read-out of the student's hidden layer for the auxiliary RAM targets, with its own
    optimiser (training only: not part of the student's checkpoint)."""

    def __init__(self, hidden: int, k: int, lr: float) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(hidden, k)
        self.optimizer = torch.optim.Adam(self.parameters(), lr=lr)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc(h)


def train_steps(agent: DQN, obs: np.ndarray, label: np.ndarray, steps: int, batch_size: int,
                rng: np.random.Generator, aux: np.ndarray | None = None, aux_head: AuxHead | None = None,
                aux_weight: float = 0.0, prev: np.ndarray | None = None, split: int = 0,
                share: float = 0.0) -> dict[str, float]:
    """``steps`` cross-entropy steps of the student's logits on the teacher's labels (plus, with
    ``aux_head``, ``aux_weight`` x the mean squared error of the head's read-out of the hidden layer
    against ``aux``). ``prev``: the actions played before each sample, for a student with an action
    history. ``split`` > 0: the first ``split`` samples are a pool apart (co-training) and ``share`` of each
    batch comes from it, the rest from the others."""
    net, opt = agent.q_network, agent.optimizer
    use_aux = aux_head is not None and aux is not None and aux.shape[1] > 0 and aux_weight > 0
    net.train()
    losses, accs, aux_losses = [], [], []
    for _ in range(steps):
        if split and split < len(label):
            k = int(round(share * batch_size))
            idx = np.concatenate([rng.integers(0, split, k), rng.integers(split, len(label), batch_size - k)])
        else:
            idx = rng.integers(0, len(label), batch_size)
        x = torch.from_numpy(obs[idx])
        y = torch.from_numpy(label[idx])
        p = torch.from_numpy(prev[idx]) if net.action_history else None
        h = net.head[:-1](net.features(x, p))  # QNetwork.forward, its last layer apart
        logits = net.head[-1](h)
        loss = F.cross_entropy(logits, y)
        total = loss
        if use_aux:
            aux_loss = F.mse_loss(aux_head(h), torch.from_numpy(aux[idx]))
            total = loss + aux_weight * aux_loss
            aux_head.optimizer.zero_grad()
            aux_losses.append(float(aux_loss.item()))
        opt.zero_grad()
        total.backward()
        opt.step()
        if use_aux:
            aux_head.optimizer.step()
        losses.append(float(loss.item()))
        accs.append(float((logits.argmax(1) == y).float().mean().item()))
    net.eval()
    k = max(1, steps // 5)
    out = {"loss": float(np.mean(losses[-k:])), "accuracy": float(np.mean(accs[-k:]))}
    if use_aux:
        out["aux_loss"] = float(np.mean(aux_losses[-k:]))
    return out


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


def keep_round(out: str, r: int) -> str:
    """Copy the student just saved (``RUN/checkpoint/model.pt``) to ``RUN/rounds/NN/model.pt`` (through a
    temporary file and a rename: a kill leaves no half-written student). -> the round's directory."""
    d = os.path.join(out, "rounds", f"{r:02d}")
    os.makedirs(d, exist_ok=True)
    shutil.copyfile(os.path.join(out, "checkpoint", "model.pt"), os.path.join(d, "model.pt.tmp"))
    os.replace(os.path.join(d, "model.pt.tmp"), os.path.join(d, "model.pt"))
    return d


def dagger(make_env: Callable[[int], Any], make_teacher: Callable[[], Any], cfg: BCConfig, out: str | None = None,
           agent: DQN | None = None, progress: bool = True, log: Callable[[str], None] = print,
           cotrain_env: Callable[[int], Any] | None = None) -> tuple[DQN, list]:
    """Round 0 (the teacher plays, unless ``agent`` is given: then DAgger continues from that student,
    e.g. an emulation student fine-tuned on the rig) and ``cfg.rounds`` DAgger rounds. ``make_env(seed)``
    -> the env to collect in; ``cotrain_env(seed)``: the env of ``cfg.cotrain_steps``. Returns the student
    and the rounds' log."""
    if cfg.cotrain_steps and cotrain_env is None:
        raise ValueError(f"cotrain_steps={cfg.cotrain_steps} needs a cotrain_env to collect them in")
    if not 0 <= cfg.cotrain_share < 1:
        raise ValueError(f"cotrain_share must be in [0, 1), got {cfg.cotrain_share}")
    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)
    env, teacher = make_env(cfg.seed), make_teacher()
    start = agent is not None
    if agent is None:
        agent = DQN(env.action_space.n, DQNConfig(learning_rate=cfg.learning_rate, action_history=cfg.action_history),
                    tuple(env.action_names))
    elif agent.cfg.action_history < cfg.action_history:
        agent = agent.with_action_history(cfg.action_history)
    for g in agent.optimizer.param_groups:
        g["lr"] = cfg.learning_rate
    agent.q_network.eval()
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "bc_config.json"), "w") as f:
            json.dump(cfg.to_dict(), f, indent=2)
    obs = np.zeros((0, 4, 84, 84), np.uint8)
    label = np.zeros((0,), np.int64)
    prev = np.zeros((0, agent.cfg.action_history), np.int64)
    aux, aux_head = None, None
    pool = None  # the co-training samples, kept apart
    if cfg.cotrain_steps:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        bar = _bar(cfg.cotrain_steps, "co-training samples", progress)
        try:
            pool = collect(cotrain_env(cfg.seed + 7), teacher, agent if start else None, cfg.cotrain_steps, cfg.beta,
                           rng, cfg.episode_steps, seed=cfg.seed * 1000 + 999, progress=bar.update,
                           epsilon=cfg.epsilon, history=agent.cfg.action_history)
        finally:
            torch.set_num_threads(threads)
            bar.close()
        log(f"co-training: {cfg.cotrain_steps} samples, the student scored {pool['scores']}")
    rounds = []
    for r in range(0 if not start else 1, cfg.rounds + 1):
        t0 = time.time()
        n = cfg.round0_steps if r == 0 else cfg.round_steps
        bar = _bar(n, f"round {r} ({'teacher' if r == 0 else 'student'})", progress)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one picture at a time: more threads only wait on each other
        try:
            d = collect(env, teacher, None if r == 0 else agent, n, cfg.beta, rng, cfg.episode_steps,
                        seed=cfg.seed * 1000 + r, progress=bar.update, epsilon=cfg.epsilon,
                        history=agent.cfg.action_history, label_at_key=cfg.label_at_key)
        finally:
            torch.set_num_threads(threads)
        bar.close()
        obs = np.concatenate([obs, d["obs"]])[-cfg.max_samples:]
        label = np.concatenate([label, d["label"]])[-cfg.max_samples:]
        prev = np.concatenate([prev, d["prev"]])[-cfg.max_samples:]
        aux = d["aux"] if aux is None else np.concatenate([aux, d["aux"]])[-cfg.max_samples:]
        if aux_head is None and aux.shape[1] > 0 and cfg.aux_weight > 0:
            aux_head = AuxHead(agent.q_network.head[-1].in_features, aux.shape[1], cfg.learning_rate)
        t1 = time.time()
        if pool is None:
            fit = train_steps(agent, obs, label, cfg.train_steps, cfg.batch_size, rng, aux, aux_head, cfg.aux_weight,
                              prev)
        else:
            fit = train_steps(agent, np.concatenate([pool["obs"], obs]), np.concatenate([pool["label"], label]),
                              cfg.train_steps, cfg.batch_size, rng, np.concatenate([pool["aux"], aux]), aux_head,
                              cfg.aux_weight, np.concatenate([pool["prev"], prev]), split=len(pool["label"]),
                              share=cfg.cotrain_share)
        row = {"round": r, "player": "teacher" if r == 0 else "student", "samples": int(len(label)),
               "scores": d["scores"], "mean_score": float(np.mean(d["scores"])) if d["scores"] else None,
               "student_agrees": d["agree"], **fit, "cotrain_samples": 0 if pool is None else len(pool["label"]),
               "collect_s": round(t1 - t0, 1),
               "train_s": round(time.time() - t1, 1)}
        rounds.append(row)
        log(f"round {r}: {row['player']} scored {row['mean_score']} over {len(d['scores'])} games; "
            f"{len(label)} samples; loss {fit['loss']:.3f}, accuracy {fit['accuracy']:.3f}"
            + (f", aux loss {fit['aux_loss']:.4f}" if "aux_loss" in fit else ""))
        if out:
            with open(os.path.join(out, "rounds.jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")
            save_student(agent, out)
            if cfg.keep_rounds:
                keep_round(out, r)
    return agent, rounds
