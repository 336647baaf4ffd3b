"""ExToken's behaviour prior: k-means over recorded demonstrations -> behaviour tokens 1..K.

Demonstrations of one task hold several *modes* (grasp yaw, approach side, ...) that a
flow-matching VLA would otherwise average or pick from at random. ExToken names them: the demos
are clustered into K modes, each frame is labelled with its mode's token ``c`` (1..K; 0 stays the
null token), and the VLA trains ``pi(a | s, c)`` (``vla train --tokens``). Online, a selector
picks the token; the token frequencies over the demos are its prior (METHODS.md, ExToken).

Two clustering units:

* ``episode`` (default): one feature per episode, the actions of its first ``chunks`` (M) chunks
  of ``horizon`` (H) ticks -- the opening, where the mode is decided -- padded past a short
  episode's end with its last action; every frame of the episode gets the episode's token.
* ``chunk``: one feature per frame, its action chunk ``a[t : t + H]`` (padded the same way),
  optionally followed by its state times ``state_weight``; every frame gets its own token.

Each action (and state) dimension is standardised over all frames of all datasets first, so a
rotation in rad weighs as much as a translation in metres. Only the parquet columns are read
(``load_demos`` with no camera): no video is decoded.

The result, ``tokens.json`` (written atomically, schema :data:`FORMAT` v :data:`VERSION`): K,
unit, M / H, seed, the feature spec (with the standardisation and the cluster centres), per
dataset and episode its token(s) with the episode's frame count and a hash of its actions, the
token prior (share of frames per token), cluster sizes, a hash of the inputs, and -- with
``purity_field`` -- the contingency table token x episode-log field and the purity. Beside it a
PNG shows what each token does. :func:`load_prior` reads it back as a :class:`TokenPrior`;
:func:`token_meta` reads the ``tokens`` block that ``vla train --tokens`` puts in a checkpoint.
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

from vla.data.atomic import atomic_write_bytes

from vla.data.tokens import (FORMAT, UNITS, VERSION, DatasetTokens, EpisodeTokens, TokenPrior,  # noqa: F401
                             action_sha, checkpoint_block, load_prior, token_meta)

# action layout of an arm (hardware.teleop.base.TeleopCommand): dpos (m / tick), drot (rad / tick), gripper
DX, DY, DRZ = 0, 1, 5


@dataclasses.dataclass(frozen=True)
class PriorConfig:
    k: int = 4
    """Behaviour tokens K (clusters); tokens are 1..K, 0 is the null token."""
    unit: str = "episode"
    """What is clustered: ``episode`` (its opening; all its frames share the token) or ``chunk`` (every frame's
    action chunk; every frame its own token)."""
    chunks: int = 3
    """Episode unit: the opening is the first ``chunks`` chunks of ``horizon`` actions."""
    horizon: int = 8
    """Actions per chunk H."""
    state_weight: float = 0.0
    """Chunk unit: weight of the standardised state appended to the chunk (0 = actions only)."""
    seed: int = 0
    """k-means seed (``random_state``); 10 restarts keep the best."""
    purity_field: str | None = None
    """An episode-log field (``meta/vla_episodes.jsonl``, e.g. ``expert_mode`` or ``success``): report the
    contingency table token x value and the purity."""

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")
        for f in ("k", "chunks", "horizon"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{f} must be a positive integer, got {v!r}")
        if not math.isfinite(self.state_weight) or self.state_weight < 0:
            raise ValueError(f"state_weight must be >= 0, got {self.state_weight}")
        if self.state_weight and self.unit != "chunk":
            raise ValueError("state_weight is for the chunk unit only (an episode is clustered by its opening actions)")


@dataclasses.dataclass
class Demo:
    """The part of a recorded episode the prior reads."""

    dataset: str
    episode_index: int
    action: np.ndarray
    """float32 [T, A]"""
    state: np.ndarray
    """float32 [T, S]"""
    row: dict = dataclasses.field(default_factory=dict)
    """Its episode-log row ({} when the dataset has no log)."""


# -- reading the demonstrations ---------------------------------------------------------------
def load_episodes(roots: Iterable[str], progress: bool = False) -> list[Demo]:
    """Actions, states and episode-log rows of every episode of ``roots``; no video is decoded."""
    from vla.data.demos import load_demos
    from vla.data.episode_log import read_episode_log

    roots = [os.path.abspath(r) for r in roots]
    if len(set(roots)) != len(roots):
        raise ValueError(f"a dataset is given twice: {roots}")
    eps = load_demos(roots, None, cameras=[], progress=progress)  # no camera: parquet columns only
    logs: dict[str, dict[int, dict]] = {}
    for r in roots:
        try:
            logs[r] = read_episode_log(r)
        except FileNotFoundError:
            logs[r] = {}
    return [Demo(e.dataset, e.episode_index, e.action, e.state, logs[e.dataset].get(e.episode_index, {})) for e in eps]


# -- features ---------------------------------------------------------------------------------
def _standardiser(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = x.mean(0)
    std = x.std(0)
    return mean, np.where(std > 1e-8, std, 1.0)  # a constant dimension (gripper never moves) stays 0


def features(demos: list[Demo], cfg: PriorConfig) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """-> (features [U, D], raw actions of each unit [U, ticks, A] for the plot, feature spec).
    A unit is an episode or a frame (``cfg.unit``)."""
    from vla.data.demos import action_chunks

    acts = np.concatenate([d.action for d in demos])
    a_mean, a_std = _standardiser(acts)
    spec: dict[str, Any] = {"unit": cfg.unit, "horizon": cfg.horizon, "action_dim": int(acts.shape[1]),
                            "action_mean": a_mean.tolist(), "action_std": a_std.tolist()}
    if cfg.unit == "episode":
        ticks = cfg.chunks * cfg.horizon
        raw = np.stack([action_chunks(d.action, ticks)[0][0] for d in demos])  # [E, M H, A], padded with the last
        x = ((raw - a_mean) / a_std).reshape(len(demos), -1)
        spec.update(chunks=cfg.chunks, ticks=ticks, description=(
            f"the first {cfg.chunks} chunks of {cfg.horizon} actions ({ticks} ticks) of each episode, padded with its "
            "last action, each action dimension standardised over every frame of the datasets"))
    else:
        raw = np.concatenate([action_chunks(d.action, cfg.horizon)[0] for d in demos])  # [N, H, A]
        x = ((raw - a_mean) / a_std).reshape(len(raw), -1)
        spec["state_weight"] = cfg.state_weight
        if cfg.state_weight:
            states = np.concatenate([d.state for d in demos])
            s_mean, s_std = _standardiser(states)
            x = np.concatenate([x, cfg.state_weight * (states - s_mean) / s_std], 1)
            spec.update(state_mean=s_mean.tolist(), state_std=s_std.tolist())
        spec["description"] = (
            f"every frame's chunk of {cfg.horizon} actions (padded with the episode's last action), each action "
            "dimension standardised over every frame of the datasets"
            + (f", then its standardised state x {cfg.state_weight:g}" if cfg.state_weight else ""))
    spec["dims"] = int(x.shape[1])
    return x.astype(np.float64), raw, spec


def inputs_sha256(demos: list[Demo], cfg: PriorConfig) -> str:
    """Hash of what the clustering saw: every episode's index, actions and states, and the settings."""
    h = hashlib.sha256(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode())
    for d in demos:
        h.update(f"{os.path.basename(d.dataset)}/{d.episode_index}/{len(d.action)}".encode())
        h.update(np.ascontiguousarray(d.action, np.float32).tobytes())
        h.update(np.ascontiguousarray(d.state, np.float32).tobytes())
    return h.hexdigest()


