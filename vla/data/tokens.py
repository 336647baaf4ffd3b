"""Behaviour-token files (``tokens.json``, written by ``vla tokens``: ExToken's prior, policies/extoken/prior.py) read
back: which token (1..K; 0 is the null token) every frame of a recorded dataset carries, and the ``tokens`` block that
``vla train --tokens`` writes into a checkpoint. Here, under vla/, because supervised fine-tuning reads them; the
clustering that writes them lives with the RL method.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np

FORMAT = "vla-extoken-prior"
VERSION = 1
UNITS = ("episode", "chunk")


def action_sha(action: np.ndarray) -> str:
    """Short hash of an episode's actions: a token file refuses an episode that was re-recorded since."""
    return hashlib.sha256(np.ascontiguousarray(action, np.float32).tobytes()).hexdigest()[:16]


# -- reading a token file -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class EpisodeTokens:
    frames: int
    action_sha256: str
    tokens: np.ndarray
    """int64 [frames]: the token of every frame."""


@dataclasses.dataclass(frozen=True)
class DatasetTokens:
    path: str
    name: str
    episodes: dict[int, EpisodeTokens]


@dataclasses.dataclass(frozen=True)
class TokenPrior:
    """A ``tokens.json`` read back (:func:`load_prior`)."""

    path: str
    k: int
    unit: str
    prior: np.ndarray
    """float64 [K]: share of the frames with token 1..K."""
    file_sha256: str
    datasets: tuple[DatasetTokens, ...]
    meta: dict[str, Any]
    """The whole file."""

    def dataset(self, root: str) -> DatasetTokens:
        """The file's entry for the dataset at ``root``: the same absolute path, else the only one with its name."""
        p = os.path.abspath(root)
        for d in self.datasets:
            if os.path.abspath(d.path) == p:
                return d
        same_name = [d for d in self.datasets if d.name == os.path.basename(p)]
        if len(same_name) == 1:
            return same_name[0]
        raise ValueError(f"tokens file {self.path} has no tokens for dataset {p} (it covers "
                         f"{[d.path for d in self.datasets]}); run `vla tokens` with that dataset")

    def episode(self, root: str, episode_index: int) -> EpisodeTokens:
        d = self.dataset(root)
        if episode_index not in d.episodes:
            raise ValueError(f"tokens file {self.path} has no tokens for episode {episode_index} of dataset {d.path} "
                             f"(it has {len(d.episodes)} episodes of it); run `vla tokens` again on the dataset")
        return d.episodes[episode_index]

    def token_of(self, dataset_root: str, episode_index: int, frame_index: int) -> int:
        """The token (1..K) of one recorded frame."""
        ep = self.episode(dataset_root, episode_index)
        if not 0 <= frame_index < ep.frames:
            raise ValueError(f"frame {frame_index} of episode {episode_index} of {dataset_root}: the episode has "
                             f"{ep.frames} frames in {self.path}")
        return int(ep.tokens[frame_index])

    def frame_tokens(self, episodes: Iterable[tuple[str, int, np.ndarray]]) -> np.ndarray:
        """Tokens of every frame of ``episodes`` ((dataset root, episode index, actions [T, A]) in
        order), concatenated: int64 [sum T]. An episode the file does not cover, or one whose
        frames or actions differ from those the tokens were computed from, is refused by name."""
        out = []
        for root, index, action in episodes:
            ep = self.episode(root, index)
            if len(action) != ep.frames or action_sha(action) != ep.action_sha256:
                raise ValueError(f"episode {index} of dataset {os.path.abspath(root)} has {len(action)} frames"
                                 f"{' and other actions' if len(action) == ep.frames else ''} than when {self.path} "
                                 f"was computed ({ep.frames} frames): the dataset changed; run `vla tokens` again")
            out.append(ep.tokens)
        return np.concatenate(out) if out else np.zeros(0, np.int64)


