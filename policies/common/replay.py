"""A fixed-capacity replay buffer of numpy arrays, and RLPD's symmetric online/offline sampling.

One transition is ``(obs, action, reward, next_obs, done, **extras)``:

* ``obs`` / ``next_obs``: a dict laid out by the buffer's ``obs_spec`` ``{name: (shape, dtype)}``,
  e.g. ``{"state": ((8,), np.float32), "front": ((64, 64, 3), np.uint8)}``;
* ``action``: float32 ``[A]`` (for DSRL: the latent noise ``w`` fed to the VLA);
* ``reward``: a finite float; ``done``: True only at a *terminal* state (success, failure), not
  at a time-limit truncation, so the TD target still bootstraps through truncations;
* ``extras``: more per-transition fields, by default ``intervention`` (bool): the human took over
  for this step (HIL-SERL sends such transitions to both the online and the offline buffer). A session's
  buffers also hold ``chunk`` (the executed chunk), ``rows`` (int32: control ticks the step executed) and
  ``truncated`` (bool: a time limit ended the episode after this step, without a terminal state), which
  the value target reads (``policies.common.sac_config.ValueTargetConfig``).

Storage is preallocated ``[capacity, ...]`` arrays written as a ring: when full, the oldest
transition is overwritten. ``next_obs`` is stored next to ``obs`` (twice the image memory, but no
episode-boundary bookkeeping): 2 cameras at 64 x 64 cost ~49 KB per transition, 4.9 GB per 100K.

``save`` writes one ``.npz`` atomically (temp file, fsync, ``os.replace``) and ``load`` restores
contents, insertion pointer and size exactly, so a resumed run samples what the killed run would
have sampled, given the same ``numpy.random.Generator`` state.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np
import torch

ObsSpec = Mapping[str, tuple[tuple[int, ...], Any]]

DEFAULT_EXTRAS: dict[str, tuple[tuple[int, ...], Any]] = {"intervention": ((), np.bool_)}
STEP_EXTRAS: dict[str, tuple[tuple[int, ...], Any]] = {"rows": ((), np.int32), "truncated": ((), np.bool_)}
"""Per-transition facts a session's buffers store beside the executed chunk, which the value target reads: the
control ticks the macro-step executed (``rows``: a per-tick discount) and whether a time limit ended the episode
there (``truncated``: the env's truncation or the session's ``max_episode_ticks``, without a terminal state)."""
_FORMAT = 1


def _norm_spec(spec: ObsSpec, what: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    out = {}
    for name, entry in spec.items():
        try:
            shape, dtype = entry
            out[str(name)] = (tuple(int(s) for s in shape), np.dtype(dtype))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{what}[{name!r}] must be (shape, dtype), got {entry!r}") from e
        if "/" in str(name):
            raise ValueError(f"{what} name {name!r} must not contain '/'")
    return out


class ReplayBuffer:
    """Ring buffer of transitions. ``add`` one at a time, ``sample`` uniformly with replacement.

    Args:
        capacity: transitions kept; the oldest is overwritten when full.
        obs_spec: ``{name: (shape, dtype)}`` of one observation (``next_obs`` has the same).
        action_dim: length of the float32 action vector.
        extras: more per-transition fields ``{name: (shape, dtype)}``; ``intervention`` (bool) is
            always present.
    """

    def __init__(self, capacity: int, obs_spec: ObsSpec, action_dim: int,
                 extras: ObsSpec | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if action_dim < 1:
            raise ValueError(f"action_dim must be >= 1, got {action_dim}")
        self.capacity = int(capacity)
        self.action_dim = int(action_dim)
        self.obs_spec = _norm_spec(obs_spec, "obs_spec")
        if not self.obs_spec:
            raise ValueError("obs_spec is empty: name at least one observation field")
        self.extras_spec = _norm_spec({**DEFAULT_EXTRAS, **(extras or {})}, "extras")
        clash = set(self.extras_spec) & {"obs", "next_obs", "action", "reward", "done"}
        if clash:
            raise ValueError(f"extras may not reuse the transition field names {sorted(clash)}")
        n = self.capacity
        self.obs = {k: np.zeros((n, *s), d) for k, (s, d) in self.obs_spec.items()}
        self.next_obs = {k: np.zeros((n, *s), d) for k, (s, d) in self.obs_spec.items()}
        self.action = np.zeros((n, self.action_dim), np.float32)
        self.reward = np.zeros((n,), np.float32)
        self.done = np.zeros((n,), np.bool_)
        self.extras = {k: np.zeros((n, *s), d) for k, (s, d) in self.extras_spec.items()}
        self.ptr = 0  # where the next transition goes
        self.size = 0  # transitions held (<= capacity)

    def __len__(self) -> int:
        return self.size

    # -- writing ---------------------------------------------------------------------------------
    def add(self, obs: Mapping[str, np.ndarray], action: np.ndarray, reward: float,
            next_obs: Mapping[str, np.ndarray], done: bool, **extras: Any) -> None:
        """Append one transition (checked: shapes, dtypes, finiteness; nothing is written on error)."""
        o = self._check_obs(obs, "obs")
        no = self._check_obs(next_obs, "next_obs")
        a = _check_array(action, "action", (self.action_dim,), np.dtype(np.float32))
        r = _check_scalar_reward(reward)
        d = _check_bool(done, "done")
        unknown = set(extras) - set(self.extras_spec)
        if unknown:
            raise ValueError(f"unknown extra field(s) {sorted(unknown)}; this buffer has {sorted(self.extras_spec)}")
        ex = {}
        for k, (shape, dtype) in self.extras_spec.items():
            v = extras.get(k, np.zeros(shape, dtype))
            ex[k] = _check_bool(v, k) if dtype == np.bool_ and shape == () else _check_array(v, k, shape, dtype)
        i = self.ptr
        for k in self.obs_spec:
            self.obs[k][i] = o[k]
            self.next_obs[k][i] = no[k]
        self.action[i] = a
        self.reward[i] = r
        self.done[i] = d
        for k, v in ex.items():
            self.extras[k][i] = v
        self.ptr = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def _check_obs(self, obs: Mapping[str, np.ndarray], what: str) -> dict[str, np.ndarray]:
        if not isinstance(obs, Mapping):
            raise ValueError(f"{what} must be a dict {{name: array}}, got {type(obs).__name__}")
        missing, unknown = set(self.obs_spec) - set(obs), set(obs) - set(self.obs_spec)
        if missing or unknown:
            raise ValueError(f"{what} fields do not match the buffer's obs_spec: missing {sorted(missing)}, "
                             f"unknown {sorted(unknown)}")
        return {k: _check_array(obs[k], f"{what}[{k!r}]", s, d) for k, (s, d) in self.obs_spec.items()}

    # -- reading ---------------------------------------------------------------------------------
    def indices(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """``batch_size`` uniform indices into the filled part (with replacement)."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty ReplayBuffer")
        return rng.integers(0, self.size, size=batch_size)

    def gather(self, idx: np.ndarray, device: torch.device | str = "cpu") -> dict[str, Any]:
        """The transitions at ``idx`` as torch tensors: obs / next_obs dicts (their stored dtypes, so
        images stay uint8), action / reward / done float32 (done is 0 or 1), extras as stored."""
        t = lambda x: torch.from_numpy(x).to(device)  # noqa: E731
        batch = {"obs": {k: t(v[idx]) for k, v in self.obs.items()},
                 "action": t(self.action[idx]),
                 "reward": t(self.reward[idx]),
                 "next_obs": {k: t(v[idx]) for k, v in self.next_obs.items()},
                 "done": t(self.done[idx].astype(np.float32))}
        batch.update({k: t(v[idx]) for k, v in self.extras.items()})
        return batch

    def sample(self, batch_size: int, rng: np.random.Generator, device: torch.device | str = "cpu",
               n_step: int | None = None, gamma: float = 0.99, **target: Any) -> dict[str, Any]:
        """``batch_size`` transitions drawn uniformly with replacement, as torch tensors (see ``gather``);
        with ``n_step``, as n-step transitions (``n_step_gather``: ``reward`` summed, ``next_obs`` / ``done``
        of the last step, and ``discount``; ``target``: its per_tick / reward_offset / time_limit)."""
        idx = self.indices(batch_size, rng)
        return self.gather(idx, device) if n_step is None else self.n_step_gather(idx, n_step, gamma, device, **target)

    # -- n-step returns --------------------------------------------------------------------------
    def continues(self, i: np.ndarray) -> np.ndarray:
        """For ring indices ``i``: is the transition stored after ``i`` the next step of the same episode?
        It is when ``i`` is not terminal, the slot after it holds a transition newer than ``i`` (it is not
        the write pointer), and its ``obs`` equals ``i``'s ``next_obs`` exactly (a session stores the same
        arrays twice; a new episode, a truncation or an overwritten slot breaks the equality). No episode
        bookkeeping is stored, so buffers written before n-step returns existed work as they are."""
        i = np.asarray(i)
        j = (i + 1) % self.capacity
        ok = (j != self.ptr) & ~self.done[i]
        for k in self.obs_spec:
            ok &= (self.obs[k][j] == self.next_obs[k][i]).reshape(len(i), -1).all(axis=1)
        return ok

    def n_step_returns(self, idx: np.ndarray, n: int, gamma: float, *, per_tick: bool = False,
                       reward_offset: float = 0.0,
                       time_limit: str = "bootstrap") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """-> (the n-step reward sums float32, the ring index of each one's last step, the discount of the
        bootstrap float32) for the transitions at ``idx`` (see ``n_step_gather``)."""
        if n < 1:
            raise ValueError(f"n_step must be >= 1, got {n}")
        idx = np.asarray(idx)
        step_discount = self._step_discount(gamma, per_tick)
        ret = self.reward[idx].astype(np.float64) - reward_offset
        last = idx.copy()
        disc = step_discount(idx)
        alive = np.ones(len(idx), bool)
        ends = self._ends(time_limit)
        for k in range(1, n):
            alive &= self.continues(last) & ~ends[last]
            if not alive.any():
                break
            nxt = (last[alive] + 1) % self.capacity
            ret[alive] += disc[alive] * (self.reward[nxt] - reward_offset)
            last[alive] = nxt
            disc[alive] = disc[alive] * step_discount(nxt)
        return ret.astype(np.float32), last, disc.astype(np.float32)

    def _step_discount(self, gamma: float, per_tick: bool):
        """index array -> the discount of each stored step: ``gamma``, or ``gamma ** rows`` (``per_tick``: gamma is
        per control tick and the step executed ``rows`` of them)."""
        if not per_tick:
            return lambda i: np.full(len(i), float(gamma))
        if "rows" not in self.extras:
            raise ValueError("a per-tick discount (gamma_per_tick) needs the rows each step executed: this buffer "
                             f"has no 'rows' extra (its extras: {sorted(self.extras)})")
        rows = self.extras["rows"]

        def discount(i: np.ndarray) -> np.ndarray:
            r = rows[i]
            if (r < 1).any():
                raise ValueError("a per-tick discount (gamma_per_tick) needs every step's rows (>= 1): transitions "
                                 "were added without rows= (ReplayBuffer.add(..., rows=np.asarray(n, np.int32)))")
            return float(gamma) ** r.astype(np.float64)

        return discount

    def _ends(self, time_limit: str) -> np.ndarray:
        """Which stored steps end the target's episode: terminal ones, and (``time_limit`` ``terminal``) truncated
        ones too."""
        if time_limit == "bootstrap":
            return self.done
        if time_limit != "terminal":
            raise ValueError(f"time_limit must be 'bootstrap' or 'terminal', got {time_limit!r}")
        if "truncated" not in self.extras:
            raise ValueError("time_limit 'terminal' needs to know which steps a time limit cut: this buffer has no "
                             f"'truncated' extra (its extras: {sorted(self.extras)}; a replay saved before sessions "
                             "stored it resumes with --time-limit bootstrap)")
        return self.done | self.extras["truncated"]

    def n_step_gather(self, idx: np.ndarray, n: int, gamma: float, device: torch.device | str = "cpu", *,
                      per_tick: bool = False, reward_offset: float = 0.0,
                      time_limit: str = "bootstrap") -> dict[str, Any]:
        """``gather(idx)`` as n-step transitions: ``reward`` = sum_{k<m} D_k (r_{t+k} - reward_offset) over the m <= n
        steps that stay in the episode (stopping after a terminal one), ``next_obs`` and ``done`` those of step
        t+m-1, ``discount`` = D_m (float32), so that the TD target is
        ``reward + discount * (1 - done) * Q(next_obs, .)``. D_k is the product of the first k steps' discounts:
        ``gamma`` each, or with ``per_tick`` ``gamma ** rows`` (the extra ``rows``: ticks the step executed).
        ``time_limit`` ``terminal``: a step that a time limit cut (the extra ``truncated``) ends the return and
        counts as done; ``bootstrap``: only terminal steps do. ``n = 1`` with the defaults gives the one-step
        transitions and ``discount`` = gamma."""
        idx = np.asarray(idx)
        ret, last, disc = self.n_step_returns(idx, n, gamma, per_tick=per_tick, reward_offset=reward_offset,
                                              time_limit=time_limit)
        batch = self.gather(idx, device)
        t = lambda x: torch.from_numpy(x).to(device)  # noqa: E731
        batch["reward"] = t(ret)
        batch["next_obs"] = {k: t(v[last]) for k, v in self.next_obs.items()}
        batch["done"] = t(self._ends(time_limit)[last].astype(np.float32))
        batch["discount"] = t(disc)
        return batch

    # -- persistence -----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the buffer to ``path`` (an ``.npz``) atomically: a kill leaves the old file or the new one."""
        path = os.fspath(path)
        meta = {"format": _FORMAT, "capacity": self.capacity, "action_dim": self.action_dim,
                "ptr": self.ptr, "size": self.size,
                "obs_spec": {k: [list(s), d.str] for k, (s, d) in self.obs_spec.items()},
                "extras": {k: [list(s), d.str] for k, (s, d) in self.extras_spec.items()}}
        n = self.size  # only the filled part; when full that is everything
        arrays = {"meta": np.array(json.dumps(meta)), "action": self.action[:n], "reward": self.reward[:n],
                  "done": self.done[:n]}
        arrays.update({f"obs/{k}": v[:n] for k, v in self.obs.items()})
        arrays.update({f"next_obs/{k}": v[:n] for k, v in self.next_obs.items()})
        arrays.update({f"extras/{k}": v[:n] for k, v in self.extras.items()})
        tmp = path + ".tmp"
        try:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ReplayBuffer":
        """A buffer equal to the one ``save`` wrote: same contents, pointer, size and capacity."""
        with np.load(os.fspath(path), allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != _FORMAT:
                raise ValueError(f"{path}: replay format {meta.get('format')!r}, this code reads {_FORMAT}")
            spec = lambda m: {k: (tuple(s), np.dtype(d)) for k, (s, d) in m.items()}  # noqa: E731
            buf = cls(meta["capacity"], spec(meta["obs_spec"]), meta["action_dim"], spec(meta["extras"]))
            n = meta["size"]
            for k in buf.obs_spec:
                buf.obs[k][:n] = z[f"obs/{k}"]
                buf.next_obs[k][:n] = z[f"next_obs/{k}"]
            buf.action[:n] = z["action"]
            buf.reward[:n] = z["reward"]
            buf.done[:n] = z["done"]
            for k in buf.extras_spec:
                buf.extras[k][:n] = z[f"extras/{k}"]
            buf.ptr, buf.size = int(meta["ptr"]), int(n)
        return buf


def sample_mixed(online: ReplayBuffer, offline: ReplayBuffer, batch_size: int, offline_fraction: float = 0.5,
                 rng: np.random.Generator | None = None, device: torch.device | str = "cpu",
                 n_step: int | None = None, gamma: float = 0.99, **target: Any) -> dict[str, Any]:
    """RLPD's symmetric sampling: ``offline_fraction`` of the batch (rounded) from the offline
    buffer (demos, interventions), the rest from the online buffer; rows are online first.

    An empty offline buffer gives an all-online batch; an empty online buffer an all-offline one. ``n_step``:
    n-step transitions from each buffer (``ReplayBuffer.n_step_gather``).
    """
    if rng is None:
        raise ValueError("sample_mixed needs rng=np.random.Generator (sampling must be reproducible)")
    if not 0.0 <= offline_fraction <= 1.0:
        raise ValueError(f"offline_fraction must be in [0, 1], got {offline_fraction}")
    if online.obs_spec != offline.obs_spec or online.action_dim != offline.action_dim \
            or online.extras_spec != offline.extras_spec:
        raise ValueError("online and offline buffers hold different transitions (obs_spec, action_dim or extras)")
    kw = {"n_step": n_step, "gamma": gamma, **target}
    if len(offline) == 0:
        return online.sample(batch_size, rng, device, **kw)
    if len(online) == 0:
        return offline.sample(batch_size, rng, device, **kw)
    n_off = int(round(batch_size * offline_fraction))
    a = online.sample(batch_size - n_off, rng, device, **kw)
    b = offline.sample(n_off, rng, device, **kw)
    return _cat(a, b)


def _cat(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: _cat(v, b[k]) if isinstance(v, dict) else torch.cat([v, b[k]]) for k, v in a.items()}


# -- checks: each error names the field ----------------------------------------------------------
def _check_array(x: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{name}: expected a numpy array of shape {shape} and dtype {dtype}, got {type(x).__name__}")
    if x.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {x.shape}")
    if x.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {x.dtype} (convert it with .astype(np.{dtype}))")
    if x.dtype.kind in "fc" and not np.isfinite(x).all():
        raise ValueError(f"{name}: contains NaN or inf")
    return x


def _check_scalar_reward(r: Any) -> float:
    if isinstance(r, np.ndarray) and r.shape in ((), (1,)):
        r = r.reshape(()).item()
    if isinstance(r, (bool, np.bool_)) or not isinstance(r, (int, float, np.integer, np.floating)):
        raise ValueError(f"reward: expected a real number, got {type(r).__name__}")
    if not np.isfinite(r):
        raise ValueError(f"reward: not finite ({r})")
    return float(r)


def _check_bool(v: Any, name: str) -> bool:
    if isinstance(v, np.ndarray) and v.shape == ():
        v = v.item()
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)) and v in (0, 1):
        return bool(v)
    raise ValueError(f"{name}: expected a bool, got {v!r}")
