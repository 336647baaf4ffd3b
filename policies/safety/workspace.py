"""AutoSafe on the arm: a workspace-box :class:`~policies.safety.autosafe.SafetySpec` and a guard that blends
any continuous-action agent's action chunk row by row.

The arm's action layout: a row ``[A]`` whose entries ``action_pos`` (default the first three) are an
end-effector displacement command in units of ``step`` metres (the executed displacement of one row is
``step * a[action_pos]``; rotation / gripper entries are left to the agent), and the observation's entries
``obs_pos`` hold the end-effector position (m). The workspace is the box [low, high] (centre c, half
extents h).

* Margin: ``Delta(p) = clip(min_i (h_i - |p_i - c_i|) / h_i, 0, 1)``: the normalised distance to the box
  boundary, 1 at the centre, 0 on a face (and outside).
* Safe action: a proportional controller back to the centre, ``a_safe[pos] = gain (c - p) / step`` clipped
  to the action bound b, the other entries 0 (hold).
* Certificate (a point mass p' = p + step a[pos], the model of a displacement-commanded arm): with
  ``gain <= 1`` and ``step * b <= min_i h_i (1 - e^{-p_max}) / p_max`` (p_max the largest sharpness of the
  blend lambda = (e^{p(1-Delta)} - 1) / (e^p - 1)), no blended step leaves the box. Proof sketch, per
  axis i on the side of wall w: 1 - lambda = (1 - e^{-p Delta}) / (1 - e^{-p}) <= p Delta / (1 - e^{-p}),
  the safe part moves away from w, so the displacement toward w is at most (1 - lambda) step b <= Delta
  min_j h_j <= the distance to w; toward the opposite wall the step is a convex combination of |step b|
  <= h_i and gain |c_i - p_i| <= |c_i - p_i|, both within h_i + |c_i - p_i|, that wall's distance.
  :func:`certified_sharpness` returns the bound; :class:`ChunkGuard` refuses a sharpness above it.

:class:`ChunkGuard` wraps any agent's chunk ``[H, A]`` (DSRL's executed chunk, a VLA's): it rolls the point
mass through the chunk, and blends each row with the safe action at the position that row starts from,
with a fixed sharpness (a generic agent has no sharpness head; :class:`~policies.safety.autosafe.AutoSafeActor`
learns one for a SAC actor that reads the state).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from policies.safety.autosafe import SafetySpec, blend_weight


@dataclasses.dataclass(frozen=True)
class Workspace:
    """The box, the action layout and the safe controller's gain (see the module docstring)."""

    low: tuple[float, float, float]
    high: tuple[float, float, float]
    step: float = 0.01
    """Metres of end-effector displacement per unit of the action's position entries (one row)."""
    gain: float = 0.2
    """Safe controller: fraction of the way back to the centre per row, in (0, 1]."""
    action_bound: float = 1.0
    """b: the action entries lie in [-b, b]."""
    obs_pos: tuple[int, int, int] = (0, 1, 2)
    action_pos: tuple[int, int, int] = (0, 1, 2)

    def __post_init__(self) -> None:
        if not all(h > lo for lo, h in zip(self.low, self.high)):
            raise ValueError(f"workspace low {self.low} must be below high {self.high} on every axis")
        if not 0 < self.gain <= 1:
            raise ValueError(f"gain must be in (0, 1] (a larger one overshoots the centre), got {self.gain}")
        if not self.step * self.action_bound <= min(self.half):
            raise ValueError(f"one row can move {self.step * self.action_bound} m, more than the smallest half "
                             f"extent {min(self.half)} m of the box: no blend can keep it inside")

    @property
    def centre(self) -> tuple[float, ...]:
        return tuple((lo + h) / 2 for lo, h in zip(self.low, self.high))

    @property
    def half(self) -> tuple[float, ...]:
        return tuple((h - lo) / 2 for lo, h in zip(self.low, self.high))

    def margin_of(self, pos: torch.Tensor) -> torch.Tensor:
        """Delta(p) [...] of positions [..., 3]."""
        lo, hi, h = pos.new_tensor(self.low), pos.new_tensor(self.high), pos.new_tensor(self.half)
        # distance to the nearer face from the faces themselves: exactly 0 on a face (no rounding through c)
        return (torch.minimum(pos - lo, hi - pos) / h).amin(-1).clamp(0.0, 1.0)

    def safe_action_of(self, pos: torch.Tensor, action_dim: int) -> torch.Tensor:
        """a_safe [..., A] at positions [..., 3]: back toward the centre on the position entries, 0 elsewhere."""
        a = pos.new_zeros(*pos.shape[:-1], action_dim)
        a[..., list(self.action_pos)] = (self.gain * (pos.new_tensor(self.centre) - pos) / self.step).clamp(
            -self.action_bound, self.action_bound)
        return a

    def inside(self, pos: torch.Tensor, tol: float = 1e-9) -> torch.Tensor:
        return ((pos >= pos.new_tensor(self.low) - tol) & (pos <= pos.new_tensor(self.high) + tol)).all(-1)


