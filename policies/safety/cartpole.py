"""A cart-pole with a continuous force, its LQR safe controller and an ellipsoidal safe set: the
test bed of the safety layers (``policies.safety.autosafe``; ``bench/autosafe.py``).

* :class:`ContinuousCartPoleEnv`: gymnasium's ``CartPole-v1`` physics (Barto, Sutton & Anderson
  1983 as gymnasium writes it: cart 1 kg, pole 0.1 kg, half length 0.5 m, explicit Euler at
  0.02 s, termination at |x| > 2.4 m or |theta| > 12 deg), but the action is a force
  ``a * force_mag`` with ``a`` in [-1, 1] instead of a push of +-10 N. State ``[x, x_dot, theta,
  theta_dot]`` (float32), theta = 0 upright. Reward per step: ``1 - (x - x_goal)^2 / x_scale^2``
  (``x_goal`` 0 gives CartPole's +1 per step alive, up to rounding): holding the cart off-centre
  pays, and the LQR (which drives the state to 0) does not do it -- so a policy has a reason to
  move away from the safe controller, and the safe set is something it may touch.
* :func:`lqr`: the discrete-time LQR of the Euler step linearised at the upright equilibrium
  (``scipy.linalg.solve_discrete_are``): gain ``K`` (force = -K x, in units of ``a``) and the
  Riccati matrix ``P``, a Lyapunov function of the linear closed loop:
  ``V(x') - V(x) = -x^T (Q + K^T R K) x`` for ``x' = (A - B K) x``.
* The safe set ``S = {x : x^T P x <= c}``. ``c`` is the largest level whose ellipsoid keeps
  |x|, |theta| and the LQR force inside limits (``max_{x in S} |e_i^T x| = sqrt(c (P^-1)_ii)``,
  ``max_{x in S} |K x| = sqrt(c K P^-1 K^T)``); ``tests/policies/test_autosafe.py`` checks that
  the clipped LQR keeps the nonlinear cart-pole inside S from states sampled in S. The normalised margin is
  ``Delta(x) = clip(1 - x^T P x / c, 0, 1)``: 1 at the upright rest state, 0 on the boundary
  and outside.

Nothing here imports torch except :func:`safety_spec`, which builds the torch callables the
AutoSafe layer calls on batches.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import gymnasium as gym
import numpy as np
import scipy.linalg
from gymnasium import spaces

GRAVITY, MASS_CART, MASS_POLE, HALF_LENGTH, DT = 9.8, 1.0, 0.1, 0.5, 0.02
TOTAL_MASS = MASS_CART + MASS_POLE
POLEMASS_LENGTH = MASS_POLE * HALF_LENGTH
X_THRESHOLD, THETA_THRESHOLD = 2.4, 12 * 2 * math.pi / 360  # gymnasium's termination bounds


def step_dynamics(state: np.ndarray, force: np.ndarray | float) -> np.ndarray:
    """One explicit-Euler step of gymnasium's cart-pole. ``state`` [..., 4] float64, ``force`` in N
    (broadcast over the leading dims). -> the next state, same shape."""
    x, x_dot, theta, theta_dot = np.moveaxis(np.asarray(state, np.float64), -1, 0)
    cos, sin = np.cos(theta), np.sin(theta)
    temp = (force + POLEMASS_LENGTH * theta_dot ** 2 * sin) / TOTAL_MASS
    theta_acc = (GRAVITY * sin - cos * temp) / (HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * cos ** 2 / TOTAL_MASS))
    x_acc = temp - POLEMASS_LENGTH * theta_acc * cos / TOTAL_MASS
    # gymnasium's "euler" integrator: positions move with the old velocities
    return np.stack([x + DT * x_dot, x_dot + DT * x_acc, theta + DT * theta_dot, theta_dot + DT * theta_acc], -1)


@dataclasses.dataclass(frozen=True)
class LQR:
    """The cart-pole's LQR safe controller and its safe set {x : x^T P x <= c}."""

    K: np.ndarray
    """Gain [1, 4]: the safe action is ``a = -K x`` (clipped to [-1, 1]), in units of ``force_mag``."""
    P: np.ndarray
    """Riccati / Lyapunov matrix [4, 4] of the discrete closed loop."""
    c: float
    """Level of the safe ellipsoid."""
    A: np.ndarray
    """Linearised discrete dynamics x' = A x + B a at the upright equilibrium."""
    B: np.ndarray

    def action(self, state: np.ndarray) -> np.ndarray:
        """a_safe = clip(-K x, -1, 1), [..., 1]."""
        return np.clip(-np.asarray(state, np.float64) @ self.K.T, -1.0, 1.0)

    def value(self, state: np.ndarray) -> np.ndarray:
        """V(x) = x^T P x, [...]."""
        s = np.asarray(state, np.float64)
        return np.einsum("...i,ij,...j->...", s, self.P, s)

    def margin(self, state: np.ndarray) -> np.ndarray:
        """Delta(x) = clip(1 - x^T P x / c, 0, 1), [...]."""
        return np.clip(1.0 - self.value(state) / self.c, 0.0, 1.0)

    def inside(self, state: np.ndarray) -> np.ndarray:
        return self.value(state) <= self.c

    def sample_inside(self, rng: np.random.Generator, n: int, level: float = 1.0) -> np.ndarray:
        """``n`` states drawn uniformly from the ellipsoid {x^T P x <= level * c}, [n, 4]."""
        d = self.P.shape[0]
        z = rng.normal(size=(n, d))
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        r = rng.uniform(size=(n, 1)) ** (1.0 / d)
        L = np.linalg.cholesky(self.P)  # P = L L^T: x = sqrt(level c) L^-T z r has x^T P x = level c r^2
        return (np.sqrt(level * self.c) * r * np.linalg.solve(L.T, z.T).T)


