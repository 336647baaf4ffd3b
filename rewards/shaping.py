"""Potential-based reward shaping (PBRS) from pairwise "which is closer to done" judgements.

**What PBRS is.** A sparse task reward (1 on success, 0 otherwise) gives a critic almost nothing
to learn from until the first success. Shaping adds a dense term to every step's reward. PBRS
(Ng, Harada & Russell, 1999) takes that term as a difference of potentials of the states:

    r'(s, a, s') = r(s, a, s') + F(s, s'),   F(s, s') = gamma * Phi(s') * (1 - terminated) - Phi(s)

**Why it keeps the optimal policy.** Summed along any trajectory with discount gamma, the
shaping terms telescope: sum_t gamma^t F(s_t, s_t+1) = -Phi(s_0) + gamma^T Phi(s_T) (the last
term is 0 when the episode terminated: a terminal state's potential is 0). So the shaped return
of every action from ``s`` is the raw return minus ``Phi(s)``, the same number whichever action is
taken: ``Q'(s, a) = Q(s, a) - Phi(s)``, and argmax_a is unchanged. A naive bonus ``r + Phi(s')``
has no such cancellation: an agent can harvest it by circling a high-potential state forever,
and the optimal policy changes (tests/rewards/test_shaping.py shows both on a small MDP). The
``gamma`` here must be the critic's discount, and the potential of a state the episode
*terminated* in is 0 (a truncated episode bootstraps, so there ``gamma * Phi(s')`` stays).

**Where the potential comes from.** ``Phi`` is a small MLP (:class:`PotentialNet`) on state
features (the VLA's embedding of the observation, or the robot state), fitted with a
Bradley-Terry model to pairwise judgements "is state b closer to done than state a":
P(b closer) = sigmoid(Phi(b) - Phi(a)) (:func:`fit_potential`). Pairs are drawn from recorded
states by :func:`preference_pairs` and labelled by a :class:`Comparator`:

* a VLM judge (``rewards/judges.py``: ``compare(frame_a, frame_b, instruction)``) adapted with
  :class:`JudgeComparator`; it sees only camera frames, so it works on a real robot;
* :class:`SubgoalProgressComparator`, which counts the sub-goals of a sim task
  (``hardware.sim_tasks``) that hold in each state. That label is PRIVILEGED: it reads object
  poses only a simulator knows. Use it in simulation, to test the pipeline or to compare a
  judge against; never as if it were available on the real robot.

**Using it.** :class:`ShapedRewardWrapper` wraps any gymnasium env: each step's reward becomes
raw + shaping, ``info["raw_reward"]`` keeps the env's own reward and ``info["shaping"]`` the
added term, so any method's critic trains on the shaped reward while success is still read from
the raw one. A fitted potential is saved as ``potential.safetensors`` + ``potential.json``
(in_dim, hidden, gamma, scale), each written atomically (:func:`save_potential`,
:func:`load_potential`, :func:`load_shaping`).

Bradley-Terry fixes Phi only up to a constant; :func:`fit_potential` centres it so the mean
potential of its training states is 0 (the policy does not depend on the constant, a critic's
initial targets do). Its scale relative to the task reward is set by the judgements' confidence;
``PotentialShaping(scale=...)`` rescales it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Literal, Mapping, NamedTuple, Protocol, Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hardware.sim_tasks import OBJECT_NAMES, get_task, objects_from_state

Verdict = Literal["first", "second", "same"]
"""Which of two states is closer to done: the first argument, the second, or neither / unsure."""
VERDICTS: tuple[str, ...] = ("first", "second", "same")
PREF_OF_VERDICT = {"first": 0.0, "second": 1.0, "same": 0.5}  # P(b closer than a), b the second

KIND = "potential"
CONFIG_FILE, WEIGHTS_FILE = "potential.json", "potential.safetensors"


# -- pair sources ------------------------------------------------------------------------------
class Comparator(Protocol):
    """Says which of two states is closer to completing the task."""

    def compare(self, a: Any, b: Any) -> Verdict: ...


def _check_verdict(v: Any, source: str) -> Verdict:
    if v not in VERDICTS:
        raise ValueError(f"{source} answered {v!r}; a comparator must answer one of {list(VERDICTS)}")
    return v


class JudgeComparator:
    """A VLM judge (``judge.compare(frame_a, frame_b, instruction) -> "first"|"second"|"same"``) as a
    :class:`Comparator` of states: ``frame_fn(state)`` picks the frame the judge sees (default: the
    state is the frame)."""

    def __init__(self, judge: Any, instruction: str, frame_fn: Callable[[Any], Any] | None = None) -> None:
        if not callable(getattr(judge, "compare", None)):
            raise TypeError(f"judge {type(judge).__name__} has no compare(frame_a, frame_b, instruction) method")
        self.judge, self.instruction = judge, instruction
        self.frame_fn = frame_fn or (lambda s: s)

    def compare(self, a: Any, b: Any) -> Verdict:
        v = self.judge.compare(self.frame_fn(a), self.frame_fn(b), self.instruction)
        return _check_verdict(v, f"judge {type(self.judge).__name__}")


class SubgoalProgressComparator:
    """PRIVILEGED, simulation only: orders two simulator states of sim task ``task_name`` by how
    many of the task's sub-goals hold in each (``hardware.sim_tasks``: ``Task.subgoals``); a state
    where the task succeeds counts as all of them. It reads the poses of every object, which no
    real robot knows: use it to test the shaping pipeline in sim, or as ground truth for a judge.

    A state is a mapping ``{"objects", "ee_pos", "gripper"}`` (a state message's arrays; objects a
    ``{name: pose7}`` dict or an ``[N, 7]`` array in ``object_names`` order) or a tuple
    ``(objects, ee_pos, gripper)``. The count is a heuristic of progress: sub-goals are milestones
    (reached, grasped, lifted, over the bowl ...), and some stop holding once passed (a released
    cube is no longer grasped), which is why success counts as all."""

    def __init__(self, task_name: str, object_names: Sequence[str] = OBJECT_NAMES) -> None:
        self.task = get_task(task_name)
        self.object_names = tuple(object_names)

    def _unpack(self, state: Any) -> tuple[Mapping[str, np.ndarray], np.ndarray, float]:
        if isinstance(state, Mapping):
            missing = [k for k in ("objects", "ee_pos", "gripper") if k not in state]
            if missing:
                raise ValueError(f"sim state lacks {missing}: expected keys objects, ee_pos, gripper")
            objects, ee, grip = state["objects"], state["ee_pos"], state["gripper"]
        else:
            objects, ee, grip = state
        if not isinstance(objects, Mapping):
            objects = objects_from_state(objects, self.object_names)
        return objects, np.asarray(ee, np.float64), float(np.asarray(grip).reshape(-1)[0])

    def progress(self, state: Any) -> int:
        """Number of the task's sub-goals that hold in ``state`` (all of them on success)."""
        objects, ee, grip = self._unpack(state)
        sg = self.task.subgoals(objects, ee, grip)
        return len(sg) if self.task.success(objects, ee, grip) else int(sum(bool(v) for v in sg.values()))

    def compare(self, a: Any, b: Any) -> Verdict:
        pa, pb = self.progress(a), self.progress(b)
        return "first" if pa > pb else "second" if pb > pa else "same"


