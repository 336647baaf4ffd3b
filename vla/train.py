"""Supervised fine-tuning of a VLA on LeRobot demonstration datasets (``vla train``).

The loop (CleanRL-style: one file, top to bottom):

1. load every episode of every ``--dataset`` (multi-task: each episode keeps its instruction),
   compute normalisation statistics (state mean / std, action min / max) and build the
   action-chunk targets ``a[t : t + H]`` (padded by repeating the last action); with ``--tokens``
   every frame also gets its ExToken behaviour token (``batch["token"]``, the null token 0 on
   ``token_dropout`` of the samples);
2. in ``frozen`` mode the pretrained trunk never changes, so its feature maps are computed
   once, for the original frames and ``aug_views`` augmented copies (random shift + colour
   jitter), and cached in the run directory; in ``lora`` / ``full`` mode the trunk runs on
   freshly augmented frames every step;
3. AdamW + warm-up / cosine schedule, gradient clipping, an exponential moving average of the
   weights (what is saved and evaluated);
4. every ``save_every`` steps: a checkpoint (EMA model + full training state: weights,
   optimiser, scheduler, EMA, step, RNG states), ``loss.csv``, TensorBoard scalars and
   ``loss_curve.png``. ``--resume RUN_DIR`` continues from the last checkpoint exactly.

Several processes (``accelerate launch --multi_gpu --num_processes N -m vla.cli train ...``, or
``torchrun``; ``vla.distributed``): ``--batch-size`` stays the *global* batch. Every process draws
the whole global batch and all its randomness from the same seeded generators (``draw_batch``) and
trains on its own ``1 / N`` of the rows; DDP averages the gradients, so each update is the one a
single process would make, up to the order of float sums. The generators advance the same whatever
N is, so a run resumes on any number of processes. The main process alone writes the run directory
and shows the progress bar.

Run directory::

    RUN_DIR/train_config.json   the TrainConfig
    RUN_DIR/checkpoints/0002000/{config.json, model.safetensors, train_state.pt}
    RUN_DIR/checkpoints/last    name of the newest complete checkpoint (written last)
    RUN_DIR/model -> the final EMA model (same files as a checkpoint)
    RUN_DIR/loss.csv, loss_curve.png, tb/
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import random
import shutil
import time
from typing import Any

import numpy as np
import torch

from vla.models import last_checkpoint, resolve_checkpoint
from vla.train_config import MODES, TrainConfig  # noqa: F401 (re-exported)


# -- data ----------------------------------------------------------------------------------
@dataclasses.dataclass
class TrainData:
    state: torch.Tensor          # [N, S]
    chunks: torch.Tensor         # [N, H, A]
    text_idx: torch.Tensor       # [R] -> row of text_emb (R = N, or more when a frame has two labels)
    text_emb: torch.Tensor       # [T, 384]
    instructions: list[str]
    images: dict[str, torch.Tensor]  # cam -> uint8 [N, s, s, 3]
    wordings: list[str] = dataclasses.field(default_factory=list)
    """Rows of text_emb: the instructions first, then their paraphrases."""
    alt: torch.Tensor | None = None  # [T, K] rows of text_emb that word instruction t (padded)
    n_alt: torch.Tensor | None = None  # [T] how many of alt[t] are real
    frame_of: torch.Tensor | None = None
    """[R] frame of each training row when frames carry two labels (the episode's instruction and
    their sub-skill's); None: row i is frame i."""
    fmaps: dict[str, torch.Tensor] | None = None  # map name -> float16 [V, N, C, h, w] (view 0 = original)
    episodes: int = 0
    opening: torch.Tensor | None = None
    """[N] bool: the frame lies within the first ``horizon`` ticks of its episode."""
    tokens: torch.Tensor | None = None
    """[N] ExToken behaviour token (1..K) of every frame, aligned with ``state``; None without ``--tokens``."""
    row_mask: torch.Tensor | None = None
    """[N, H] bool: the chunk rows that train (``--dagger-rows coherent``); None: every row."""
    segments: list[tuple[int, int]] | None = None
    """``[start, end)`` frames of each dataset, in ``--dataset`` order; None: one."""


def build_data(cfg: TrainConfig, text_encoder, prior=None, progress: bool = True
               ) -> tuple[TrainData, dict[str, np.ndarray], list[str]]:
    """``prior``: an ExToken ``TokenPrior`` (``--tokens``) that gives every frame its behaviour token."""
    from vla.data.demos import action_chunks, coherent_rows, load_demos

    eps = load_demos(list(cfg.datasets), cfg.image_size, list(cfg.cameras) if cfg.cameras else None,
                     success_only=cfg.success_only, crops={c[0]: tuple(c[1:]) for c in cfg.crops}, progress=progress)
    if not eps:
        raise ValueError(f"the datasets {list(cfg.datasets)} hold no "
                         f"{'successful ' if cfg.success_only else ''}episodes")
    cams = list(cfg.cameras) if cfg.cameras else list(eps[0].images)
    frame_of, labels = frame_labels(eps, cfg.labels)
    instructions = sorted(set(labels))
    state = np.concatenate([e.state for e in eps])
    action = np.concatenate([e.action for e in eps])
    chunks = np.concatenate([action_chunks(e.action, cfg.horizon)[0] for e in eps])
    row_of = {t: i for i, t in enumerate(instructions)}
    text_idx = np.array([row_of[t] for t in labels], dtype=np.int64)
    images = {c: torch.from_numpy(np.concatenate([e.images[c] for e in eps])) for c in cams}
    stats = {"state_mean": state.mean(0), "state_std": state.std(0), "action_min": action.min(0),
             "action_max": action.max(0)}
    wordings, alt = paraphrase_table(instructions, dict(cfg.paraphrases))
    data = TrainData(state=torch.from_numpy(state), chunks=torch.from_numpy(chunks).float(),
                     text_idx=torch.from_numpy(text_idx).long(), text_emb=text_encoder(wordings),
                     instructions=instructions, images=images, episodes=len(eps), wordings=wordings,
                     frame_of=None if frame_of is None else torch.from_numpy(frame_of).long())
    data.opening = torch.from_numpy(np.concatenate([np.arange(len(e.action)) < cfg.horizon for e in eps]))
    ends = np.cumsum([len(e) for e in eps])
    data.segments = [(int(ends[i - 1]) if i else 0, int(ends[j]))  # each dataset's frames: contiguous, in --dataset order
                     for i, j in _runs([e.dataset for e in eps])]
    if cfg.dagger_rows == "coherent":
        if not any(e.driven is not None for e in eps):
            raise ValueError(f"--dagger-rows coherent: none of the datasets {list(cfg.datasets)} holds frames a policy "
                             "drove (episodes recorded by `vla record --dagger`, intervention False); it would change "
                             "nothing")
        data.row_mask = torch.from_numpy(np.concatenate([coherent_rows(e.driven, len(e), cfg.horizon) for e in eps]))
    if prior is not None:  # frame i of the concatenated episodes -> (its dataset, episode, frame within it) -> token
        data.tokens = torch.from_numpy(prior.frame_tokens([(e.dataset, e.episode_index, e.action) for e in eps])).long()
    if len(wordings) > len(instructions):
        k = max(len(a) for a in alt)
        data.alt = torch.tensor([a + [a[0]] * (k - len(a)) for a in alt], dtype=torch.long)
        data.n_alt = torch.tensor([len(a) for a in alt], dtype=torch.long)
    return data, stats, cams


def _runs(names: list[str]) -> list[tuple[int, int]]:
    """``(first, last)`` index of each run of equal consecutive names."""
    out: list[tuple[int, int]] = []
    for i, n in enumerate(names):
        if out and names[out[-1][0]] == n:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def frame_labels(eps, labels: str) -> tuple[np.ndarray | None, list[str]]:
    """The training rows: ``(frame_of, instruction per row)``. ``episode``: every frame with its
    episode's instruction; ``frame``: with its own task (the sub-skill it belongs to, for data
    recorded with ``--label-subskills``); ``both``: each frame with its episode's instruction, and
    a second time with its sub-skill's where that differs. ``frame_of`` is None when row i is frame i."""
    rows_frame: list[np.ndarray] = []
    rows_text: list[str] = []
    off, two = 0, False
    for e in eps:
        n = len(e)
        own = e.frame_instructions or [e.instruction] * n
        rows_frame.append(off + np.arange(n))
        rows_text += own if labels == "frame" else [e.instruction] * n
        extra = [j for j in range(n) if own[j] != e.instruction] if labels == "both" else []
        if extra:
            two = True
            rows_frame.append(off + np.asarray(extra))
            rows_text += [own[j] for j in extra]
        off += n
    return (np.concatenate(rows_frame) if two else None), rows_text


def paraphrase_table(instructions: list[str], paraphrases: dict[str, tuple[str, ...]]
                     ) -> tuple[list[str], list[list[int]]]:
    """The wordings to embed (the instructions, then the paraphrases of those in the data) and, per
    instruction, the rows that word it (itself first). A paraphrase that is another instruction of
    the data would teach one task's wording for another: refused."""
    wordings = list(instructions)
    alt = [[i] for i in range(len(instructions))]
    for i, ins in enumerate(instructions):
        for w in paraphrases.get(ins, ()):
            if w in instructions and w != ins:
                raise ValueError(f"paraphrase {w!r} of {ins!r} is another instruction of the datasets: "
                                 "one wording cannot mean two tasks")
            if w not in wordings:
                wordings.append(w)
            if wordings.index(w) not in alt[i]:
                alt[i].append(wordings.index(w))
    owners: dict[int, list[str]] = {}
    for i, rows in enumerate(alt):
        for r in rows:
            owners.setdefault(r, []).append(instructions[i])
    shared = {wordings[r]: who for r, who in owners.items() if len(who) > 1}
    if shared:
        raise ValueError(f"paraphrases shared between instructions: {shared}; one wording cannot mean two tasks")
    return wordings, alt


def paraphrases_used(data: TrainData) -> dict[str, list[str]]:
    """``{instruction: [its paraphrases trained on]}`` for the instructions that have any."""
    if data.alt is None:
        return {}
    return {ins: [data.wordings[r] for r in rows[1:int(k)]] for ins, rows, k in
            zip(data.instructions, data.alt.tolist(), data.n_alt.tolist()) if k > 1}


def sample_text_rows(data: TrainData, idx: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Rows of text_emb for a batch of frames: each frame's instruction, or with paraphrases one of
    its wordings uniformly."""
    ti = data.text_idx[idx]
    if data.alt is None:
        return ti
    r = (torch.rand(len(ti), generator=gen) * data.n_alt[ti]).long().clamp_max(data.alt.shape[1] - 1)
    return data.alt[ti, r]


def frame_sampler(data: TrainData, balance: str, batch_size: int, gen: torch.Generator, opening_weight: float = 1.0):
    """Draws a batch of training rows (frames, each with one instruction): uniformly over the rows
    (``frames``), or an instruction uniformly and then one of its rows (``tasks``). One instruction:
    the two are the same draw. ``opening_weight`` != 1: a row whose frame opens its episode (``data.opening``)
    weighs that much more."""
    n = len(data.text_idx)
    uniform = balance == "frames" or len(data.instructions) == 1
    if uniform and opening_weight == 1.0:
        return lambda: torch.randint(0, n, (batch_size,), generator=gen)
    if uniform:
        weights = torch.ones(n, dtype=torch.float64)
    else:
        counts = torch.bincount(data.text_idx, minlength=len(data.instructions)).double()
        weights = 1.0 / counts[data.text_idx]
    if opening_weight != 1.0:
        frame = torch.arange(n) if data.frame_of is None else data.frame_of
        weights = weights * torch.where(data.opening[frame], opening_weight, 1.0).double()
    return lambda: torch.multinomial(weights, batch_size, replacement=True, generator=gen)


def augment(images: torch.Tensor, cfg: TrainConfig, gen: torch.Generator) -> torch.Tensor:
    from vla.models.encoders import color_jitter, random_shift

    return color_jitter(random_shift(images, cfg.shift_pad, gen), cfg.jitter, gen)


def draw_batch(data: TrainData, cfg: TrainConfig, draw, gen: torch.Generator, state_std: torch.Tensor,
               part: slice = slice(None)) -> dict[str, Any]:
    """One step's training batch (CPU tensors), the rows ``part`` of it. The global batch of ``cfg.batch_size``
    rows and all its randomness -- state noise, wordings, cached views or image augmentations, dropped tokens,
    the flow-matching noise and times -- are drawn in full, from ``gen`` and the global torch generator, in
    every process alike; then ``part`` keeps this process's rows (``Processes.part``). So the parts of a step
    are, together, exactly the batch one process trains on, and the generators advance the same whatever the
    number of processes (a run resumes on any number). The draws come in the order they always did: one
    process trains as it did before multi-process training existed."""
    from vla.models.flow import sample_flow_time

    rows = draw()
    idx = rows if data.frame_of is None else data.frame_of[rows]
    state = data.state[idx]
    state = state + cfg.state_noise * state_std * torch.randn(state.shape, generator=gen)
    text = data.text_emb[sample_text_rows(data, rows, gen)]
    mine = idx[part]
    batch: dict[str, Any] = {"state": state[part], "action": data.chunks[mine], "text": text[part]}
    if data.row_mask is not None:  # weighed over the global batch, then cut: the parts average to its mean
        from vla.models.flow import row_weights

        batch["action_weight"] = row_weights(data.row_mask[idx])[part]
    if data.fmaps is not None:
        view = torch.randint(0, 1 + cfg.aug_views, (cfg.batch_size,), generator=gen)
        batch["fmaps"] = {k: f[view[part], mine].float() for k, f in data.fmaps.items()}
    else:  # augmented whole (the draws go image by image), then cut: cheap next to the trunk that runs on the part
        batch["images"] = {c: augment(imgs[idx], cfg, gen)[part] for c, imgs in data.images.items()}
    if data.tokens is not None:
        # each sample's behaviour token; token_dropout of them get the null token 0 instead
        # (classifier-free-guidance style), so the VLA keeps acting without one
        drop = torch.rand(len(idx), generator=gen) < cfg.token_dropout
        batch["token"] = data.tokens[idx].masked_fill(drop, 0)[part]
    # flow-matching noise and time from the global torch generator: seeded alike and drawn only here in every process
    batch["noise"] = torch.randn(len(idx), *data.chunks.shape[1:])[part]
    batch["t"] = sample_flow_time(len(idx))[part]
    return batch


class TrainStep(torch.nn.Module):
    """A training step's forward pass as one module call: the trunk's features when the batch brings images
    (lora / full), then the flow-matching loss. DDP averages the gradients of what runs inside the forward
    of the module it wraps, so both must run here, not as separate calls on the VLA."""

    def __init__(self, vla) -> None:
        super().__init__()
        self.vla = vla

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        if "images" in batch:
            fmaps = self.vla.trunk_features(batch["images"])
            batch = {**{k: v for k, v in batch.items() if k != "images"}, "fmaps": fmaps}
        return self.vla.loss(batch)[0]


def _to(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: _to(v, device) if isinstance(v, dict) else v.to(device) for k, v in batch.items()}


def _feature_keys(model, data: TrainData, cfg: TrainConfig) -> list[tuple[int, int, str]]:
    """``(start, end, key)`` per dataset of ``data`` (its frames are contiguous): the key names the dataset's trunk
    features by content -- the frames the trunk sees (cameras, after crop and resize), the trunk's weights and the
    augmentation settings and seed -- so a cache file is reused exactly when it holds what would be computed."""
    import hashlib

    trunk = hashlib.sha256()
    for name, t in sorted(model.trunk.state_dict().items()):
        trunk.update(name.encode())
        trunk.update(t.detach().cpu().contiguous().numpy().tobytes())
    settings = json.dumps({"trunk": trunk.hexdigest(), "views": 1 + cfg.aug_views, "shift_pad": cfg.shift_pad,
                           "jitter": cfg.jitter, "seed": cfg.seed, "cameras": sorted(data.images)}, sort_keys=True)
    out = []
    for start, end in data.segments or [(0, len(data.state))]:
        h = hashlib.sha256(settings.encode())
        for cam in sorted(data.images):
            h.update(cam.encode())
            h.update(data.images[cam][start:end].numpy().tobytes())
        out.append((start, end, h.hexdigest()[:32]))
    return out


@torch.no_grad()
def cache_features(model, data: TrainData, cfg: TrainConfig, path: str | None, device: torch.device | str = "cpu",
                   shared: str | None = None) -> dict[str, torch.Tensor]:
    """Trunk feature maps of every frame (view 0 = original, then ``aug_views`` augmented), float16 on the
    CPU; the trunk runs on ``device`` (where ``model`` is). Each dataset's features are computed with their own
    augmentation draws (seeded by ``cfg.seed`` and the dataset's content key, ``_feature_keys``), so they are the
    same whichever datasets they are trained beside. ``shared`` (``vla train --feature-cache DIR``): one file per
    dataset there, ``<key>.pt``, reused by every run that trains on that dataset with the same trunk and settings;
    else the whole set is written to ``path`` (the run directory), reused on resume. Files are written
    atomically."""
    from tqdm import tqdm

    n = len(data.state)
    views = 1 + cfg.aug_views
    keys = _feature_keys(model, data, cfg)
    if shared is None and path is not None and os.path.isfile(path):
        cached = torch.load(path, weights_only=True)
        # a file from before the content keys ("keys" absent) is trusted on its frame and view counts, as it was
        if cached.get("n") == n and cached.get("views") == views and cached.get("keys", keys) == keys:
            return cached["fmaps"]
    found: dict[str, dict[str, torch.Tensor]] = {}
    if shared is not None:
        os.makedirs(shared, exist_ok=True)
        for start, end, key in keys:
            f = os.path.join(shared, key + ".pt")
            if os.path.isfile(f):
                got = torch.load(f, weights_only=True)
                if got.get("n") == end - start and got.get("views") == views:
                    found[key] = got["fmaps"]
    todo = [k for k in keys if k[2] not in found]
    model.eval()
    bar = tqdm(total=views * sum(e - s for s, e, _ in todo), desc="cache trunk features", unit="frame",
               disable=not todo)
    for start, end, key in todo:
        gen = torch.Generator().manual_seed(cfg.seed + 12345 + int(key[:12], 16))
        per_view: list[dict[str, torch.Tensor]] = []
        for v in range(views):
            out: dict[str, torch.Tensor] = {}
            for cam, imgs in data.images.items():
                parts: dict[str, list[torch.Tensor]] = {}
                for i in range(start, end, 128):
                    x = imgs[i:min(i + 128, end)]
                    if v > 0:
                        x = augment(x, cfg, gen)
                    fine, coarse = model.trunk(x.to(device))
                    parts.setdefault(cam, []).append(coarse.half().cpu())
                    if fine is not None:
                        parts.setdefault(cam + "@fine", []).append(fine.half().cpu())
                    bar.update(len(x) / len(data.images))
                out.update({k: torch.cat(p) for k, p in parts.items()})
            per_view.append(out)
        found[key] = {k: torch.stack([v[k] for v in per_view]) for k in per_view[0]}
        if shared is not None:
            f = os.path.join(shared, key + ".pt")
            torch.save({"n": end - start, "views": views, "fmaps": found[key]}, f + ".tmp")
            os.replace(f + ".tmp", f)
    bar.close()
    names = list(found[keys[0][2]])
    fmaps = {k: torch.cat([found[key][k] for _, _, key in keys], dim=1) for k in names}
    if shared is None and path is not None:
        torch.save({"n": n, "views": views, "keys": keys, "fmaps": fmaps}, path + ".tmp")
        os.replace(path + ".tmp", path)
    return fmaps


def _sim_tasks(datasets) -> list[str]:
    """Sim task names recorded in the datasets' episode logs (empty for real data)."""
    from vla.data.episode_log import read_episode_log

    names: dict[str, None] = {}
    for d in datasets:
        try:
            rows = read_episode_log(d)
        except FileNotFoundError:
            continue
        for _, row in sorted(rows.items()):
            if row.get("task"):
                names[row["task"]] = None
    return list(names)


def _where(path: str) -> str:
    """A dataset's path as a checkpoint records it: relative to the working directory when it lies
    inside it (a checkpoint committed with a repository names no machine's paths), else absolute."""
    p = os.path.abspath(path)
    rel = os.path.relpath(p)
    return p if rel == ".." or rel.startswith(".." + os.sep) else rel


def load_token_prior(cfg: TrainConfig, ckpt: str | None):
    """``--tokens``: the ExToken ``TokenPrior``, checked before any frame is decoded: its K is the model's
    ``num_tokens``, it covers every episode trained on, and on resume it is the file the run started with.
    None without ``--tokens``."""
    if not cfg.tokens:
        return None
    from vla.data.tokens import load_prior
    from vla.data.demos import load_demos

    prior = load_prior(cfg.tokens)
    if cfg.num_tokens != prior.k:
        raise ValueError(f"--tokens {cfg.tokens} holds K={prior.k} tokens but the model has num_tokens="
                         f"{cfg.num_tokens} (--num-tokens / --init): they must agree")
    eps = load_demos(list(cfg.datasets), None, cameras=[], success_only=cfg.success_only, progress=False)
    prior.frame_tokens([(e.dataset, e.episode_index, e.action) for e in eps])  # refuses an uncovered episode by name
    if ckpt is not None:
        with open(os.path.join(ckpt, "config.json")) as f:
            was = (json.load(f).get("tokens") or {}).get("file_sha256")
        if was != prior.file_sha256:
            raise ValueError(f"--resume: {cfg.tokens} changed since the run started (sha256 {prior.file_sha256[:12]}, "
                             f"the run's checkpoint has {str(was)[:12]}): restore it or start a new run")
    return prior


# -- checkpoints ---------------------------------------------------------------------------
def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])


def save_checkpoint(run_dir: str, step: int, model, ema_model, opt, sched, gen: torch.Generator, keep: int,
                    extra: dict[str, Any]) -> str:
    ckpt_root = os.path.join(run_dir, "checkpoints")
    name = f"{step:07d}"
    final = os.path.join(ckpt_root, name)
    tmp = final + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    ema_model.save(tmp, extra={"step": step, **extra})
    torch.save({"step": step, "model": model.state_dict(), "ema": ema_model.state_dict(),
                "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": _rng_state(),
                "generator": gen.get_state()}, os.path.join(tmp, "train_state.pt"))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    with open(os.path.join(ckpt_root, "last.tmp"), "w") as f:
        f.write(name)
    os.replace(os.path.join(ckpt_root, "last.tmp"), os.path.join(ckpt_root, "last"))
    done = sorted(d for d in os.listdir(ckpt_root) if d.isdigit())
    for old in done[:-keep]:
        shutil.rmtree(os.path.join(ckpt_root, old), ignore_errors=True)
    return final


def plot_loss(csv_path: str, png_path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, losses = [], []
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            steps.append(int(row["step"]))
            losses.append(float(row["loss"]))
    if not steps:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, losses, lw=0.8, alpha=0.5, label="loss (batch)")
    if len(losses) >= 10:
        k = max(5, len(losses) // 30)
        sm = np.convolve(losses, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1:], sm, lw=1.8, label=f"moving average ({k})")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("flow-matching loss")
    ax.set_title(os.path.basename(os.path.dirname(os.path.abspath(csv_path))))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path + ".tmp.png", dpi=120)
    plt.close(fig)
    os.replace(png_path + ".tmp.png", png_path)


