"""The one interface every VLA backbone exposes to training, evaluation and the RL modules.

An observation batch is a dict (DESIGN.md, "Observations and actions")::

    {"images": {camera: uint8 [B, H, W, 3]}, "state": float32 [B, S], "instruction": list[str] (len B)}

numpy arrays or torch tensors are both accepted. Actions come back as float32 ``[B, H, A]`` in
the robot's units (normalisation is the backbone's business).

Handles the RL modules steer with:

* ``noise`` (DSRL): replaces the sampler's initial Gaussian; shape ``[B, *noise_shape]``. The
  same noise gives the same actions; a wrong shape raises ``ValueError``.
* ``token`` (ExToken): a behaviour token id per batch (0 = null token).
* the instruction text (SARL).
* ``sample_actions_stochastic`` (GRPO / LfH): a stochastic version of the sampler that returns
  the chain of intermediate samples and the per-step log-probabilities of its transitions;
  ``chain_logprob`` re-evaluates them under the current weights (with gradients).

Training modes (``set_mode``): ``frozen`` (nothing trains), ``lora`` (peft adapters on the
backbone's ``lora_targets`` + the action head train), ``full`` (everything but the frozen text
encoder trains). RL modules that steer a frozen VLA call ``set_mode("frozen")``.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import torch
from torch import nn

MODES = ("frozen", "lora", "full")


@dataclasses.dataclass
class StochasticSample:
    actions: torch.Tensor
    """[B, H, A] in robot units."""
    chain: torch.Tensor
    """[B, K + 1, *noise_shape]: the sampler's states, chain[:, 0] = initial noise (normalised units)."""
    logprob: torch.Tensor
    """[B, K]: log-density of each transition chain[:, k] -> chain[:, k + 1]."""


def as_tensor_batch(obs: dict[str, Any], device: torch.device | str = "cpu") -> dict[str, Any]:
    """Check an observation batch and turn its arrays into tensors on ``device``. Raises
    ``ValueError`` naming the field that is wrong."""
    if not isinstance(obs, dict):
        raise ValueError(f"observation batch must be a dict, got {type(obs).__name__}")
    for key in ("images", "state", "instruction"):
        if key not in obs:
            raise ValueError(f"observation batch is missing '{key}' (has {sorted(obs)})")
    state = torch.as_tensor(obs["state"], dtype=torch.float32, device=device)
    if state.ndim != 2:
        raise ValueError(f"observation 'state' must be [B, S], got shape {list(state.shape)}")
    b = state.shape[0]
    instr = obs["instruction"]
    if isinstance(instr, str):
        instr = [instr] * b
    instr = list(instr)
    if len(instr) != b or not all(isinstance(s, str) for s in instr):
        raise ValueError(f"observation 'instruction' must be {b} strings (one per batch row), got {instr!r:.200}")
    images = {}
    for cam, img in obs["images"].items():
        img = torch.as_tensor(img, device=device)
        if img.ndim != 4 or img.shape[0] != b or img.shape[-1] != 3 or img.dtype != torch.uint8:
            raise ValueError(f"observation 'images.{cam}' must be uint8 [B={b}, H, W, 3], "
                             f"got {img.dtype} {list(img.shape)}")
        images[cam] = img
    return {"images": images, "state": state, "instruction": instr}


class VLA(nn.Module, abc.ABC):
    """Abstract VLA backbone. Subclasses set ``noise_shape`` / ``action_shape`` and implement
    the abstract methods; ``set_mode`` has a default built on ``backbone_modules`` and
    ``lora_targets``."""

    mode: str = "full"

    @property
    @abc.abstractmethod
    def noise_shape(self) -> tuple[int, ...]:
        """Per-sample shape of the sampler's initial noise (DSRL's action space)."""

    @property
    @abc.abstractmethod
    def action_shape(self) -> tuple[int, int]:
        """(H, A) of the returned action chunk."""

    @property
    def num_tokens(self) -> int:
        """Behaviour tokens (ExToken) the backbone accepts besides the null token 0."""
        return 0

    @abc.abstractmethod
    def sample_actions(self, obs: dict, noise=None, token=None, num_steps: int | None = None) -> torch.Tensor:
        """Deterministic sampler (given ``noise``): -> float32 [B, H, A] in robot units."""

    @abc.abstractmethod
    def sample_actions_stochastic(self, obs: dict, noise=None, token=None, num_steps: int | None = None,
                                  sigma: float = 0.1, generator: torch.Generator | None = None) -> StochasticSample:
        """Stochastic sampler with per-step log-probabilities (for GRPO-style training)."""

    @abc.abstractmethod
    def chain_logprob(self, obs: dict, chain: torch.Tensor, token=None, sigma: float = 0.1) -> torch.Tensor:
        """log-probabilities [B, K] of a chain from ``sample_actions_stochastic`` under the current weights."""

    @abc.abstractmethod
    def embed(self, obs: dict) -> torch.Tensor:
        """Observation features [B, D] (what RL critics may read)."""

    @abc.abstractmethod
    def loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """Supervised loss on a batch (obs fields + ``action`` [B, H, A] + ``action_is_pad`` [B, H])."""

    def sample_actions_from_embedding(self, emb: torch.Tensor, noise=None, token=None,
                                      num_steps: int | None = None, normalized: bool = False) -> torch.Tensor:
        """Actions from stored ``embed`` features (DSRL-NA re-generates chunks for replayed states).
        ``normalized`` returns the sampler's own units (what the noise maps to) instead of robot units."""
        raise NotImplementedError(f"{type(self).__name__} cannot sample from a stored embedding")

    # -- training modes --------------------------------------------------------------------
    def backbone_modules(self) -> dict[str, nn.Module]:
        """The pretrained parts that the mode applies to (name -> module)."""
        return {}

    def always_frozen_modules(self) -> dict[str, nn.Module]:
        """Parts that never train (e.g. the sentence encoder)."""
        return {}

    lora_targets: tuple[str, ...] = ()

    def set_mode(self, mode: str, lora_rank: int = 8, lora_alpha: int = 16,
                 lora_targets: tuple[str, ...] | None = None) -> "VLA":
        from vla.models.modes import apply_mode

        apply_mode(self, mode, lora_rank=lora_rank, lora_alpha=lora_alpha, lora_targets=lora_targets)
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]
