"""The Go1 body of ``bench/safeexplorer.py``: a gymnasium env over the MuJoCo Go1 (``hardware.sim_go1``, in
process, fast mode) with a safe region and the Go1's deterministic recovery, as a SafeExplorer RecoverySpec.

Lives in ``bench/`` because ``policies/`` never imports ``hardware/`` (DESIGN.md): the agent only sees the
gymnasium env and the ``in_region`` / ``recovery`` callables built here. (Over the bridge the same body is
``robot_io.legged_env.LeggedEnv`` in ``joints`` mode; in process it skips the sockets for the budget.)

* Action ``a`` [12] in [-A_MAX, A_MAX]: joint targets ``STAND_Q + JOINT_SCALE a`` with fixed PD gains (kp 60,
  kd 2, the recovery controller's); one env step = one 50 Hz control period (10 physics steps at 500 Hz).
  The bound is wide enough for the recovery's targets (the sit posture); the learner starts near 0.
* Observation [36]: q(12), dq(12), trunk quat wxyz(4), gyro(3), base height(1), tilt(1), base linear
  velocity in the trunk frame(3; privileged, simulation only).
* Reward: ``clip(v_x, -1, 1) + 0.5`` per step (forward speed + alive) ``- 0.005 |a|^2``. A fall (the
  simulator's: tilt > 1 rad, trunk below 6 cm or trunk / head on the floor) terminates the episode.
* R_level = {tilt <= 0.25 level, base height >= 0.27 - 0.05 level, |roll / pitch rate| <= 3 rad/s} (level 1:
  0.25 rad, 22 cm). R is sized to what the recovery can return from (``recovery_rate``: exits driven by random
  joint targets of std 1.0 action units, seed 100, 60 trials): it re-enters (and settles) 56 / 60 at level 0.4
  (the curriculum's start) and 56 / 60 at level 1. The rate bound hands over before the trunk has picked up
  speed: without it the same trials gave 47 / 60 at level 1, and the first R (tilt 0.6 rad, 15 cm) 5 / 30,
  the trunk still falling (gyro up to 12 rad/s) when it left R. The rate bound does not shrink with the level:
  scaled (2 rad/s x level), a learner exploring with std 0.3 left R_0.4 after 1.4 steps on average and acted
  on 2% of the steps of a 40K-step run; fixed at 3 rad/s it stays about 23 steps at either level.
* Recovery: ``hardware.go1_control.RecoveryController`` (tuck, rise, stabilise), restarted from the measured
  joints at the start of every segment; its targets are expressed as actions (its tuck gains of kp 30 are
  replaced by the env's 60 -- the one difference to the simulator's own ``stand`` mode). It keeps control
  until the state is back in R *and* the controller has settled (``RecoverySpec.settled``: level and still
  for 0.3 s): handed back at the first re-entry, the learner took over mid-rise, often with the trunk still
  tipping, and the robot left R again.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from hardware import go1_control as gc
from hardware.sim_go1 import SimGo1

JOINT_SCALE, A_MAX, KP, KD = 0.4, 3.0, 60.0, 2.0
TILT_R, HEIGHT_STAND, HEIGHT_SPAN, GYRO_R = 0.25, 0.27, 0.05, 3.0
OBS_DIM = 36


class Go1SafeEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = 500, seed: int = 0) -> None:
        self.sim = SimGo1(realtime=False, control_hz=50.0, control_substeps=10, seed=seed)
        self.sim.connect()
        self.max_steps = int(max_steps)
        self.observation_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        self.action_space = spaces.Box(-A_MAX, A_MAX, (12,), np.float32)
        self.dt = self.sim.control_dt
        self.steps = 0

    @staticmethod
    def _obs(s) -> np.ndarray:
        return np.concatenate([s.q, s.dq, s.quat, s.gyro, [s.base_height, s.tilt], s.extras["base_lin_vel"]]
                              ).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        s = self.sim.reset(seed=int(self.np_random.integers(2 ** 31)))
        self.steps = 0
        return self._obs(s), {}

    def step(self, action):
        a = np.clip(np.asarray(action, np.float64).reshape(12), -A_MAX, A_MAX)
        self.sim.command_joint_positions(gc.STAND_Q + JOINT_SCALE * a, KP, KD)
        self.sim.step()
        s = self.sim.read_state()
        self.steps += 1
        vx = float(s.extras["base_lin_vel"][0])
        reward = float(np.clip(vx, -1.0, 1.0)) + 0.5 - 0.005 * float(np.sum(np.asarray(action) ** 2))
        return self._obs(s), reward, bool(s.fallen), self.steps >= self.max_steps, {"fall": bool(s.fallen)}

    def close(self) -> None:
        self.sim.disconnect()


def in_region(obs: np.ndarray, level: float) -> bool:
    height, tilt, tip_rate = float(obs[31]), float(obs[32]), float(np.hypot(obs[28], obs[29]))
    return tilt <= TILT_R * level and height >= HEIGHT_STAND - HEIGHT_SPAN * level and tip_rate <= GYRO_R


class Go1Recovery:
    """The stand-up / stabilise controller as actions of :class:`Go1SafeEnv` (deterministic given the segment's
    first state)."""

    def __init__(self, dt: float) -> None:
        self.dt, self.ctrl = dt, gc.RecoveryController()

    def start(self, obs: np.ndarray) -> None:
        self.ctrl.start(np.asarray(obs[:12], np.float64))

    def settled(self) -> bool:
        """The controller has finished: standing, level and still for its settle time (``phase == 'done'``)."""
        return self.ctrl.done

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        o = np.asarray(obs, np.float64)
        cmd = self.ctrl.step(self.dt, o[:12], o[12:24], o[24:28])
        return ((cmd.q - gc.STAND_Q) / JOINT_SCALE).astype(np.float32)


def recovery_spec(env: Go1SafeEnv):
    from policies.safety.safeexplorer import RecoverySpec

    rec = Go1Recovery(env.dt)
    return RecoverySpec(in_region=in_region, recovery=rec, start=rec.start, settled=rec.settled)


def recovery_rate(level: float, action_std: float = 1.0, trials: int = 30, seed: int = 0) -> dict[str, Any]:
    """How often the recovery brings the Go1 back into R_level: each trial drives the robot with random
    actions ~ N(0, action_std^2) from a fresh stance until it leaves R_level (or 150 steps), then runs the
    recovery for up to 200 steps (4 s) until it hands back (in R_level and settled, SafeExplorer's rule).
    -> counts of ``reentered`` / ``fell`` / ``timeout`` and of trials that fell before leaving or never left."""
    env = Go1SafeEnv(max_steps=10_000, seed=seed)
    rec = Go1Recovery(env.dt)
    rng = np.random.default_rng(seed)
    out = {"reentered": 0, "fell": 0, "timeout": 0, "fell_before_leaving": 0, "never_left": 0}
    try:
        for trial in range(trials):
            obs, _ = env.reset(seed=seed + trial)
            left = False
            for _ in range(150):
                obs, _, term, _, _ = env.step(rng.normal(0.0, action_std, 12))
                if term:
                    out["fell_before_leaving"] += 1
                    break
                if not in_region(obs, level):
                    left = True
                    break
            else:
                out["never_left"] += 1
            if not left:
                continue
            rec.start(obs)
            result = "timeout"
            for _ in range(200):
                obs, _, term, _, _ = env.step(rec(obs))
                if term:
                    result = "fell"
                    break
                if in_region(obs, level) and rec.settled():
                    result = "reentered"
                    break
            out[result] += 1
    finally:
        env.close()
    return out