def lqr(force_mag: float = 10.0, q: tuple[float, ...] = (0.1, 0.1, 10.0, 1.0), r: float = 1.0,
        x_limit: float = 2.0, theta_limit: float = 0.8 * THETA_THRESHOLD, force_limit: float = 2.0,
        level_fraction: float = 1.0) -> LQR:
    """The discrete LQR of the cart-pole linearised at the upright rest state, and the safe level c.

    c is the largest level whose ellipsoid keeps |x| <= ``x_limit``, |theta| <= ``theta_limit`` (by
    default 2 m and 80% of gymnasium's 12 deg termination bound) and the unclipped LQR force
    |K x| <= ``force_limit`` (in units of ``force_mag``: 2 lets the LQR saturate the actuator near the
    boundary), times ``level_fraction``. The ellipsoid's invariance under the clipped LQR on the
    nonlinear cart-pole is not implied by the linear analysis when the force saturates: it is
    checked numerically (``tests/policies/test_autosafe.py``; the worst V / c over 300 steps from
    states drawn in S is ~0.97 with these defaults)."""
    # linearise the Euler step by central differences (the discrete map itself, so A, B are exact to O(h^2))
    h, x0 = 1e-6, np.zeros(4)
    A = np.stack([(step_dynamics(x0 + h * e, 0.0) - step_dynamics(x0 - h * e, 0.0)) / (2 * h) for e in np.eye(4)], 1)
    B = ((step_dynamics(x0, h * force_mag) - step_dynamics(x0, -h * force_mag)) / (2 * h)).reshape(4, 1)
    Q, R = np.diag(q), np.array([[r]])
    P = scipy.linalg.solve_discrete_are(A, B, Q, R)
    K = np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)  # u = -K x minimises sum x^T Q x + u^T R u
    P_inv = np.linalg.inv(P)
    # max over {x^T P x <= c} of |w^T x| is sqrt(c w^T P^-1 w): solve each limit for c
    levels = [x_limit ** 2 / P_inv[0, 0], theta_limit ** 2 / P_inv[2, 2],
              force_limit ** 2 / float((K @ P_inv @ K.T)[0, 0])]
    return LQR(K=K, P=P, c=level_fraction * min(levels), A=A, B=B)


class ContinuousCartPoleEnv(gym.Env):
    """CartPole with a continuous force (see the module docstring). ``info["safe"]``: whether the new
    state lies in the LQR's safe set (when ``safe_set`` is given), ``info["state"]`` the float64 state."""

    metadata = {"render_modes": []}

    def __init__(self, force_mag: float = 10.0, max_steps: int = 500, x_goal: float = 0.0, x_scale: float = 1.0,
                 init_range: float = 0.05, safe_set: LQR | None = None) -> None:
        self.force_mag, self.max_steps, self.x_goal, self.x_scale = float(force_mag), int(max_steps), x_goal, x_scale
        self.init_range, self.safe_set = float(init_range), safe_set
        high = np.array([2 * X_THRESHOLD, np.inf, 2 * THETA_THRESHOLD, np.inf], np.float32)
        self.observation_space = spaces.Box(-high, high, dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.state = np.zeros(4)
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.state = self.np_random.uniform(-self.init_range, self.init_range, 4)
        self.steps = 0
        return self.state.astype(np.float32), self._info()

    def step(self, action):
        a = float(np.clip(np.asarray(action, np.float64).reshape(-1)[0], -1.0, 1.0))
        if not math.isfinite(a):
            raise ValueError(f"action must be finite, got {action!r}")
        self.state = step_dynamics(self.state, a * self.force_mag)
        self.steps += 1
        x, theta = self.state[0], self.state[2]
        terminated = bool(abs(x) > X_THRESHOLD or abs(theta) > THETA_THRESHOLD)
        truncated = self.steps >= self.max_steps
        reward = 0.0 if terminated else 1.0 - ((x - self.x_goal) / self.x_scale) ** 2
        return self.state.astype(np.float32), float(reward), terminated, truncated, self._info()

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"state": self.state.copy()}
        if self.safe_set is not None:
            info["safe"] = bool(self.safe_set.inside(self.state))
            info["margin"] = float(self.safe_set.margin(self.state))
        return info


def safety_spec(controller: LQR):
    """The :class:`policies.safety.autosafe.SafetySpec` of the cart-pole: ``safe_action(obs)`` the LQR
    force clip(-K x, -1, 1) and ``margin(obs)`` = clip(1 - x^T P x / c, 0, 1), on float tensors [B, 4]."""
    import torch

    from policies.safety.autosafe import SafetySpec

    K = torch.as_tensor(controller.K, dtype=torch.float32)  # [1, 4]
    P_over_c = torch.as_tensor(controller.P / controller.c, dtype=torch.float32)

    def safe_action(obs: torch.Tensor) -> torch.Tensor:
        return (-obs @ K.T.to(obs)).clamp(-1.0, 1.0)

    def margin(obs: torch.Tensor) -> torch.Tensor:
        return (1.0 - ((obs @ P_over_c.to(obs)) * obs).sum(-1)).clamp(0.0, 1.0)

    return SafetySpec(safe_action=safe_action, margin=margin)