class PreferencePairs(NamedTuple):
    """Pairs of state indices and their labels: ``prefs[k]`` = P(state ``idx_b[k]`` is closer to done
    than state ``idx_a[k]``), 1.0 / 0.0 / 0.5. Features of the pairs: ``feats[idx_a]``, ``feats[idx_b]``."""

    idx_a: np.ndarray
    idx_b: np.ndarray
    prefs: np.ndarray


def preference_pairs(states: Sequence[Any], comparator: Comparator, n_pairs: int,
                     rng: np.random.Generator) -> PreferencePairs:
    """Draw ``n_pairs`` pairs of distinct states uniformly (with replacement across pairs) and label
    each with ``comparator.compare(states[a], states[b])``."""
    n = len(states)
    if n < 2:
        raise ValueError(f"states: need at least 2 states to draw pairs from, got {n}")
    if n_pairs < 1:
        raise ValueError(f"n_pairs must be >= 1, got {n_pairs}")
    idx_a = rng.integers(0, n, size=n_pairs)
    idx_b = (idx_a + rng.integers(1, n, size=n_pairs)) % n  # never the same state twice
    name = f"comparator {type(comparator).__name__}"
    prefs = np.array([PREF_OF_VERDICT[_check_verdict(comparator.compare(states[i], states[j]), name)]
                      for i, j in zip(idx_a, idx_b)], np.float32)
    return PreferencePairs(idx_a, idx_b, prefs)


