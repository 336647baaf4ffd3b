"""SARL's prompt policy, top to bottom: the critic Q(s, e), the replay of semantic transitions, the n-step
returns, action selection over the prompt library, the update, persistence, and the grounding tracker.

    s  = state features (e.g. the frozen VLA's embedding of the observation when the prompt is chosen)
    e_p = the frozen text embedding of library prompt p                     (PromptLibrary.embeddings)
    Q_i(s, e_p) = MLP_i([s, e_p]),  i = 1, 2                                twin critics, LayerNorm MLPs
    act:  p = argmax_p mean_i Q_i(s, e_p)  (greedy)  |  p ~ softmax(mean_i Q_i(s, e) / T)  |  epsilon-greedy
    target (n-step over semantic steps, double Q-learning with the twins' minimum):
          p' = argmax_p mean_i Q_i(s_{t+n}, e_p)                            the online critics choose
          y  = sum_{k<n} gamma^k r_{t+k} + gamma^n (1 - done) min_i Qbar_i(s_{t+n}, e_{p'})   the targets score
    loss: sum_i (Q_i(s_t, e_{p_t}) - y)^2;  Qbar_i <- (1 - tau) Qbar_i + tau Q_i after every gradient step

Every prompt is scored in one batch ([B, N] from [B, S] states and the [N, D] library), so the library
can grow (templates, VLM proposals snapped to it) without another head: a new prompt is a new row of
``prompt_embeddings``, and prompts near in embedding space start near in Q.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import io
import json
import os
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from policies.sarl.config import SARLConfig
from policies.sarl.semantic import SemanticStepResult


# ------------------------------------------------------------------------------------------------
# the critic
# ------------------------------------------------------------------------------------------------
class PromptQ(nn.Module):
    """Q(s, e) = MLP([s, e]) -> a scalar; LayerNorm + ReLU after each hidden layer (RLPD's critic)."""

    def __init__(self, state_dim: int, prompt_dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        d = state_dim + prompt_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.LayerNorm(h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, state: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        """[B, S], [B, D] -> [B]: the value of giving prompt row b in state row b."""
        return self.net(torch.cat([state, prompt], dim=-1)).squeeze(-1)

    def all_prompts(self, state: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        """[B, S], [N, D] -> [B, N]: every prompt of the library in every state, in one batch."""
        b, n = state.shape[0], prompts.shape[0]
        pairs = torch.cat([state[:, None, :].expand(b, n, -1), prompts[None].expand(b, n, -1)], dim=-1)
        return self.net(pairs).squeeze(-1)


# ------------------------------------------------------------------------------------------------
# replay of semantic transitions (n-step, already summed)
# ------------------------------------------------------------------------------------------------
class SemanticReplay:
    """A ring of n-step semantic transitions ``(state, prompt index, n-step reward, next state, done,
    discount)``: ``discount`` is gamma^k for the k semantic steps the reward sums, ``done`` whether
    ``next_state`` is terminal. The oldest is overwritten when full; sampling is uniform."""

    FIELDS = ("state", "prompt", "reward", "next_state", "done", "discount")

    def __init__(self, capacity: int, state_dim: int) -> None:
        self.capacity, self.state_dim = int(capacity), int(state_dim)
        self.state = np.zeros((self.capacity, self.state_dim), np.float32)
        self.prompt = np.zeros((self.capacity,), np.int64)
        self.reward = np.zeros((self.capacity,), np.float32)
        self.next_state = np.zeros((self.capacity, self.state_dim), np.float32)
        self.done = np.zeros((self.capacity,), np.float32)
        self.discount = np.zeros((self.capacity,), np.float32)
        self.ptr, self.size = 0, 0

    def __len__(self) -> int:
        return self.size

    def add(self, state: np.ndarray, prompt: int, reward: float, next_state: np.ndarray, done: bool,
            discount: float) -> None:
        i = self.ptr
        self.state[i], self.prompt[i], self.reward[i] = state, prompt, reward
        self.next_state[i], self.done[i], self.discount[i] = next_state, float(done), discount
        self.ptr, self.size = (i + 1) % self.capacity, min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        if self.size == 0:
            raise ValueError("cannot sample from an empty SemanticReplay")
        idx = rng.integers(0, self.size, size=batch_size)
        return {k: torch.from_numpy(getattr(self, k)[idx]) for k in self.FIELDS}

    def state_dict(self) -> dict[str, Any]:
        """The filled part as tensors, with the pointer and the capacity."""
        d: dict[str, Any] = {k: torch.from_numpy(getattr(self, k)[: self.size].copy()) for k in self.FIELDS}
        d.update(ptr=self.ptr, size=self.size, capacity=self.capacity)
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if int(d["capacity"]) != self.capacity or tuple(d["state"].shape[1:]) != (self.state_dim,):
            raise ValueError(f"replay: the checkpoint holds capacity {d['capacity']} x state dim "
                             f"{list(d['state'].shape[1:])}, this policy {self.capacity} x {self.state_dim}")
        n = int(d["size"])
        for k in self.FIELDS:
            getattr(self, k)[:n] = d[k].numpy()
        self.ptr, self.size = int(d["ptr"]), n


class NStepReturns:
    """Turns the semantic steps of an episode into n-step transitions: a transition leaves once n later
    steps are known, and every pending one leaves at the episode's end (terminated: done, no bootstrap;
    truncated: it bootstraps from the last state, with gamma^k for its k remaining steps)."""

    def __init__(self, n: int, gamma: float) -> None:
        self.n, self.gamma = int(n), float(gamma)
        self.pending: collections.deque[tuple[np.ndarray, int, float]] = collections.deque()

    def push(self, state: np.ndarray, prompt: int, reward: float, next_state: np.ndarray, terminated: bool,
             truncated: bool) -> list[tuple[np.ndarray, int, float, np.ndarray, bool, float]]:
        """One semantic step -> the transitions ready for the replay."""
        self.pending.append((state, prompt, float(reward)))
        out = []
        while self.pending and (len(self.pending) >= self.n or terminated or truncated):
            ret = sum(self.gamma ** k * r for k, (_, _, r) in enumerate(self.pending))
            s, p, _ = self.pending.popleft()
            out.append((s, p, ret, next_state, terminated, self.gamma ** (len(self.pending) + 1)))
        return out


# ------------------------------------------------------------------------------------------------
# the prompt policy
# ------------------------------------------------------------------------------------------------
class PromptPolicy:
    """SARL's off-policy prompt policy over a fixed prompt library.

    Args:
        cfg: the settings (``SARLConfig``).
        state_dim: length of the state features s.
        prompt_embeddings: ``[N, D]``, one row per library prompt (``PromptLibrary.embeddings``).
    """

    def __init__(self, cfg: SARLConfig, state_dim: int, prompt_embeddings: np.ndarray | torch.Tensor) -> None:
        self.cfg, self.state_dim = cfg, int(state_dim)
        self.prompts = torch.as_tensor(np.asarray(prompt_embeddings, np.float32))
        if self.prompts.ndim != 2 or self.prompts.shape[0] < 1:
            raise ValueError(f"prompt_embeddings must be [N, D] with N >= 1, got {list(self.prompts.shape)}")
        if self.state_dim < 1:
            raise ValueError(f"state_dim must be >= 1, got {state_dim}")
        self.num_prompts, self.prompt_dim = (int(x) for x in self.prompts.shape)
        with torch.random.fork_rng(devices=[]):  # seeded initialisation, the global RNG left alone
            torch.manual_seed(cfg.seed)
            self.q = nn.ModuleList([PromptQ(self.state_dim, self.prompt_dim, cfg.hidden) for _ in range(2)])
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        self.opt = torch.optim.Adam(self.q.parameters(), lr=cfg.lr)
        self.replay = SemanticReplay(cfg.replay_capacity, self.state_dim)
        self.nstep = NStepReturns(cfg.n_step, cfg.gamma)
        self.rng = np.random.default_rng(cfg.seed)
        self.steps = 0
        """Semantic steps observed (drives warm-up and the exploration schedule)."""
        self.updates = 0
        """Gradient steps taken."""

    # -- acting ------------------------------------------------------------------------------------
    def _state(self, state: np.ndarray) -> torch.Tensor:
        s = torch.as_tensor(np.asarray(state, np.float32))
        if s.shape != (self.state_dim,):
            raise ValueError(f"state features: expected shape ({self.state_dim},), got {tuple(s.shape)}")
        return s

    @torch.no_grad()
    def q_values(self, state: np.ndarray) -> np.ndarray:
        """mean_i Q_i(s, e_p) for every library prompt p: float32 [N]."""
        s = self._state(state)[None]
        return torch.stack([q.all_prompts(s, self.prompts) for q in self.q]).mean(0)[0].numpy()

    def exploration(self) -> float:
        """The temperature (``boltzmann``) or epsilon now: linear from start to end over
        ``explore_decay_steps`` semantic steps after warm-up."""
        c = self.cfg
        start, end = (c.temperature_start, c.temperature_end) if c.exploration == "boltzmann" else \
            (c.epsilon_start, c.epsilon_end)
        frac = min(1.0, max(0, self.steps - c.warmup_steps) / c.explore_decay_steps)
        return start + frac * (end - start)

    def act(self, state: np.ndarray, greedy: bool = False) -> int:
        """The library index of the prompt to give in ``state``: greedy (evaluation), uniform during
        warm-up, else Boltzmann / epsilon-greedy (``cfg.exploration``)."""
        if greedy:
            return int(np.argmax(self.q_values(state)))
        if self.steps < self.cfg.warmup_steps:
            return int(self.rng.integers(self.num_prompts))
        q = self.q_values(state).astype(np.float64)
        x = self.exploration()
        if self.cfg.exploration == "boltzmann":
            logits = (q - q.max()) / x  # softmax(Q / T), shifted for stability
            p = np.exp(logits) / np.exp(logits).sum()
            return int(self.rng.choice(self.num_prompts, p=p))
        if self.rng.random() < x:
            return int(self.rng.integers(self.num_prompts))
        return int(np.argmax(q))

    # -- learning ----------------------------------------------------------------------------------
    def observe(self, state: np.ndarray, prompt: int, reward: float, next_state: np.ndarray, terminated: bool,
                truncated: bool) -> None:
        """Record one semantic step (``prompt`` the library index given in ``state``)."""
        if not 0 <= int(prompt) < self.num_prompts:
            raise ValueError(f"prompt index {prompt} is outside the library (0..{self.num_prompts - 1})")
        s, s2 = self._state(state).numpy(), self._state(next_state).numpy()
        for tr in self.nstep.push(s, int(prompt), float(reward), s2, bool(terminated), bool(truncated)):
            self.replay.add(*tr)
        self.steps += 1

    @property
    def ready(self) -> bool:
        """Warm-up is over and the replay holds a transition: ``update`` may run."""
        return self.steps >= self.cfg.warmup_steps and len(self.replay) > 0

    def update(self) -> dict[str, float]:
        """``updates_per_step`` gradient steps on the twin critics -> flat diagnostics."""
        if not self.ready:
            raise RuntimeError(f"PromptPolicy.update before warm-up ended ({self.steps} of "
                               f"{self.cfg.warmup_steps} semantic steps, {len(self.replay)} transitions)")
        c = self.cfg
        for _ in range(c.updates_per_step):
            b = self.replay.sample(c.batch_size, self.rng)
            with torch.no_grad():
                # double Q-learning: the online twins choose the next prompt, the target twins' minimum scores it
                q_next = torch.stack([q.all_prompts(b["next_state"], self.prompts) for q in self.q]).mean(0)
                e_next = self.prompts[q_next.argmax(dim=1)]
                target_next = torch.min(*(qt(b["next_state"], e_next) for qt in self.q_target))
                # n-step TD target: the summed n-step reward + gamma^k of the bootstrap, none past a terminal
                y = b["reward"] + b["discount"] * (1.0 - b["done"]) * target_next
            e = self.prompts[b["prompt"]]
            qs = [q(b["state"], e) for q in self.q]
            assert qs[0].shape == y.shape == (c.batch_size,), f"Q {tuple(qs[0].shape)} vs target {tuple(y.shape)}"
            loss = sum(F.mse_loss(qi, y) for qi in qs)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            if c.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(self.q.parameters(), c.max_grad_norm)
            self.opt.step()
            with torch.no_grad():  # polyak averaging of the target critics
                for p, pt in zip(self.q.parameters(), self.q_target.parameters()):
                    pt.lerp_(p, c.tau)
            self.updates += 1
        return {"losses/q_loss": loss.item() / 2, "losses/q_mean": qs[0].mean().item(),
                "losses/td_target_mean": y.mean().item(), "charts/exploration": self.exploration(),
                "charts/replay_size": float(len(self.replay))}

    # -- persistence -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs: critics, targets, optimiser, replay, the pending n-step
        window, the sampling generator, counters, and the library embeddings (checked on load)."""
        pending = list(self.nstep.pending)
        return {"q": self.q.state_dict(), "q_target": self.q_target.state_dict(), "opt": self.opt.state_dict(),
                "replay": self.replay.state_dict(),
                "nstep": {"states": torch.tensor(np.array([s for s, _, _ in pending], np.float32)),
                          "prompts": [p for _, p, _ in pending], "rewards": [r for _, _, r in pending]},
                "rng": json.dumps(self.rng.bit_generator.state), "steps": self.steps, "updates": self.updates,
                "prompt_embeddings": self.prompts.clone()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        emb = d["prompt_embeddings"]
        if tuple(emb.shape) != tuple(self.prompts.shape) or not torch.allclose(emb, self.prompts, atol=1e-6):
            raise ValueError(f"the checkpoint's prompt library ({list(emb.shape)}) is not this policy's "
                             f"({list(self.prompts.shape)}): same prompts, same order, same encoder needed")
        self.q.load_state_dict(d["q"])
        self.q_target.load_state_dict(d["q_target"])
        self.opt.load_state_dict(d["opt"])
        self.replay.load_state_dict(d["replay"])
        n = d["nstep"]
        self.nstep.pending = collections.deque(
            (s.numpy(), int(p), float(r)) for s, p, r in zip(n["states"], n["prompts"], n["rewards"]))
        self.rng.bit_generator.state = json.loads(d["rng"])
        self.steps, self.updates = int(d["steps"]), int(d["updates"])

    def save(self, path: str | os.PathLike) -> None:
        """Write ``state_dict()`` to ``path`` atomically (temp file, fsync, ``os.replace``): a kill leaves
        the old file or the new one, never a torn one."""
        from vla.data.atomic import atomic_write_bytes

        buf = io.BytesIO()
        torch.save(self.state_dict(), buf)
        atomic_write_bytes(os.fspath(path), buf.getvalue())

    def load(self, path: str | os.PathLike) -> None:
        """Restore what ``save`` wrote (tensors and plain types only: ``weights_only`` loading)."""
        self.load_state_dict(torch.load(os.fspath(path), weights_only=True))


# ------------------------------------------------------------------------------------------------
# grounding: what each prompt did
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class PromptRecord:
    """What one library prompt did over the session."""

    chosen: int = 0
    """Semantic steps that gave this prompt."""
    ticks: int = 0
    """Control ticks spent under it (all steps together)."""
    chunks: int = 0
    """Chunks executed under it (all steps together)."""
    subgoals: dict[str, int] = dataclasses.field(default_factory=dict)
    """Sub-goal name -> steps under this prompt in which it became true."""
    succeeded_under: int = 0
    """Steps in which the task succeeded while this prompt was held."""
    success_after: int = 0
    """Choices of this prompt in episodes that ended in success (success_after / chosen estimates
    P(episode success | prompt chosen))."""


class Grounding:
    """Per library prompt: times chosen, ticks, sub-goals reached, successes (``record`` every semantic
    step, ``end_episode`` at every episode end). ``to_json`` / ``from_json`` for logs and resume."""

    def __init__(self, prompts: Sequence[str]) -> None:
        self.records = {p: PromptRecord() for p in prompts}
        self._episode: list[str] = []  # the prompts chosen so far in this episode, repeats included

    def record(self, result: SemanticStepResult) -> None:
        if result.prompt not in self.records:
            raise KeyError(f"Grounding.record: {result.prompt!r} is not a library prompt")
        r = self.records[result.prompt]
        r.chosen += 1
        r.ticks += result.ticks
        r.chunks += result.chunks
        for name in result.subgoals_reached:
            r.subgoals[name] = r.subgoals.get(name, 0) + 1
        r.succeeded_under += int(result.success)
        self._episode.append(result.prompt)

    def end_episode(self, success: bool) -> None:
        """The episode is over: credit its prompt choices with its outcome."""
        if success:
            for p in self._episode:
                self.records[p].success_after += 1
        self._episode = []

    def to_json(self) -> str:
        """``{prompt: {chosen, mean_ticks, mean_chunks, subgoals, succeeded_under, success_after}}``, most
        chosen first (``mean_*`` null for a prompt never chosen)."""
        out = {}
        for p, r in sorted(self.records.items(), key=lambda kv: -kv[1].chosen):
            out[p] = {**dataclasses.asdict(r), "mean_ticks": r.ticks / r.chosen if r.chosen else None,
                      "mean_chunks": r.chunks / r.chosen if r.chosen else None}
        return json.dumps(out, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Grounding":
        """The tracker ``to_json`` wrote (at an episode boundary: the open episode's choices are not in it)."""
        g = cls([])
        fields = {f.name for f in dataclasses.fields(PromptRecord)}
        g.records = {p: PromptRecord(**{k: v for k, v in d.items() if k in fields})
                     for p, d in json.loads(text).items()}
        return g
