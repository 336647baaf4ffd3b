"""A learned success detector for real robots, where no simulator predicate exists (HIL-SERL).

HIL-SERL trains a binary classifier on a few hundred labelled camera frames and uses it as the
sparse reward of the RL session: reward 1 and the episode ends when it says "success". Here:

* **Model** (``SuccessClassifier``): the ImageNet EfficientNet-Lite0 trunk of the compact VLA
  (``vla.models.encoders.EfficientNetTrunk``), frozen, one small trainable head per camera
  (1x1 projection, then HIL-SERL's learned spatial embedding -- K learned weightings of the
  feature grid per channel, which keeps *where* things are -- next to a global max-pool, which
  says *whether* something is there), the cameras' features concatenated into an MLP -> one logit.
* **Labels** (``label_frames``) from LeRobot v3 datasets recorded by ``vla record``: episode
  success is read from ``meta/vla_episodes.jsonl``. The last ``last_k`` frames of a successful
  episode are positives; the ``margin`` frames before them are left out (the robot is about to
  succeed there, and an operator's "success" key comes a reaction time after the fact); every
  other frame, and every frame of a failed episode, is a negative.
* **Training** (``train_classifier``): the trunk features of every frame are computed once, for
  the frame and ``aug_views`` augmented copies (DrQ random shift + colour jitter), so the head
  trains in seconds on a CPU. Episodes, not frames, are split into train / validation (frames of
  one episode are near copies of each other). Batches are class-balanced. The head with the
  lowest validation loss is kept, and the decision threshold is chosen on the validation frames
  for high precision: a false positive ends an episode wrongly and rewards a failure. The run
  directory gets the model, ``report.json`` and ``pr_curve.png``.
* **Reward** (``classifier_reward``): the same ``reward_fn(env, obs, info)`` hook as
  ``rewards.sim_success.success_reward``, so a session swaps one for the other.

The threshold chosen on validation frames is also scored on them, so those numbers are a little
optimistic; ``vla reward eval`` on a dataset the classifier never saw gives the honest ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rewards.classifier_config import ClassifierConfig, ClassifierTrainConfig
from vla.data.episode_log import EPISODE_LOG_PATH, read_outcomes
from vla.models.encoders import EfficientNetTrunk, color_jitter, random_shift, resize_uint8

log = logging.getLogger(__name__)

KIND = "success_classifier"
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


# -- the model ---------------------------------------------------------------------------------
class _CameraHead(nn.Module):
    """Trunk feature map [B, C, h, w] -> [B, P * K + P]: learned spatial embedding + global max."""

    def __init__(self, in_channels: int, grid: tuple[int, int], proj: int, kernels: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.Conv2d(in_channels, proj, 1), nn.GELU())
        h, w = grid
        self.kernel = nn.Parameter(torch.randn(proj, h, w, kernels) / (h * w) ** 0.5)
        self.out_dim = proj * kernels + proj

    def forward(self, fmap: torch.Tensor) -> torch.Tensor:
        x = self.proj(fmap)
        assert x.shape[1:] == self.kernel.shape[:3], f"feature map {list(x.shape)} vs head grid {list(self.kernel.shape)}"
        spatial = torch.einsum("bphw,phwk->bpk", x, self.kernel).flatten(1)  # per channel, K weightings of the grid
        return torch.cat([spatial, x.amax(dim=(2, 3))], dim=1)


class SuccessClassifier(nn.Module):
    """P(success | camera frames). ``predict_proba({cam: uint8 [B, H, W, 3]}) -> float [B]``."""

    def __init__(self, cfg: ClassifierConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.trunk = EfficientNetTrunk(blocks=cfg.trunk_blocks, pretrained=cfg.pretrained, fine_blocks=0)
        self.trunk.eval()
        for p in self.trunk.parameters():
            p.requires_grad_(False)
        with torch.no_grad():  # the grid the trunk makes of an image_size frame
            _, probe = self.trunk(torch.zeros(1, cfg.image_size, cfg.image_size, 3, dtype=torch.uint8))
        self.grid = tuple(probe.shape[2:])
        self.heads = nn.ModuleList(_CameraHead(probe.shape[1], self.grid, cfg.proj_channels, cfg.spatial_kernels)
                                   for _ in cfg.cameras)
        d = sum(h.out_dim for h in self.heads)
        self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Dropout(cfg.dropout), nn.Linear(d, cfg.hidden), nn.GELU(),
                                 nn.Dropout(cfg.dropout), nn.Linear(cfg.hidden, 1))

    @property
    def cameras(self) -> tuple[str, ...]:
        return self.cfg.cameras

    @property
    def threshold(self) -> float:
        return self.cfg.threshold

    def train(self, mode: bool = True) -> "SuccessClassifier":
        super().train(mode)
        self.trunk.eval()  # frozen: its batch-norm statistics stay ImageNet's
        return self

    def check_cameras(self, images: dict[str, Any]) -> None:
        missing = [c for c in self.cameras if c not in images]
        if missing:
            raise KeyError(f"success classifier: no image from camera(s) {missing}; it was trained on "
                           f"{list(self.cameras)} and got {sorted(images)}")

    @torch.no_grad()
    def features(self, images: dict[str, Any]) -> dict[str, torch.Tensor]:
        """{cam: uint8 [B, H, W, 3]} -> {cam: trunk feature map [B, C, h, w]} (frozen, no grad)."""
        self.check_cameras(images)
        out = {}
        for cam in self.cameras:
            x = images[cam] if torch.is_tensor(images[cam]) else torch.from_numpy(np.ascontiguousarray(images[cam]))
            assert x.dtype == torch.uint8 and x.ndim == 4 and x.shape[-1] == 3, \
                f"camera {cam!r}: images must be uint8 [B, H, W, 3], got {x.dtype} {list(x.shape)}"
            _, out[cam] = self.trunk(resize_uint8(x, self.cfg.image_size))
        return out

    def logits_from_features(self, fmaps: dict[str, torch.Tensor]) -> torch.Tensor:
        """{cam: [B, C, h, w]} -> logits [B] (the trainable part)."""
        z = torch.cat([head(fmaps[cam].float()) for cam, head in zip(self.cameras, self.heads)], dim=1)
        return self.mlp(z).squeeze(1)

    def forward(self, images: dict[str, Any]) -> torch.Tensor:
        return self.logits_from_features(self.features(images))

    @torch.no_grad()
    def predict_proba(self, images: dict[str, Any], batch_size: int = 64) -> np.ndarray:
        """{cam: uint8 [B, H, W, 3]} (numpy or torch) -> P(success) float32 [B]."""
        self.check_cameras(images)
        was_training = self.training
        self.eval()
        n = len(images[self.cameras[0]])
        out = [torch.sigmoid(self({c: images[c][i:i + batch_size] for c in self.cameras}))
               for i in range(0, n, batch_size)]
        self.train(was_training)
        return torch.cat(out).numpy().astype(np.float32) if out else np.zeros(0, np.float32)

    # -- checkpoints ---------------------------------------------------------------------------
    def head_state(self) -> dict[str, torch.Tensor]:
        """The trainable weights (the trunk is ImageNet's, loaded from its package)."""
        return {k: v.detach().contiguous().clone() for k, v in self.state_dict().items() if not k.startswith("trunk.")}

    def save(self, path: str, extra: dict[str, Any] | None = None) -> None:
        """``config.json`` + ``model.safetensors`` in directory ``path``, each written atomically. The
        config (written last) records the weights' sha256, so a half-replaced pair fails to load."""
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        tmp = os.path.join(path, WEIGHTS_FILE + ".tmp")
        save_file(self.head_state(), tmp)
        _fsync(tmp)
        digest = _sha256(tmp)
        os.replace(tmp, os.path.join(path, WEIGHTS_FILE))
        meta = {"kind": KIND, "config": dataclasses.asdict(self.cfg), "weights_sha256": digest,
                "trunk": f"efficientnet-lite0 (ImageNet), first {self.cfg.trunk_blocks} blocks, frozen", **(extra or {})}
        _atomic_write_text(os.path.join(path, CONFIG_FILE), json.dumps(meta, indent=2))

    @classmethod
    def load(cls, path: str) -> "SuccessClassifier":
        from safetensors.torch import load_file

        meta = read_meta(path)
        weights = os.path.join(path, WEIGHTS_FILE)
        if not os.path.isfile(weights):
            raise FileNotFoundError(f"{path}: no {WEIGHTS_FILE}")
        if meta.get("weights_sha256") and _sha256(weights) != meta["weights_sha256"]:
            raise ValueError(f"{weights} does not match the sha256 in {CONFIG_FILE} (a save was interrupted, "
                             "or the files come from different runs): retrain, or restore both files together")
        cfg = dict(meta["config"])
        cfg["cameras"] = tuple(cfg["cameras"])
        model = cls(ClassifierConfig(**cfg))
        missing, unexpected = model.load_state_dict(load_file(weights), strict=False)
        missing = [k for k in missing if not k.startswith("trunk.")]
        if missing or unexpected:
            raise ValueError(f"{weights} does not match its config: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return model.eval()


def read_meta(path: str) -> dict[str, Any]:
    """The ``config.json`` of a saved classifier (raises a clear error for anything else)."""
    cfg_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"no {CONFIG_FILE} in {path}: not a success classifier (train one with "
                                "`vla reward train`)")
    with open(cfg_path) as f:
        meta = json.load(f)
    if meta.get("kind") != KIND:
        raise ValueError(f"{cfg_path} is a {meta.get('kind')!r} checkpoint, not a {KIND!r}")
    return meta


def _fsync(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _atomic_write_text(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# -- the reward --------------------------------------------------------------------------------
def classifier_reward(path: str, threshold: float | None = None) -> Callable[[Any, dict, dict], tuple[float, bool]]:
    """``reward_fn(env, obs, info) -> (reward, terminated)`` for ``robot_io.RobotEnv`` from a saved
    classifier: ``(1.0, True)`` when P(success | obs["images"]) >= threshold (default: the one
    chosen at training), else ``(0.0, False)``. Puts ``info["success"]`` and
    ``info["success_prob"]``. Same call shape as ``rewards.sim_success.success_reward``."""
    model = SuccessClassifier.load(path)  # a wrong path fails here, not on the first step
    thr = model.threshold if threshold is None else float(threshold)
    if not 0.0 <= thr <= 1.0:
        raise ValueError(f"threshold is a probability in [0, 1], got {thr}")

    def reward_fn(env, obs: dict, info: dict) -> tuple[float, bool]:
        model.check_cameras(obs["images"])
        p = float(model.predict_proba({c: np.asarray(obs["images"][c])[None] for c in model.cameras})[0])
        ok = p >= thr
        info["success_prob"] = p
        info["success"] = ok
        return (1.0, True) if ok else (0.0, False)

    reward_fn.classifier = model  # type: ignore[attr-defined]
    reward_fn.threshold = thr  # type: ignore[attr-defined]
    return reward_fn


# -- labels from datasets ----------------------------------------------------------------------
@dataclasses.dataclass
class LabelledFrames:
    images: dict[str, np.ndarray]
    """camera -> uint8 [N, S, S, 3]"""
    labels: np.ndarray
    """float32 [N], 1 = success"""
    groups: np.ndarray
    """int64 [N]: which episode a frame comes from (the train / validation split is by episode)"""
    group_names: list[str] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)


def read_episode_outcomes(root: str) -> dict[int, bool]:
    """``episode_index -> success`` from a dataset's episode log (written by ``vla record``),
    read by ``vla.data.episode_log`` with its one rule for torn and repeated lines."""
    return read_outcomes(root)


def frame_labels(n: int, success: bool, last_k: int, margin: int) -> np.ndarray:
    """Per-frame labels of one episode of ``n`` frames: 1 = positive, 0 = negative, -1 = left out."""
    y = np.zeros(n, np.int8)
    if success:
        y[max(0, n - last_k):] = 1
        y[max(0, n - last_k - margin):max(0, n - last_k)] = -1
    return y


def label_frames(roots: list[str], image_size: int, cameras: list[str] | None = None, last_k: int = 2,
                 margin: int = 3, progress: bool = True) -> LabelledFrames:
    """Labelled frames of LeRobot v3 datasets (see the module docstring for the rule). Episodes
    without a recorded outcome are skipped, with a warning."""
    from vla.data.demos import load_demos

    if last_k <= 0 or margin < 0:
        raise ValueError(f"last_k must be positive and margin >= 0, got {last_k}, {margin}")
    outcomes = {os.path.abspath(r): read_episode_outcomes(r) for r in roots}
    eps = load_demos(list(roots), image_size, cameras, progress=progress)
    if not eps:
        raise ValueError(f"no episodes in {list(roots)}")
    cams = list(cameras) if cameras is not None else sorted(eps[0].images)
    imgs: dict[str, list[np.ndarray]] = {c: [] for c in cams}
    labels, groups, names, skipped = [], [], [], []
    for ep in eps:
        ok = outcomes[ep.dataset].get(ep.episode_index)
        if ok is None:
            skipped.append(f"{os.path.basename(ep.dataset)}#{ep.episode_index}")
            continue
        y = frame_labels(len(ep), ok, last_k, margin)
        keep = y >= 0
        for c in cams:
            imgs[c].append(ep.images[c][keep])
        labels.append(y[keep].astype(np.float32))
        groups.append(np.full(int(keep.sum()), len(names), np.int64))
        names.append(f"{ep.dataset}#{ep.episode_index}")
    if skipped:
        log.warning("%d episode(s) have no outcome in %s and were skipped: %s", len(skipped), EPISODE_LOG_PATH,
                    ", ".join(skipped[:10]))
    if not labels:
        raise ValueError(f"no labelled frames in {list(roots)}: no episode has an outcome in {EPISODE_LOG_PATH}")
    return LabelledFrames(images={c: np.concatenate(v) for c, v in imgs.items()}, labels=np.concatenate(labels),
                          groups=np.concatenate(groups), group_names=names)


# -- metrics -----------------------------------------------------------------------------------
def binary_metrics(probs: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, float]:
    pred, y = np.asarray(probs) >= threshold, np.asarray(labels) > 0.5
    tp, fp = int((pred & y).sum()), int((pred & ~y).sum())
    fn, tn = int((~pred & y).sum()), int((~pred & ~y).sum())
    recall = tp / max(tp + fn, 1)
    tnr = tn / max(tn + fp, 1)
    return {"threshold": float(threshold), "n": len(y), "positives": int(y.sum()),
            "accuracy": (tp + tn) / max(len(y), 1), "balanced_accuracy": (recall + tnr) / 2,
            "precision": tp / (tp + fp) if tp + fp else float("nan"), "recall": recall,
            "tp": tp, "fp": fp, "tn": tn, "fn": fn}


def precision_recall_curve(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(precision, recall, threshold) for "positive iff p >= threshold", one point per distinct p,
    thresholds descending."""
    probs, y = np.asarray(probs, np.float64), np.asarray(labels) > 0.5
    order = np.argsort(-probs, kind="stable")
    p_sorted, y_sorted = probs[order], y[order]
    tp, fp = np.cumsum(y_sorted), np.cumsum(~y_sorted)
    last = np.r_[np.flatnonzero(np.diff(p_sorted)), len(p_sorted) - 1]  # last index of each distinct p
    tp, fp = tp[last], fp[last]
    return tp / (tp + fp), tp / max(int(y.sum()), 1), p_sorted[last]


def average_precision(probs: np.ndarray, labels: np.ndarray) -> float:
    prec, rec, _ = precision_recall_curve(probs, labels)
    return float(np.sum(np.diff(np.r_[0.0, rec]) * prec))


def choose_threshold(probs: np.ndarray, labels: np.ndarray, target_precision: float) -> tuple[float, bool]:
    """The threshold with the highest recall among those whose precision >= ``target_precision``.
    -> (threshold, target met). It sits at the lowest positive probability it keeps, not half-way
    to the next negative: what errs, errs towards "not yet" (a missed success costs a few more
    ticks; a false one ends the episode and rewards a failure). If no threshold reaches the
    target: the most precise one, and False."""
    prec, rec, thr = precision_recall_curve(probs, labels)
    if len(thr) == 0 or rec.max() == 0:
        return 1.0, False
    ok = (prec >= target_precision) & (rec > 0)
    met = bool(ok.any())
    if met:
        i = int(np.flatnonzero(ok & (rec == rec[ok].max()))[0])  # the highest threshold with that recall
    else:
        i = int(np.flatnonzero(prec == prec[rec > 0].max())[-1])
    return float(thr[i]), met


# -- training ----------------------------------------------------------------------------------
def split_episodes(groups: np.ndarray, labels: np.ndarray, val_fraction: float,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (train, val) over frames, splitting whole episodes, stratified by whether an
    episode has positive frames, so both sides see both classes."""
    uniq = np.unique(groups)
    has_pos = np.array([labels[groups == g].max() > 0.5 for g in uniq])
    val_groups = []
    for kind in (True, False):
        gs = uniq[has_pos == kind]
        gs = gs[rng.permutation(len(gs))]
        if len(gs) >= 2:
            val_groups.extend(gs[: max(1, int(round(val_fraction * len(gs))))])
    val = np.isin(groups, val_groups)
    train = ~val
    for name, m in (("training", train), ("validation", val)):
        y = labels[m] > 0.5
        if not y.any() or y.all():
            raise ValueError(f"the {name} split has {'no positive' if not y.any() else 'no negative'} frames: "
                             f"need at least 2 successful episodes and more negative frames (got {len(uniq)} episodes, "
                             f"{int(has_pos.sum())} with positives)")
    return train, val


@torch.no_grad()
def _cache_features(model: SuccessClassifier, images: dict[str, np.ndarray], views: int, tc: ClassifierTrainConfig,
                    gen: torch.Generator, desc: str, progress: bool) -> dict[str, torch.Tensor]:
    """{cam: float16 [views, N, C, h, w]}: view 0 the frame itself, then augmented copies."""
    from tqdm import tqdm

    n = len(next(iter(images.values())))
    bar = tqdm(total=views * n * len(images), desc=desc, unit="frame", disable=not progress)
    out: dict[str, torch.Tensor] = {}
    for cam, arr in images.items():
        per_view = []
        for v in range(views):
            parts = []
            for i in range(0, n, 128):
                x = resize_uint8(torch.from_numpy(np.ascontiguousarray(arr[i:i + 128])), model.cfg.image_size)
                if v > 0:
                    x = color_jitter(random_shift(x, tc.shift_pad, gen), tc.jitter, gen)
                parts.append(model.trunk(x)[1].half())
                bar.update(len(x))
            per_view.append(torch.cat(parts))
        out[cam] = torch.stack(per_view)
    bar.close()
    return out


def _balanced_bce(logits: torch.Tensor, y: torch.Tensor) -> float:
    loss = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
    return float((loss[y > 0.5].mean() + loss[y < 0.5].mean()) / 2)


def train_classifier(data: LabelledFrames, out_dir: str, cfg: ClassifierConfig | None = None,
                     train_cfg: ClassifierTrainConfig | None = None, progress: bool = True,
                     extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train the head on ``data`` (split by episode), choose the threshold on the validation
    episodes, and write ``out_dir/{config.json, model.safetensors, report.json, pr_curve.png}``.
    -> the report (also in ``report.json``)."""
    tc = train_cfg or ClassifierTrainConfig()
    cfg = cfg or ClassifierConfig(cameras=tuple(sorted(data.images)))
    if tc.threads:
        torch.set_num_threads(tc.threads)
    missing = [c for c in cfg.cameras if c not in data.images]
    if missing:
        raise ValueError(f"no frames from camera(s) {missing}; the data has {sorted(data.images)}")
    labels = np.asarray(data.labels, np.float32)
    assert labels.ndim == 1 and len(data.groups) == len(labels), "labels and groups must be [N]"
    for c in cfg.cameras:
        assert len(data.images[c]) == len(labels), f"camera {c!r}: {len(data.images[c])} frames for {len(labels)} labels"
    t0 = time.perf_counter()
    rng = np.random.default_rng(tc.seed)
    gen = torch.Generator().manual_seed(tc.seed)
    torch.manual_seed(tc.seed)
    train_m, val_m = split_episodes(np.asarray(data.groups), labels, tc.val_fraction, rng)
    model = SuccessClassifier(cfg)
    feats_tr = _cache_features(model, {c: data.images[c][train_m] for c in cfg.cameras}, 1 + tc.aug_views, tc, gen,
                               "trunk features (train)", progress)
    feats_va = _cache_features(model, {c: data.images[c][val_m] for c in cfg.cameras}, 1, tc, gen,
                               "trunk features (val)", progress)
    y_tr, y_va = torch.from_numpy(labels[train_m]), torch.from_numpy(labels[val_m])
    pos, neg = np.flatnonzero(labels[train_m] > 0.5), np.flatnonzero(labels[train_m] < 0.5)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay)

    def val_logits() -> torch.Tensor:
        model.eval()
        with torch.no_grad():
            return model.logits_from_features({c: feats_va[c][0] for c in cfg.cameras})

    history: list[dict[str, float]] = []
    best = (float("inf"), 0, model.head_state())
    half = tc.batch_size // 2
    from tqdm import tqdm

    for step in tqdm(range(1, tc.steps + 1), desc="train success classifier", unit="step", disable=not progress):
        model.train()
        idx = torch.from_numpy(np.concatenate([rng.choice(pos, half), rng.choice(neg, tc.batch_size - half)]))
        view = torch.randint(0, 1 + tc.aug_views, (len(idx),), generator=gen)
        logits = model.logits_from_features({c: feats_tr[c][view, idx] for c in cfg.cameras})
        assert logits.shape == (len(idx),), f"logits {list(logits.shape)}, expected [{len(idx)}]"
        loss = F.binary_cross_entropy_with_logits(logits, y_tr[idx])  # the batch is class-balanced
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % tc.eval_every == 0 or step == tc.steps:
            vl = _balanced_bce(val_logits(), y_va)
            history.append({"step": step, "train_loss": float(loss.detach()), "val_loss": vl})
            if vl < best[0]:
                best = (vl, step, model.head_state())
    model.load_state_dict(best[2], strict=False)  # the head; the trunk never changed
    p_va = torch.sigmoid(val_logits()).numpy()
    thr, met = choose_threshold(p_va, labels[val_m], tc.target_precision)
    model.cfg = dataclasses.replace(cfg, threshold=thr)
    at_thr, at_half = binary_metrics(p_va, labels[val_m], thr), binary_metrics(p_va, labels[val_m], 0.5)
    n_groups = lambda m: int(len(np.unique(data.groups[m])))  # noqa: E731
    report = {"out_dir": os.path.abspath(out_dir), "threshold": thr, "target_precision": tc.target_precision,
              "target_precision_met": met, "val": at_thr, "val_at_0.5": at_half,
              "val_average_precision": average_precision(p_va, labels[val_m]),
              "train_frames": int(train_m.sum()), "train_positives": int(len(pos)), "train_episodes": n_groups(train_m),
              "val_frames": int(val_m.sum()), "val_episodes": n_groups(val_m), "best_step": best[1],
              "best_val_loss": best[0], "steps": tc.steps, "wall_s": time.perf_counter() - t0,
              "train_config": dataclasses.asdict(tc), "history": history, **(extra or {})}
    os.makedirs(out_dir, exist_ok=True)
    model.save(out_dir, extra={"val": at_thr, "target_precision_met": met, **(extra or {})})
    _atomic_write_text(os.path.join(out_dir, "report.json"), json.dumps(report, indent=2))
    plot_pr(p_va, labels[val_m], thr, tc.target_precision, os.path.join(out_dir, "pr_curve.png"),
            title=os.path.basename(os.path.normpath(out_dir)))
    if not met:
        log.warning("no threshold reaches precision %.2f on the validation frames; using the most precise one "
                    "(%.3f). More labelled episodes (or more positive frames per episode) help.",
                    tc.target_precision, thr)
    return report


def plot_pr(probs: np.ndarray, labels: np.ndarray, threshold: float, target_precision: float, path: str,
            title: str = "") -> None:
    """Validation precision-recall curve with the chosen operating point, and P(success) per class."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prec, rec, _ = precision_recall_curve(probs, labels)
    m = binary_metrics(probs, labels, threshold)
    y = np.asarray(labels) > 0.5
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.step(np.r_[0.0, rec], np.r_[1.0, prec], where="post", lw=2)
    a.axhline(target_precision, color="gray", ls="--", lw=1, label=f"target precision {target_precision:.2f}")
    a.plot([m["recall"]], [m["precision"] if m["tp"] + m["fp"] else 1.0], "ro",
           label=f"threshold {threshold:.3f}: P {m['precision']:.2f} R {m['recall']:.2f}")
    a.set_xlabel("recall")
    a.set_ylabel("precision")
    a.set_xlim(-0.02, 1.02)
    a.set_ylim(-0.02, 1.02)
    a.grid(alpha=0.3)
    a.legend(fontsize=8, loc="lower left")
    a.set_title(f"validation precision-recall (AP {average_precision(probs, labels):.3f})")
    bins = np.linspace(0, 1, 41)
    b.hist(np.asarray(probs)[~y], bins=bins, alpha=0.6, label=f"negative frames ({int((~y).sum())})")
    b.hist(np.asarray(probs)[y], bins=bins, alpha=0.6, label=f"positive frames ({int(y.sum())})")
    b.axvline(threshold, color="r", lw=1)
    b.set_yscale("log")
    b.set_xlabel("P(success)")
    b.set_ylabel("frames")
    b.legend(fontsize=8)
    b.set_title("validation frames")
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def evaluate_classifier(path: str, data: LabelledFrames, threshold: float | None = None) -> dict[str, Any]:
    """Metrics of a saved classifier on labelled frames (at its threshold unless given)."""
    model = SuccessClassifier.load(path)
    missing = [c for c in model.cameras if c not in data.images]
    if missing:
        raise ValueError(f"the dataset has no camera(s) {missing} (it has {sorted(data.images)}); the classifier "
                         f"was trained on {list(model.cameras)}")
    probs = model.predict_proba({c: data.images[c] for c in model.cameras})
    thr = model.threshold if threshold is None else float(threshold)
    return {**binary_metrics(probs, data.labels, thr), "average_precision": average_precision(probs, data.labels),
            "episodes": int(len(np.unique(data.groups)))}