# -- the potential -----------------------------------------------------------------------------
class PotentialNet(nn.Module):
    """Phi(s): state features [B, in_dim] -> potentials [B]. Inputs are standardised with the
    training features' mean and std (buffers, saved with the weights)."""

    def __init__(self, in_dim: int, hidden: int = 128) -> None:
        super().__init__()
        if in_dim < 1 or hidden < 1:
            raise ValueError(f"in_dim and hidden must be >= 1, got in_dim={in_dim}, hidden={hidden}")
        self.in_dim, self.hidden = int(in_dim), int(hidden)
        self.register_buffer("feat_mean", torch.zeros(in_dim))
        self.register_buffer("feat_std", torch.ones(in_dim))
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.ndim == 2 and x.shape[1] == self.in_dim, \
            f"PotentialNet expects features [B, {self.in_dim}], got {list(x.shape)}"
        return self.mlp((x - self.feat_mean) / self.feat_std).squeeze(-1)

    @torch.no_grad()
    def potential(self, features: Any) -> float | np.ndarray:
        """Numpy in, numpy out: one feature vector [in_dim] -> a float, a batch [B, in_dim] -> [B]."""
        x = torch.as_tensor(np.asarray(features, np.float32))
        if x.ndim not in (1, 2) or x.shape[-1] != self.in_dim:
            raise ValueError(f"features must be [{self.in_dim}] or [B, {self.in_dim}], got {list(x.shape)}")
        out = self(x.reshape(-1, self.in_dim)).numpy()
        return float(out[0]) if x.ndim == 1 else out


def _as_features(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x, np.float32)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be [N, D] (one feature row per pair), got shape {list(arr.shape)}")
    bad = int((~np.isfinite(arr)).sum())
    if bad:
        raise ValueError(f"{name} has {bad} non-finite values")
    return arr


def _pair_stats(net: PotentialNet, a: torch.Tensor, b: torch.Tensor, p: torch.Tensor) -> tuple[float, float]:
    """(BCE loss, accuracy on the decisive pairs: prefs != 0.5; NaN when there are none)."""
    with torch.no_grad():
        d = net(b) - net(a)
        loss = float(F.binary_cross_entropy_with_logits(d, p))
        decisive = p != 0.5
        acc = float(((d[decisive] > 0) == (p[decisive] > 0.5)).float().mean()) if decisive.any() else math.nan
    return loss, acc


