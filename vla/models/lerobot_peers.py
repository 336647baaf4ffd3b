"""LeRobot's ACT and Diffusion Policy as evaluation-only peers behind the VLA interface.

The bench (``bench/sft_peers.py``) trains one ACT or Diffusion Policy per task with LeRobot's
own training code (``lerobot-train``) and rolls them out through ``vla eval`` like any VLA. ACT
and DP read no language, so a peer checkpoint is a *router* directory::

    config.json   {"kind": "lerobot-peer", "policy": "act" | "diffusion",
                   "tasks": {instruction: subdir, ...}, "sim_tasks": [...] (optional)}
    <subdir>/     a LeRobot ``pretrained_model`` directory as lerobot-train writes it: config.json,
                  model.safetensors, policy_preprocessor.json / policy_postprocessor.json and
                  their normaliser stats (*.safetensors)

``sample_actions`` sends each batch row to the policy of its instruction (an unknown instruction
raises ``ValueError`` naming the known ones) and runs, per policy::

    obs {"images": {cam: uint8 [B,H,W,3]}, "state": [B,S]}
      -> {"observation.images.<cam>": float [B,3,H,W] in [0,1], "observation.state": [B,S]}
      -> the checkpoint's saved preprocessor (normalisation with the training set's stats)
      -> policy.predict_action_chunk -> first n_action_steps rows
      -> the saved postprocessor (un-normalise) -> float32 [B, n_action_steps, A] robot units

``action_shape = (n_action_steps, A)``: the rows LeRobot's own ``select_action`` executes before
it predicts again (ACT: the first ``n_action_steps`` of its ``chunk_size`` predictions; DP: the
``n_action_steps`` rows from the current observation on). ``vla eval`` executes the whole returned
chunk by default, i.e. LeRobot's own re-planning rate.

Diffusion Policy conditions on the last ``n_obs_steps`` observations (LeRobot default 2). The
harness hands over one observation per chunk, so the adapter repeats the current observation
``n_obs_steps`` times -- what LeRobot's ``select_action`` does itself at an episode's first step.
A DP trained with ``n_obs_steps = 1`` has no such approximation.

These peers are baselines, not steerable backbones: ``noise`` (DSRL), behaviour tokens,
``noise_shape``, the stochastic sampler, ``embed`` and ``loss`` raise with a message saying so.
The ResNet18 backbones are randomly initialised at training time (``pretrained_backbone_weights
= None``: the ImageNet weights cannot be downloaded here); loading forces that field to ``None``
too, so a checkpoint never triggers a torchvision download (its weights are in model.safetensors).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from vla.models.base import StochasticSample, VLA, as_tensor_batch
from vla.models.lerobot_adapters import _load_weights

KIND = "lerobot-peer"
POLICIES = ("act", "diffusion")
"""LeRobot policy types a peer router may hold."""

IMAGE_PREFIX = "observation.images."
STATE_KEY = "observation.state"
ACTION_KEY = "action"

_NOT_STEERABLE = ("LeRobot ACT / Diffusion Policy peers are evaluation-only baselines for `vla eval`; "
                  "they are not steerable by DSRL / ExToken / GRPO")


class LeRobotPeer(VLA):
    """A router over one LeRobot ACT or Diffusion Policy per instruction (see the module docstring).

    ``policies[i]`` is a ``PreTrainedPolicy`` with its ``preprocessors[i]`` / ``postprocessors[i]``
    (LeRobot pipelines); ``routes`` maps an instruction to an index into them. All policies must
    be of type ``policy_type`` and agree on ``(n_action_steps, action dim)``."""

    def __init__(self, policy_type: str, policies: list[nn.Module], preprocessors: list, postprocessors: list,
                 routes: dict[str, int]) -> None:
        super().__init__()
        if policy_type not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy_type!r}")
        if not policies or not (len(policies) == len(preprocessors) == len(postprocessors)):
            raise ValueError(f"need one pre- and postprocessor per policy, got {len(policies)} policies, "
                             f"{len(preprocessors)} preprocessors, {len(postprocessors)} postprocessors")
        if not routes:
            raise ValueError("routes is empty: a peer needs at least one instruction -> policy entry")
        for instr, i in routes.items():
            if not 0 <= i < len(policies):
                raise ValueError(f"route {instr!r} -> policy {i}, but there are {len(policies)} policies")
        self.policy_type = policy_type
        self.policies = nn.ModuleList(policies)
        self.preprocessors, self.postprocessors = list(preprocessors), list(postprocessors)
        self.routes = dict(routes)
        shapes = {self._chunk_shape(p) for p in policies}
        if len(shapes) != 1:
            raise ValueError(f"the routed policies disagree on (n_action_steps, action dim): {sorted(shapes)}")
        (self._action_shape,) = shapes
        for p in policies:
            if p.config.type != policy_type:
                raise ValueError(f"router holds '{policy_type}' policies, got a '{p.config.type}' one")
        self.eval()

    @staticmethod
    def _chunk_shape(policy: nn.Module) -> tuple[int, int]:
        cfg = policy.config
        if ACTION_KEY not in cfg.output_features:
            raise ValueError(f"policy config has no '{ACTION_KEY}' output (has {sorted(cfg.output_features)})")
        return int(cfg.n_action_steps), int(cfg.output_features[ACTION_KEY].shape[0])

    # -- loading --------------------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, path: str | Path, kind: str | None = None,
                        device: str | torch.device = "cpu") -> "LeRobotPeer":
        """Load a router directory (see the module docstring); every policy loads strictly (the
        weights must match its config.json) with the pre/postprocessors lerobot-train saved."""
        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ValueError(f"{str(path)!r} has no config.json: not a LeRobot peer router directory")
        try:
            meta = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{cfg_file} is not valid JSON: {e}") from None
        if meta.get("kind") != KIND or (kind is not None and kind != KIND):
            raise ValueError(f"{cfg_file}: kind {meta.get('kind')!r}, expected {KIND!r}")
        ptype, tasks = meta.get("policy"), meta.get("tasks")
        if ptype not in POLICIES:
            raise ValueError(f"{cfg_file}: 'policy' must be one of {POLICIES}, got {ptype!r}")
        if not isinstance(tasks, dict) or not tasks or not all(isinstance(v, str) for v in tasks.values()):
            raise ValueError(f"{cfg_file}: 'tasks' must map each instruction to a policy subdirectory, got {tasks!r}")
        subdirs = sorted(set(tasks.values()))
        loaded = [load_lerobot_policy(path / d, ptype, device) for d in subdirs]
        return cls(ptype, [p for p, _, _ in loaded], [pre for _, pre, _ in loaded], [post for _, _, post in loaded],
                   routes={instr: subdirs.index(d) for instr, d in tasks.items()})

    # -- the VLA interface ----------------------------------------------------------------------
    @property
    def action_shape(self) -> tuple[int, int]:
        return self._action_shape

    @property
    def noise_shape(self) -> tuple[int, ...]:
        raise NotImplementedError(f"noise_shape: {_NOT_STEERABLE}")

    @property
    def known_instructions(self) -> list[str]:
        return sorted(self.routes)

    def _route(self, instructions: list[str]) -> dict[int, list[int]]:
        """policy index -> the batch rows it answers."""
        groups: dict[int, list[int]] = {}
        for row, instr in enumerate(instructions):
            if instr not in self.routes:
                raise ValueError(f"no {self.policy_type} policy for instruction {instr!r}; this peer knows "
                                 f"{self.known_instructions}")
            groups.setdefault(self.routes[instr], []).append(row)
        return groups

    def _lerobot_batch(self, policy: nn.Module, images: dict[str, torch.Tensor], state: torch.Tensor) -> dict:
        cfg = policy.config
        batch = {}
        for key, feat in cfg.image_features.items():
            cam = key[len(IMAGE_PREFIX):] if key.startswith(IMAGE_PREFIX) else key
            if cam not in images:
                raise ValueError(f"observation 'images' has no '{cam}' camera, which this {self.policy_type} "
                                 f"policy reads (has {sorted(images)})")
            img = images[cam].permute(0, 3, 1, 2).float() / 255.0  # uint8 [B,H,W,3] -> float [B,3,H,W] in [0, 1]
            if tuple(img.shape[1:]) != tuple(feat.shape):
                raise ValueError(f"observation 'images.{cam}' is {list(images[cam].shape[1:])} (H, W, C); this "
                                 f"policy was trained on {list(feat.shape)} (C, H, W)")
            batch[key] = img
        want = cfg.robot_state_feature
        if want is not None:
            if state.shape[1] != want.shape[0]:
                raise ValueError(f"observation 'state' must be [B, {want.shape[0]}] for this policy, "
                                 f"got {list(state.shape)}")
            batch[STATE_KEY] = state
        return batch

    def _predict(self, i: int, images: dict[str, torch.Tensor], state: torch.Tensor) -> torch.Tensor:
        policy, pre, post = self.policies[i], self.preprocessors[i], self.postprocessors[i]
        batch = pre(self._lerobot_batch(policy, images, state))
        h, a = self.action_shape
        if self.policy_type == "diffusion":
            # DP conditions on n_obs_steps observations: repeat the current one (LeRobot's own
            # select_action does the same at an episode's first step). Empty queues: offline mode.
            n = int(policy.config.n_obs_steps)
            batch = {k: v.unsqueeze(1).expand(v.shape[0], n, *v.shape[1:]) if isinstance(v, torch.Tensor)
                     and (k == STATE_KEY or k.startswith(IMAGE_PREFIX)) else v for k, v in batch.items()}
            policy.reset()
        chunk = policy.predict_action_chunk(batch)[:, :h]  # normalised units
        b = state.shape[0]
        assert tuple(chunk.shape) == (b, h, a), f"{self.policy_type} chunk {list(chunk.shape)} != [{b}, {h}, {a}]"
        return post(chunk).to(torch.float32)

    def sample_actions(self, obs: dict, noise=None, token=None, num_steps: int | None = None) -> torch.Tensor:
        """-> float32 [B, n_action_steps, A] in robot units, each row from its instruction's policy.
        ``noise`` / ``token`` / ``num_steps`` are not supported (evaluation-only baselines)."""
        if noise is not None:
            raise ValueError(f"noise: {_NOT_STEERABLE}")
        if token is not None and bool(torch.as_tensor(token).ne(0).any()):
            raise ValueError(f"token: {_NOT_STEERABLE} (pass None or the null token 0)")
        if num_steps is not None:
            raise ValueError("num_steps: LeRobot peers run their policy's own sampler settings")
        device = next(self.parameters()).device
        o = as_tensor_batch(obs, device)
        b = o["state"].shape[0]
        out = torch.empty(b, *self.action_shape, dtype=torch.float32)
        with torch.no_grad():
            for i, rows in self._route(o["instruction"]).items():
                idx = torch.as_tensor(rows, device=device)
                images = {c: img.index_select(0, idx) for c, img in o["images"].items()}
                out[rows] = self._predict(i, images, o["state"].index_select(0, idx)).cpu()
        return out.to(device)

    def sample_actions_stochastic(self, obs: dict, noise=None, token=None, num_steps: int | None = None,
                                  sigma: float = 0.1, generator: torch.Generator | None = None) -> StochasticSample:
        raise NotImplementedError(f"sample_actions_stochastic: {_NOT_STEERABLE}")

    def chain_logprob(self, obs: dict, chain: torch.Tensor, token=None, sigma: float = 0.1) -> torch.Tensor:
        raise NotImplementedError(f"chain_logprob: {_NOT_STEERABLE}")

    def embed(self, obs: dict) -> torch.Tensor:
        raise NotImplementedError(f"embed: {_NOT_STEERABLE}")

    def loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError(f"loss: {_NOT_STEERABLE}; train them with lerobot-train (bench/sft_peers.py)")


def load_lerobot_policy(path: str | Path, policy_type: str | None = None, device: str | torch.device = "cpu"):
    """A lerobot-train ``pretrained_model`` directory -> (policy in eval mode, preprocessor,
    postprocessor). ``pretrained_backbone_weights`` is forced to ``None``: the trained backbone is in
    model.safetensors, and nothing may be downloaded."""
    from lerobot.configs import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    path = Path(path)
    for f in ("config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json"):
        if not (path / f).is_file():
            raise ValueError(f"{str(path)!r} has no {f}: expected a lerobot-train pretrained_model directory")
    ptype = json.loads((path / "config.json").read_text()).get("type")
    if ptype not in POLICIES or (policy_type is not None and ptype != policy_type):
        raise ValueError(f"{path / 'config.json'} has type {ptype!r}, expected "
                         f"{policy_type if policy_type is not None else ' or '.join(POLICIES)!r}")
    config = PreTrainedConfig.from_pretrained(path)
    config.device = str(device)
    config.pretrained_backbone_weights = None
    policy = get_policy_class(ptype)(config).to(device)
    _load_weights(policy, path / "model.safetensors")
    policy.eval()
    pre, post = make_pre_post_processors(config, pretrained_path=str(path),
                                         preprocessor_overrides={"device_processor": {"device": str(device)}},
                                         postprocessor_overrides={"device_processor": {"device": "cpu"}})
    return policy, pre, post