def init_weights(model, path: str) -> None:
    """Copy a compact checkpoint's weights *and* normalisation statistics into ``model`` (``--init``:
    fine-tuning, DAgger rounds). The architectures must be the same."""
    from vla.models.compact import CompactVLA

    src = CompactVLA.load(resolve_checkpoint(path))
    if src.mode == "lora":
        raise ValueError(f"--init {path}: a LoRA checkpoint cannot seed a new run (start from a frozen or full one)")
    want = dataclasses.replace(model.cfg, pretrained=False)
    if src.cfg != want:
        diff = {f.name: (getattr(src.cfg, f.name), getattr(want, f.name)) for f in dataclasses.fields(want)
                if getattr(src.cfg, f.name) != getattr(want, f.name)}
        raise ValueError(f"--init {path}: its model differs from this run's in {sorted(diff)} "
                         f"(checkpoint vs run: {diff}); train with the checkpoint's settings")
    model.load_state_dict(src.state_dict())


# -- the loop ------------------------------------------------------------------------------
def _quiet(*args, **kwargs) -> None:
    """``print`` in the processes other than the main one."""


def _start_loss_csv(csv_path: str, start: int) -> None:
    """A new ``loss.csv``, or on resume the old one without the rows logged after step ``start``."""
    if start == 0 or not os.path.isfile(csv_path):
        with open(csv_path, "w") as f:
            f.write("step,loss,lr,samples_per_s\n")
        return
    with open(csv_path) as f:
        rows = f.read().splitlines()
    keep = [rows[0]] + [r for r in rows[1:] if r and int(r.split(",")[0]) <= start]
    with open(csv_path + ".tmp", "w") as f:
        f.write("\n".join(keep) + "\n")
    os.replace(csv_path + ".tmp", csv_path)


