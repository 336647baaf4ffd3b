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
* ``embed(obs) -> [B, embed_dim]`` and ``sample_actions_from_embedding(emb, noise, ...)`` (DSRL-NA
  re-generates chunks for replayed states from stored features; the first ``embed_summary_dim``
  columns are what a critic should read), ``normalize_actions`` / ``unnormalize_actions`` (robot
  units <-> the sampler's own action units, which ``sample_actions_from_embedding(normalized=True)``
  returns; a backbone's own: min / max [-1, 1] for the compact VLA, mean / std for LeRobot's),
  ``clip_normalized_actions`` (an operator's or a demo's normalised chunk limited to the range the
  sampler returns, whatever that is for the backbone).

A backbone that lacks an optional handle raises ``NotImplementedError`` naming it;
``require_handles(*names)`` (called when an RL method is built) raises one ``ValueError`` naming
every missing or unsupported handle and the backbone.

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

from vla.models.modes import apply_mode


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

    def frozen_features(self, obs: dict):
        """The part of ``obs``'s conditioning that no trainable weight affects in the current mode (the compact
        VLA's frozen vision trunk), for a caller that scores the same observations many times: GRPO's update
        re-scores every macro-step of its rollouts ``epochs`` times plus once under the reference, and the trunk is
        about 95% of a log-probability's cost on a CPU. Hand them back as ``features=`` to
        ``sample_actions_stochastic`` / ``chain_logprob`` on a VLA whose frozen part has the same weights. None
        (the default): nothing to cache, and the caller passes no ``features``."""
        return None

    @abc.abstractmethod
    def embed(self, obs: dict) -> torch.Tensor:
        """Observation features [B, D] (what RL critics may read)."""

    @abc.abstractmethod
    def loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """Supervised loss on a batch (obs fields + ``action`` [B, H, A] + ``action_is_pad`` [B, H])."""

    # -- steering handles with a default that says the backbone lacks them -------------------
    @property
    def embed_dim(self) -> int:
        """Columns D of ``embed()``'s features [B, D] (what a replay buffer stores per state)."""
        raise NotImplementedError(self._missing("embed_dim"))

    @property
    def embed_summary_dim(self) -> int:
        """The first ``embed_summary_dim`` columns of ``embed()`` are a fixed-size summary of the
        observation that a critic may read; the rest (if any) is what ``sample_actions_from_embedding``
        needs to rebuild the denoiser's conditioning. Default: all of it."""
        return self.embed_dim

    def normalize_actions(self, a: torch.Tensor) -> torch.Tensor:
        """Robot units [..., A] -> the sampler's own action units [..., A] (what
        ``sample_actions_from_embedding(normalized=True)`` returns)."""
        raise NotImplementedError(self._missing("normalize_actions"))

    def unnormalize_actions(self, a: torch.Tensor) -> torch.Tensor:
        """The sampler's own action units [..., A] -> robot units [..., A]."""
        raise NotImplementedError(self._missing("unnormalize_actions"))

    def clip_normalized_actions(self, a: torch.Tensor) -> torch.Tensor:
        """Normalised actions [..., A] that did not come from the sampler (an operator's chunk, a
        recorded demo's) limited to the range the sampler returns, so that a critic reading
        normalised chunks sees them as it sees the sampler's. Only a backbone knows that range: the
        compact VLA's min / max units are [-1, 1] (its sampler and ``unnormalize_actions`` clip
        there), LeRobot's mean / std or quantile units are unbounded. Default: the round trip
        ``normalize_actions(unnormalize_actions(a))``, which clips where ``unnormalize_actions``
        clips and is the identity (up to float rounding) where it does not."""
        return self.normalize_actions(self.unnormalize_actions(a))

    def sample_actions_from_embedding(self, emb: torch.Tensor, noise=None, token=None,
                                      num_steps: int | None = None, normalized: bool = False) -> torch.Tensor:
        """Actions [B, H, A] from stored ``embed`` features with supplied ``noise`` (DSRL-NA
        re-generates chunks for replayed states). ``normalized`` returns the sampler's own units
        (what the noise maps to) instead of robot units. With the same noise,
        ``sample_actions_from_embedding(embed(obs), noise)`` equals ``sample_actions(obs, noise)``."""
        raise NotImplementedError(self._missing("sample_actions_from_embedding"))

    # -- checking handles --------------------------------------------------------------------
    HANDLES = {
        "noise": "the sampler's initial noise (noise_shape)",
        "token": "behaviour tokens (num_tokens > 0)",
        "instruction": "the instruction text as the prompt",
        "embed": "observation features embed(obs) -> [B, D]",
        "embed_dim": "the width D of embed()",
        "normalize_actions": "robot units -> the sampler's action units",
        "unnormalize_actions": "the sampler's action units -> robot units",
        "sample_actions_from_embedding": "actions from stored embed() features and supplied noise",
        "sample_actions_stochastic": "a stochastic sampler with per-step log-probabilities",
        "chain_logprob": "log-probabilities of a stochastic chain under the current weights",
    }
    """Steering handles an RL method may require (``require_handles``), with what each one is."""

    def backbone_name(self) -> str:
        """How errors name this backbone (class, and the LeRobot policy kind where there is one)."""
        kind = getattr(self, "kind", "")
        return f"{type(self).__name__} ({kind})" if kind else type(self).__name__

    def _missing(self, handle: str) -> str:
        return f"the {self.backbone_name()} backbone does not implement the steering handle '{handle}'"

    def unsupported_handles(self) -> dict[str, str]:
        """Handles this backbone has but cannot serve in its current configuration: name -> why."""
        return {} if self.num_tokens > 0 else {"token": "it has no behaviour tokens (num_tokens = 0)"}

    def require_handles(self, *names: str) -> None:
        """Raise ``ValueError`` naming every handle in ``names`` that this backbone lacks (not
        implemented, or unsupported as configured), and the backbone; an RL method calls it when it
        is built. Known handles: ``VLA.HANDLES``."""
        unknown = [n for n in names if n not in self.HANDLES]
        if unknown:
            raise ValueError(f"unknown steering handle(s) {unknown}; known: {sorted(self.HANDLES)}")
        unsupported = self.unsupported_handles()
        problems = []
        for n in names:
            if n in unsupported:
                problems.append(f"'{n}' ({self.HANDLES[n]}): unsupported, {unsupported[n]}")
            elif n in VLA.__dict__ and _overrides(type(self), n) is VLA.__dict__[n]:
                problems.append(f"'{n}' ({self.HANDLES[n]}): not implemented")
        if problems:
            raise ValueError(f"the {self.backbone_name()} backbone lacks steering handle(s) this needs: "
                             + "; ".join(problems))

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
        apply_mode(self, mode, lora_rank=lora_rank, lora_alpha=lora_alpha, lora_targets=lora_targets)
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]


def _overrides(cls: type, name: str) -> Any:
    """The class attribute ``name`` as ``cls`` resolves it (the base class's when not overridden)."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None