# -- clustering -------------------------------------------------------------------------------
def cluster(x: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """k-means -> (token of each row, 1..K, token 1 the largest cluster; centres [K, D] in token order)."""
    from sklearn.cluster import KMeans

    if k > len(x):
        raise ValueError(f"k={k} behaviour tokens from {len(x)} units: choose --k <= {len(x)} or record more")
    km = KMeans(n_clusters=k, n_init=10, random_state=seed).fit(x)
    sizes = np.bincount(km.labels_, minlength=k)
    if (sizes == 0).any():
        raise ValueError(f"k={k}: the demonstrations hold only {int((sizes > 0).sum())} distinct behaviours; "
                         "choose a smaller --k")
    order = sorted(range(k), key=lambda c: (-sizes[c], c))  # token 1 = largest cluster: stable, readable tables
    token_of_label = np.empty(k, np.int64)
    token_of_label[order] = np.arange(1, k + 1)
    return token_of_label[km.labels_], km.cluster_centers_[order]


def _value_key(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def purity_table(tokens: np.ndarray, values: list[Any], k: int, field: str) -> dict[str, Any]:
    """Contingency table token x field value over the units that have the field, and the purity
    (sum over tokens of the largest count in its row / units counted): 1 = every token is one value."""
    have = [i for i, v in enumerate(values) if v is not None]
    keys = sorted({_value_key(values[i]) for i in have})
    table = {str(t): {key: 0 for key in keys} for t in range(1, k + 1)}
    for i in have:
        table[str(int(tokens[i]))][_value_key(values[i])] += 1
    n = len(have)
    purity = sum(max(row.values(), default=0) for row in table.values()) / n if n else None
    return {"field": field, "values": keys, "table": table, "purity": purity, "counted": n,
            "missing": len(values) - n}


def build_prior(demos: list[Demo], cfg: PriorConfig) -> dict[str, Any]:
    """Cluster ``demos`` -> the content of ``tokens.json`` (see the module docstring)."""
    if not demos:
        raise ValueError("no episodes to cluster")
    x, _, spec = features(demos, cfg)
    tokens, centres = cluster(x, cfg.k, cfg.seed)
    lengths = [len(d.action) for d in demos]
    if cfg.unit == "episode":
        frame_tokens = [np.full(n, t, np.int64) for n, t in zip(lengths, tokens)]
    else:
        frame_tokens = np.split(tokens, np.cumsum(lengths)[:-1])
    frames_per_token = np.bincount(np.concatenate(frame_tokens), minlength=cfg.k + 1)[1:]
    datasets: dict[str, dict[str, Any]] = {}
    for d, ft in zip(demos, frame_tokens):
        ds = datasets.setdefault(d.dataset, {"path": d.dataset, "name": os.path.basename(d.dataset), "episodes": []})
        ep: dict[str, Any] = {"episode_index": d.episode_index, "frames": len(d.action), "action_sha256": action_sha(d.action)}
        if cfg.unit == "episode":
            ep["token"] = int(ft[0])
        else:
            ep["tokens"] = ft.tolist()
        ds["episodes"].append(ep)
    out: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "k": cfg.k, "unit": cfg.unit, "chunks": cfg.chunks, "horizon": cfg.horizon,
        "seed": cfg.seed, "state_weight": cfg.state_weight,
        "prior": (frames_per_token / frames_per_token.sum()).tolist(),
        "cluster_sizes": np.bincount(tokens, minlength=cfg.k + 1)[1:].tolist(),
        "frames_per_token": frames_per_token.tolist(),
        "feature": {**spec, "centres": np.round(centres, 5).tolist()},
        "inputs_sha256": inputs_sha256(demos, cfg),
        "datasets": list(datasets.values()),
        "purity": None,
    }
    if cfg.purity_field:
        per_episode = [d.row.get(cfg.purity_field) for d in demos]
        values = per_episode if cfg.unit == "episode" else [v for v, n in zip(per_episode, lengths) for _ in range(n)]
        out["purity"] = purity_table(tokens, values, cfg.k, cfg.purity_field)
    return out


def write_prior(prior: dict[str, Any], path: str | Path) -> None:
    atomic_write_bytes(Path(path), (json.dumps(prior, indent=1) + "\n").encode("utf-8"))


# -- the picture ------------------------------------------------------------------------------
def plot_prior(prior: dict[str, Any], demos: list[Demo], png: str | Path) -> None:
    """Cluster sizes, and per token the mean cumulative end-effector path (dx, dy) and z-rotation (drz) of
    its units' actions -- the opening of its episodes, or its frames' chunks: what each token does."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = PriorConfig(k=prior["k"], unit=prior["unit"], chunks=prior["chunks"], horizon=prior["horizon"],
                      seed=prior["seed"], state_weight=prior["state_weight"])
    _, raw, _ = features(demos, cfg)
    tokens = np.array([e["token"] for ds in prior["datasets"] for e in ds["episodes"]] if cfg.unit == "episode" else
                      [t for ds in prior["datasets"] for e in ds["episodes"] for t in e["tokens"]])
    k = cfg.k
    colours = plt.get_cmap("tab10" if k <= 10 else "tab20")(np.arange(k) % (10 if k <= 10 else 20))
    arm = raw.shape[2] > DRZ
    fig, axes = plt.subplots(1, 3 if arm else 1, figsize=(13 if arm else 4.5, 4), squeeze=False)
    ax = axes[0, 0]
    ax.bar(np.arange(1, k + 1), prior["cluster_sizes"], color=colours)
    ax.set_xticks(np.arange(1, k + 1))
    ax.set_xlabel("token")
    ax.set_ylabel(f"{cfg.unit}s")
    ax.set_title(f"cluster sizes (K={k}, unit {cfg.unit})")
    if prior.get("purity") and prior["purity"]["purity"] is not None:
        ax.set_title(ax.get_title() + f"\npurity vs {prior['purity']['field']}: {prior['purity']['purity']:.2f}",
                     fontsize=9)
    if arm:
        ticks = np.arange(raw.shape[1] + 1)
        for t in range(1, k + 1):
            sel = raw[tokens == t]
            path = np.concatenate([np.zeros((1, 2)), np.cumsum(sel[:, :, [DX, DY]].mean(0), 0)]) * 1000
            yaw = np.degrees(np.concatenate([[0.0], np.cumsum(sel[:, :, DRZ].mean(0))]))
            axes[0, 1].plot(path[:, 0], path[:, 1], "-o", ms=2, color=colours[t - 1], label=f"token {t} (n={len(sel)})")
            axes[0, 2].plot(ticks, yaw, color=colours[t - 1], label=f"token {t}")
        axes[0, 1].plot(0, 0, "k+", ms=10)
        axes[0, 1].set_aspect("equal", adjustable="datalim")
        axes[0, 1].set_xlabel("cumulative dx (mm)")
        axes[0, 1].set_ylabel("cumulative dy (mm)")
        axes[0, 1].set_title(f"mean end-effector path over the {raw.shape[1]} ticks")
        axes[0, 1].legend(fontsize=8)
        axes[0, 2].set_xlabel("tick")
        axes[0, 2].set_ylabel("cumulative drz (deg)")
        axes[0, 2].set_title("mean z-rotation (yaw)")
        for a in axes[0, 1:]:
            a.grid(alpha=0.3)
    fig.tight_layout()
    png = str(png)
    tmp = os.path.join(os.path.dirname(os.path.abspath(png)), f".{os.path.basename(png)}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, png)