def train(cfg: TrainConfig, resume: bool = False, progress: bool = True, feature_cache: str | None = None
          ) -> dict[str, Any]:
    """Train (or with ``resume`` continue) the run ``cfg.out``. Under ``accelerate launch`` / ``torchrun``
    every process calls this; the main one writes the run directory and shows the progress bar."""
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    from vla.data.atomic import atomic_write_bytes
    from vla.distributed import start_processes
    from vla.models.compact import CompactVLA, CompactVLAConfig
    from vla.models.modes import count_parameters

    procs = start_processes()
    part = procs.part(cfg.batch_size)  # this process's rows of every global batch
    say = print if procs.is_main else _quiet
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run_dir = cfg.out
    os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
    cfg_path = os.path.join(run_dir, "train_config.json")
    ckpt = last_checkpoint(run_dir) if resume else None
    if not resume and last_checkpoint(run_dir) is not None:
        raise FileExistsError(f"{run_dir} already holds a training run: pass --resume to continue it, "
                              "or choose another --out")
    procs.wait()  # every process has looked at the run directory before the main one writes to it
    if not resume and procs.is_main:
        with open(cfg_path + ".tmp", "w") as f:
            json.dump(dataclasses.asdict(cfg), f, indent=2)
        os.replace(cfg_path + ".tmp", cfg_path)

    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)

    prior = load_token_prior(cfg, ckpt)

    from vla.models.encoders import TextEncoder

    text = TextEncoder()
    data, stats, cams = build_data(cfg, text, prior, progress=progress and procs.is_main)
    if cfg.paraphrases and data.alt is None:
        raise ValueError(f"--paraphrases: none of its {len(cfg.paraphrases)} instructions is in the datasets, whose "
                         f"instructions are {data.instructions}")
    mcfg = CompactVLAConfig(cameras=tuple(cams), image_size=cfg.image_size, horizon=cfg.horizon,
                            state_dim=data.state.shape[1], action_dim=data.chunks.shape[2], num_tokens=cfg.num_tokens,
                            neck=cfg.neck, crops=cfg.crops, fine_blocks=cfg.fine_blocks,
                            hidden=cfg.head_hidden, depth=cfg.head_depth, head_film=cfg.head_film)
    model = CompactVLA(mcfg)
    model.set_normalization(**stats, **CompactVLA.text_stats(data.text_emb))
    if cfg.init and ckpt is None:
        init_weights(model, cfg.init)
    model.set_mode(cfg.mode, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_targets=cfg.lora_targets)
    model.to(procs.device)
    if cfg.mode == "frozen":  # the main process computes (or finds) the feature cache; the others then read it
        cache = os.path.join(run_dir, "features_cache.pt")
        if procs.is_main:
            data.fmaps = cache_features(model, data, cfg, cache, procs.device, shared=feature_cache)
        procs.wait()
        if data.fmaps is None:
            data.fmaps = (cache_features(model, data, cfg, None, procs.device, shared=feature_cache) if feature_cache
                          else torch.load(cache, weights_only=True)["fmaps"])
    ema_model = CompactVLA(dataclasses.replace(mcfg, pretrained=False))
    if cfg.mode == "lora":
        ema_model.set_mode("lora", lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_targets=cfg.lora_targets)
    ema_model.to(procs.device)
    ema_model.load_state_dict(model.state_dict())
    ema_model.mode = model.mode
    for p in ema_model.parameters():
        p.requires_grad_(False)

    params = model.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def lr_lambda(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    start = 0
    if ckpt is not None:
        st = torch.load(os.path.join(ckpt, "train_state.pt"), map_location="cpu", weights_only=False)
        model.load_state_dict(st["model"])
        ema_model.load_state_dict(st["ema"])
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        _set_rng_state(st["rng"])
        gen.set_state(st["generator"])
        start = int(st["step"])
        say(f"resumed {run_dir} from step {start} ({ckpt})")
    # several processes: the step runs under DDP (gradients averaged in backward); one process: as it is
    step_fn, opt = procs.prepare(TrainStep(model), opt)

    counts = count_parameters(model)
    n = len(data.state)
    per_instruction = torch.bincount(data.text_idx, minlength=len(data.instructions)).tolist()
    info = {"episodes": data.episodes, "frames": n, "instructions": data.instructions, "cameras": cams,
            "frames_per_instruction": dict(zip(data.instructions, per_instruction)), "balance": cfg.balance,
            "paraphrases": paraphrases_used(data),
            "parameters": counts}
    if data.tokens is not None:
        per_token = torch.bincount(data.tokens, minlength=prior.k + 1)[1:].tolist()
        info["tokens"] = {"file": cfg.tokens, "k": prior.k, "unit": prior.unit, "frames_per_token": per_token,
                          "token_dropout": cfg.token_dropout}
        say(f"behaviour tokens: K={prior.k} ({prior.unit} unit) from {cfg.tokens}, frames per token {per_token}, "
            f"null token on {cfg.token_dropout:.0%} of the samples")
    if data.row_mask is not None:
        first_only = int((data.row_mask.sum(1) == 1).sum())
        info["dagger_rows"] = {"rule": cfg.dagger_rows, "rows_kept": round(float(data.row_mask.float().mean()), 4),
                               "frames_first_row_only": first_only}
        say(f"--dagger-rows {cfg.dagger_rows}: {first_only} frames a policy drove train their first chunk row only; "
            f"{data.row_mask.float().mean():.0%} of all chunk rows train")
    if procs.is_main:
        atomic_write_bytes(os.path.join(run_dir, "data_summary.json"), json.dumps(info, indent=2).encode())
    if data.alt is not None:
        say(f"paraphrases: {len(data.wordings) - len(data.instructions)} more wordings for "
            f"{len(info['paraphrases'])} of the {len(data.instructions)} instructions")
    say(f"{data.episodes} episodes, {n} frames, {len(data.instructions)} instruction(s); mode {cfg.mode}: "
        f"{counts['trainable']:,} of {counts['total']:,} parameters train"
        + (f"; {procs.world} processes, {cfg.batch_size // procs.world} samples each per step of "
           f"{cfg.batch_size}, on {procs.device.type}" if procs.world > 1 else ""))

    tb = SummaryWriter(os.path.join(run_dir, "tb"), purge_step=start if start else None) if procs.is_main else None
    csv_path = os.path.join(run_dir, "loss.csv")
    if procs.is_main:
        _start_loss_csv(csv_path, start)

    step_fn.train()
    extra = {"instructions": data.instructions, "paraphrases": info["paraphrases"], "sim_tasks": _sim_tasks(cfg.datasets),
             "train": {"datasets": [_where(d) for d in cfg.datasets], "mode": cfg.mode}}
    if prior is not None:
        from vla.data.tokens import checkpoint_block

        extra["tokens"] = checkpoint_block(prior)
    t0 = time.perf_counter()
    t_log, samples_since = t0, 0
    draw = frame_sampler(data, cfg.balance, cfg.batch_size, gen, cfg.opening_weight)
    state_std = model.state_std.detach().cpu()
    bar = tqdm(total=cfg.steps, initial=start, desc="train", unit="step", disable=not (progress and procs.is_main))
    step = start
    stopped_early = False
    try:
        while step < cfg.steps:
            batch = _to(draw_batch(data, cfg, draw, gen, state_std, part), procs.device)
            loss = step_fn(batch)  # this process's rows; the mean over them
            opt.zero_grad(set_to_none=True)
            procs.backward(loss)  # several processes: DDP leaves the processes' mean gradient in every one
            gnorm = procs.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            sched.step()
            with torch.no_grad():
                d = cfg.ema_decay if step >= cfg.warmup_steps else 0.0
                for pe, pm in zip(ema_model.state_dict().values(), model.state_dict().values()):
                    if pe.dtype.is_floating_point:
                        pe.mul_(d).add_(pm.detach(), alpha=1 - d)
                    else:
                        pe.copy_(pm)
            step += 1
            samples_since += cfg.batch_size
            bar.update(1)
            if step % cfg.log_every == 0 or step == cfg.steps:
                lv = procs.mean(loss)  # the global batch's mean loss
                now = time.perf_counter()
                sps = samples_since / max(now - t_log, 1e-9)
                t_log, samples_since = now, 0
                if procs.is_main:
                    tb.add_scalar("train/loss", lv, step)
                    tb.add_scalar("train/lr", sched.get_last_lr()[0], step)
                    tb.add_scalar("train/grad_norm", float(gnorm), step)
                    tb.add_scalar("perf/samples_per_s", sps, step)
                    with open(csv_path, "a") as f:
                        f.write(f"{step},{lv:.6f},{sched.get_last_lr()[0]:.3e},{sps:.1f}\n")
                bar.set_postfix(loss=f"{lv:.4f}", sps=f"{sps:.0f}")
            # one clock decides for every process, so that all stop (and the main one saves) at the same step
            out_of_time = cfg.max_minutes is not None and procs.main_says(
                (time.perf_counter() - t0) / 60 >= cfg.max_minutes)
            if (step % cfg.save_every == 0 or step == cfg.steps or out_of_time) and procs.is_main:
                save_checkpoint(run_dir, step, model, ema_model, opt, sched, gen, cfg.keep_checkpoints, extra)
                plot_loss(csv_path, os.path.join(run_dir, "loss_curve.png"))
            if out_of_time:
                stopped_early = True
                if procs.is_main:
                    tqdm.write(f"--max-minutes {cfg.max_minutes:g} reached at step {step}; saved")
                break
    finally:
        bar.close()
        if tb is not None:
            tb.close()
    if procs.is_main:
        final = os.path.join(run_dir, "model")
        shutil.rmtree(final + ".tmp", ignore_errors=True)
        ema_model.save(final + ".tmp", extra={"step": step, **extra})
        shutil.rmtree(final, ignore_errors=True)
        os.replace(final + ".tmp", final)
        plot_loss(csv_path, os.path.join(run_dir, "loss_curve.png"))
    summary = {"run_dir": os.path.abspath(run_dir), "steps": step, "stopped_early": stopped_early,
               "wall_s": time.perf_counter() - t0, "processes": procs.world, **info}
    if procs.is_main:
        atomic_write_bytes(os.path.join(run_dir, "train_summary.json"), json.dumps(summary, indent=2).encode())
    procs.wait()  # every process returns once the run directory is complete
    return summary
