"""A cheap MuJoCo body for SafeExplorer (``policies.safety.safeexplorer``; ``bench/safeexplorer.py``): a cart
on an endless rail balancing a pole while it learns to run, with a fall, a safe region and a deterministic
recovery.

* :class:`BalanceCartEnv` (a MuJoCo model written here: gymnasium's MuJoCo envs need ``imageio``, which
  is not installed). Cart 1 kg on a frictionless slider (no end stops), a 0.6 m pole of 0.2 kg on a
  hinge, a motor on the slider (action a in [-1, 1], force ``a * force_n``), 100 Hz physics (semi-implicit Euler), one
  env step = 2 physics steps (0.02 s). Observation ``[x_dot, theta, theta_dot]`` (float32; theta = 0
  upright, > 0 with the tip toward +x). Reward per step ``exp(-((x_dot - v_target) / 0.5)^2)`` (1 at the
  target speed): getting to speed means accelerating, which tips the pole -- the learner has a reason
  to approach the boundary. A **fall** (termination) is ``|theta| > fall_rad`` (the tip height below
  ``L cos(fall_rad)``, the "torso height" of this body). Episodes of ``max_steps`` (time limit:
  truncation).
* The safe region R_level = {|theta| <= level theta_R, |theta_dot| <= level omega_R} (:func:`in_region`),
  the tilt and tilt-rate limits of a legged robot in one dimension, level in (0, 1].
* The recovery (:class:`Recovery`): the discrete LQR of the model linearised at the upright rest
  (``mujoco.mjd_transitionFD``, ``scipy.linalg.solve_discrete_are``) on ``[theta, x_dot, theta_dot]``
  (x does not enter the dynamics), clipped to [-1, 1]: it stops the cart and stands the pole up -- a
  "stand-up" controller that costs reward (the cart stops). Deterministic, as are the dynamics, so the
  analytic value of recovery states is exact. From R_1 it re-enters R (``tests/policies/test_safeexplorer.py``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
import scipy.linalg
from gymnasium import spaces

XML = """
<mujoco model="balance_cart">
  <option timestep="0.01" gravity="0 0 -9.81"/>
  <worldbody>
    <body name="cart" pos="0 0 0.5">
      <joint name="slider" type="slide" axis="1 0 0" damping="0.1"/>
      <geom name="cart" type="box" size="0.2 0.1 0.05" mass="1.0" contype="0" conaffinity="0"/>
      <body name="pole">
        <joint name="hinge" type="hinge" axis="0 1 0" damping="0.005"/>
        <geom name="pole" type="capsule" fromto="0 0 0 0 0 0.6" size="0.02" mass="0.2" contype="0" conaffinity="0"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor name="push" joint="slider" gear="{force}" ctrlrange="-1 1" ctrllimited="true"/></actuator>
</mujoco>
"""
POLE_LENGTH = 0.6
THETA_R, OMEGA_R = 0.35, 2.5
"""R_1: |theta| <= 0.35 rad and |theta_dot| <= 2.5 rad/s (R_level scales both)."""


def in_region(obs: np.ndarray, level: float) -> bool:
    """Whether the observation ``[x_dot, theta, theta_dot]`` lies in R_level."""
    return bool(abs(obs[1]) <= level * THETA_R and abs(obs[2]) <= level * OMEGA_R)


class BalanceCartEnv(gym.Env):
    """See the module docstring. ``info["fall"]`` on a fall; ``info["x"]`` the cart position."""

    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = 250, v_target: float = 1.0, force_n: float = 20.0, fall_rad: float = 0.8,
                 init_range: float = 0.05, frame_skip: int = 2) -> None:
        self.model = mujoco.MjModel.from_xml_string(XML.replace("{force}", str(float(force_n))))
        self.data = mujoco.MjData(self.model)
        self.max_steps, self.v_target, self.fall_rad = int(max_steps), float(v_target), float(fall_rad)
        self.init_range, self.frame_skip = float(init_range), int(frame_skip)
        self.dt = self.model.opt.timestep * self.frame_skip
        high = np.array([np.inf, np.pi, np.inf], np.float32)
        self.observation_space = spaces.Box(-high, high, dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.steps = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.data.qvel[0], self.data.qpos[1], self.data.qvel[1]], np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[:] = self.np_random.uniform(-self.init_range, self.init_range, 2)
        self.data.qvel[:] = self.np_random.uniform(-self.init_range, self.init_range, 2)
        mujoco.mj_forward(self.model, self.data)
        self.steps = 0
        return self._obs(), {}

    def set_state(self, x_dot: float, theta: float, theta_dot: float, x: float = 0.0) -> np.ndarray:
        """Put the body in a given state (tests); -> the observation."""
        self.data.qpos[:] = (x, theta)
        self.data.qvel[:] = (x_dot, theta_dot)
        mujoco.mj_forward(self.model, self.data)
        return self._obs()

    def step(self, action):
        a = np.asarray(action, np.float64).reshape(-1)
        if a.shape != (1,) or not np.isfinite(a).all():
            raise ValueError(f"action must be one finite float, got {action!r}")
        self.data.ctrl[0] = float(np.clip(a[0], -1.0, 1.0))
        mujoco.mj_step(self.model, self.data, nstep=self.frame_skip)
        self.steps += 1
        obs = self._obs()
        fall = bool(abs(obs[1]) > self.fall_rad)
        reward = 0.5 + 0.5 * float(np.exp(-((obs[0] - self.v_target) / 0.5) ** 2))
        return obs, reward, fall, self.steps >= self.max_steps, {"fall": fall, "x": float(self.data.qpos[0])}


class Recovery:
    """The LQR stand-up controller (module docstring): a = clip(-K [theta, x_dot, theta_dot], -1, 1)."""

    def __init__(self, env: BalanceCartEnv, q: tuple[float, float, float] = (10.0, 1.0, 1.0), r: float = 1.0) -> None:
        m, d = env.model, mujoco.MjData(env.model)
        mujoco.mj_resetData(m, d)
        mujoco.mj_forward(m, d)
        nx = 2 * m.nv
        A, B = np.zeros((nx, nx)), np.zeros((nx, m.nu))
        mujoco.mjd_transitionFD(m, d, 1e-6, True, A, B, None, None)  # one physics step, state (qpos, qvel)
        Ak, Bk = np.linalg.matrix_power(A, env.frame_skip), sum(
            np.linalg.matrix_power(A, i) @ B for i in range(env.frame_skip))  # the env step (action held)
        idx = [1, 2, 3]  # theta, x_dot, theta_dot: x enters nothing
        Ar, Br = Ak[np.ix_(idx, idx)], Bk[idx]
        P = scipy.linalg.solve_discrete_are(Ar, Br, np.diag(q), np.array([[r]]))
        self.K = np.linalg.solve(np.array([[r]]) + Br.T @ P @ Br, Br.T @ P @ Ar)  # [1, 3]

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        s = np.array([obs[1], obs[0], obs[2]], np.float64)
        return np.clip(-self.K @ s, -1.0, 1.0).astype(np.float32)


def recovery_spec(env: BalanceCartEnv):
    """The :class:`policies.safety.safeexplorer.RecoverySpec` of the body (R_level and the LQR)."""
    from policies.safety.safeexplorer import RecoverySpec

    return RecoverySpec(in_region=in_region, recovery=Recovery(env))
