"""The compact flow-matching VLA: the embedded default backbone, small enough to train on a CPU.

    instruction --MiniLM (frozen)-----------------------> Linear ----------\
    camera_i ----EfficientNet-Lite0 trunk (pretrained)--> neck_i ------------> fusion MLP -> cond
    state -------normalise--------------------------------> Linear ---------/
    cond (+ behaviour token) --> flow-matching action expert --Euler from noise--> chunk [H, A]

* The trunk is ImageNet EfficientNet-Lite0 cut at stride 16 (``vision_blocks``); it is the
  "backbone" that the training mode (frozen / LoRA / full) applies to. Each camera has its own
  small trainable neck: spatial-softmax keypoints of 1x1-conv channels of the stride-8 map
  (``fine_blocks``: where things are, to a few pixels) and a projection of the stride-16 map
  (what they are).
* Actions are normalised to [-1, 1] per dimension with the training data's min / max before the
  flow head sees them; states are standardised. The statistics live in buffers and therefore in
  every checkpoint.
* ``noise`` is in the normalised action space, shape ``(H, A)``; DSRL picks it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vla.models.base import VLA, StochasticSample, as_tensor_batch
from vla.models.encoders import EfficientNetTrunk, TextEncoder, TEXT_DIM, crop_uint8, resize_uint8
from vla.models.flow import FlowHeadConfig, FlowMatchingHead

KIND = "compact-flow-vla"
NECKS = ("keypoints", "film")


@dataclasses.dataclass(frozen=True)
class CompactVLAConfig:
    cameras: tuple[str, ...] = ("front", "wrist")
    """Camera names, in the order the neck reads them (must match the observation's images)."""
    image_size: int = 96
    """Images are resized to image_size x image_size before the trunk."""
    vision_blocks: int = 11
    """EfficientNet-Lite0 MBConv blocks kept (11: stride 16, 112 channels)."""
    fine_blocks: int = 5
    """The keypoints read the map after this many blocks (5: stride 8, 40 channels); 0 = the last map."""
    keypoints: int = 32
    """Spatial-softmax keypoints per camera."""
    state_dim: int = 8
    action_dim: int = 7
    horizon: int = 8
    """Actions per chunk (H)."""
    cond_dim: int = 256
    hidden: int = 256
    depth: int = 3
    head_film: bool = False
    """FiLM-condition every hidden layer of the action expert on the fused observation (instruction
    included), not only its input (``FlowHeadConfig.film``)."""
    num_tokens: int = 0
    """Behaviour tokens (ExToken); 0 = none. Token 0 is always the null token."""
    num_steps: int = 10
    """Euler steps of the sampler."""
    pretrained: bool = True
    """Load ImageNet weights into the trunk (False only for tests)."""
    neck: str = "film"
    """Per-camera neck: ``"film"`` (two trainable 3x3 convs on the fine map, modulated by the
    instruction (FiLM), -> spatial softmax: the keypoints can single out the object the
    instruction names) or ``"keypoints"`` (1x1 convs -> spatial softmax; checkpoints written
    before the FiLM neck existed have no ``neck`` field and load as this)."""
    neck_width: int = 32
    """Channels of the ``"film"`` neck's convolutions."""
    crops: tuple[tuple[str, float, float, float, float], ...] = ()
    """Per-camera region of interest ``(camera, x0, y0, x1, y1)`` (fractions of the frame) cut out
    before the resize to ``image_size``: a camera that frames the whole cell from afar sees the
    objects a few pixels wide at 96 px; its crop magnifies the workspace. Cameras not named
    are used whole."""

    def __post_init__(self) -> None:
        if not self.cameras:
            raise ValueError("CompactVLAConfig.cameras must name at least one camera")
        for f in ("image_size", "keypoints", "state_dim", "action_dim", "horizon", "cond_dim", "hidden", "depth",
                  "num_steps"):
            if getattr(self, f) <= 0:
                raise ValueError(f"CompactVLAConfig.{f} must be positive, got {getattr(self, f)}")
        if self.neck not in NECKS:
            raise ValueError(f"CompactVLAConfig.neck must be one of {list(NECKS)}, got {self.neck!r}")
        if self.image_size % 16:
            raise ValueError(f"CompactVLAConfig.image_size must be a multiple of 16, got {self.image_size}")
        for c in self.crops:
            if len(c) != 5 or c[0] not in self.cameras:
                raise ValueError(f"CompactVLAConfig.crops entries are (camera, x0, y0, x1, y1) with a camera of "
                                 f"{list(self.cameras)}, got {c!r}")
            x0, y0, x1, y1 = c[1:]
            if not (0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1):
                raise ValueError(f"CompactVLAConfig.crops[{c[0]!r}]: need 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1, "
                                 f"got {tuple(c[1:])}")

    @property
    def crop_boxes(self) -> dict[str, tuple[float, float, float, float]]:
        return {c[0]: tuple(c[1:]) for c in self.crops}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CompactVLAConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown CompactVLAConfig field(s) {unknown}; known: {sorted(names)}")
        d = dict(d)
        if "cameras" in d:
            d["cameras"] = tuple(d["cameras"])
        if "crops" in d:
            d["crops"] = tuple(tuple(c) for c in d["crops"])
        return cls(**d)


class SpatialSoftmax(nn.Module):
    """Expected (x, y) in [-1, 1] of each channel's softmax over the map -> [B, 2C]."""

    def __init__(self, h: int, w: int) -> None:
        super().__init__()
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
        self.register_buffer("pos", torch.stack([xs.flatten(), ys.flatten()], 1), persistent=False)  # [HW, 2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        att = torch.softmax(x.flatten(2), dim=-1)  # [B, C, HW]
        return (att @ self.pos).flatten(1)


def _channels_last(x: torch.Tensor | None) -> torch.Tensor | None:
    """The necks run their convolutions in channels-last layout (weights and inputs): on a CPU that
    is about twice as fast for these small-channel 3x3 convolutions as the default layout."""
    return None if x is None else x.contiguous(memory_format=torch.channels_last)


class CameraNeck(nn.Module):
    """Keypoints (spatial softmax of 1x1-conv channels) from the fine map, a projection of the
    coarse map; -> [B, 2 K + out]."""

    def __init__(self, c_coarse: int, hw_coarse: int, c_fine: int, hw_fine: int, keypoints: int,
                 out: int = 128) -> None:
        super().__init__()
        c_kp, hw_kp = (c_fine, hw_fine) if c_fine else (c_coarse, hw_coarse)
        self.kp = nn.Sequential(nn.Conv2d(c_kp, 64, 1), nn.SiLU(), nn.Conv2d(64, keypoints, 1))
        self.softmax = SpatialSoftmax(hw_kp, hw_kp)
        self.reduce = nn.Conv2d(c_coarse, 32, 1)
        self.proj = nn.Linear(32 * hw_coarse * hw_coarse, out)
        self.use_fine = bool(c_fine)
        self.out_dim = 2 * keypoints + out

    def forward(self, coarse: torch.Tensor, fine: torch.Tensor | None, text: torch.Tensor | None = None) -> torch.Tensor:
        coarse, fine = _channels_last(coarse), _channels_last(fine)
        kp = self.softmax(self.kp(fine if self.use_fine else coarse))
        return torch.cat([kp, F.silu(self.proj(F.silu(self.reduce(coarse)).flatten(1)))], dim=-1)


class FiLMCameraNeck(CameraNeck):
    """Like :class:`CameraNeck`, but the keypoints come from two trainable 3x3 convolutions over
    the fine map whose first output is scaled and shifted per channel by the instruction
    embedding (FiLM, Perez et al. 2018): "the red cube" can light up other pixels than "the blue
    cube". The FiLM layer starts at identity (zero init)."""

    def __init__(self, c_coarse: int, hw_coarse: int, c_fine: int, hw_fine: int, keypoints: int,
                 text_dim: int, width: int = 32, out: int = 128) -> None:
        super().__init__(c_coarse, hw_coarse, c_fine, hw_fine, keypoints, out)
        c_in = c_fine or c_coarse
        self.kp = nn.Conv2d(width, keypoints, 1)
        self.conv1 = nn.Conv2d(c_in, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        self.film = nn.Linear(text_dim, 2 * width)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)

    def forward(self, coarse: torch.Tensor, fine: torch.Tensor | None, text: torch.Tensor | None = None) -> torch.Tensor:
        if text is None:
            raise ValueError("the FiLM neck needs the instruction embedding")
        coarse, fine = _channels_last(coarse), _channels_last(fine)
        h = self.conv1(fine if self.use_fine else coarse)
        gamma, beta = self.film(text).chunk(2, dim=-1)
        h = F.silu(h * (1 + gamma[:, :, None, None]) + beta[:, :, None, None])
        kp = self.softmax(self.kp(F.silu(self.conv2(h))))
        return torch.cat([kp, F.silu(self.proj(F.silu(self.reduce(coarse)).flatten(1)))], dim=-1)


class CompactVLA(VLA):
    lora_targets = ("_expand_conv", "_project_conv")
    """peft LoRA on the trunk's 1x1 convolutions (expand / project of each MBConv block)."""

    def __init__(self, cfg: CompactVLAConfig = CompactVLAConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.text = TextEncoder()  # not a submodule: never trained, never checkpointed
        self.trunk = EfficientNetTrunk(cfg.vision_blocks, pretrained=cfg.pretrained, fine_blocks=cfg.fine_blocks)
        hw = cfg.image_size // 16
        args = (self.trunk.out_channels, hw, self.trunk.fine_channels, cfg.image_size // self.trunk.fine_stride,
                cfg.keypoints)
        self.necks = nn.ModuleDict({c: FiLMCameraNeck(*args, text_dim=TEXT_DIM, width=cfg.neck_width)
                                    if cfg.neck == "film" else CameraNeck(*args) for c in cfg.cameras})
        self.necks.to(memory_format=torch.channels_last)
        vis = sum(n.out_dim for n in self.necks.values())
        self.text_proj = nn.Linear(TEXT_DIM, 128)
        self.state_proj = nn.Linear(cfg.state_dim, 64)
        self.fuse = nn.Sequential(nn.Linear(vis + 128 + 64, cfg.cond_dim), nn.LayerNorm(cfg.cond_dim), nn.SiLU(),
                                  nn.Linear(cfg.cond_dim, cfg.cond_dim))
        self.head = FlowMatchingHead(FlowHeadConfig(horizon=cfg.horizon, action_dim=cfg.action_dim,
                                                    cond_dim=cfg.cond_dim, hidden=cfg.hidden, depth=cfg.depth,
                                                    num_tokens=cfg.num_tokens, num_steps=cfg.num_steps,
                                                    film=cfg.head_film))
        # Normalisation statistics (set from the training data by set_normalization).
        self.register_buffer("state_mean", torch.zeros(cfg.state_dim))
        self.register_buffer("state_std", torch.ones(cfg.state_dim))
        self.register_buffer("action_min", -torch.ones(cfg.action_dim))
        self.register_buffer("action_max", torch.ones(cfg.action_dim))
        # Instruction embeddings are centred on the training instructions' mean and scaled by
        # their spread: MiniLM puts "pick up the red cube" and "... blue cube" at cosine 0.8,
        # and the colour word is what the policy must act on.
        self.register_buffer("text_mean", torch.zeros(TEXT_DIM))
        self.register_buffer("text_scale", torch.ones(1))
        self.mode = "full"

    def train(self, mode: bool = True) -> "CompactVLA":
        super().train(mode)
        # The pretrained trunk's BatchNorm statistics stay as ImageNet left them (fine-tuning
        # batches are small and correlated): its BN layers are always in eval mode.
        for m in self.trunk.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
        return self

    # -- interface facts -------------------------------------------------------------------
    @property
    def noise_shape(self) -> tuple[int, int]:
        return (self.cfg.horizon, self.cfg.action_dim)

    @property
    def action_shape(self) -> tuple[int, int]:
        return (self.cfg.horizon, self.cfg.action_dim)

    @property
    def num_tokens(self) -> int:
        return self.cfg.num_tokens

    @property
    def embed_dim(self) -> int:
        """``embed()`` is the flow head's condition vector (cond_dim): summary and denoiser input at once."""
        return self.cfg.cond_dim

    def backbone_modules(self) -> dict[str, nn.Module]:
        return {"trunk": self.trunk}

    # -- normalisation ---------------------------------------------------------------------
    def set_normalization(self, state_mean, state_std, action_min, action_max, text_mean=None,
                          text_scale=None) -> None:
        """Statistics of the training data. ``text_mean`` / ``text_scale``: mean of the training
        instructions' embeddings and the root mean squared distance from it (``text_stats``)."""
        pairs = [("state_mean", state_mean), ("state_std", state_std), ("action_min", action_min),
                 ("action_max", action_max)]
        if text_mean is not None:
            pairs += [("text_mean", text_mean), ("text_scale", torch.as_tensor(text_scale, dtype=torch.float32).reshape(1))]
        for name, v in pairs:
            v = torch.as_tensor(v, dtype=torch.float32)
            buf = getattr(self, name)
            if v.shape != buf.shape or not torch.isfinite(v).all():
                raise ValueError(f"normalisation '{name}' must be {list(buf.shape)} finite values, got {list(v.shape)}")
            buf.copy_(v)
        self.state_std.clamp_(min=1e-3)
        span = (self.action_max - self.action_min).clamp(min=1e-4)
        self.action_max.copy_(self.action_min + span)

    @staticmethod
    def text_stats(embeddings: torch.Tensor) -> dict[str, torch.Tensor]:
        """``text_mean`` / ``text_scale`` from the distinct training instructions' embeddings [T, 384]
        (one instruction: nothing to tell apart, the scale stays 1)."""
        e = torch.as_tensor(embeddings, dtype=torch.float32)
        mean = e.mean(0)
        spread = float((e - mean).pow(2).sum(-1).mean().sqrt()) if len(e) > 1 else 0.0
        return {"text_mean": mean, "text_scale": torch.tensor([spread if spread > 1e-3 else 1.0])}

    def normalize_text(self, text: torch.Tensor) -> torch.Tensor:
        return (text - self.text_mean) / self.text_scale

    def normalize_actions(self, a: torch.Tensor) -> torch.Tensor:
        return 2 * (a - self.action_min) / (self.action_max - self.action_min) - 1

    def unnormalize_actions(self, a: torch.Tensor) -> torch.Tensor:
        return (a.clamp(-1, 1) + 1) / 2 * (self.action_max - self.action_min) + self.action_min

    # -- features --------------------------------------------------------------------------
    def preprocess_images(self, images: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        missing = [c for c in self.cfg.cameras if c not in images]
        if missing:
            raise ValueError(f"observation is missing camera(s) {missing}; this VLA reads {list(self.cfg.cameras)} "
                             f"and got {sorted(images)}")
        boxes = self.cfg.crop_boxes
        return {c: resize_uint8(crop_uint8(images[c], boxes[c]) if c in boxes else images[c], self.cfg.image_size)
                for c in self.cfg.cameras}

    def trunk_features(self, images: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """uint8 images (already at image_size) -> trunk maps, all cameras in one batch:
        ``{camera: coarse map, camera + "@fine": fine map}`` (the second only with fine_blocks)."""
        cams = list(self.cfg.cameras)
        fine, coarse = self.trunk(torch.cat([images[c] for c in cams]))
        out = dict(zip(cams, coarse.chunk(len(cams))))
        if fine is not None:
            out.update(zip([c + "@fine" for c in cams], fine.chunk(len(cams))))
        return out

    def cond_from_features(self, fmaps: dict[str, torch.Tensor], state: torch.Tensor,
                           text: torch.Tensor) -> torch.Tensor:
        if state.shape[-1] != self.cfg.state_dim:
            raise ValueError(f"observation 'state' must have {self.cfg.state_dim} dims, got {state.shape[-1]}")
        text = self.normalize_text(text)
        vis = [self.necks[c](fmaps[c].float(), fmaps[c + "@fine"].float() if c + "@fine" in fmaps else None, text)
               for c in self.cfg.cameras]
        s = (state - self.state_mean) / self.state_std
        return self.fuse(torch.cat(vis + [self.text_proj(text), self.state_proj(s)], dim=-1))

    def _cond(self, obs: dict, features: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        dev = self.state_mean.device
        obs = as_tensor_batch(obs, dev)
        if features is None:
            fmaps = self.trunk_features(self.preprocess_images(obs["images"]))
        else:
            fmaps = self._check_features(features, obs["state"].shape[0])
        return self.cond_from_features(fmaps, obs["state"], self.text(obs["instruction"]).to(dev))

    def frozen_features(self, obs: dict) -> dict[str, torch.Tensor] | None:
        """The trunk's maps of ``obs`` (``trunk_features``), when no trunk weight is trainable (modes ``frozen``
        and a head-only fine-tune; LoRA adapters sit in the trunk: None there)."""
        if any(p.requires_grad for p in self.trunk.parameters()):
            return None
        with torch.no_grad():
            obs = as_tensor_batch(obs, self.state_mean.device)
            return self.trunk_features(self.preprocess_images(obs["images"]))

    def _check_features(self, features: dict[str, torch.Tensor], batch: int) -> dict[str, torch.Tensor]:
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.trunk.parameters()):
            raise ValueError("features= is refused while the trunk is trainable (mode "
                             f"{self.mode!r}): cached maps would hide its gradient")
        want = [c for c in self.cfg.cameras] + ([c + "@fine" for c in self.cfg.cameras] if self.trunk.fine_channels
                                               else [])
        missing = [k for k in want if k not in features]
        if missing:
            raise ValueError(f"features lack the trunk maps {missing} (frozen_features makes them)")
        bad = [k for k in want if features[k].shape[0] != batch]
        if bad:
            raise ValueError(f"features {bad} have batch {features[bad[0]].shape[0]}, the observation {batch}")
        return {k: features[k] for k in want}

    def embed(self, obs: dict) -> torch.Tensor:
        return self._cond(obs)

    # -- sampling --------------------------------------------------------------------------
    @torch.no_grad()
    def sample_actions(self, obs: dict, noise=None, token=None, num_steps: int | None = None) -> torch.Tensor:
        cond = self._cond(obs)
        x = self.head.sample(cond, noise=noise, token=token, num_steps=num_steps)
        return self.unnormalize_actions(x)

    @torch.no_grad()
    def sample_actions_from_embedding(self, emb: torch.Tensor, noise=None, token=None,
                                      num_steps: int | None = None, normalized: bool = False) -> torch.Tensor:
        x = self.head.sample(emb, noise=noise, token=token, num_steps=num_steps)
        return x.clamp(-1, 1) if normalized else self.unnormalize_actions(x)

    @torch.no_grad()
    def sample_actions_stochastic(self, obs: dict, noise=None, token=None, num_steps: int | None = None,
                                  sigma: float = 0.1, generator: torch.Generator | None = None,
                                  features: dict[str, torch.Tensor] | None = None) -> StochasticSample:
        cond = self._cond(obs, features)
        x, chain, logp = self.head.sample_stochastic(cond, noise=noise, token=token, num_steps=num_steps,
                                                     sigma=sigma, generator=generator)
        return StochasticSample(actions=self.unnormalize_actions(x), chain=chain, logprob=logp)

    def chain_logprob(self, obs: dict, chain: torch.Tensor, token=None, sigma: float = 0.1,
                      features: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        return self.head.chain_logprob(self._cond(obs, features), chain, token=token, sigma=sigma)

    # -- training --------------------------------------------------------------------------
    def loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """``batch``: either an observation batch (images / state / instruction) or precomputed
        ``fmaps`` {camera: trunk map} + ``state`` + ``text`` [B, 384]; plus ``action`` [B, H, A] in
        robot units and optionally ``token`` [B], ``action_weight`` [B, H] (each chunk row's weight, ``flow.row_weights``),
        and the flow-matching ``noise`` [B, H, A] and time ``t`` [B] (drawn by the head when absent)."""
        if "fmaps" in batch:
            cond = self.cond_from_features(batch["fmaps"], batch["state"], batch["text"])
        else:
            cond = self._cond(batch)
        a = self.normalize_actions(torch.as_tensor(batch["action"], dtype=torch.float32, device=cond.device))
        loss = self.head.loss(cond, a, token=batch.get("token"), noise=batch.get("noise"), t=batch.get("t"),
                              weight=batch.get("action_weight"))
        return loss, {"flow_loss": float(loss.detach())}

    # -- checkpoints -----------------------------------------------------------------------
    def save(self, path: str, extra: dict[str, Any] | None = None) -> None:
        """Write ``config.json`` + ``model.safetensors`` into directory ``path`` (atomically per file)."""
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        meta = {"kind": KIND, "config": dataclasses.asdict(self.cfg), "mode": self.mode,
                "lora": getattr(self, "lora_config", None), **(extra or {})}
        tmp = os.path.join(path, "model.safetensors.tmp")
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, tmp)
        os.replace(tmp, os.path.join(path, "model.safetensors"))
        tmp = os.path.join(path, "config.json.tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=2)
        os.replace(tmp, os.path.join(path, "config.json"))

    @classmethod
    def load(cls, path: str, map_location: str = "cpu") -> "CompactVLA":
        from safetensors.torch import load_file

        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise FileNotFoundError(f"no config.json in {path}: not a compact VLA checkpoint directory")
        with open(cfg_path) as f:
            meta = json.load(f)
        if meta.get("kind") != KIND:
            raise ValueError(f"{cfg_path} is a {meta.get('kind') or meta.get('type')!r} checkpoint, not {KIND!r}")
        cfg = dict(meta["config"])
        cfg.setdefault("neck", "keypoints")  # written before the FiLM neck existed
        cfg["pretrained"] = False  # the weights come from the checkpoint
        model = cls(CompactVLAConfig.from_dict(cfg))
        if meta.get("mode") == "lora" and meta.get("lora"):
            lc = meta["lora"]
            model.set_mode("lora", lora_rank=lc["rank"], lora_alpha=lc["alpha"], lora_targets=lc["targets"])
        state = load_file(os.path.join(path, "model.safetensors"), device=map_location)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if k not in ("text_mean", "text_scale")]  # older checkpoints: identity
        if missing or unexpected:
            raise ValueError(f"checkpoint {path} does not match its config: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        model.mode = meta.get("mode", "full")
        return model.eval()
