"""``TrainConfig``: every knob of ``vla train`` (no torch here, so ``vla --help`` stays fast)."""

from __future__ import annotations

import dataclasses
import json

MODES = ("frozen", "lora", "full")
BALANCES = ("frames", "tasks")
LABELS = ("both", "episode", "frame")
DAGGER_ROWS = ("all", "coherent")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    datasets: tuple[str, ...]
    """LeRobot v3 dataset directories (several = multi-task)."""
    out: str
    """Run directory."""
    mode: str = "frozen"
    """Vision trunk: frozen (features cached once), lora (peft adapters) or full."""
    steps: int = 6000
    """Optimiser steps. 6000 at batch 128 is the recipe of bench/results/vla_sft round 8 (80% on the pick
    tasks with temporal ensembling; about 25 min of training on a 2-core VM)."""
    batch_size: int = 128
    lr: float = 3e-4
    weight_decay: float = 1e-4
    warmup_steps: int = 500
    grad_clip: float = 1.0
    ema_decay: float = 0.999
    horizon: int = 8
    image_size: int = 96
    cameras: tuple[str, ...] | None = None
    """Cameras to read (default: every camera of the first dataset)."""
    crops: tuple[tuple[str, float, float, float, float], ...] = ()
    """Per-camera region of interest ``(camera, x0, y0, x1, y1)``, fractions of the frame, cut out
    before the resize to image_size (``--crop front=0.2,0.4,0.8,0.8``)."""
    success_only: bool = False
    """Train on the episodes marked successful in ``meta/vla_episodes.jsonl`` only (filtered BC)."""
    num_tokens: int = 0
    """Behaviour tokens of the action expert (ExToken; 0 = none, token 0 is the null token). With
    ``tokens`` it must be that file's K (``vla train --tokens`` sets it)."""
    tokens: str | None = None
    """ExToken's behaviour prior (``vla tokens`` writes it): every training frame is given its token
    (``batch["token"]``), so the VLA learns ``pi(a | s, c)``. It must cover every episode trained on."""
    token_dropout: float = 0.2
    """With ``tokens``: the share of samples trained with the null token 0 instead of their own
    (classifier-free-guidance style), so the VLA still acts without a token."""
    fine_blocks: int = 3
    """Trunk blocks before the map the neck's keypoints read (3: stride 4, 24 channels; 5: stride 8,
    40 channels -- half the spatial resolution, about 0.4x the feature cache). Stride 4 is the
    default since bench/results/vla_sft round 5: with the front crop it took the pick tasks from
    about 10% to about 40%."""
    head_hidden: int = 256
    """Width of the flow-matching action expert's velocity MLP (the compact VLA's ``hidden``)."""
    head_depth: int = 3
    """Hidden layers of the action expert's velocity MLP (the compact VLA's ``depth``)."""
    head_film: bool = False
    """FiLM-condition every hidden layer of the action expert, not only its input (``head_film``)."""
    neck: str = "film"
    """Camera neck of the compact VLA: ``film`` (instruction-modulated convolutions -> keypoints) or
    ``keypoints`` (1x1 convolutions -> keypoints; the first design, kept for its checkpoints)."""
    init: str | None = None
    """Start from this compact checkpoint (or run directory): its weights and its normalisation
    statistics (fine-tuning on more data, DAgger rounds). The model settings must be its own."""
    aug_views: int = 1
    """Frozen mode: augmented copies of every frame whose features are cached (besides the original)."""
    shift_pad: int = 0
    """Random-shift augmentation: pixels of replicate padding (at image_size). Default 0: for a
    fixed camera a shifted image moves every object away from where it really is (round 6 of
    bench/results/vla_sft measured no gain from 4 px); a hand-held or re-mounted camera may want 4."""
    jitter: float = 0.15
    """Brightness / contrast jitter (+-)."""
    state_noise: float = 0.05
    """Gaussian noise on the standardised state (augmentation)."""
    labels: str = "both"
    """Which instruction a frame is trained with when its task differs from its episode's (data
    recorded with ``vla record --label-subskills``): ``episode`` (the task's: "put the red cube in
    the bowl"), ``frame`` (the sub-skill's: "pick up the red cube", then "put it in the bowl") or
    ``both`` (each such frame twice, once with each). Data without sub-skill labels: all the same."""
    paraphrases: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Other wordings of the datasets' instructions, ``(instruction, (wording, ...))``: each training
    sample is given its instruction or one of its wordings, uniformly (``--paraphrases``)."""
    balance: str = "frames"
    """How a batch draws its frames: ``frames`` (uniformly over every frame of every dataset, so a task with
    longer episodes gets more of each batch) or ``tasks`` (an instruction uniformly, then one of its frames:
    each task gets an equal share however long its episodes are)."""
    opening_weight: float = 1.0
    """Frames within the first ``horizon`` ticks of their episode are drawn this many times as often as the others
    (1 = uniform). For ``--tokens``: a behaviour mode (which way the fingers turn) is decided in an episode's first
    frames and the robot's state shows it a tick later, so the token carries information only there."""
    dagger_rows: str = "all"
    """Which rows of a frame's action-chunk target train, for data that ``vla record --dagger`` recorded: ``all``,
    or ``coherent``: row k of frame t only when the expert itself executed frames t .. t+k-1. A frame the policy
    drove then trains its first row only: its later rows are the expert's labels at the states the *policy's*
    actions led to, answers along another path, not a plan the expert would have carried out from frame t.
    Frames of plain demonstrations keep every row."""
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_targets: tuple[str, ...] | None = None
    save_every: int = 2000
    log_every: int = 50
    keep_checkpoints: int = 3
    max_minutes: float | None = None
    """Stop (and save) after this much wall-clock training time."""
    seed: int = 0
    threads: int | None = None
    """torch CPU threads (default: torch's choice)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for f in ("steps", "batch_size", "horizon", "image_size", "save_every", "log_every", "keep_checkpoints",
                  "head_hidden", "head_depth"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive, got {getattr(self, f)}")
        if self.lr <= 0 or not 0 <= self.ema_decay < 1:
            raise ValueError(f"lr must be > 0 and ema_decay in [0, 1), got {self.lr}, {self.ema_decay}")
        if self.shift_pad < 0 or self.jitter < 0 or self.aug_views < 0:
            raise ValueError(f"shift_pad, jitter and aug_views must be >= 0, got {self.shift_pad}, {self.jitter}, "
                             f"{self.aug_views}")
        if not self.opening_weight > 0:
            raise ValueError(f"opening_weight must be > 0, got {self.opening_weight}")
        if not 0.0 <= self.token_dropout <= 1.0:
            raise ValueError(f"token_dropout must be in [0, 1], got {self.token_dropout}")
        if self.tokens is not None and self.num_tokens <= 0:
            raise ValueError(f"tokens {self.tokens!r} needs num_tokens = the file's K (vla train --tokens sets it), "
                             f"got {self.num_tokens}")
        if self.balance not in BALANCES:
            raise ValueError(f"balance must be one of {BALANCES}, got {self.balance!r}")
        if self.labels not in LABELS:
            raise ValueError(f"labels must be one of {LABELS}, got {self.labels!r}")
        if self.dagger_rows not in DAGGER_ROWS:
            raise ValueError(f"dagger_rows must be one of {DAGGER_ROWS}, got {self.dagger_rows!r}")
        if self.neck not in ("film", "keypoints"):
            raise ValueError(f"neck must be 'film' or 'keypoints', got {self.neck!r}")
        if not self.datasets:
            raise ValueError("give at least one --dataset")
        for entry in self.paraphrases:
            if (len(entry) != 2 or not isinstance(entry[0], str) or not entry[0]
                    or not all(isinstance(w, str) and w.strip() for w in entry[1])):
                raise ValueError(f"paraphrases entry {entry!r}: expected (instruction, (wording, ...)) with "
                                 "non-empty strings")
        for c in self.crops:
            if len(c) != 5 or not 0 <= c[1] < c[3] <= 1 or not 0 <= c[2] < c[4] <= 1:
                raise ValueError(f"crop {c!r}: expected (camera, x0, y0, x1, y1) with 0 <= x0 < x1 <= 1 and "
                                 "0 <= y0 < y1 <= 1 (fractions of the frame)")

    @classmethod
    def from_json(cls, path: str) -> "TrainConfig":
        with open(path) as f:
            d = json.load(f)
        for k in ("datasets", "cameras", "lora_targets"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        d["crops"] = tuple(tuple(c) for c in d.get("crops", ()))
        d["paraphrases"] = tuple((k, tuple(v)) for k, v in d.get("paraphrases", ()))
        return cls(**d)
