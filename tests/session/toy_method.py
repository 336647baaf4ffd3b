"""A toy RL method defined outside ``policies/``, for the test that a new method needs only a
registry line: it steers the VLA with noise 0 or N(0, I) plus one learned offset (its "actor
parameter"), and its update only tracks the replayed reward."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from policies.base import Act, Agent, check_handles


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    noise: str = dataclasses.field(default="zero", metadata={"choices": ("zero", "random")})
    """zero: the VLA's chunk from zero noise; random: from N(0, I) noise."""
    step_size: float = 0.1
    """How fast the offset follows the mean replayed reward."""


class ToyAgent(Agent):
    name = "toy"
    HANDLES = ("noise", "embed", "sample_actions_from_embedding")

    def __init__(self, vla, cfg: ToyConfig = ToyConfig(), seed: int = 0) -> None:
        self.vla, self.cfg = vla, cfg
        self.noise_shape = tuple(int(x) for x in vla.noise_shape)
        h, a = (int(x) for x in vla.action_shape)
        self.exec_steps = h
        self.chunk_shape = (h, a)
        self.obs_spec = {"emb": ((int(vla.embed_dim),), np.float32)}
        self.action_dim = 1  # stores the noise's mean
        self.offset = torch.zeros(1)
        self.mean_reward = 0.0
        self.updates = 0

    @classmethod
    def build(cls, vla, cfg, seed: int = 0, observation_space=None) -> "ToyAgent":
        check_handles(vla, cls.HANDLES, cls.name)
        return cls(vla, cfg, seed)

    def observe(self, obs: dict) -> dict:
        from vla.envs import VLAPolicy

        return {"emb": self.vla.embed(VLAPolicy.batch(obs))}

    def act_chunk(self, aobs, rng, warmup, deterministic=False, generator=None) -> Act:
        if self.cfg.noise == "zero" or deterministic:
            noise = torch.zeros(self.noise_shape)
        else:
            noise = torch.from_numpy(rng.standard_normal(self.noise_shape).astype(np.float32))
        noise = noise + self.offset
        with torch.no_grad():
            chunk = self.vla.sample_actions_from_embedding(aobs["emb"], noise=noise[None], normalized=True)[0]
        return Act(action=np.array([float(noise.mean())], np.float32), chunk=chunk[: self.exec_steps])

    def update(self, online, demo, rng) -> dict[str, float]:
        batch = online.sample(min(8, len(online)), rng)
        self.mean_reward += self.cfg.step_size * (float(np.mean(np.asarray(batch["reward"]))) - self.mean_reward)
        self.offset = torch.full((1,), 0.01 * self.updates)
        self.updates += 1
        return {"losses/mean_reward": self.mean_reward}

    def state_dict(self) -> dict:
        return {"offset": self.offset.clone(), "mean_reward": self.mean_reward, "updates": self.updates}

    def load_state_dict(self, d: dict) -> None:
        self.offset, self.mean_reward, self.updates = d["offset"].clone(), float(d["mean_reward"]), int(d["updates"])

    def actor_parameters(self) -> dict:
        return {"offset": self.offset.clone()}

    def load_actor_parameters(self, params: dict) -> None:
        self.offset = params["offset"].clone().float()
