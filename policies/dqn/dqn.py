"""Nature-DQN (Mnih et al. 2015), laid out like CleanRL's ``dqn_atari.py``: config (``config.py``),
network, replay, the update, then the training loop, top to bottom.

It trains on any gymnasium env with the picture layout of ``policies.dqn.preprocess`` and a
``Discrete`` action space: ``AleEnv`` (pure emulation, as fast as the CPU goes) or the rig's
``robot_io.rig_env.RigEnv`` (real time: the game does not wait for the update, so there a slow
update costs frames). ``evaluate`` plays either with a trained network.

Run directory (``train(cfg, make_env, out)``)::

    RUN/dqn_config.json               the config
    RUN/episodes.jsonl                one line per finished training episode (step, score, length, epsilon)
    RUN/checkpoint/{model.pt, replay.npz, state.json}    replaced atomically (written to
                                      checkpoint.partial, then renamed; the previous one is kept as
                                      checkpoint.old until the new one is in place)
    RUN/summary.json                  written (atomically) when the run ends

A checkpoint is taken at the first episode end after every ``checkpoint_every`` steps and at the
end, so ``resume=True`` after a kill continues from the last checkpointed episode boundary with
the network, target network, optimiser, replay contents, step count and RNG states it had then
(an episode cannot be resumed half-way: the game moved on). A killed process leaves either the
old or the new checkpoint complete, never a torn one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from policies.dqn.config import DQNConfig
from policies.dqn.preprocess import ActionHistory, FrameStack, obs_picture


# ------------------------------------------------------------------------------------------------
# network
# ------------------------------------------------------------------------------------------------
class QNetwork(nn.Module):
    """The Nature CNN: uint8 [B, 4, 84, 84] -> Q [B, n_actions]. With ``action_history`` k > 0 it also
    reads the agent's last k actions (int64 [B, k], -1: none yet), one-hot, beside the flattened
    convolution features, into the hidden layer."""

    def __init__(self, n_actions: int, in_frames: int = 4, size: int = 84, action_history: int = 0) -> None:
        super().__init__()
        self.n_actions, self.in_shape = int(n_actions), (int(in_frames), int(size), int(size))
        self.action_history = int(action_history)
        self.conv = nn.Sequential(
            nn.Conv2d(in_frames, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten())
        with torch.no_grad():
            n_flat = self.conv(torch.zeros(1, *self.in_shape)).shape[1]  # 3136 at 84 x 84
        self.head = nn.Sequential(nn.Linear(n_flat + self.action_history * self.n_actions, 512), nn.ReLU(),
                                  nn.Linear(512, n_actions))

    def features(self, x: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
        """The head's input: flattened convolution features (+ the one-hot action history)."""
        assert x.shape[1:] == self.in_shape, f"QNetwork wants [B, {self.in_shape}], got {list(x.shape)}"
        f = self.conv(x.float() / 255.0)  # pixels to [0, 1] here, so the replay stays uint8
        if self.action_history:
            if prev is None or tuple(prev.shape) != (x.shape[0], self.action_history):
                raise ValueError(f"this network reads the last {self.action_history} actions: pass prev "
                                 f"[B, {self.action_history}], got {None if prev is None else list(prev.shape)}")
            hot = F.one_hot(prev.long().clamp(min=0), self.n_actions).float() * (prev >= 0)[..., None].float()
            f = torch.cat([f, hot.flatten(1)], 1)
        return f

    def forward(self, x: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.features(x, prev))


def linear_schedule(start_e: float, end_e: float, duration: int, t: int) -> float:
    """Epsilon at step ``t``: linear from ``start_e`` to ``end_e`` over ``duration`` steps, then flat."""
    slope = (end_e - start_e) / max(duration, 1)
    return max(slope * t + start_e, end_e)


