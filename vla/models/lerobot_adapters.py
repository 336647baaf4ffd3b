"""LeRobot pi0 / pi05 / SmolVLA policies behind the repo's VLA interface (``vla.models.base.VLA``).

Load a checkpoint directory written by ``PreTrainedPolicy.save_pretrained`` (``config.json`` +
``model.safetensors``, optionally the ``policy_preprocessor*`` / ``policy_postprocessor*`` files
that ``lerobot-train`` writes next to them) with ``LeRobotVLA.from_checkpoint(path)``. Nothing
is fetched from the Hugging Face hub: every file must be local (or already in the HF cache).

Data path (the policy's own LeRobot processor pipeline does the policy-specific work)::

    obs {"images": {cam: uint8 [B,H,W,3]}, "state": [B,S], "instruction": [str]}
      -> {"observation.images.<key>": float [B,3,H,W] in [0,1], "observation.state", "task"}
      -> preprocessor: newline / pi05 state-in-prompt, tokenizer, normalisation (dataset stats)
      -> model.sample_actions(..., noise) in normalised, padded units [B, chunk_size, max_action_dim]
      -> trim to the real action dim -> postprocessor (un-normalise) -> float32 [B, H, A] robot units

Conventions:

* ``noise_shape = (chunk_size, max_action_dim)``: the noise lives in the model's normalised,
  zero-padded action space; only the first ``A`` dims reach the robot.
* Flow convention as in ``vla.models.flow`` (it is LeRobot's): ``t = 1`` noise, ``t = 0`` action,
  Euler steps ``x <- x + dt * v`` with ``dt = -1 / num_steps``. ``sample_actions_stochastic``
  turns each step into ``x_{k+1} ~ N(x_k + dt * v, sigma^2 I)`` (last step deterministic) on top
  of the model's own prefix KV cache and ``denoise_step``.
* Tokenizer: pi0 / pi05 use PaliGemma's tokenizer, which LeRobot downloads by name. Here it is
  either passed in (object or local directory), found in ``<checkpoint>/tokenizer/`` (what
  ``save_pretrained`` writes) or found in the local HF cache; otherwise ``from_checkpoint``
  raises ``ValueError`` saying so. There is no silent stand-in tokenizer. SmolVLA uses the
  tokenizer of its VLM processor (``config.vlm_model_name``, which may be a local directory:
  pass ``vlm_dir``).
* Normalisation stats come from the checkpoint's saved processor files, else from ``stats``;
  with neither, state and actions pass through un-normalised (a warning says so).
* ``token`` (ExToken) is not supported: these backbones have no behaviour tokens.
* Steering handles: ``normalize_actions`` / ``unnormalize_actions`` are the processors' action
  (un)normaliser (the sampler's units are its normalised space, the real ``A`` dims: mean / std
  or quantile units, not bounded to [-1, 1], so ``clip_normalized_actions`` leaves them alone); refused with
  relative actions or the pi-aloha conversion, which need the observation. ``embed`` rows carry
  the denoiser's prefix so that ``sample_actions_from_embedding`` works on stored rows; see
  ``LeRobotVLA.embed`` for the layout and its cost.

lerobot 0.6.1 pins ``transformers<5.6``; with a newer transformers two library calls changed
signature (``create_causal_mask``, ``DynamicCache.crop``). ``patch_lerobot_for_transformers``
(applied when an adapter is built, a no-op where not needed) bridges both; the tests check the
KV-cached sampler against the model's joint (uncached) forward pass.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vla.models.base import StochasticSample, VLA, as_tensor_batch
from vla.models.flow import FlowMatchingHead

log = logging.getLogger(__name__)

PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"
"""The tokenizer LeRobot's pi0 / pi05 processors load by name (only looked up in the local HF cache here)."""

IMAGE_PREFIX = "observation.images."
STATE_KEY = "observation.state"
ACTION_KEY = "action"
PAD_KEY = "action_is_pad"

_PATCHED: list[str] = []


def patch_lerobot_for_transformers() -> list[str]:
    """Bridge lerobot 0.6.1 (written for transformers 5.4-5.5) to newer transformers releases.

    * ``create_causal_mask`` lost ``cache_position`` and renamed ``past_key_values`` to ``cache``;
      pi0 / pi05 (``lerobot.policies.pi_gemma``) still call the old form. They always pass a
      ready 4D mask, which the function returns as is, so only the call signature needs bridging.
    * ``DynamicCache.crop(n)`` used to mean "keep the first n tokens of every layer"; it now only
      accepts negative counts. SmolVLA's ``denoise_step`` crops with the old meaning.

    Idempotent; patches only what the installed transformers needs. Returns what was patched."""
    from transformers import masking_utils

    if "create_causal_mask" not in _PATCHED and \
            "cache_position" not in inspect.signature(masking_utils.create_causal_mask).parameters:
        from lerobot.policies import pi_gemma

        new = masking_utils.create_causal_mask

        def create_causal_mask(config, inputs_embeds, attention_mask, cache_position=None, past_key_values=None,
                               position_ids=None, **kwargs):
            return new(config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                       cache=past_key_values, position_ids=position_ids, **kwargs)

        pi_gemma.create_causal_mask = create_causal_mask
        _PATCHED.append("create_causal_mask")

    if "DynamicCache.crop" not in _PATCHED and not _crop_keeps_absolute_length():
        from lerobot.policies.smolvla import smolvlm_with_expert
        from transformers import DynamicCache

        class LegacyCropDynamicCache(DynamicCache):
            """``crop(n >= 0)`` keeps the first n tokens of every layer (the pre-5.6 meaning)."""

            def crop(self, max_length: int) -> None:
                if max_length < 0:
                    return super().crop(max_length)
                for layer in self.layers:
                    extra = layer.get_seq_length() - max_length
                    if getattr(layer, "is_initialized", True) and extra > 0:
                        layer.crop(-extra)

        smolvlm_with_expert.DynamicCache = LegacyCropDynamicCache
        _PATCHED.append("DynamicCache.crop")
    return list(_PATCHED)


def _crop_keeps_absolute_length() -> bool:
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2), 0)
    try:
        cache.crop(2)
    except ValueError:
        return False
    return cache.get_seq_length() == 2


