"""The arm body of ``bench/autosafe.py``: reach a goal near a face of the workspace box on the simulated Franka.

Lives in ``bench/`` because ``policies/`` never imports ``hardware/`` (DESIGN.md): the agent only sees the
gymnasium env, and the safety layer only the observation's end-effector position.

* The arm: ``hardware.sim_franka.SimFranka`` in process, fast mode (no thread, no camera), one env step =
  one 10 Hz control period (50 physics steps at 500 Hz, differential IK at 100 Hz). Orientation and
  gripper are held at the home pose's.
* Action ``a`` [3] in [-1, 1]: an end-effector displacement command, the target of the step is the
  measured position + ``STEP a`` (the layout of ``policies.safety.workspace.Workspace``, ``step`` = STEP).
* Observation [9]: end-effector position p (3), goal g (3), g - p (3).
* Reward ``exp(-|p - g| / 5 cm)`` per step (1 at the goal, positive, so returns compare as ratios).
* The workspace: the box ``WORKSPACE_LOW`` .. ``WORKSPACE_HIGH`` (a violation is a step that ends with
  the measured end effector outside it). The goal is uniform in the box's middle (``GOAL_FRACTION`` of each
  half extent around the centre): the task never needs the faces, so the best behaviour stays inside, while
  exploration (and the home pose, 3 cm under the top face) takes an unguarded learner out. Goals near a face
  would be a different test: AutoSafe's blend grows toward the faces, and within ``step / gain`` of the
  balance ``lambda / (1 - lambda) = step / (gain |c - p|)`` its agent cannot hold a point there at all.
* The safety layer's box is the workspace shrunk by ``TRACKING_MARGIN`` on every face: the layer's
  certificate holds for the displacement model p' = p + step a; the margin covers the simulated arm's
  tracking error about that model (see ``tracking_error`` and the JSON's ``model_error``).

No episode ends early (a box face is not a wall here; a real table is).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from hardware.sim_franka import SimFranka

WORKSPACE_LOW, WORKSPACE_HIGH = (0.35, -0.20, 0.25), (0.70, 0.20, 0.55)
TRACKING_MARGIN = 0.015
"""m: the safety layer's box is the workspace shrunk by this on every face."""
STEP = 0.03
"""m of end-effector displacement per unit action, per step."""
GOAL_FRACTION = 0.5
"""Goals are uniform in centre +- GOAL_FRACTION * half extent of the workspace."""
REWARD_SCALE = 0.05
OBS_DIM, ACT_DIM = 9, 3


def guard_box() -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The safety layer's box (the workspace shrunk by ``TRACKING_MARGIN``)."""
    return (tuple(v + TRACKING_MARGIN for v in WORKSPACE_LOW), tuple(v - TRACKING_MARGIN for v in WORKSPACE_HIGH))


def inside_workspace(p: np.ndarray) -> bool:
    return bool(np.all(p >= np.asarray(WORKSPACE_LOW)) and np.all(p <= np.asarray(WORKSPACE_HIGH)))


def sample_goal(rng: np.random.Generator) -> np.ndarray:
    """Uniform in the middle of the box (``GOAL_FRACTION`` of each half extent around the centre)."""
    lo, hi = np.asarray(WORKSPACE_LOW), np.asarray(WORKSPACE_HIGH)
    c, h = (lo + hi) / 2, (hi - lo) / 2
    return rng.uniform(c - GOAL_FRACTION * h, c + GOAL_FRACTION * h)


class ArmReachEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = 40, seed: int = 0) -> None:
        self.arm = SimFranka(realtime=False, control_substeps=50, seed=seed)
        self.arm.connect()
        self.max_steps = int(max_steps)
        self.observation_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)
        self.rng = np.random.default_rng(seed)
        self.goal = np.zeros(3)
        self.steps = 0
        self.model_errors: list[float] = []
        """|measured p' - (p + STEP a)| of every step: the arm's error about the layer's displacement model."""

    def _obs(self) -> np.ndarray:
        p = np.asarray(self.arm.read_state().ee_pos, np.float64)
        self._p = p
        return np.concatenate([p, self.goal, self.goal - p]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        st = self.arm.reset(seed=int(self.rng.integers(2**31)))
        self._quat = np.asarray(st.ee_quat, np.float64)
        self.goal = sample_goal(self.rng)
        self.steps = 0
        obs = self._obs()
        return obs, {"safe": inside_workspace(self._p)}

    def step(self, action):
        a = np.clip(np.asarray(action, np.float64).reshape(ACT_DIM), -1.0, 1.0)
        target = self._p + STEP * a
        self.arm.command_ee_pose(target, self._quat, gripper=1.0)
        self.arm.step()
        self.steps += 1
        obs = self._obs()
        self.model_errors.append(float(np.linalg.norm(self._p - target)))
        dist = float(np.linalg.norm(self._p - self.goal))
        r = float(np.exp(-dist / REWARD_SCALE))
        trunc = self.steps >= self.max_steps
        return obs, r, False, trunc, {"safe": inside_workspace(self._p), "dist": dist}

    def close(self) -> None:
        self.arm.disconnect()


def tracking_error(errors: list[float]) -> dict:
    e = np.asarray(errors) if errors else np.zeros(1)
    return {"steps": len(errors), "mean_m": float(e.mean()), "p99_m": float(np.percentile(e, 99)),
            "max_m": float(e.max())}
