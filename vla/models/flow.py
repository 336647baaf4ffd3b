"""Flow-matching action expert over action chunks, with the three handles the RL modules use.

Convention (openpi / LeRobot pi0): ``t = 1`` is pure noise, ``t = 0`` the action chunk,
``x_t = t * noise + (1 - t) * action``, the network predicts the velocity ``u = noise - action``
and sampling integrates ``dx/dt = v`` from ``t = 1`` to ``0`` with Euler steps ``x <- x + dt * v``,
``dt = -1 / num_steps``. Training draws ``t ~ Beta(1.5, 1) * 0.999 + 0.001``.

Handles:
* ``noise`` replaces the sampler's initial Gaussian (DSRL steers here); a wrong shape is refused.
* ``token`` picks a behaviour-token embedding (ExToken); token 0 is the null token.
* ``sample_stochastic`` turns each Euler step into a Gaussian transition
  ``x_{k+1} ~ N(x_k + dt * v(x_k, t_k), sigma^2 I)`` and returns the per-step log-probabilities
  of the transitions it sampled (the "flow-noise" construction RLinf uses for GRPO on flow
  policies: the deterministic ODE step becomes the mean of a policy whose density is known).
  The last step is kept deterministic by default so the returned actions are not blurred.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class FlowHeadConfig:
    horizon: int = 8
    """Actions per chunk (H)."""
    action_dim: int = 7
    """Action dimensions (A)."""
    cond_dim: int = 128
    """Size of the conditioning vector (fused observation features)."""
    hidden: int = 256
    """Width of the velocity MLP."""
    depth: int = 3
    """Hidden layers of the velocity MLP."""
    num_tokens: int = 0
    """Behaviour tokens (ExToken); 0 disables them. Token 0 is the null token."""
    num_steps: int = 10
    """Default Euler steps at sampling time."""
    film: bool = False
    """Condition every hidden layer of the velocity MLP (FiLM: a per-layer scale and shift from the
    condition vector, zero-initialised), not only its input (concatenation, the default)."""

    def __post_init__(self) -> None:
        for f in ("horizon", "action_dim", "cond_dim", "hidden", "depth", "num_steps"):
            if getattr(self, f) <= 0:
                raise ValueError(f"FlowHeadConfig.{f} must be positive, got {getattr(self, f)}")


def _time_embedding(t: torch.Tensor, dim: int = 32) -> torch.Tensor:
    """Sinusoidal embedding of t in [0, 1] -> [B, dim]."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, device=t.device, dtype=t.dtype) * (-math.log(1000.0) / (half - 1)))
    ang = t[:, None] * 1000.0 * freqs[None]
    return torch.cat([ang.sin(), ang.cos()], dim=-1)


def row_weights(mask: torch.Tensor) -> torch.Tensor:
    """Chunk-row weights [B, H] for ``FlowHead.loss`` from a bool mask of the rows that count: the loss is then
    the mean over the kept rows. Made for the whole (global) batch before it is cut between processes, so the
    processes' means, averaged, are the one-process mean."""
    m = torch.as_tensor(mask).float()
    return m * (m.numel() / m.sum().clamp_min(1.0))


def sample_flow_time(b: int) -> torch.Tensor:
    """Flow-matching times of ``b`` samples, Beta(1.5, 1) (more weight near the noise end) kept in
    [0.001, 1], from the global torch generator. -> float32 [b]."""
    return torch.distributions.Beta(1.5, 1.0).sample((b,)) * 0.999 + 0.001