@dataclasses.dataclass
class _Prefix:
    """What the denoiser needs from one pass over the observation (images, language, state)."""

    hidden: torch.Tensor
    """[B, L, D] the VLM's last hidden states over the prefix tokens."""
    pad_masks: torch.Tensor
    """[B, L] True for real (non-padding) prefix tokens."""
    past_key_values: Any
    """The VLM's KV cache over the prefix."""
    state: torch.Tensor | None = None
    """[B, max_state_dim] padded normalised state (pi0 feeds it to the action expert)."""


class LeRobotVLA(VLA):
    """A LeRobot flow-matching VLA policy (pi0 / pi05 / SmolVLA) as a ``VLA``.

    Build one with ``from_checkpoint`` or directly from a loaded policy with the named subclass
    (``LeRobotPi0(policy, tokenizer=...)``):

    * ``tokenizer``: a tokenizer object; required for pi0 / pi05 unless processors are given,
      SmolVLA defaults to its VLM processor's.
    * ``camera_map``: the repo's camera names -> the policy's image keys (``"front" ->
      "observation.images.base_0_rgb"``; the prefix may be left out). By default a camera maps to
      the image key of the same name. Policy cameras without an observation get LeRobot's
      empty-camera padding.
    * ``stats``: normalisation stats for freshly built processors (``None``: no normalisation).
    * ``preprocessor`` / ``postprocessor``: LeRobot pipelines (e.g. a checkpoint's saved ones)
      used instead of building them from the config.

    Until ``set_mode`` is called the ``requires_grad`` flags are what LeRobot's config left (SmolVLA's
    ``train_expert_only`` freezes its VLM)."""

    kind: str = ""
    policy_class_path: tuple[str, str] = ("", "")
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    uses_state_token: bool = False
    """The action expert reads the state itself (pi0), besides the prefix."""

    def __init__(self, policy: nn.Module, tokenizer: Any = None, camera_map: Mapping[str, str] | None = None,
                 stats: Mapping[str, Mapping[str, Any]] | None = None, preprocessor: Any = None,
                 postprocessor: Any = None) -> None:
        super().__init__()
        expected = _import(*self.policy_class_path)
        if not isinstance(policy, expected):
            raise ValueError(f"{type(self).__name__} wraps a {expected.__name__}, got {type(policy).__name__}")
        patch_lerobot_for_transformers()
        self.policy = policy
        cfg = policy.config
        if ACTION_KEY not in cfg.output_features:
            raise ValueError(f"policy config has no '{ACTION_KEY}' output feature (has {sorted(cfg.output_features)})")
        self._action_dim = int(cfg.output_features[ACTION_KEY].shape[0])
        state = cfg.input_features.get(STATE_KEY)
        self._state_dim = int(state.shape[0]) if state is not None else None
        if (preprocessor is None) != (postprocessor is None):
            raise ValueError("pass both preprocessor and postprocessor, or neither")
        tokenizer = self._default_tokenizer() if tokenizer is None else tokenizer
        if preprocessor is None:
            if tokenizer is None:
                raise ValueError(f"{self.kind} needs a tokenizer (the PaliGemma tokenizer for pi0 / pi05): pass "
                                 "tokenizer=<tokenizer object>, or load with from_checkpoint(path, tokenizer=<dir>)")
            if stats is None:
                log.warning("%s: no normalisation stats given: state and actions pass un-normalised", self.kind)
            preprocessor, postprocessor = self._build_processors(tokenizer, stats)
        elif stats is not None:
            raise ValueError("stats are read from the given preprocessor / postprocessor; do not pass both")
        self.tokenizer = tokenizer
        self.preprocessor, self.postprocessor = preprocessor, postprocessor
        self.camera_map = self._check_camera_map(camera_map)

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, path: str | Path, kind: str | None = None, *, tokenizer: Any = None,
                        camera_map: Mapping[str, str] | None = None, stats: Mapping | None = None,
                        vlm_dir: str | Path | None = None, device: str | torch.device = "cpu") -> "LeRobotVLA":
        """Load a policy from a local checkpoint directory. ``kind`` (``pi0`` / ``pi05`` /
        ``smolvla``) defaults to config.json's ``type``. ``tokenizer``: a tokenizer object or a
        local directory (see the module docstring for the lookup order). ``stats``: normalisation
        stats ``{"observation.state": {"mean": ..., ...}, "action": {...}}`` when the directory has
        no saved processor. ``vlm_dir`` (SmolVLA): a local copy of the VLM's config + processor,
        replacing ``config.vlm_model_name``. The weights must match the config exactly."""
        path = Path(path)
        if not path.is_dir():
            raise ValueError(f"checkpoint directory {str(path)!r} does not exist")
        cfg_file, weights = path / "config.json", path / "model.safetensors"
        if not cfg_file.is_file():
            raise ValueError(f"checkpoint {str(path)!r} has no config.json "
                             "(expected the output of PreTrainedPolicy.save_pretrained)")
        try:
            ptype = json.loads(cfg_file.read_text()).get("type")
        except json.JSONDecodeError as e:
            raise ValueError(f"{cfg_file} is not valid JSON: {e}") from None
        if ptype not in ADAPTERS:
            raise ValueError(f"{cfg_file} has type {ptype!r}; supported LeRobot policy types: {sorted(ADAPTERS)}")
        if kind is not None and kind != ptype:
            raise ValueError(f"kind={kind!r} but {cfg_file} says type {ptype!r}")
        adapter = ADAPTERS[ptype]
        if cls is not LeRobotVLA and cls is not adapter:
            raise ValueError(f"{cls.__name__} loads '{cls.kind}' checkpoints, "
                             f"{str(path)!r} holds a '{ptype}' policy")
        if not weights.is_file():
            raise ValueError(f"checkpoint {str(path)!r} has no model.safetensors")

        from lerobot.configs import PreTrainedConfig

        config = PreTrainedConfig.from_pretrained(path)
        config.device = str(device)
        adapter._prepare_config(config, vlm_dir)
        patch_lerobot_for_transformers()
        try:
            policy = _import(*adapter.policy_class_path)(config)
        except OSError as e:  # transformers: a hub id that is not in the local cache
            raise ValueError(f"building the {ptype} policy needs files that are not available offline: {e}") from None
        policy.to(device)
        _load_weights(policy, weights, adapter._fix_state_dict_keys(policy))
        policy.eval()

        tokenizer = adapter._resolve_tokenizer(tokenizer, path, policy)
        pre = post = None
        if (path / "policy_preprocessor.json").is_file():
            if stats is not None:
                raise ValueError(f"{str(path)!r} has saved processors with their own stats; do not pass stats")
            pre, post = adapter._load_processors(path, tokenizer, policy, device)
        return adapter(policy, tokenizer=tokenizer, camera_map=camera_map, stats=stats, preprocessor=pre,
                       postprocessor=post)

    def save_pretrained(self, path: str | Path) -> None:
        """Write the policy, its processors (with the normalisation stats) and, for pi0 / pi05, the
        tokenizer (into ``tokenizer/``): ``from_checkpoint(path)`` restores this adapter."""
        if getattr(self, "_lora_injected", False):
            raise ValueError("this model carries LoRA adapters; merge them into the weights before saving")
        path = Path(path)
        self.policy.save_pretrained(path)
        self.preprocessor.save_pretrained(path)
        self.postprocessor.save_pretrained(path)
        if self.kind != "smolvla" and hasattr(self.tokenizer, "save_pretrained"):
            self.tokenizer.save_pretrained(path / "tokenizer")

    @classmethod
    def _prepare_config(cls, config: Any, vlm_dir: str | Path | None) -> None:
        if vlm_dir is not None:
            raise ValueError(f"vlm_dir only applies to smolvla checkpoints, not {cls.kind}")

    @classmethod
    def _fix_state_dict_keys(cls, policy: nn.Module):
        return None

    @classmethod
    def _resolve_tokenizer(cls, tokenizer: Any, path: Path, policy: nn.Module) -> Any:
        """pi0 / pi05: explicit object or directory -> <checkpoint>/tokenizer -> HF cache -> ValueError."""
        from transformers import AutoTokenizer

        if tokenizer is not None and not isinstance(tokenizer, (str, Path)):
            return tokenizer
        candidates = [Path(tokenizer)] if tokenizer is not None else [path / "tokenizer", PALIGEMMA_TOKENIZER]
        errors = []
        for c in candidates:
            if isinstance(c, Path) and not c.is_dir():
                errors.append(f"{str(c)!r}: no such directory")
                continue
            try:
                return AutoTokenizer.from_pretrained(str(c), local_files_only=True)
            except (OSError, ValueError) as e:
                errors.append(f"{str(c)!r}: {str(e).splitlines()[0]}")
        raise ValueError(f"{cls.kind} needs the PaliGemma tokenizer and none is available offline ("
                         + "; ".join(errors) + "). Pass tokenizer=<tokenizer object or local directory>, or put "
                         f"it in {str(path / 'tokenizer')!r}")

    @classmethod
    def _load_processors(cls, path: Path, tokenizer: Any, policy: nn.Module, device: str | torch.device):
        """The processors lerobot-train saved, with our tokenizer object instead of a hub download."""
        from lerobot.policies.factory import make_pre_post_processors

        return make_pre_post_processors(
            policy.config, pretrained_path=str(path),
            preprocessor_overrides={"tokenizer_processor": {"tokenizer": tokenizer},
                                    "device_processor": {"device": str(device)}})

    def _default_tokenizer(self) -> Any:
        return None

    @abc.abstractmethod
    def _build_processors(self, tokenizer: Any, stats: Mapping | None):
        """Fresh processor pipelines, step for step as lerobot's ``make_<kind>_pre_post_processors``
        builds them, but with a tokenizer object instead of a hub name."""

    # -- shapes ---------------------------------------------------------------------------------
    @property
    def noise_shape(self) -> tuple[int, int]:
        """(chunk_size, max_action_dim): the model's normalised, zero-padded action space."""
        return (int(self.policy.config.chunk_size), int(self.policy.config.max_action_dim))

    @property
    def action_shape(self) -> tuple[int, int]:
        return (int(self.policy.config.chunk_size), self._action_dim)

    @property
    @abc.abstractmethod
    def default_num_steps(self) -> int:
        """The model's own number of denoising steps."""

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device

    # -- observation -> model inputs -----------------------------------------------------------
    def _image_keys(self) -> set[str]:
        """Image keys the preprocessor accepts: the policy's, and the sources of its rename map."""
        keys = set(self.policy.config.image_features)
        for step in getattr(self.preprocessor, "steps", []):
            for src, dst in (getattr(step, "rename_map", None) or {}).items():
                if dst in keys:
                    keys.add(src)
        return keys

    def _check_camera_map(self, camera_map: Mapping[str, str] | None) -> dict[str, str]:
        known = self._image_keys()
        if camera_map is None:
            return {k[len(IMAGE_PREFIX):]: k for k in known if k.startswith(IMAGE_PREFIX)}
        out = {}
        for cam, key in camera_map.items():
            key = key if key.startswith(IMAGE_PREFIX) else IMAGE_PREFIX + key
            if key not in known:
                raise ValueError(f"camera_map['{cam}'] = {key!r} is not an image input of this policy "
                                 f"(known: {sorted(known)})")
            out[cam] = key
        return out

    def _lerobot_batch(self, obs: dict) -> dict[str, Any]:
        """The repo's observation batch -> LeRobot's batch (images float [B,3,H,W] in [0, 1])."""
        o = as_tensor_batch(obs, self.device)
        batch: dict[str, Any] = {}
        for cam, img in o["images"].items():
            if cam not in self.camera_map:
                raise ValueError(f"observation 'images.{cam}' has no policy image key; pass camera_map "
                                 f"(cameras this adapter knows: {sorted(self.camera_map)})")
            batch[self.camera_map[cam]] = img.permute(0, 3, 1, 2).float() / 255.0
        if not batch:
            raise ValueError("observation 'images' is empty: the policy needs at least one camera")
        if self._state_dim is not None and o["state"].shape[1] != self._state_dim:
            raise ValueError(f"observation 'state' must be [B, {self._state_dim}] for this policy, "
                             f"got {list(o['state'].shape)}")
        batch[STATE_KEY] = o["state"]
        batch["task"] = o["instruction"]
        return batch

    def _preprocess(self, obs: dict) -> dict[str, Any]:
        return self.preprocessor(self._lerobot_batch(obs))

    @abc.abstractmethod
    def _model_inputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Preprocessed batch -> the inputs of the model's sampler / prefix, plus ``batch_size``."""

    def _finish_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Normalised padded chunk [B, H, max_action_dim] -> robot units [B, H, A] float32."""
        actions = self.postprocessor(actions[:, :, : self._action_dim])
        return actions.to(self.device, torch.float32)

    # -- checks -------------------------------------------------------------------------------
    def _check_token(self, token) -> None:
        if token is not None and bool(torch.as_tensor(token).ne(0).any()):
            raise ValueError(f"token: LeRobot {self.kind} has no behaviour tokens (num_tokens = 0); "
                             "pass None or the null token 0")

    def _check_noise(self, noise, batch: int) -> torch.Tensor:
        h, a = self.noise_shape
        if noise is None:
            return torch.randn(batch, h, a, device=self.device)
        noise = torch.as_tensor(noise, dtype=torch.float32, device=self.device)
        if tuple(noise.shape) != (batch, h, a):
            raise ValueError(f"noise must have shape [B={batch}, H={h}, A={a}] (chunk_size, max_action_dim), "
                             f"got {list(noise.shape)}")
        if not torch.isfinite(noise).all():
            raise ValueError("noise contains NaN or inf")
        return noise

    def _check_steps(self, num_steps: int | None) -> int:
        if num_steps is None:
            return self.default_num_steps
        if int(num_steps) != num_steps or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}")
        return int(num_steps)

    # -- sampling -----------------------------------------------------------------------------
    @abc.abstractmethod
    def _sample(self, inputs: dict[str, Any], noise: torch.Tensor, num_steps: int) -> torch.Tensor:
        """The model's own deterministic sampler -> normalised padded chunk."""

    @abc.abstractmethod
    def _embed_prefix(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The model's ``embed_prefix``: -> prefix embeddings [B, L, D], pad masks [B, L], attention masks [B, L]."""

    @abc.abstractmethod
    def _prefix_from_embs(self, embs: torch.Tensor, pad_masks: torch.Tensor, att_masks: torch.Tensor,
                          state: torch.Tensor | None) -> _Prefix:
        """One VLM pass over the prefix embeddings -> hidden states + KV cache."""

    def _prefix(self, inputs: dict[str, Any]) -> _Prefix:
        """One VLM pass over images, language (and state) -> hidden states + KV cache."""
        embs, pad_masks, att_masks = self._embed_prefix(inputs)
        return self._prefix_from_embs(embs, pad_masks, att_masks, inputs["state"] if self.uses_state_token else None)

    @abc.abstractmethod
    def _velocity(self, prefix: _Prefix, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """v(x_t, t) [B, chunk_size, max_action_dim] from the model's ``denoise_step``."""

    def sample_actions(self, obs: dict, noise=None, token=None, num_steps: int | None = None) -> torch.Tensor:
        """The model's Euler sampler from ``noise`` [B, chunk_size, max_action_dim] -> float32
        [B, chunk_size, A] in robot units; the same noise gives the same actions."""
        self._check_token(token)
        steps = self._check_steps(num_steps)
        with torch.no_grad():
            inputs = self._model_inputs(self._preprocess(obs))
            x0 = self._check_noise(noise, inputs["batch_size"])
            return self._finish_actions(self._sample(inputs, x0, steps))

    def _times(self, k: int, steps: int, batch: int) -> torch.Tensor:
        return torch.full((batch,), 1.0 + k * (-1.0 / steps), dtype=torch.float32, device=self.device)

    def sample_actions_stochastic(self, obs: dict, noise=None, token=None, num_steps: int | None = None,
                                  sigma: float = 0.1, generator: torch.Generator | None = None) -> StochasticSample:
        """Flow-noise sampler: ``x_{k+1} ~ N(x_k + dt * v(x_k, t_k), sigma^2 I)``, the last step
        deterministic (log-prob 0). ``chain`` and ``logprob`` are in the normalised padded space
        [B, K+1, chunk_size, max_action_dim]; ``actions`` in robot units."""
        self._check_token(token)
        if sigma <= 0:
            raise ValueError(f"sigma must be positive, got {sigma}")
        steps = self._check_steps(num_steps)
        with torch.no_grad():
            inputs = self._model_inputs(self._preprocess(obs))
            x = self._check_noise(noise, inputs["batch_size"])
            prefix = self._prefix(inputs)
            dt = -1.0 / steps
            chain, logps = [x], []
            for k in range(steps):
                mean = x + dt * self._velocity(prefix, x, self._times(k, steps, x.shape[0]))
                if k == steps - 1:
                    x = mean
                    logps.append(torch.zeros(x.shape[0], device=x.device))
                else:
                    eps = torch.randn(mean.shape, device=mean.device, dtype=mean.dtype, generator=generator)
                    x = mean + sigma * eps
                    logps.append(FlowMatchingHead.transition_logprob(x, mean, sigma))
                chain.append(x)
            return StochasticSample(actions=self._finish_actions(x), chain=torch.stack(chain, 1),
                                    logprob=torch.stack(logps, 1))

    def chain_logprob(self, obs: dict, chain: torch.Tensor, token=None, sigma: float = 0.1) -> torch.Tensor:
        """log-probabilities [B, K] of ``chain`` under the current weights, with gradients."""
        self._check_token(token)
        if sigma <= 0:
            raise ValueError(f"sigma must be positive, got {sigma}")
        chain = torch.as_tensor(chain, dtype=torch.float32, device=self.device)
        if chain.ndim != 4 or chain.shape[1] < 2 or tuple(chain.shape[2:]) != self.noise_shape:
            raise ValueError(f"chain must be [B, K+1, {self.noise_shape[0]}, {self.noise_shape[1]}] with K >= 1, "
                             f"got {list(chain.shape)}")
        with torch.no_grad():
            inputs = self._model_inputs(self._preprocess(obs))
        if chain.shape[0] != inputs["batch_size"]:
            raise ValueError(f"chain has batch {chain.shape[0]}, the observation {inputs['batch_size']}")
        prefix = self._prefix(inputs)
        steps = chain.shape[1] - 1
        dt = -1.0 / steps
        out = []
        for k in range(steps):
            x = chain[:, k]
            if k == steps - 1:  # deterministic last step
                out.append(torch.zeros(x.shape[0], device=x.device))
                continue
            mean = x + dt * self._velocity(prefix, x, self._times(k, steps, x.shape[0]))
            out.append(FlowMatchingHead.transition_logprob(chain[:, k + 1], mean, sigma))
        return torch.stack(out, 1)

    # -- features and loss ----------------------------------------------------------------------
    def embed(self, obs: dict) -> torch.Tensor:
        """-> float32 [B, embed_dim]: ``[summary | prefix]``.

        * ``summary`` (the first ``embed_summary_dim`` = VLM width columns): the mean over the real
          prefix tokens (images, language, and state for SmolVLA) of the VLM's last hidden states,
          what a critic may read. Gradients flow through it unless the caller disables them.
        * ``prefix`` (detached): what the denoiser needs, so that ``sample_actions_from_embedding``
          re-generates chunks for a stored state (DSRL-NA's replayed states): the prefix input
          embeddings (vision tower + language embedding output) [L, D], their pad and attention
          masks [L] each, and for pi0 the padded normalised state [max_state_dim]. The language is
          padded to ``tokenizer_max_length`` here, so that L (and ``embed_dim``) is fixed.

        Cost: ``(1 + L) * D + 2 L (+ max_state_dim)`` floats per row. The stock models, 3 cameras and
        48 language tokens, come to about L = 241, D = 960 (SmolVLA: ~0.23 M floats, ~0.9 MB) and
        L = 816, D = 2048 (pi0 / pi05: ~1.7 M floats, ~6.7 MB); a replay buffer of such rows needs a
        GPU-box's memory (the tiny test models: a few hundred floats). Sampling from it skips the
        tokenizer and the vision tower but re-runs the VLM over the prefix (the dominant cost of a
        ``sample_actions`` call) and the denoising steps."""
        with torch.no_grad():
            inputs = self._pad_language(self._model_inputs(self._preprocess(obs)))
        embs, pad_masks, att_masks = self._embed_prefix(inputs)
        state = inputs["state"] if self.uses_state_token else None
        prefix = self._prefix_from_embs(embs, pad_masks, att_masks, state)
        m = prefix.pad_masks[..., None].to(prefix.hidden.dtype)
        summary = ((prefix.hidden * m).sum(1) / m.sum(1).clamp_min(1.0)).float()
        self._prefix_dtype = embs.dtype
        parts = [summary, embs.detach().float().flatten(1), pad_masks.detach().float(), att_masks.detach().float()]
        if state is not None:
            parts.append(state.detach().float())
        return torch.cat(parts, dim=1)

    def _pad_language(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Language tokens padded (masked out) to ``tokenizer_max_length``: a fixed prefix length
        whatever the instruction (the padding is masked, so the model's outputs do not change)."""
        n, tokens = int(self.policy.config.tokenizer_max_length), inputs["tokens"]
        if tokens.shape[1] >= n:
            return inputs
        extra = n - tokens.shape[1]
        pad_id = getattr(self.tokenizer, "pad_token_id", None) or 0
        return {**inputs, "tokens": torch.cat([tokens, tokens.new_full((tokens.shape[0], extra), pad_id)], 1),
                "masks": torch.cat([inputs["masks"], inputs["masks"].new_zeros((tokens.shape[0], extra))], 1)}

    @property
    def embed_summary_dim(self) -> int:
        """The VLM's width: the pooled hidden state at the front of ``embed()``."""
        return self._embed_layout()[0]

    @property
    def embed_dim(self) -> int:
        d, length, s = self._embed_layout()
        return d + length * d + 2 * length + s

    def _embed_layout(self) -> tuple[int, int, int]:
        """(D, L, S) of ``embed()``'s rows, found once by embedding a blank observation."""
        if getattr(self, "_layout", None) is None:
            obs = {"images": {}, "instruction": [""],
                   "state": torch.zeros(1, self._state_dim or int(self.policy.config.max_state_dim))}
            for cam, key in self.camera_map.items():
                feat = self.policy.config.image_features.get(key)
                h, w = (int(feat.shape[1]), int(feat.shape[2])) if feat is not None else (32, 32)
                obs["images"][cam] = torch.zeros(1, h, w, 3, dtype=torch.uint8)
            with torch.no_grad():
                inputs = self._pad_language(self._model_inputs(self._preprocess(obs)))
                embs, _, _ = self._embed_prefix(inputs)
            self._prefix_dtype = embs.dtype
            s = int(inputs["state"].shape[1]) if self.uses_state_token else 0
            self._layout = (int(embs.shape[2]), int(embs.shape[1]), s)
        return self._layout

    def _prefix_from_embedding(self, emb) -> _Prefix:
        """``embed()`` rows -> the denoiser's prefix (one VLM pass over the stored prefix embeddings)."""
        d, length, s = self._embed_layout()
        emb = torch.as_tensor(emb, dtype=torch.float32, device=self.device)
        if emb.ndim != 2 or emb.shape[1] != self.embed_dim:
            raise ValueError(f"embedding must be [B, {self.embed_dim}] (rows of this {self.kind} adapter's embed()), "
                             f"got {list(emb.shape)}")
        b, i = emb.shape[0], d
        embs = emb[:, i: i + length * d].reshape(b, length, d).to(self._prefix_dtype)
        i += length * d
        pad_masks, att_masks = emb[:, i: i + length] > 0.5, emb[:, i + length: i + 2 * length] > 0.5
        state = emb[:, i + 2 * length:] if s else None
        return self._prefix_from_embs(embs, pad_masks, att_masks, state)

    def sample_actions_from_embedding(self, emb: torch.Tensor, noise=None, token=None,
                                      num_steps: int | None = None, normalized: bool = False) -> torch.Tensor:
        """The model's Euler sampler from ``noise`` on the prefix stored in ``emb`` (rows of
        ``embed()``) -> [B, chunk_size, A]: robot units, or with ``normalized`` the model's
        normalised units (the real ``A`` dims of its padded action space; ``unnormalize_actions``
        maps them to robot units). Equals ``sample_actions(obs, noise)`` for ``emb = embed(obs)``
        up to float rounding. Cost: see ``embed``."""
        self._check_token(token)
        steps = self._check_steps(num_steps)
        with torch.no_grad():
            prefix = self._prefix_from_embedding(emb)
            x = self._check_noise(noise, prefix.pad_masks.shape[0])
            dt = -1.0 / steps
            for k in range(steps):  # LeRobot's euler_integrate: t = 1 + k dt, x <- x + dt v(x, t)
                x = x + dt * self._velocity(prefix, x, self._times(k, steps, x.shape[0]))
            if normalized:
                return x[:, :, : self._action_dim].to(torch.float32)
            return self._finish_actions(x)

    # -- action units ------------------------------------------------------------------------------
    def unsupported_handles(self) -> dict[str, str]:
        out = super().unsupported_handles()
        c = self.policy.config
        why = None
        if getattr(c, "use_relative_actions", False):
            why = "the policy predicts actions relative to the observed state (use_relative_actions)"
        elif getattr(c, "adapt_to_pi_aloha", False):
            why = "the policy's actions pass through the pi-aloha conversion (adapt_to_pi_aloha)"
        if why:
            out.update(normalize_actions=why, unnormalize_actions=why)
        return out

    def _action_step(self, pipeline: Any, cls_name: str) -> Any:
        problem = self.unsupported_handles().get("normalize_actions")
        if problem:
            raise ValueError(f"the {self.backbone_name()} backbone cannot map actions between units without the "
                             f"observation: {problem}")
        from lerobot.processor import NormalizerProcessorStep, UnnormalizerProcessorStep

        cls = {"normalize": NormalizerProcessorStep, "unnormalize": UnnormalizerProcessorStep}[cls_name]
        steps = [st for st in getattr(pipeline, "steps", []) if isinstance(st, cls)]
        return steps[0] if steps else None  # no normaliser: the units are the robot's

    def _map_actions(self, a, pipeline: Any, which: str) -> torch.Tensor:
        from lerobot.processor import TransitionKey

        a = torch.as_tensor(a, dtype=torch.float32, device=self.device)
        if a.shape[-1] != self._action_dim:
            raise ValueError(f"actions must be [..., A={self._action_dim}], got {list(a.shape)}")
        step = self._action_step(pipeline, which)
        if step is None:
            return a
        return step({TransitionKey.ACTION: a})[TransitionKey.ACTION].to(self.device, torch.float32)

    def normalize_actions(self, a: torch.Tensor) -> torch.Tensor:
        """Robot units [..., A] -> the model's normalised action units (its preprocessor's normaliser)."""
        return self._map_actions(a, self.preprocessor, "normalize")

    def unnormalize_actions(self, a: torch.Tensor) -> torch.Tensor:
        """The model's normalised action units [..., A] -> robot units (its postprocessor's unnormaliser)."""
        return self._map_actions(a, self.postprocessor, "unnormalize")

    def clip_normalized_actions(self, a: torch.Tensor) -> torch.Tensor:
        """Unchanged: LeRobot's normalised action units (mean / std, quantiles) are unbounded; neither
        its sampler nor its unnormaliser clips them."""
        a = torch.as_tensor(a, dtype=torch.float32, device=self.device)
        if a.shape[-1] != self._action_dim:
            raise ValueError(f"actions must be [..., A={self._action_dim}], got {list(a.shape)}")
        return a

    def _lerobot_train_batch(self, batch: dict) -> dict[str, Any]:
        if ACTION_KEY not in batch:
            raise ValueError(f"loss batch is missing '{ACTION_KEY}' (has {sorted(batch)})")
        lb = self._lerobot_batch(batch)
        b = lb[STATE_KEY].shape[0]
        action = torch.as_tensor(batch[ACTION_KEY], dtype=torch.float32, device=self.device)
        if tuple(action.shape) != (b, *self.action_shape):
            raise ValueError(f"batch '{ACTION_KEY}' must be [B={b}, H={self.action_shape[0]}, "
                             f"A={self.action_shape[1]}], got {list(action.shape)}")
        pad = batch.get(PAD_KEY)
        pad = torch.zeros(b, action.shape[1], dtype=torch.bool, device=self.device) if pad is None else \
            torch.as_tensor(pad, device=self.device).bool()
        if tuple(pad.shape) != (b, action.shape[1]):
            raise ValueError(f"batch '{PAD_KEY}' must be [B={b}, H={action.shape[1]}], got {list(pad.shape)}")
        if batch.get("action_weight") is not None:  # rows of weight 0 are left out (vla train --dagger-rows coherent)
            keep = torch.as_tensor(batch["action_weight"], device=self.device) > 0
            if tuple(keep.shape) != (b, action.shape[1]):
                raise ValueError(f"batch 'action_weight' must be [B={b}, H={action.shape[1]}], got {list(keep.shape)}")
            pad = pad | ~keep
        lb[ACTION_KEY], lb[PAD_KEY] = action, pad
        return self.preprocessor(lb)

    @abc.abstractmethod
    def loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """The policy's flow-matching loss on obs fields + ``action`` [B, H, A] (robot units) +
        ``action_is_pad`` [B, H]; padded steps do not count."""

    # -- training modes -------------------------------------------------------------------------
    @abc.abstractmethod
    def backbone_modules(self) -> dict[str, nn.Module]:
        """The pretrained VLM (vision tower + language model); the action expert and the
        projections always train in supervised fine-tuning."""

    def always_frozen_modules(self) -> dict[str, nn.Module]:
        """The language-model heads: nothing here predicts text, so they never get gradients."""
        return {}


# -- pi0 / pi05 ------------------------------------------------------------------------------------
class _PaliGemmaAdapter(LeRobotVLA):
    """Shared by pi0 and pi05: PaliGemma VLM + Gemma action expert (``PI0Pytorch`` / ``PI05Pytorch``)."""

    uses_state_token = True

    @classmethod
    def _fix_state_dict_keys(cls, policy: nn.Module):
        """The renames LeRobot's own ``from_pretrained`` applies (openpi-converted checkpoints),
        then the ``model.`` prefix."""
        def fix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            state = policy._fix_pytorch_state_dict_keys(state, policy.config)
            return {k if k.startswith("model.") else f"model.{k}": v for k, v in state.items()}
        return fix

    @property
    def default_num_steps(self) -> int:
        return int(self.policy.config.num_inference_steps)

    def _model_inputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

        images, img_masks = self.policy._preprocess_images(batch)
        inputs = {"images": images, "img_masks": img_masks, "tokens": batch[OBS_LANGUAGE_TOKENS],
                  "masks": batch[OBS_LANGUAGE_ATTENTION_MASK], "batch_size": batch[OBS_LANGUAGE_TOKENS].shape[0]}
        if self.uses_state_token:
            inputs["state"] = self.policy.prepare_state(batch)
        return inputs

    def _sample(self, inputs: dict[str, Any], noise: torch.Tensor, num_steps: int) -> torch.Tensor:
        args = [inputs["images"], inputs["img_masks"], inputs["tokens"], inputs["masks"]]
        if self.uses_state_token:
            args.append(inputs["state"])
        return self.policy.model.sample_actions(*args, noise=noise, num_steps=num_steps)

    def _embed_prefix(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.policy.model.embed_prefix(inputs["images"], inputs["img_masks"], inputs["tokens"], inputs["masks"])

    def _prefix_from_embs(self, embs: torch.Tensor, pad_masks: torch.Tensor, att_masks: torch.Tensor,
                          state: torch.Tensor | None) -> _Prefix:
        """The prefix pass of ``PI0Pytorch.sample_actions``, keeping the hidden states too."""
        from lerobot.policies.common.vla_utils import make_att_2d_masks, prepare_attention_masks_4d

        m = self.policy.model
        att_2d = make_att_2d_masks(pad_masks, att_masks)
        position_ids = torch.cumsum(pad_masks, dim=1) - 1
        m.paligemma_with_expert.paligemma.model.language_model.config._attn_implementation = "eager"  # noqa: SLF001
        (hidden, _), past_key_values = m.paligemma_with_expert.forward(
            attention_mask=prepare_attention_masks_4d(att_2d), position_ids=position_ids, past_key_values=None,
            inputs_embeds=[embs, None], use_cache=True)
        return _Prefix(hidden=hidden, pad_masks=pad_masks, past_key_values=past_key_values, state=state)

    def _velocity(self, prefix: _Prefix, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        kwargs = {"state": prefix.state} if self.uses_state_token else {}
        return self.policy.model.denoise_step(prefix_pad_masks=prefix.pad_masks,
                                              past_key_values=prefix.past_key_values, x_t=x, timestep=t, **kwargs)

    def loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        # PI0Policy.forward ignores action_is_pad; run the same steps on the core model and mask.
        p = self._lerobot_train_batch(batch)
        inputs = self._model_inputs(p)
        m = self.policy.model
        actions = self.policy.prepare_action(p)
        noise = m.sample_noise(actions.shape, actions.device)
        time = m.sample_time(actions.shape[0], actions.device)
        args = [inputs["images"], inputs["img_masks"], inputs["tokens"], inputs["masks"]]
        if self.uses_state_token:
            args.append(inputs["state"])
        losses = m.forward(*args, actions, noise, time)[:, :, : self._action_dim]  # [B, H, A]
        keep = (~p[PAD_KEY]).to(losses.dtype)[..., None]
        loss = (losses * keep).sum() / (keep.sum() * losses.shape[-1]).clamp_min(1.0)
        return loss, {"loss": float(loss.detach())}

    def backbone_modules(self) -> dict[str, nn.Module]:
        return {"vlm": self.policy.model.paligemma_with_expert.paligemma}

    def always_frozen_modules(self) -> dict[str, nn.Module]:
        pwe = self.policy.model.paligemma_with_expert
        heads = {"vlm_lm_head": pwe.paligemma.lm_head, "expert_lm_head": pwe.gemma_expert.lm_head}
        tied = {id(pwe.paligemma.model.language_model.get_input_embeddings().weight)}
        return {k: h for k, h in heads.items() if id(h.weight) not in tied}

    def _tokenizer_step(self, tokenizer: Any):
        from lerobot.processor import TokenizerProcessorStep

        return TokenizerProcessorStep(tokenizer=tokenizer, max_length=self.policy.config.tokenizer_max_length,
                                      padding_side="right", padding="max_length")

    def _relative_steps(self):
        from lerobot.processor import AbsoluteActionsProcessorStep, RelativeActionsProcessorStep

        c = self.policy.config
        rel = RelativeActionsProcessorStep(enabled=c.use_relative_actions,
                                           exclude_joints=getattr(c, "relative_exclude_joints", []),
                                           action_names=getattr(c, "action_feature_names", None))
        return rel, AbsoluteActionsProcessorStep(enabled=c.use_relative_actions, relative_step=rel)


class LeRobotPi0(_PaliGemmaAdapter):
    """pi0: the state enters the action expert as one token."""

    kind = "pi0"
    policy_class_path = ("lerobot.policies.pi0.modeling_pi0", "PI0Policy")

    def _build_processors(self, tokenizer: Any, stats: Mapping | None):
        from lerobot.policies.pi0.processor_pi0 import Pi0NewLineProcessor
        from lerobot.processor import make_default_policy_processor_steps, make_policy_processor_pipelines

        s = make_default_policy_processor_steps(self.policy.config, _stats_tensors(stats))
        rel, absolute = self._relative_steps()
        return make_policy_processor_pipelines(
            input_steps=[s.rename_observations, s.add_batch_dim, Pi0NewLineProcessor(),
                         self._tokenizer_step(tokenizer), s.to_device, rel, s.normalize],
            output_steps=[s.unnormalize, absolute, s.to_cpu])


class LeRobotPi05(_PaliGemmaAdapter):
    """pi05: the normalised state is discretised into the prompt; the expert is time-conditioned by adaRMS."""

    kind = "pi05"
    policy_class_path = ("lerobot.policies.pi05.modeling_pi05", "PI05Policy")
    uses_state_token = False

    def _build_processors(self, tokenizer: Any, stats: Mapping | None):
        from lerobot.policies.pi05.processor_pi05 import Pi05PrepareStateTokenizerProcessorStep
        from lerobot.processor import make_default_policy_processor_steps, make_policy_processor_pipelines

        c = self.policy.config
        s = make_default_policy_processor_steps(c, _stats_tensors(stats))
        rel, absolute = self._relative_steps()
        return make_policy_processor_pipelines(
            input_steps=[s.rename_observations, s.add_batch_dim, rel, s.normalize,
                         Pi05PrepareStateTokenizerProcessorStep(max_state_dim=c.max_state_dim),
                         self._tokenizer_step(tokenizer), s.to_device],
            output_steps=[s.unnormalize, absolute, s.to_cpu])


# -- SmolVLA -----------------------------------------------------------------------------------------
class LeRobotSmolVLA(LeRobotVLA):
    """SmolVLA: SmolVLM (first ``num_vlm_layers`` layers) + a narrower expert that cross-attends to
    the VLM's KV cache; the state is one prefix token."""

    kind = "smolvla"
    policy_class_path = ("lerobot.policies.smolvla.modeling_smolvla", "SmolVLAPolicy")

    @classmethod
    def _prepare_config(cls, config: Any, vlm_dir: str | Path | None) -> None:
        if vlm_dir is not None:
            if not Path(vlm_dir).is_dir():
                raise ValueError(f"vlm_dir {str(vlm_dir)!r} does not exist")
            config.vlm_model_name = str(vlm_dir)
        config.load_vlm_weights = False  # the checkpoint's model.safetensors holds the VLM weights

    @classmethod
    def _resolve_tokenizer(cls, tokenizer: Any, path: Path, policy: nn.Module) -> Any:
        """An explicit tokenizer (object or local directory), else the VLM processor's."""
        if isinstance(tokenizer, (str, Path)):
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
        return policy.model.vlm_with_expert.processor.tokenizer if tokenizer is None else tokenizer

    def _default_tokenizer(self) -> Any:
        return self.policy.model.vlm_with_expert.processor.tokenizer

    def _build_processors(self, tokenizer: Any, stats: Mapping | None):
        from lerobot.processor import (NewLineTaskProcessorStep, TokenizerProcessorStep,
                                       make_default_policy_processor_steps, make_policy_processor_pipelines)

        c = self.policy.config
        s = make_default_policy_processor_steps(c, _stats_tensors(stats))
        tok = TokenizerProcessorStep(tokenizer=tokenizer, padding=c.pad_language_to, padding_side="right",
                                     max_length=c.tokenizer_max_length)
        return make_policy_processor_pipelines(
            input_steps=[s.rename_observations, s.add_batch_dim, NewLineTaskProcessorStep(), tok, s.to_device,
                         s.normalize],
            output_steps=[s.unnormalize, s.to_cpu])

    @property
    def default_num_steps(self) -> int:
        return int(self.policy.config.num_steps)

    def _model_inputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

        batch = self.policy._prepare_batch(batch)  # aloha state conversion when configured
        images, img_masks = self.policy.prepare_images(batch)
        return {"images": images, "img_masks": img_masks, "tokens": batch[OBS_LANGUAGE_TOKENS],
                "masks": batch[OBS_LANGUAGE_ATTENTION_MASK], "state": self.policy.prepare_state(batch),
                "batch_size": batch[OBS_LANGUAGE_TOKENS].shape[0]}

    def _sample(self, inputs: dict[str, Any], noise: torch.Tensor, num_steps: int) -> torch.Tensor:
        # VLAFlowMatching.sample_actions reads the step count from its config only.
        cfg = self.policy.model.config
        saved, cfg.num_steps = cfg.num_steps, num_steps
        try:
            return self.policy.model.sample_actions(inputs["images"], inputs["img_masks"], inputs["tokens"],
                                                    inputs["masks"], inputs["state"], noise=noise)
        finally:
            cfg.num_steps = saved

    def _finish_actions(self, actions: torch.Tensor) -> torch.Tensor:
        if self.policy.config.adapt_to_pi_aloha:
            actions = actions[:, :, : self._action_dim].clone()
            actions = self.policy._pi_aloha_encode_actions(actions)
        return super()._finish_actions(actions)

    def _embed_prefix(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.policy.model.embed_prefix(inputs["images"], inputs["img_masks"], inputs["tokens"], inputs["masks"],
                                              state=inputs["state"])

    def _prefix_from_embs(self, embs: torch.Tensor, pad_masks: torch.Tensor, att_masks: torch.Tensor,
                          state: torch.Tensor | None) -> _Prefix:
        """The prefix pass of ``VLAFlowMatching.sample_actions``, keeping the hidden states too (the
        state is a prefix token here)."""
        from lerobot.policies.common.vla_utils import make_att_2d_masks

        m = self.policy.model
        position_ids = torch.cumsum(pad_masks, dim=1) - 1
        (hidden, _), past_key_values = m.vlm_with_expert.forward(
            attention_mask=make_att_2d_masks(pad_masks, att_masks), position_ids=position_ids,
            past_key_values=None, inputs_embeds=[embs, None], use_cache=m.config.use_cache)
        return _Prefix(hidden=hidden, pad_masks=pad_masks, past_key_values=past_key_values)

    def _velocity(self, prefix: _Prefix, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.policy.model.denoise_step(prefix_pad_masks=prefix.pad_masks,
                                              past_key_values=prefix.past_key_values, x_t=x, timestep=t)

    def loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        loss, info = self.policy.forward(self._lerobot_train_batch(batch))  # masks action_is_pad itself
        return loss, {k: float(v) for k, v in info.items() if isinstance(v, (int, float))}

    def backbone_modules(self) -> dict[str, nn.Module]:
        return {"vlm": self.policy.model.vlm_with_expert.vlm}

    def always_frozen_modules(self) -> dict[str, nn.Module]:
        vlm = self.policy.model.vlm_with_expert.vlm
        tied = vlm.lm_head.weight is vlm.model.text_model.get_input_embeddings().weight
        return {} if tied else {"vlm_lm_head": vlm.lm_head}


ADAPTERS: dict[str, type[LeRobotVLA]] = {"pi0": LeRobotPi0, "pi05": LeRobotPi05, "smolvla": LeRobotSmolVLA}
"""LeRobot policy type (config.json "type") -> adapter class."""


# -- helpers -------------------------------------------------------------------------------------------
def _import(module: str, name: str) -> Any:
    import importlib

    return getattr(importlib.import_module(module), name)


def _stats_tensors(stats: Mapping | None) -> dict[str, dict[str, torch.Tensor]] | None:
    if stats is None:
        return None
    return {k: {s: torch.as_tensor(v, dtype=torch.float32) for s, v in d.items()} for k, d in stats.items()}


def _load_weights(policy: nn.Module, file: Path, fix_keys=None) -> None:
    """Load ``model.safetensors`` strictly (LeRobot's loaders warn and carry on with random weights).
    Tied parameters, which safetensors stores once, count as loaded through their twin."""
    from safetensors.torch import load_file

    state = load_file(str(file), device=str(next(policy.parameters()).device))
    if fix_keys is not None:
        state = fix_keys(state)
    twins: dict[tuple, set[str]] = {}
    for name, t in policy.state_dict(keep_vars=True).items():
        if t.numel():
            twins.setdefault((t.data_ptr(), t.shape, t.dtype), set()).add(name)
    by_name = {n: group for group in twins.values() for n in group}
    missing, unexpected = policy.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (by_name.get(k, set()) & state.keys())]
    if missing or unexpected:
        raise ValueError(f"{file} does not match the policy built from its config.json: "
                         f"{len(missing)} missing keys {missing[:5]}, {len(unexpected)} unexpected keys "
                         f"{unexpected[:5]}")