def _field(cond: bool, path: str, name: str, want: str, got: Any) -> None:
    if not cond:
        shown = repr(got)
        raise ValueError(f"{path}: field '{name}' must be {want}, got "
                         f"{shown[:80] + '...' if len(shown) > 80 else shown}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def load_prior(path: str | Path) -> TokenPrior:
    """Read and check a ``tokens.json`` written by ``vla tokens``. A malformed or inconsistent file is a
    ValueError that names the field."""
    path = str(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"tokens file {path}: no such file (write one with `vla tokens`)")
    raw = Path(path).read_bytes()
    try:
        d = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"tokens file {path}: not JSON ({e})") from None
    _field(isinstance(d, dict), path, "(top level)", "an object", d)
    _field(d.get("format") == FORMAT, path, "format", repr(FORMAT) + " (a file written by `vla tokens`)", d.get("format"))
    _field(d.get("version") == VERSION, path, "version", str(VERSION), d.get("version"))
    k = d.get("k")
    _field(_is_int(k) and k > 0, path, "k", "a positive integer", k)
    _field(d.get("unit") in UNITS, path, "unit", f"one of {UNITS}", d.get("unit"))
    prior = d.get("prior")
    _field(isinstance(prior, list) and len(prior) == k
           and all(isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) and p >= 0 for p in prior)
           and abs(sum(prior) - 1) < 1e-6, path, "prior", f"a list of k={k} non-negative numbers summing to 1", prior)
    sets = d.get("datasets")
    _field(isinstance(sets, list) and len(sets) > 0, path, "datasets", "a non-empty list", sets)
    per_episode = d["unit"] == "episode"
    datasets = []
    for i, ds in enumerate(sets):
        where = f"datasets[{i}]"
        _field(isinstance(ds, dict), path, where, "an object", ds)
        _field(isinstance(ds.get("path"), str) and ds["path"], path, f"{where}.path", "a dataset path", ds.get("path"))
        _field(isinstance(ds.get("episodes"), list), path, f"{where}.episodes", "a list", ds.get("episodes"))
        eps: dict[int, EpisodeTokens] = {}
        for j, ep in enumerate(ds["episodes"]):
            w = f"{where}.episodes[{j}]"
            _field(isinstance(ep, dict), path, w, "an object", ep)
            idx, n = ep.get("episode_index"), ep.get("frames")
            _field(_is_int(idx) and idx >= 0 and idx not in eps, path, f"{w}.episode_index",
                   "a non-negative integer, once per dataset", idx)
            _field(_is_int(n) and n > 0, path, f"{w}.frames", "a positive integer", n)
            _field(isinstance(ep.get("action_sha256"), str), path, f"{w}.action_sha256", "a string",
                   ep.get("action_sha256"))
            if per_episode:
                t = ep.get("token")
                _field(_is_int(t) and 1 <= t <= k, path, f"{w}.token", f"an integer in 1..{k} (unit episode)", t)
                toks = np.full(n, t, np.int64)
            else:
                t = ep.get("tokens")
                _field(isinstance(t, list) and len(t) == n and all(_is_int(x) and 1 <= x <= k for x in t), path,
                       f"{w}.tokens", f"a list of {n} integers in 1..{k} (unit chunk, one per frame)", t)
                toks = np.asarray(t, np.int64)
            eps[idx] = EpisodeTokens(frames=n, action_sha256=ep["action_sha256"], tokens=toks)
        datasets.append(DatasetTokens(path=ds["path"], name=ds.get("name") or os.path.basename(ds["path"]), episodes=eps))
    return TokenPrior(path=path, k=k, unit=d["unit"], prior=np.asarray(prior, np.float64),
                      file_sha256=hashlib.sha256(raw).hexdigest(), datasets=tuple(datasets), meta=d)


def checkpoint_block(prior: TokenPrior) -> dict[str, Any]:
    """The ``tokens`` block ``vla train --tokens`` writes into a checkpoint's config.json."""
    return {"k": prior.k, "unit": prior.unit, "prior": prior.prior.tolist(), "file_sha256": prior.file_sha256}


def token_meta(checkpoint_dir: str) -> dict[str, Any] | None:
    """The ``tokens`` block of a checkpoint (or run directory) trained with ``vla train --tokens``:
    ``{"k", "unit", "prior" [K floats], "file_sha256"}``; None for a checkpoint trained without tokens."""
    from vla.models import resolve_checkpoint

    cfg_path = os.path.join(resolve_checkpoint(checkpoint_dir), "config.json")
    with open(cfg_path) as f:
        meta = json.load(f)
    block = meta.get("tokens")
    if block is None:
        return None
    _field(isinstance(block, dict), cfg_path, "tokens", "an object", block)
    k = block.get("k")
    _field(_is_int(k) and k > 0, cfg_path, "tokens.k", "a positive integer", k)
    _field(block.get("unit") in UNITS, cfg_path, "tokens.unit", f"one of {UNITS}", block.get("unit"))
    prior = block.get("prior")
    _field(isinstance(prior, list) and len(prior) == k and all(isinstance(p, (int, float)) for p in prior), cfg_path,
           "tokens.prior", f"a list of k={k} numbers", prior)
    _field(isinstance(block.get("file_sha256"), str), cfg_path, "tokens.file_sha256", "a string", block.get("file_sha256"))
    num = (meta.get("config") or {}).get("num_tokens")
    _field(num == k, cfg_path, "config.num_tokens", f"tokens.k = {k}", num)
    return dict(block)