class FlowMatchingHead(nn.Module):
    def __init__(self, cfg: FlowHeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        flat = cfg.horizon * cfg.action_dim
        self.token_emb = nn.Embedding(cfg.num_tokens + 1, cfg.cond_dim) if cfg.num_tokens else None
        if self.token_emb is not None:
            # small, as a transformer's embeddings (std 0.02), not nn.Embedding's N(0, 1) (a random offset larger than
            # the observation itself: norm 16 vs 10): a token starts as (nearly) nothing added to the observation.
            # Neither init made a VLA trained on one demo per scene follow its token: it recalls each training scene's
            # mode from the image; demos of every scene in every mode do (bench/results/README.md, ExToken)
            nn.init.normal_(self.token_emb.weight, std=0.02)
        layers: list[nn.Module] = [nn.Linear(flat + 32 + cfg.cond_dim, cfg.hidden), nn.SiLU()]
        for _ in range(cfg.depth - 1):
            layers += [nn.Linear(cfg.hidden, cfg.hidden), nn.SiLU()]
        layers.append(nn.Linear(cfg.hidden, flat))
        self.net = nn.Sequential(*layers)
        self.films = None
        if cfg.film:  # one scale / shift per hidden layer, starting at identity
            self.films = nn.ModuleList(nn.Linear(cfg.cond_dim, 2 * cfg.hidden) for _ in range(cfg.depth))
            for f in self.films:
                nn.init.zeros_(f.weight)
                nn.init.zeros_(f.bias)

    @property
    def noise_shape(self) -> tuple[int, int]:
        return (self.cfg.horizon, self.cfg.action_dim)

    def _cond(self, cond: torch.Tensor, token: torch.Tensor | None) -> torch.Tensor:
        assert cond.ndim == 2 and cond.shape[1] == self.cfg.cond_dim, \
            f"cond must be [B, {self.cfg.cond_dim}], got {list(cond.shape)}"
        if token is None:
            return cond if self.token_emb is None else cond + self.token_emb(
                torch.zeros(cond.shape[0], dtype=torch.long, device=cond.device))
        if self.token_emb is None:
            raise ValueError("this head has no behaviour tokens (FlowHeadConfig.num_tokens = 0)")
        token = torch.as_tensor(token, device=cond.device).long().reshape(-1).expand(cond.shape[0])
        if int(token.min()) < 0 or int(token.max()) > self.cfg.num_tokens:
            raise ValueError(f"token must be in [0, {self.cfg.num_tokens}] (0 = null), got {token.tolist()}")
        return cond + self.token_emb(token)

    def velocity(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """v(x_t, t | cond): x [B, H, A], t [B] -> [B, H, A]. ``cond`` already includes the token."""
        b = x.shape[0]
        h = torch.cat([x.reshape(b, -1), _time_embedding(t), cond], dim=-1)
        if self.films is None:
            return self.net(h).reshape(b, *self.noise_shape)
        linears = [m for m in self.net if isinstance(m, nn.Linear)]
        for lin, film in zip(linears[:-1], self.films):
            gamma, beta = film(cond).chunk(2, dim=-1)
            h = torch.nn.functional.silu(lin(h) * (1 + gamma) + beta)
        return linears[-1](h).reshape(b, *self.noise_shape)

    def check_noise(self, noise: torch.Tensor | None, batch: int, like: torch.Tensor) -> torch.Tensor:
        if noise is None:
            return torch.randn(batch, *self.noise_shape, device=like.device, dtype=like.dtype)
        noise = torch.as_tensor(noise, device=like.device, dtype=like.dtype)
        if tuple(noise.shape) != (batch, *self.noise_shape):
            raise ValueError(f"noise must have shape [B={batch}, H={self.cfg.horizon}, A={self.cfg.action_dim}], "
                             f"got {list(noise.shape)}")
        if not torch.isfinite(noise).all():
            raise ValueError("noise contains NaN or inf")
        return noise

    @torch.no_grad()
    def sample(self, cond: torch.Tensor, noise: torch.Tensor | None = None, token=None,
               num_steps: int | None = None) -> torch.Tensor:
        """Deterministic Euler sampler: the same ``noise`` always gives the same chunk."""
        steps = num_steps or self.cfg.num_steps
        c = self._cond(cond, token)
        x = self.check_noise(noise, cond.shape[0], cond)
        dt = -1.0 / steps
        for k in range(steps):
            t = torch.full((x.shape[0],), 1.0 + k * dt, device=x.device, dtype=x.dtype)
            x = x + dt * self.velocity(x, t, c)
        return x

    @torch.no_grad()
    def sample_stochastic(self, cond: torch.Tensor, noise: torch.Tensor | None = None, token=None,
                          num_steps: int | None = None, sigma: float = 0.1, deterministic_last: bool = True,
                          generator: torch.Generator | None = None):
        """Stochastic sampler for policy gradients. Returns ``(actions [B,H,A], chain [B,K+1,H,A],
        logprob [B,K])``, where ``logprob[:, k]`` is log N(chain[:, k+1]; chain[:, k] + dt * v, sigma^2 I)
        summed over the chunk (0 for a deterministic last step)."""
        if sigma <= 0:
            raise ValueError(f"sigma must be positive, got {sigma}")
        steps = num_steps or self.cfg.num_steps
        c = self._cond(cond, token)
        x = self.check_noise(noise, cond.shape[0], cond)
        dt = -1.0 / steps
        chain, logps = [x], []
        for k in range(steps):
            t = torch.full((x.shape[0],), 1.0 + k * dt, device=x.device, dtype=x.dtype)
            mean = x + dt * self.velocity(x, t, c)
            if deterministic_last and k == steps - 1:
                x = mean
                logps.append(torch.zeros(x.shape[0], device=x.device, dtype=x.dtype))
            else:
                eps = torch.randn(mean.shape, device=mean.device, dtype=mean.dtype, generator=generator)
                x = mean + sigma * eps
                logps.append(self.transition_logprob(x, mean, sigma))
            chain.append(x)
        return x, torch.stack(chain, 1), torch.stack(logps, 1)

    @staticmethod
    def transition_logprob(x_next: torch.Tensor, mean: torch.Tensor, sigma: float) -> torch.Tensor:
        """log N(x_next; mean, sigma^2 I), summed over every dimension but the batch."""
        d = x_next[0].numel()
        sq = ((x_next - mean) ** 2).reshape(x_next.shape[0], -1).sum(-1)
        return -0.5 * sq / sigma**2 - d * math.log(sigma) - 0.5 * d * math.log(2 * math.pi)

    def chain_logprob(self, cond: torch.Tensor, chain: torch.Tensor, token=None, sigma: float = 0.1,
                      deterministic_last: bool = True) -> torch.Tensor:
        """Re-evaluate the log-probabilities of a sampled chain under the current weights (with
        gradients): what a PPO/GRPO ratio needs. -> [B, K]."""
        c = self._cond(cond, token)
        steps = chain.shape[1] - 1
        dt = -1.0 / steps
        out = []
        for k in range(steps):
            x = chain[:, k]
            t = torch.full((x.shape[0],), 1.0 + k * dt, device=x.device, dtype=x.dtype)
            mean = x + dt * self.velocity(x, t, c)
            if deterministic_last and k == steps - 1:
                out.append(torch.zeros(x.shape[0], device=x.device, dtype=x.dtype))
            else:
                out.append(self.transition_logprob(chain[:, k + 1], mean, sigma))
        return torch.stack(out, 1)

    def loss(self, cond: torch.Tensor, actions: torch.Tensor, token=None, noise: torch.Tensor | None = None,
             t: torch.Tensor | None = None, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Flow-matching loss: || v(x_t, t) - (noise - actions) ||^2 with t ~ Beta(1.5, 1). ``noise`` [B, H, A]
        and ``t`` [B] (``sample_flow_time``) are drawn here unless given: multi-process training draws them
        for the whole global batch and gives each process its rows, so that the processes together train on
        exactly what one process would. ``weight`` [B, H]: each chunk row's weight in the mean (1 everywhere
        when None); ``row_weights`` makes them from a mask of the rows that count. A row of weight 0 still
        enters the velocity network's input ``x_t`` (the chunk is denoised whole); only its error is dropped."""
        assert actions.shape[1:] == self.noise_shape, \
            f"actions must be [B, {self.cfg.horizon}, {self.cfg.action_dim}], got {list(actions.shape)}"
        b = actions.shape[0]
        noise = torch.randn_like(actions) if noise is None else noise.to(actions)
        t = sample_flow_time(b).to(actions) if t is None else t.to(actions)
        assert noise.shape == actions.shape and t.shape == (b,), \
            f"noise must be {list(actions.shape)} and t [{b}], got {list(noise.shape)} and {list(t.shape)}"
        x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * actions
        v = self.velocity(x_t, t, self._cond(cond, token))
        err = (v - (noise - actions)) ** 2
        if weight is None:
            return err.mean()
        w = torch.as_tensor(weight, device=err.device).to(err.dtype)
        assert w.shape == err.shape[:2], f"weight must be [{b}, {self.cfg.horizon}], got {list(w.shape)}"
        return (err.mean(-1) * w).mean()
