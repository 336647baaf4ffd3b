"""What an RL method reads of a frozen VLA: its embedding's summary columns, optionally beside the
simulator's privileged state (a labelled oracle), and the env's camera layout for a CNN encoder.

Shared by the methods that act on the VLA's features (DSRL, residual RL). ``SelectFeatures`` and
``SelectPrivileged`` are "encoders" with nothing to train: they pick columns of stored observations.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class SelectFeatures(nn.Module):
    """SAC 'encoder' that reads the stored VLA features' summary: obs {"feat": [B, D]} -> [B, d], the
    first ``d = vla.embed_summary_dim`` columns (the rest, if any, is the denoiser's conditioning that
    ``sample_actions_from_embedding`` rebuilds: the LeRobot adapters' prefix embeddings and masks)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.out_dim = dim

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return obs["feat"][:, : self.out_dim]


PRIVILEGED_POS_SCALE = 0.02
"""Metres per unit of the oracle's object-to-gripper offsets: the decisive 1-4 cm of a grasp or a release become
0.5-2 units, the size of the VLA features beside them (std about 0.5); raw metres (0.01-0.04) were too small for
the critic's first layer to weigh against 256 features (issue 61)."""
PRIVILEGED_EE_SCALE = 0.1
"""Metres per unit of the oracle's absolute end-effector position (a workspace of some 0.3 m spans a few units)."""


def privileged_scale(privileged_dim: int) -> torch.Tensor:
    """Per-column multipliers of the privileged vector (``vla.oracle_env``: N object offsets [3N], N quaternions
    [4N], the end-effector position [3], the gripper opening [1]): offsets / PRIVILEGED_POS_SCALE, quaternions and
    the opening (already O(1)) as they are, the end-effector position / PRIVILEGED_EE_SCALE. A vector of another
    length (an ``--env`` of the user's own with a ``privileged`` field) is read as it is."""
    n, rest = divmod(privileged_dim - 4, 7)
    if n < 1 or rest:
        return torch.ones(privileged_dim)
    return torch.cat([torch.full((3 * n,), 1.0 / PRIVILEGED_POS_SCALE), torch.ones(4 * n),
                      torch.full((3,), 1.0 / PRIVILEGED_EE_SCALE), torch.ones(1)])


class SelectPrivileged(SelectFeatures):
    """Encoder ``oracle``: the VLA features' summary and the privileged state, the latter scaled to the features'
    size (``privileged_scale``), concatenated."""

    def __init__(self, dim: int, privileged_dim: int) -> None:
        super().__init__(dim)
        self.summary_dim, self.out_dim = dim, dim + privileged_dim
        self.register_buffer("scale", privileged_scale(privileged_dim), persistent=False)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([obs["feat"][:, : self.summary_dim], obs["privileged"] * self.scale], dim=1)


def camera_layout(cfg, observation_space) -> dict[str, Any]:
    """``cfg.encoder`` ``cnn``'s inputs: the env's camera names and robot state length; ``oracle``'s: the
    privileged observation's length ({} for ``vla``)."""
    if cfg.encoder == "vla":
        return {}
    spaces = getattr(observation_space, "spaces", {}) or {}
    if cfg.encoder == "oracle":
        if "privileged" not in spaces:
            raise ValueError("encoder 'oracle' reads the env's `privileged` observation (a sim task env made with "
                             "privileged=True); this env has none")
        return {"privileged_dim": int(spaces["privileged"].shape[0])}
    if "images" not in spaces or "state" not in spaces:
        raise ValueError(f"encoder {cfg.encoder!r} reads the env's cameras and state: the env needs an "
                         "observation_space with 'images' and 'state' (a learner without an env cannot build it)")
    return {"cameras": list(spaces["images"].spaces), "state_dim": int(spaces["state"].shape[0])}


def summary_dim(vla, feat_dim: int) -> int:
    """The columns of ``vla.embed()`` a critic reads (the VLA interface's ``embed_summary_dim``; all
    ``feat_dim`` of them where the VLA cannot say)."""
    try:
        d = int(vla.embed_summary_dim)
    except (AttributeError, NotImplementedError):
        return feat_dim
    if not 0 < d <= feat_dim:
        raise ValueError(f"the VLA's embed_summary_dim {d} must be in [1, feat_dim = {feat_dim}]")
    return d


def embed_dim(vla) -> int:
    """The width of ``vla.embed()`` (the VLA interface's ``embed_dim``; 0 when it cannot say)."""
    try:
        return int(vla.embed_dim)
    except (AttributeError, NotImplementedError):
        return int(getattr(getattr(vla, "cfg", None), "cond_dim", 0))  # a VLA from before the handle


def split_refusal(cfg) -> str | None:
    """Why a session whose agent reads ``cfg.encoder`` cannot be split into actor / learner (None: it can): the
    link carries the VLA's features, not camera frames or simulator state."""
    if cfg.encoder != "vla":
        return (f"--encoder {cfg.encoder} runs with --role local only (in-process only): the actor / learner link "
                "carries the VLA's features, not camera frames (use --encoder vla to split the session)")
    return None


def encoder_inputs(obs: dict, obs_spec: dict, cameras: list[str], image_size: int) -> dict[str, torch.Tensor]:
    """A batch of one of what an agent's encoder reads from an env observation: each of ``cameras`` resized to
    ``image_size`` (uint8), the robot ``state`` and the ``privileged`` object poses where ``obs_spec`` holds them."""
    import numpy as np

    from vla.models.encoders import resize_uint8

    out: dict[str, torch.Tensor] = {}
    for cam in cameras:
        img = torch.from_numpy(np.array(obs["images"][cam]))[None]  # a copy: camera frames may be read-only
        out[cam] = resize_uint8(img, image_size)
    if "state" in obs_spec:
        out["state"] = torch.from_numpy(np.asarray(obs["state"], np.float32))[None]
    if "privileged" in obs_spec:
        if "privileged" not in obs:
            raise ValueError("encoder 'oracle': the observation has no `privileged` field (make the sim task env "
                             "with privileged=True)")
        out["privileged"] = torch.from_numpy(np.asarray(obs["privileged"], np.float32))[None]
    return out