def fit_potential(feats_a: Any, feats_b: Any, prefs: Any, *, hidden: int = 128, epochs: int = 200,
                  lr: float = 1e-3, weight_decay: float = 1e-4, batch_size: int = 256, val_frac: float = 0.2,
                  seed: int = 0) -> tuple[PotentialNet, dict[str, Any]]:
    """Fit Phi by Bradley-Terry: P(b closer to done than a) = sigmoid(Phi(b) - Phi(a)), binary
    cross-entropy against ``prefs`` (1.0 b closer, 0.0 a closer, 0.5 same / unsure; soft labels in
    [0, 1] are fine). A random ``val_frac`` of the pairs is held out. Returns the net (eval mode,
    centred: mean potential 0 over the training states) and a report: ``train_loss``,
    ``val_loss``, ``train_acc``, ``val_acc`` (accuracy of sign(Phi(b) - Phi(a)) on the pairs not
    labelled 0.5), pair counts and seconds. Seeded; the global torch RNG is left untouched."""
    t0 = time.perf_counter()
    a, b = _as_features(feats_a, "feats_a"), _as_features(feats_b, "feats_b")
    if b.shape != a.shape:
        raise ValueError(f"feats_b must have the shape of feats_a {list(a.shape)}, got {list(b.shape)}")
    p = np.asarray(prefs, np.float32)
    n = a.shape[0]
    if p.shape != (n,):
        raise ValueError(f"prefs must be [{n}] (one label per pair of feats_a / feats_b), got shape {list(p.shape)}")
    if not np.isfinite(p).all() or p.min() < 0.0 or p.max() > 1.0:
        raise ValueError("prefs must be finite and in [0, 1] (1 = b closer to done, 0 = a closer, 0.5 = same)")
    if not 0.0 <= val_frac < 1.0:
        raise ValueError(f"val_frac must be in [0, 1), got {val_frac}")
    n_val = int(round(val_frac * n)) if val_frac > 0 else 0
    if n - n_val < 1 or (val_frac > 0 and n_val < 1):
        raise ValueError(f"prefs: {n} pairs are too few to hold out val_frac={val_frac} of them and train on the rest")
    if epochs < 1 or batch_size < 1 or lr <= 0 or weight_decay < 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1, lr > 0, weight_decay >= 0; got epochs={epochs}, "
                         f"batch_size={batch_size}, lr={lr}, weight_decay={weight_decay}")

    order = np.random.default_rng(seed).permutation(n)
    tr, va = order[n_val:], order[:n_val]
    A, B, P = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(p)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = PotentialNet(a.shape[1], hidden)
        train_states = torch.cat([A[tr], B[tr]])
        net.feat_mean.copy_(train_states.mean(0))
        std = train_states.std(0) if len(train_states) > 1 else torch.ones(a.shape[1])
        net.feat_std.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))  # a constant feature stays as is
        opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
        tr_t = torch.from_numpy(tr)
        net.train()
        for _ in range(epochs):
            for idx in tr_t[torch.randperm(len(tr_t))].split(batch_size):
                logit = net(B[idx]) - net(A[idx])  # log-odds that b is closer to done than a
                loss = F.binary_cross_entropy_with_logits(logit, P[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        net.eval()
        with torch.no_grad():  # Bradley-Terry is blind to a constant: centre Phi on the training states
            net.mlp[-1].bias -= net(train_states).mean()

    train_loss, train_acc = _pair_stats(net, A[tr], B[tr], P[tr])
    val_loss, val_acc = _pair_stats(net, A[va], B[va], P[va]) if n_val else (math.nan, math.nan)
    report = {"n_pairs": n, "n_train": len(tr), "n_val": n_val, "n_same": int((p == 0.5).sum()),
              "train_loss": train_loss, "val_loss": val_loss, "train_acc": train_acc, "val_acc": val_acc,
              "epochs": epochs, "seconds": time.perf_counter() - t0}
    return net, report


# -- shaping -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PotentialShaping:
    """F(s, s') = gamma * Phi(s') * (1 - terminated) - Phi(s), with Phi(s) = scale * phi(s)."""

    phi: Callable[[Any], float]
    """State features -> potential (e.g. ``PotentialNet.potential``)."""
    gamma: float
    """The discount of the critic that trains on the shaped reward (a different one breaks the
    guarantee that the optimal policy is unchanged)."""
    scale: float = 1.0
    """Multiplies every potential: sets the shaping's size relative to the task reward."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1] (the critic's discount), got {self.gamma}")
        if not math.isfinite(self.scale):
            raise ValueError(f"scale must be finite, got {self.scale}")

    def potential(self, s: Any) -> float:
        v = self.scale * float(self.phi(s))
        if not math.isfinite(v):
            raise ValueError(f"the potential of a state is {v}; phi must return finite values")
        return v

    def difference(self, phi_s: float, phi_next: float, terminated: bool) -> float:
        """The shaping term from two potentials already computed (a terminal state's potential is 0)."""
        return self.gamma * phi_next * (1.0 - float(terminated)) - phi_s

    def term(self, s: Any, s_next: Any, terminated: bool) -> float:
        """F(s, s') for one transition."""
        return self.difference(self.potential(s), self.potential(s_next), terminated)

    def shape(self, r: float, s: Any, s_next: Any, terminated: bool) -> float:
        """The shaped reward r + F(s, s')."""
        return float(r) + self.term(s, s_next, terminated)


class ShapedRewardWrapper(gym.Wrapper):
    """Adds ``shaping``'s term to each step's reward, with ``feature_fn(obs)`` the features Phi reads.
    ``info["raw_reward"]`` is the env's own reward (read success from it), ``info["shaping"]`` the
    added term, ``info["potential"]`` Phi of the new observation (before termination zeroes it).
    The potential of the current observation is kept from the last reset / step, so Phi runs once
    a step."""

    def __init__(self, env: gym.Env, shaping: PotentialShaping, feature_fn: Callable[[Any], Any]) -> None:
        super().__init__(env)
        self.shaping, self.feature_fn = shaping, feature_fn
        self._phi: float | None = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._phi = self.shaping.potential(self.feature_fn(obs))
        info = dict(info, potential=self._phi)
        return obs, info

    def step(self, action):
        if self._phi is None:
            raise RuntimeError("ShapedRewardWrapper.step before reset: the potential of the first state is unknown")
        obs, reward, terminated, truncated, info = self.env.step(action)
        phi_next = self.shaping.potential(self.feature_fn(obs))
        f = self.shaping.difference(self._phi, phi_next, terminated)
        self._phi = phi_next
        info = dict(info, raw_reward=float(reward), shaping=f, potential=phi_next)
        info.setdefault("success", float(reward) > 0)  # the session's rule (success = a positive reward), kept raw
        return obs, float(reward) + f, terminated, truncated, info


# -- save / load -------------------------------------------------------------------------------
def save_potential(path: str, net: PotentialNet, gamma: float, scale: float = 1.0,
                   extra: dict[str, Any] | None = None) -> None:
    """``potential.safetensors`` + ``potential.json`` (kind, in_dim, hidden, gamma, scale, the weights'
    sha256, ``extra`` such as the fit report) in directory ``path``, each written to a tmp file and
    moved into place. The json is written last and names the weights' hash, so a half-replaced
    pair fails to load instead of loading mismatched."""
    from safetensors.torch import save_file

    from rewards.success_classifier import _atomic_write_text, _fsync, _sha256

    PotentialShaping(lambda s: 0.0, gamma, scale)  # the same checks as at use
    os.makedirs(path, exist_ok=True)
    tmp = os.path.join(path, WEIGHTS_FILE + ".tmp")
    save_file({k: v.detach().contiguous().clone() for k, v in net.state_dict().items()}, tmp)
    _fsync(tmp)
    digest = _sha256(tmp)
    os.replace(tmp, os.path.join(path, WEIGHTS_FILE))
    meta = {"kind": KIND, "in_dim": net.in_dim, "hidden": net.hidden, "gamma": float(gamma), "scale": float(scale),
            "weights_sha256": digest, **(extra or {})}
    _atomic_write_text(os.path.join(path, CONFIG_FILE), json.dumps(meta, indent=2))


def load_potential(path: str) -> tuple[PotentialNet, dict[str, Any]]:
    """The net (eval mode) and the json of a potential saved by :func:`save_potential`."""
    from safetensors.torch import load_file

    cfg_path, weights = os.path.join(path, CONFIG_FILE), os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"no {CONFIG_FILE} in {path}: not a saved potential")
    with open(cfg_path) as f:
        meta = json.load(f)
    if meta.get("kind") != KIND:
        raise ValueError(f"{cfg_path} is a {meta.get('kind')!r} checkpoint, not a {KIND!r}")
    if not os.path.isfile(weights):
        raise FileNotFoundError(f"{path}: no {WEIGHTS_FILE}")
    from rewards.success_classifier import _sha256

    if _sha256(weights) != meta["weights_sha256"]:
        raise ValueError(f"{weights} does not match the sha256 in {CONFIG_FILE} (an interrupted save, or files "
                         "from different fits): fit again, or restore both files together")
    net = PotentialNet(meta["in_dim"], meta["hidden"])
    net.load_state_dict(load_file(weights))  # strict: a mismatch names the keys
    return net.eval(), meta


def load_shaping(path: str) -> PotentialShaping:
    """A :class:`PotentialShaping` over a saved potential, with the gamma and scale it was saved with."""
    net, meta = load_potential(path)
    return PotentialShaping(net.potential, meta["gamma"], meta.get("scale", 1.0))
