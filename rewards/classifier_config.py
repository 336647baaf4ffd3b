"""Configs of the success classifier (rewards/success_classifier.py); no torch here, so
`vla --help` stays fast."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ClassifierConfig:
    cameras: tuple[str, ...]
    """Cameras the classifier looks at, in order; each gets its own head."""
    image_size: int = 96
    """Frames are resized to image_size x image_size (``resize_uint8``, as in training the VLA)."""
    trunk_blocks: int = 11
    """EfficientNet-Lite0 MBConv blocks kept (11: stride 16, 112 channels)."""
    proj_channels: int = 32
    """Channels of the 1x1 projection of the trunk's feature map, per camera."""
    spatial_kernels: int = 4
    """Learned spatial weightings per channel (HIL-SERL's SpatialLearnedEmbeddings)."""
    hidden: int = 128
    dropout: float = 0.3
    threshold: float = 0.5
    """P(success) at or above which a frame counts as success; training sets it on validation data."""
    pretrained: bool = True
    """ImageNet weights for the trunk (False only for tests that need no real features)."""

    def __post_init__(self) -> None:
        if not self.cameras or len(set(self.cameras)) != len(self.cameras):
            raise ValueError(f"the classifier needs one or more distinct cameras, got {list(self.cameras)}")
        if self.image_size < 32:
            raise ValueError(f"image_size must be >= 32 px, got {self.image_size}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold is a probability in [0, 1], got {self.threshold}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        for f in ("proj_channels", "spatial_kernels", "hidden"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive, got {getattr(self, f)}")


@dataclasses.dataclass(frozen=True)
class ClassifierTrainConfig:
    steps: int = 1000
    """Optimiser steps of the head."""
    batch_size: int = 64
    """Frames per step, half positives and half negatives."""
    lr: float = 1e-3
    weight_decay: float = 1e-2
    aug_views: int = 2
    """Augmented copies (random shift + colour jitter) of every training frame whose features are cached."""
    shift_pad: int = 4
    jitter: float = 0.15
    val_fraction: float = 0.2
    """Fraction of the episodes (of each class) held out for validation and the threshold."""
    target_precision: float = 0.95
    """The threshold is the one with the highest validation recall among those with this precision."""
    eval_every: int = 50
    """Steps between validation losses (the head with the lowest one is kept)."""
    seed: int = 0
    threads: int | None = None
    """torch CPU threads (default: torch's choice)."""

    def __post_init__(self) -> None:
        for f in ("steps", "batch_size", "eval_every"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive, got {getattr(self, f)}")
        if self.batch_size < 2:
            raise ValueError("batch_size must be >= 2 (one positive and one negative per step)")
        if self.aug_views < 0 or self.shift_pad < 0 or self.jitter < 0:
            raise ValueError("aug_views, shift_pad and jitter must be >= 0")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if not 0.0 < self.target_precision <= 1.0:
            raise ValueError(f"target_precision must be in (0, 1], got {self.target_precision}")