# ------------------------------------------------------------------------------------------------
# replay
# ------------------------------------------------------------------------------------------------
class FrameReplay:
    """Ring buffer of (stacked obs, action, reward, next obs, done) with uint8 frames.

    ``next_obs`` of a step is its ``obs`` shifted by one frame plus the new frame (``FrameStack``
    guarantees it), so only the new frame is stored: 5 frames a transition instead of 8.
    ``done`` is a terminal (or a lost life in training): no bootstrap; a time-limit truncation
    bootstraps. ``save`` / ``load`` restore contents and pointer exactly."""

    def __init__(self, capacity: int, stack: int = 4, size: int = 84) -> None:
        self.capacity, self.stack, self.size = int(capacity), int(stack), int(size)
        self.obs = np.zeros((self.capacity, self.stack, self.size, self.size), np.uint8)
        self.next_frame = np.zeros((self.capacity, self.size, self.size), np.uint8)
        self.action = np.zeros(self.capacity, np.int64)
        self.reward = np.zeros(self.capacity, np.float32)
        self.done = np.zeros(self.capacity, np.float32)
        self.pos, self.full = 0, False

    def __len__(self) -> int:
        return self.capacity if self.full else self.pos

    def add(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, done: bool) -> None:
        assert obs.shape == next_obs.shape == (self.stack, self.size, self.size), \
            f"replay wants [{self.stack}, {self.size}, {self.size}] stacks, got {obs.shape} / {next_obs.shape}"
        assert np.array_equal(obs[1:], next_obs[:-1]), "next_obs must be obs shifted by one frame (FrameStack.push)"
        i = self.pos
        self.obs[i], self.next_frame[i] = obs, next_obs[-1]
        self.action[i], self.reward[i], self.done[i] = int(action), float(reward), float(done)
        self.pos = (self.pos + 1) % self.capacity
        self.full = self.full or self.pos == 0

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        idx = rng.integers(0, len(self), batch_size)
        obs = self.obs[idx]
        next_obs = np.concatenate([obs[:, 1:], self.next_frame[idx][:, None]], 1)
        return {"obs": torch.from_numpy(obs), "next_obs": torch.from_numpy(next_obs),
                "action": torch.from_numpy(self.action[idx]), "reward": torch.from_numpy(self.reward[idx]),
                "done": torch.from_numpy(self.done[idx])}

    def save(self, path: str) -> None:
        n = len(self)  # only the filled part (a young buffer is small on disk)
        with open(path, "wb") as f:
            np.savez(f, obs=self.obs[:n], next_frame=self.next_frame[:n], action=self.action[:n],
                     reward=self.reward[:n], done=self.done[:n],
                     meta=np.array([self.capacity, self.stack, self.size, self.pos, int(self.full)], np.int64))
            f.flush()
            os.fsync(f.fileno())

    @classmethod
    def load(cls, path: str) -> "FrameReplay":
        with np.load(path) as z:
            capacity, stack, size, pos, full = (int(v) for v in z["meta"])
            rb = cls(capacity, stack, size)
            n = len(z["action"])
            for k in ("obs", "next_frame", "action", "reward", "done"):
                getattr(rb, k)[:n] = z[k]
        rb.pos, rb.full = pos, bool(full)
        return rb


# ------------------------------------------------------------------------------------------------
# the agent: acting and the update
# ------------------------------------------------------------------------------------------------
def make_optimizer(cfg: DQNConfig, params) -> torch.optim.Optimizer:
    if cfg.optimizer == "rmsprop":  # Nature's: squared-gradient momentum 0.95, min squared gradient 0.01
        return torch.optim.RMSprop(params, lr=cfg.learning_rate, alpha=0.95, eps=0.01, centered=True)
    return torch.optim.Adam(params, lr=cfg.learning_rate, eps=1.5e-4)


def td_target(target_network: nn.Module, reward: torch.Tensor, next_obs: torch.Tensor, done: torch.Tensor,
              gamma: float) -> torch.Tensor:
    """y = r + gamma * max_a' Q_target(s', a') * (1 - done): the bootstrap reads the *target* network."""
    with torch.no_grad():
        target_max = target_network(next_obs).max(dim=1).values
        return reward + gamma * target_max * (1.0 - done)