def certified_sharpness(ws: Workspace) -> float:
    """The largest sharpness p_max with step b <= min h (1 - e^{-p_max}) / p_max (inf if step b is tiny)."""
    ratio = ws.step * ws.action_bound / min(ws.half)  # in (0, 1]; (1 - e^{-p}) / p decreases from 1 at p = 0
    if ratio >= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    while (1 - math.exp(-hi)) / hi > ratio:
        hi *= 2
        if hi > 1e6:
            return math.inf
    for _ in range(100):
        mid = (lo + hi) / 2
        if mid > 0 and (1 - math.exp(-mid)) / mid < ratio:
            hi = mid
        else:
            lo = mid
    return lo


def workspace_spec(ws: Workspace, action_dim: int) -> SafetySpec:
    """The :class:`SafetySpec` of the box on observations [B, D] (positions at ``ws.obs_pos``)."""
    idx = list(ws.obs_pos)

    def safe_action(obs: torch.Tensor) -> torch.Tensor:
        return ws.safe_action_of(obs[..., idx], action_dim)

    def margin(obs: torch.Tensor) -> torch.Tensor:
        return ws.margin_of(obs[..., idx])

    return SafetySpec(safe_action=safe_action, margin=margin)


class ChunkGuard:
    """AutoSafe's blend on an action chunk, row by row, with a fixed sharpness (module docstring).

    ``__call__(pos [B, 3], chunk [B, H, A]) -> (blended chunk [B, H, A], lambda [B, H])``: row h is blended
    at p_h, the position the point mass reaches after the blended rows before it (p_0 = ``pos``)."""

    def __init__(self, ws: Workspace, sharpness: float = 1.0) -> None:
        bound = certified_sharpness(ws)
        if not 0 < sharpness <= bound:
            raise ValueError(f"sharpness {sharpness} is outside (0, {bound:.4g}], the certified range for a row "
                             f"step of {ws.step * ws.action_bound} m in a box of half extent {min(ws.half)} m")
        self.ws, self.sharpness = ws, float(sharpness)

    @torch.no_grad()
    def __call__(self, pos: torch.Tensor, chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, H, A = chunk.shape
        assert pos.shape == (B, 3), f"pos {tuple(pos.shape)} != ({B}, 3)"
        ws, ap = self.ws, list(self.ws.action_pos)
        # only the position entries are blended; rotation / gripper entries stay the agent's
        out, lams, p = chunk.clone(), chunk.new_empty(B, H), pos.clone()
        for h in range(H):
            a = chunk[:, h, ap].clamp(-ws.action_bound, ws.action_bound)
            a_safe = ws.safe_action_of(p, A)[:, ap]
            lam, one_minus = blend_weight(p.new_full((B,), self.sharpness), ws.margin_of(p))
            out[:, h, ap] = a_safe + one_minus[:, None] * (a - a_safe)  # (1 - lambda) a + lambda a_safe
            lams[:, h] = lam
            p = p + ws.step * out[:, h, ap]  # the point mass executes the row
        return out, lams
