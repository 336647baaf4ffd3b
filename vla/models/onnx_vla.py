"""An exported ONNX policy (``vla export policy``) behind the VLA interface, for evaluation.

``vla eval --checkpoint deploy/pick.int8.onnx`` rolls the file out through the same harness as
the torch checkpoint it came from, so a quantised or otherwise exported graph gets a success
rate in sim before it goes to the robot (issue "Deploy": int8's success-rate change). The
graph runs in onnxruntime through ``deploy.runtime.OnnxPolicy`` -- the very code the edge runner
uses, with its crop / resize in numpy -- one observation at a time.

Only the sampler is exported: ``sample_actions`` (with or without a supplied ``noise``) works,
every training and steering handle other than ``noise`` raises ``NotImplementedError`` saying
that the checkpoint is an exported graph. Noise drawn when none is given comes from the
policy's own numpy generator (seeded), not from torch's.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from vla.models.base import StochasticSample, VLA

KIND = "onnx"
SUFFIX = ".onnx"

_EXPORTED_ONLY = ("an exported ONNX policy runs its sampler only (evaluation / deployment); train, embed and "
                  "steer the torch checkpoint it was exported from")


def is_onnx_file(path: str) -> bool:
    return str(path).endswith(SUFFIX) and os.path.isfile(path)


class OnnxVLA(VLA):
    """``deploy.runtime.OnnxPolicy`` as a VLA: ``sample_actions(obs_batch, noise)`` runs the graph
    once per batch row. ``threads``: onnxruntime's intra-op threads."""

    kind = KIND

    def __init__(self, path: str, threads: int = 1, seed: int = 0) -> None:
        super().__init__()
        from deploy.runtime.onnx_policy import OnnxPolicy

        self.policy = OnnxPolicy(path, threads=threads, seed=seed)
        self.path = path
        meta = self.policy.meta
        if "horizon" not in meta or "action_dim" not in meta:
            raise ValueError(f"{path}: metadata has no 'horizon' / 'action_dim': not a policy exported by "
                             "`vla export policy` (a classifier or a hand-made graph cannot be evaluated as a VLA)")
        self._action_shape = (int(meta["horizon"]), int(meta["action_dim"]))
        spec = self.policy.inputs.get("noise")
        self._noise_shape = tuple(int(d) for d in spec.shape[1:]) if spec is not None else None

    @classmethod
    def from_checkpoint(cls, path: str, kind: str | None = None, threads: int | None = None) -> "OnnxVLA":
        return cls(path, threads=threads or max(1, torch.get_num_threads()))

    @property
    def action_shape(self) -> tuple[int, int]:
        return self._action_shape

    @property
    def noise_shape(self) -> tuple[int, ...]:
        if self._noise_shape is None:
            raise NotImplementedError(f"{self.path}: the graph has no 'noise' input")
        return self._noise_shape

    @property
    def known_instructions(self) -> list[str]:
        return list(self.policy.instructions)

    def unsupported_handles(self) -> dict[str, str]:
        """Every steering handle but the noise (if the graph has that input) and the instruction
        (one of the exported ones): the graph holds the sampler only."""
        keep = {"instruction"} | ({"noise"} if self._noise_shape is not None else set())
        return {h: _EXPORTED_ONLY for h in self.HANDLES if h not in keep}

    def sample_actions(self, obs: dict, noise=None, token=None, num_steps: int | None = None) -> torch.Tensor:
        """obs batch (``images`` {camera: uint8 [B, H, W, 3]}, ``state`` [B, S], ``instruction`` [B])
        -> float32 [B, H, A] in robot units."""
        if token is not None and bool(torch.as_tensor(token).ne(0).any()):
            raise ValueError(f"token: {_EXPORTED_ONLY} (pass None or the null token 0)")
        if num_steps is not None:
            raise ValueError("num_steps: the exported graph has its sampler's step count built in")
        state = np.asarray(obs["state"].cpu() if isinstance(obs["state"], torch.Tensor) else obs["state"], np.float32)
        b = state.shape[0]
        instructions = obs.get("instruction")
        instructions = [instructions] * b if isinstance(instructions, str) else list(instructions or [None] * b)
        if noise is not None:
            noise = torch.as_tensor(noise, dtype=torch.float32).cpu().numpy()
            if noise.shape[0] != b:
                raise ValueError(f"noise has {noise.shape[0]} rows for a batch of {b}")
        out = np.empty((b, *self.action_shape), np.float32)
        for i in range(b):
            row = {"state": state[i],
                   "images": {c: np.asarray(img[i].cpu() if isinstance(img, torch.Tensor) else img[i])
                              for c, img in obs["images"].items()}}
            if instructions[i] is not None:
                row["instruction"] = instructions[i]
            out[i] = self.policy(row, None if noise is None else noise[i])
        return torch.from_numpy(out)

    def sample_actions_stochastic(self, obs: dict, noise=None, token=None, num_steps: int | None = None,
                                  sigma: float = 0.1, generator: torch.Generator | None = None) -> StochasticSample:
        raise NotImplementedError(f"sample_actions_stochastic: {_EXPORTED_ONLY}")

    def chain_logprob(self, obs: dict, chain: torch.Tensor, token=None, sigma: float = 0.1) -> torch.Tensor:
        raise NotImplementedError(f"chain_logprob: {_EXPORTED_ONLY}")

    def embed(self, obs: dict) -> torch.Tensor:
        raise NotImplementedError(f"embed: {_EXPORTED_ONLY}")

    def loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError(f"loss: {_EXPORTED_ONLY}")