class DQN:
    """The online and target Q networks, the optimiser and the counters of one DQN agent."""

    def __init__(self, n_actions: int, cfg: DQNConfig, action_names: tuple[str, ...] = ()) -> None:
        self.cfg, self.n_actions = cfg, int(n_actions)
        self.action_names = tuple(action_names)
        self.q_network = QNetwork(n_actions, cfg.frame_stack, cfg.frame_size, cfg.action_history)
        self.target_network = QNetwork(n_actions, cfg.frame_stack, cfg.frame_size, cfg.action_history)
        self.target_network.load_state_dict(self.q_network.state_dict())
        self.optimizer = make_optimizer(cfg, self.q_network.parameters())
        self.updates = 0

    def act(self, obs_stack: np.ndarray, epsilon: float, rng: np.random.Generator,
            prev: np.ndarray | None = None) -> int:
        """Epsilon-greedy: a random action with probability ``epsilon``, else argmax_a Q(s, a). ``prev``:
        the agent's last actions (``ActionHistory``), for a network with ``cfg.action_history``."""
        if rng.random() < epsilon:
            return int(rng.integers(self.n_actions))
        p = None
        if self.cfg.action_history:
            if prev is None:
                raise ValueError(f"this agent reads its last {self.cfg.action_history} actions: pass prev "
                                 "(policies.dqn.preprocess.ActionHistory)")
            p = torch.as_tensor(np.asarray(prev, np.int64))[None]
        with torch.no_grad():
            q = self.q_network(torch.from_numpy(np.ascontiguousarray(obs_stack))[None], p)
        return int(q.argmax(dim=1).item())

    def with_action_history(self, k: int) -> "DQN":
        """A copy that also reads its last ``k`` actions and acts exactly as this one until trained: the
        hidden layer's weights for the new one-hot inputs start at zero (fine-tuning a pictures-only agent
        into a delay-aware one). The optimiser starts afresh."""
        import dataclasses

        if k < self.cfg.action_history:
            raise ValueError(f"cannot shorten the action history from {self.cfg.action_history} to {k}")
        out = DQN(self.n_actions, dataclasses.replace(self.cfg, action_history=int(k)), self.action_names)
        sd = self.q_network.state_dict()
        w = sd["head.0.weight"]
        pad = torch.zeros(w.shape[0], out.q_network.head[0].in_features - w.shape[1], dtype=w.dtype)
        n_flat = w.shape[1] - self.cfg.action_history * self.n_actions
        # the old history's columns stay the newest k_old actions' (the history is oldest first)
        sd["head.0.weight"] = torch.cat([w[:, :n_flat], pad, w[:, n_flat:]], 1)
        out.q_network.load_state_dict(sd)
        out.sync_target()
        out.updates = self.updates
        return out

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """One gradient step on the Huber TD loss; returns the flat log keys (and ``td_target``)."""
        B = batch["action"].shape[0]
        y = td_target(self.target_network, batch["reward"], batch["next_obs"], batch["done"], self.cfg.gamma)
        q_all = self.q_network(batch["obs"])
        assert q_all.shape == (B, self.n_actions), f"Q is {list(q_all.shape)}, want [{B}, {self.n_actions}]"
        q_sa = q_all.gather(1, batch["action"][:, None]).squeeze(1)  # Q(s, a) of the actions taken
        assert q_sa.shape == y.shape == (B,)
        loss = F.smooth_l1_loss(q_sa, y)  # Huber: Nature's error clipping to [-1, 1] in the gradient
        self.optimizer.zero_grad()
        loss.backward()
        if self.cfg.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(self.q_network.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        return {"losses/td_loss": float(loss.item()), "losses/q_values": float(q_sa.mean().item()), "td_target": y}

    def sync_target(self) -> None:
        """tau = 1: the target network becomes a copy of the online network."""
        self.target_network.load_state_dict(self.q_network.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {"q_network": self.q_network.state_dict(), "target_network": self.target_network.state_dict(),
                "optimizer": self.optimizer.state_dict(), "updates": self.updates, "n_actions": self.n_actions,
                "action_names": list(self.action_names), "config": self.cfg.to_dict()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.q_network.load_state_dict(d["q_network"])
        self.target_network.load_state_dict(d["target_network"])
        self.optimizer.load_state_dict(d["optimizer"])
        self.updates = int(d["updates"])

    @classmethod
    def from_checkpoint(cls, path: str) -> "DQN":
        """A trained agent from ``RUN`` (its checkpoint), ``RUN/checkpoint`` or a ``model.pt``."""
        for cand in (os.path.join(path, "checkpoint", "model.pt"), os.path.join(path, "checkpoint.old", "model.pt"),
                     os.path.join(path, "model.pt"), path):
            if os.path.isfile(cand):
                d = torch.load(cand, map_location="cpu", weights_only=False)
                agent = cls(d["n_actions"], DQNConfig.from_dict(d["config"]), tuple(d.get("action_names", ())))
                agent.load_state_dict(d)
                return agent
        raise FileNotFoundError(f"{path}: no DQN checkpoint (model.pt) there")


# ------------------------------------------------------------------------------------------------
# the run directory
# ------------------------------------------------------------------------------------------------
def _atomic_json(data: Any, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(out: str, agent: DQN, rb: FrameReplay, state: dict[str, Any], rng: np.random.Generator) -> None:
    ckpt = os.path.join(out, "checkpoint")
    tmp, old = ckpt + ".partial", ckpt + ".old"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    torch.save(agent.state_dict(), os.path.join(tmp, "model.pt"))
    rb.save(os.path.join(tmp, "replay.npz"))
    torch.save({"np": rng.bit_generator.state, "torch": torch.get_rng_state()}, os.path.join(tmp, "rng.pt"))
    _atomic_json({**state, "time": time.time()}, os.path.join(tmp, "state.json"))  # written last: marks it complete
    shutil.rmtree(old, ignore_errors=True)
    if os.path.isdir(ckpt):
        os.replace(ckpt, old)
    os.replace(tmp, ckpt)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(out: str, agent: DQN, rng: np.random.Generator) -> tuple[FrameReplay, dict[str, Any]]:
    ckpt = os.path.join(out, "checkpoint")
    d = ckpt if os.path.isfile(os.path.join(ckpt, "state.json")) else ckpt + ".old"
    if not os.path.isfile(os.path.join(d, "state.json")):
        raise FileNotFoundError(f"{out}: no checkpoint to resume from")
    agent.load_state_dict(torch.load(os.path.join(d, "model.pt"), weights_only=False))
    rb = FrameReplay.load(os.path.join(d, "replay.npz"))
    r = torch.load(os.path.join(d, "rng.pt"), weights_only=False)
    rng.bit_generator.state = r["np"]
    torch.set_rng_state(r["torch"])
    with open(os.path.join(d, "state.json")) as f:
        state = json.load(f)
    # episodes logged after the checkpoint will be played again: drop their lines
    p = os.path.join(out, "episodes.jsonl")
    if os.path.isfile(p):
        with open(p) as f:
            keep = [ln for ln in f if ln.strip() and json.loads(ln)["episode"] < state["episode"]]
        with open(p + ".tmp", "w") as f:
            f.writelines(keep)
        os.replace(p + ".tmp", p)
    return rb, state


# ------------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------------
def train(cfg: DQNConfig, make_env: Callable[[DQNConfig], Any], out: str, resume: bool = False,
          progress: bool = True, log: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Train a DQN on ``make_env(cfg)`` into run directory ``out``; returns the summary."""
    if cfg.action_history:
        raise ValueError(f"action_history={cfg.action_history}: the TD update here trains pictures-only networks; "
                         "a delay-aware network is trained by behaviour cloning (policies.dqn.bc)")
    torch.set_num_threads(cfg.threads)
    os.makedirs(out, exist_ok=True)
    if not resume and os.path.isdir(os.path.join(out, "checkpoint")):
        raise FileExistsError(f"{out} already holds a DQN run: pass resume, or choose another directory")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    env = make_env(cfg)
    n_actions = int(env.action_space.n)
    agent = DQN(n_actions, cfg, tuple(getattr(env, "action_names", ())))
    if resume:
        rb, state = load_checkpoint(out, agent, rng)
        step, episode = int(state["step"]), int(state["episode"])
        print(f"resumed {out} at step {step}, episode {episode} ({len(rb)} transitions)", flush=True)
    else:
        cfg.to_json(os.path.join(out, "dqn_config.json"))
        rb, step, episode = FrameReplay(cfg.buffer_size, cfg.frame_stack, cfg.frame_size), 0, 0
    stack = FrameStack(cfg.frame_size, cfg.frame_stack)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.total_steps, initial=step, desc=f"dqn {cfg.game}", unit="step", dynamic_ncols=True)
    t0, step0, next_ckpt = time.time(), step, (step // cfg.checkpoint_every + 1) * cfg.checkpoint_every
    info_log: dict[str, float] = {}
    scores: list[float] = []
    try:
        # each episode's emulator start comes from its index, so a resumed run replays the same starts
        obs, info = env.reset(seed=cfg.seed * 1_000_003 + episode)
        s = stack.reset(obs_picture(obs))
        lives, ep_len = info.get("lives", 0), 0
        while step < cfg.total_steps:
            # ALGO LOGIC: epsilon-greedy action
            epsilon = linear_schedule(cfg.start_e, cfg.end_e, int(cfg.exploration_fraction * cfg.total_steps), step)
            action = agent.act(s, epsilon, rng)
            obs, reward, terminated, truncated, info = env.step(action)
            s2 = stack.push(obs_picture(obs))
            step += 1
            ep_len += 1
            # a lost life is a terminal for the bootstrap (Nature), not for the game
            life_lost = cfg.terminal_on_life_loss and info.get("lives", lives) < lives
            lives = info.get("lives", lives)
            r = float(np.sign(reward)) if cfg.clip_rewards else float(reward)
            rb.add(s, action, r, s2, terminated or life_lost)
            s = s2
            # ALGO LOGIC: training
            if step > cfg.learning_starts and step % cfg.train_every == 0:
                u = agent.update(rb.sample(cfg.batch_size, rng))
                info_log = {k: v for k, v in u.items() if k.startswith("losses/")}
            if step % cfg.target_update_every == 0:
                agent.sync_target()
            if bar is not None:
                bar.update(1)
            if terminated or truncated:
                score = float(info.get("score", 0.0))
                scores.append(score)
                rec = {"episode": episode, "step": step, "score": score, "length": ep_len, "epsilon": round(epsilon, 4),
                       "sps": round((step - step0) / max(time.time() - t0, 1e-9), 1), **info_log}
                with open(os.path.join(out, "episodes.jsonl"), "a") as f:
                    f.write(json.dumps(rec) + "\n")
                if log is not None:
                    log(rec)
                if bar is not None:
                    bar.set_postfix(score=score, eps=f"{epsilon:.2f}")
                episode += 1
                if step >= next_ckpt:
                    save_checkpoint(out, agent, rb, {"step": step, "episode": episode}, rng)
                    next_ckpt = (step // cfg.checkpoint_every + 1) * cfg.checkpoint_every
                obs, info = env.reset(seed=cfg.seed * 1_000_003 + episode)
                s = stack.reset(obs_picture(obs))
                lives, ep_len = info.get("lives", 0), 0
        save_checkpoint(out, agent, rb, {"step": step, "episode": episode}, rng)
    finally:
        if bar is not None:
            bar.close()
        close = getattr(env, "close", None)
        if close is not None:
            close()
    summary = {"steps": step, "episodes": episode, "updates": agent.updates, "wall_s": round(time.time() - t0, 1),
               "sps": round((step - step0) / max(time.time() - t0, 1e-9), 1),
               "last_scores": scores[-10:], "config": cfg.to_dict()}
    _atomic_json(summary, os.path.join(out, "summary.json"))
    return summary


# ------------------------------------------------------------------------------------------------
# evaluation
# ------------------------------------------------------------------------------------------------
def evaluate(agent: DQN | None, env, episodes: int, epsilon: float = 0.05, seed: int = 0,
             max_steps: int | None = None, n_actions: int | None = None,
             frame_size: int | None = None, frame_stack: int | None = None) -> dict[str, Any]:
    """Play ``episodes`` whole games (no life-loss terminals) with epsilon-greedy ``agent`` (None: a
    uniformly random policy). ``max_steps`` cuts an episode (the rig plays in real time). Returns the
    scores and their mean."""
    rng = np.random.default_rng(seed)
    n = int(n_actions or env.action_space.n)
    c = agent.cfg if agent is not None else DQNConfig()
    stack = FrameStack(frame_size or c.frame_size, frame_stack or c.frame_stack)
    hist = ActionHistory(c.action_history)
    scores, lengths = [], []
    for ep in range(episodes):
        obs, info = env.reset(seed=seed * 1_000_003 + ep)
        s, prev = stack.reset(obs_picture(obs)), hist.reset()
        steps, score = 0, 0.0
        while True:
            a = int(rng.integers(n)) if agent is None else agent.act(s, epsilon, rng, prev)
            obs, reward, terminated, truncated, info = env.step(a)
            s, prev = stack.push(obs_picture(obs)), hist.push(a)
            score += float(reward)
            steps += 1
            if terminated or truncated or (max_steps is not None and steps >= max_steps):
                break
        scores.append(score)
        lengths.append(steps)
    return {"episodes": episodes, "scores": scores, "lengths": lengths, "mean": float(np.mean(scores)),
            "std": float(np.std(scores))}
