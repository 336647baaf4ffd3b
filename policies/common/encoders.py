"""A small image + state encoder for RL from pixels, and DrQ's random-shift augmentation.

``SmallImageStateEncoder`` is the scale DSRL uses on pi0 (64 x 64 images, an 8-d state, about
500K parameters with the actor and critic): per camera four 3x3 conv layers of 32 channels with
stride 2 (64 -> 32 -> 16 -> 8 -> 4), flattened and projected to ``camera_dim`` with LayerNorm +
tanh; the state through a 2-layer MLP; everything concatenated and projected to ``out_dim`` with
LayerNorm + tanh (bounded features for actor and critic, as in DrQ-v2 / SERL). With 2 cameras and
the defaults it has ~277K parameters.

``random_shift`` is DrQ's augmentation: pad each image by ``pad`` pixels (edge replicated) and crop
back at a random offset. Apply it to the sampled batch (``shift_observations``), not inside the
encoder, so that acting never sees shifted images and the caller owns the generator it draws from.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn


class SmallImageStateEncoder(nn.Module):
    """{camera: uint8 [B, H, W, 3], "state": float [B, state_dim]} -> float [B, out_dim] in (-1, 1).

    Args:
        cameras: camera names, one CNN each.
        image_size: H = W expected of every camera image (resize before, e.g. with
            ``vla.models.encoders.resize_uint8``).
        state_dim: length of the proprioceptive state (0: images only).
        out_dim: feature size handed to the actor and critic.
        channels: conv channels; convs: conv layers (each halves the resolution).
        camera_dim: per-camera embedding size; state_hidden: width of the state MLP.
    """

    def __init__(self, cameras: list[str], image_size: int = 64, state_dim: int = 8, out_dim: int = 256,
                 channels: int = 32, convs: int = 4, camera_dim: int = 128, state_hidden: int = 64) -> None:
        super().__init__()
        if not cameras:
            raise ValueError("SmallImageStateEncoder needs at least one camera")
        if "state" in cameras:
            raise ValueError("'state' is reserved for the state vector; rename that camera")
        if image_size % (2 ** convs) != 0:
            raise ValueError(f"image_size {image_size} must be divisible by 2**convs = {2 ** convs}")
        self.cameras, self.image_size, self.state_dim, self.out_dim = list(cameras), image_size, state_dim, out_dim
        side = image_size // 2 ** convs

        def cnn() -> nn.Sequential:
            layers, c = [], 3
            for _ in range(convs):
                layers += [nn.Conv2d(c, channels, 3, stride=2, padding=1), nn.ReLU()]
                c = channels
            return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * side * side, camera_dim),
                                 nn.LayerNorm(camera_dim), nn.Tanh())

        self.cnns = nn.ModuleDict({c: cnn() for c in self.cameras})
        self.state_mlp = (nn.Sequential(nn.Linear(state_dim, state_hidden), nn.ReLU(),
                                        nn.Linear(state_hidden, state_hidden), nn.ReLU())
                          if state_dim > 0 else None)
        fused = camera_dim * len(self.cameras) + (state_hidden if state_dim > 0 else 0)
        self.head = nn.Sequential(nn.Linear(fused, out_dim), nn.LayerNorm(out_dim), nn.Tanh())

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        parts = []
        for cam in self.cameras:
            if cam not in obs:
                raise ValueError(f"observation has no camera {cam!r} (has {sorted(obs)})")
            img = obs[cam]
            if img.dim() != 4 or tuple(img.shape[1:]) != (self.image_size, self.image_size, 3):
                raise ValueError(f"camera {cam!r}: expected [B, {self.image_size}, {self.image_size}, 3], "
                                 f"got {list(img.shape)}")
            x = img.permute(0, 3, 1, 2).float() / 255.0 - 0.5  # uint8 HWC -> float CHW in [-0.5, 0.5]
            parts.append(self.cnns[cam](x))
        if self.state_mlp is not None:
            state = obs.get("state")
            if state is None or tuple(state.shape[1:]) != (self.state_dim,):
                raise ValueError(f"'state': expected [B, {self.state_dim}], "
                                 f"got {None if state is None else list(state.shape)}")
            parts.append(self.state_mlp(state.float()))
        return self.head(torch.cat(parts, dim=-1))


def random_shift(images: torch.Tensor, pad: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """DrQ's random shift of uint8 (or float) images [B, H, W, C]: replicate-pad by ``pad`` and crop
    back at a random integer offset per image. One gather, no per-image loop; dtype kept."""
    if pad <= 0:
        return images
    b, h, w, _ = images.shape
    dev = images.device
    oy = torch.randint(0, 2 * pad + 1, (b, 1), generator=generator, device=dev) - pad
    ox = torch.randint(0, 2 * pad + 1, (b, 1), generator=generator, device=dev) - pad
    # clamping the source index to the image is the same as replicate padding then cropping
    rows = (torch.arange(h, device=dev) + oy).clamp_(0, h - 1)  # [B, H]
    cols = (torch.arange(w, device=dev) + ox).clamp_(0, w - 1)  # [B, W]
    bi = torch.arange(b, device=dev)[:, None, None]
    return images[bi, rows[:, :, None], cols[:, None, :]]


def shift_observations(batch: Mapping[str, Any], pad: int = 4, generator: torch.Generator | None = None) -> dict:
    """``random_shift`` every image ([B, H, W, 3] uint8 tensor) in a (nested) dict -- an observation, or
    a whole replay batch, whose ``obs`` and ``next_obs`` are then shifted independently (DrQ)."""
    out = {}
    for k, v in batch.items():
        if isinstance(v, Mapping):
            out[k] = shift_observations(v, pad, generator)
        else:
            out[k] = random_shift(v, pad, generator) if _is_image(v) else v
    return out


def _is_image(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 4 and v.shape[-1] == 3


def count_parameters(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())

