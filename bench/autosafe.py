#!/usr/bin/env python
"""AutoSafe: SAC vs AutoSafe-SAC vs SAC + a hard safety filter (Simplex), on two bodies.

``--env cartpole`` (default; writes ``autosafe.json``): the env is ``policies.safety.cartpole.ContinuousCartPoleEnv`` (gymnasium's CartPole physics, force
in [-10, 10] N, episodes of ``--max-steps``) with reward ``1 - (x - 0.5)^2 / 4``: holding the cart
0.5 m off centre pays more than the LQR's upright rest at 0, so a policy has a reason to leave the
safe controller's behaviour. The safe set is the LQR's ellipsoid ``x^T P x <= c``
(``policies.safety.cartpole.lqr``); a violation is a step that ends outside it.

Arms, all the same SAC (``policies.common.sac``: 2 critics, UTD 1, batch 256, hidden 256 x 256;
every arm acts with its own actor from the first step and updates after ``--learning-starts``):

* ``sac``: plain SAC.
* ``autosafe``: ``policies.safety.autosafe.AutoSafeSAC`` with the LQR as a_safe and
  Delta = 1 - x^T P x / c (``AutoSafeConfig`` defaults: p starts at 1, capped at 2).
* ``sac+simplex``: SAC whose action is replaced by the LQR's when the model predicts that the next
  state would leave the safe set (``SimplexFilter``, exact one-step model); the replay stores the
  executed action.

``--env arm`` (writes ``autosafe_arm.json``): the simulated Franka reaching a goal in the middle half of a
workspace box, from a home pose 3 cm under its top face (the arm body below: end-effector displacement
actions of up to 3 cm per 10 Hz step,
reward ``exp(-|p - g| / 5 cm)``, 40-step episodes). The safe action is a proportional controller back to
the box centre and Delta the normalised distance to the nearest face
(``policies.safety.workspace``), on the box shrunk by 1.5 cm for the arm's tracking error about the
displacement model; a violation is a step that ends with the measured end effector outside the real
box. Simplex predicts p' = p + step a (the model, not the arm). The JSON also holds the arm's measured
error about that model (``model_error``).

Reported per arm (mean over seeds, and per seed): violations during training (steps outside the safe
set, episodes with one), falls (terminations), the training return per episode, the final return
(deterministic policy, under its safety layer, ``--eval-episodes`` episodes), and for AutoSafe the
inference rate on one thread: a deterministic policy forward of one observation with the LQR and the
margin inside it, in Hz. Goals (issue 18): AutoSafe 0 violations; its final return >= 0.9x SAC's;
>= 50 Hz with margin (here on this machine's one core; the issue's 50 Hz is on a Raspberry Pi).

Writes ``bench/results/autosafe[_arm].json`` and ``.png``.

    .venv/bin/python -m bench.autosafe [--env cartpole|arm] [--quick] [--out DIR] [--steps N] [--seeds N]
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import pathlib
import platform
import sys
import time
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from policies.common.replay import ReplayBuffer
from policies.common.sac import SAC, SACConfig
from policies.safety.autosafe import AutoSafeSAC, SimplexFilter
from policies.safety.cartpole import ContinuousCartPoleEnv, lqr, safety_spec, step_dynamics
from policies.safety.config import AutoSafeConfig
from policies.safety.workspace import Workspace, certified_sharpness, workspace_spec

from bench.harness import flags, plots
from bench.harness.results import write_result


ARMS = ("sac", "autosafe", "sac+simplex")
X_GOAL, X_SCALE, FORCE = 0.5, 2.0, 10.0
GOAL_RETURN_RATIO, GOAL_HZ = 0.9, 50.0


@dataclasses.dataclass
class Body:
    """What the bench needs of an env: its sizes, its safety spec and Simplex model, states to time on."""

    name: str
    obs_dim: int
    act_dim: int
    make_env: Callable[[int, int], Any]
    """(max_steps, seed) -> a gymnasium env whose ``info["safe"]`` says whether the step ended in the safe set."""
    spec: Any
    predict: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """Simplex's one-step model (obs, action) -> next obs."""
    sample_states: Callable[[np.random.Generator, int], np.ndarray]
    """n observations inside the safe set [n, obs_dim] (inference timing, the sharpness probe)."""
    config: dict
    result: str
    """The results file's stem."""
    defaults: dict
    """Full-run defaults of --steps / --max-steps / --learning-starts for this body."""
    finish: Callable[[Any], dict] = lambda env: {}
    """env -> extra per-run measurements (the arm: its error about the displacement model)."""
    autosafe: dict = dataclasses.field(default_factory=dict)
    """AutoSafeConfig overrides for this body (the arm: the sharpness cap at its certificate's bound)."""


def cartpole_body() -> Body:
    ctrl = lqr(force_mag=FORCE)

    def predict(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:  # the env's own step, one step ahead
        return torch.from_numpy(step_dynamics(obs.double().numpy(), FORCE * action.double().numpy()[:, 0])).float()

    return Body(
        name="cartpole", obs_dim=4, act_dim=1,
        make_env=lambda max_steps, seed: ContinuousCartPoleEnv(force_mag=FORCE, max_steps=max_steps, x_goal=X_GOAL,
                                                               x_scale=X_SCALE, safe_set=ctrl),
        spec=safety_spec(ctrl), predict=predict,
        sample_states=lambda rng, n: ctrl.sample_inside(rng, n).astype(np.float32),
        config={"env": {"x_goal": X_GOAL, "x_scale": X_SCALE, "force_mag": FORCE},
                "safe_set": {"c": ctrl.c, "K": ctrl.K.tolist(), "P": ctrl.P.tolist()}},
        result="autosafe", defaults={"steps": 20_000, "max_steps": 500, "learning_starts": 1000})


# ---- The arm body of ``bench/autosafe.py``: reach a goal near a face of the workspace box on the simulated Franka.
#
# Lives in ``bench/`` because ``policies/`` never imports ``hardware/`` (DESIGN.md): the agent only sees the
# gymnasium env, and the safety layer only the observation's end-effector position.
#
# * The arm: ``hardware.sim_franka.SimFranka`` in process, fast mode (no thread, no camera), one env step =
#   one 10 Hz control period (50 physics steps at 500 Hz, differential IK at 100 Hz). Orientation and
#   gripper are held at the home pose's.
# * Action ``a`` [3] in [-1, 1]: an end-effector displacement command, the target of the step is the
#   measured position + ``STEP a`` (the layout of ``policies.safety.workspace.Workspace``, ``step`` = STEP).
# * Observation [9]: end-effector position p (3), goal g (3), g - p (3).
# * Reward ``exp(-|p - g| / 5 cm)`` per step (1 at the goal, positive, so returns compare as ratios).
# * The workspace: the box ``WORKSPACE_LOW`` .. ``WORKSPACE_HIGH`` (a violation is a step that ends with
#   the measured end effector outside it). The goal is uniform in the box's middle (``GOAL_FRACTION`` of each
#   half extent around the centre): the task never needs the faces, so the best behaviour stays inside, while
#   exploration (and the home pose, 3 cm under the top face) takes an unguarded learner out. Goals near a face
#   would be a different test: AutoSafe's blend grows toward the faces, and within ``step / gain`` of the
#   balance ``lambda / (1 - lambda) = step / (gain |c - p|)`` its agent cannot hold a point there at all.
# * The safety layer's box is the workspace shrunk by ``TRACKING_MARGIN`` on every face: the layer's
#   certificate holds for the displacement model p' = p + step a; the margin covers the simulated arm's
#   tracking error about that model (see ``tracking_error`` and the JSON's ``model_error``).
#
# No episode ends early (a box face is not a wall here; a real table is).

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
        from hardware.sim_franka import SimFranka  # MuJoCo: imported only for this body

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


def arm_body() -> Body:
    lo, hi = guard_box()
    ws = Workspace(lo, hi, step=STEP, gain=0.2, action_bound=1.0)
    # the learned sharpness may go as far as the certificate allows (4.3 here; the cart-pole's cap is 2)
    cap = float(np.floor(certified_sharpness(ws) * 100) / 100)
    spec = workspace_spec(ws, ACT_DIM)

    def predict(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:  # the displacement model p' = p + step a
        nxt = obs.clone()
        nxt[:, :3] = obs[:, :3] + STEP * action.clamp(-1, 1)
        return nxt

    def sample_states(rng: np.random.Generator, n: int) -> np.ndarray:
        p = rng.uniform(lo, hi, (n, 3))
        g = np.stack([sample_goal(rng) for _ in range(n)])
        return np.concatenate([p, g, g - p], 1).astype(np.float32)

    return Body(
        name="arm", obs_dim=OBS_DIM, act_dim=ACT_DIM,
        make_env=lambda max_steps, seed: ArmReachEnv(max_steps=max_steps, seed=seed),
        spec=spec, predict=predict, sample_states=sample_states,
        config={"env": {"workspace_low": list(WORKSPACE_LOW), "workspace_high": list(WORKSPACE_HIGH),
                        "step_m": STEP, "goal_fraction": GOAL_FRACTION, "reward_scale_m": REWARD_SCALE,
                        "control_hz": 10},
                "safe_set": {"guard_low": list(lo), "guard_high": list(hi), "tracking_margin_m": TRACKING_MARGIN,
                             "safe_gain": ws.gain, "certified_sharpness": certified_sharpness(ws)}},
        result="autosafe_arm", defaults={"steps": 10_000, "max_steps": 40, "learning_starts": 1000},
        finish=lambda env: {"model_error": tracking_error(env.model_errors)}, autosafe={"sharpness_max": cap})


BODIES = {"cartpole": cartpole_body, "arm": arm_body}


def make_agent(arm: str, body: Body, sac_cfg: SACConfig, seed: int):
    if arm == "autosafe":
        return AutoSafeSAC(body.obs_dim, body.act_dim, body.spec, AutoSafeConfig(sac=sac_cfg, **body.autosafe),
                           seed=seed), None
    filt = SimplexFilter(body.spec, threshold=0.0, predict=body.predict) if arm == "sac+simplex" else None
    return SAC(body.obs_dim, body.act_dim, sac_cfg, seed=seed), filt


def act(agent, filt, obs: np.ndarray, deterministic: bool = False) -> tuple[np.ndarray, bool]:
    o = torch.from_numpy(obs)[None]
    a = agent.act(o, deterministic=deterministic)
    switched = False
    if filt is not None:
        a, sw = filt(o, a)
        switched = bool(sw[0])
    return a[0].numpy(), switched


def train(arm: str, seed: int, args, sac_cfg: SACConfig, body: Body) -> dict:
    torch.manual_seed(seed)
    agent, filt = make_agent(arm, body, sac_cfg, seed)
    env = body.make_env(args.max_steps, seed)
    buf = ReplayBuffer(args.steps, {"x": ((body.obs_dim,), np.float32)}, body.act_dim)
    rng = np.random.default_rng(seed)
    flat = lambda b: {**b, "obs": b["obs"]["x"], "next_obs": b["next_obs"]["x"]}  # noqa: E731
    obs, _ = env.reset(seed=seed)
    viol_steps, viol_episodes, falls, switches, ep_ret, ep_viol = 0, 0, 0, 0, 0.0, False
    episodes, cum_viol = [], []
    t0 = time.perf_counter()
    for step in range(args.steps):
        a, sw = act(agent, filt, obs)
        switches += sw
        nobs, r, term, trunc, info = env.step(a)
        if not info["safe"]:
            viol_steps += 1
            ep_viol = True
        buf.add({"x": obs}, a.astype(np.float32), r, {"x": nobs}, term)
        ep_ret += r
        obs = nobs
        if term or trunc:
            falls += term
            viol_episodes += ep_viol
            episodes.append({"end_step": step + 1, "return": ep_ret, "length": env.steps, "fell": term,
                             "violated": ep_viol})
            obs, _ = env.reset()
            ep_ret, ep_viol = 0.0, False
        if step + 1 >= args.learning_starts:
            agent.update_many(lambda: flat(buf.sample(sac_cfg.batch_size, rng)))
        cum_viol.append(viol_steps)
    train_s = time.perf_counter() - t0
    # the final policy: deterministic, under its safety layer
    extra = body.finish(env)
    eval_env = body.make_env(args.max_steps, 10_000 + seed)
    returns, eval_viol = [], 0
    for k in range(args.eval_episodes):
        o, _ = eval_env.reset(seed=10_000 + 100 * seed + k)
        ret, done = 0.0, False
        while not done:
            a, _ = act(agent, filt, o, deterministic=True)
            o, r, term, trunc, info = eval_env.step(a)
            eval_viol += not info["safe"]
            ret += r
            done = term or trunc
        returns.append(ret)
    every = max(1, args.steps // 200)
    out = {"arm": arm, "seed": seed, "violation_steps": viol_steps, "violation_episodes": viol_episodes,
           "falls": falls, "episodes": len(episodes), "filter_switches": switches if filt is not None else None,
           "final_return_mean": float(np.mean(returns)), "final_returns": [float(x) for x in returns],
           "eval_violation_steps": int(eval_viol), "train_s": train_s, "steps_per_s": args.steps / train_s,
           "train_episodes": episodes, "cum_violations": {"step": list(range(every, args.steps + 1, every)),
                                                          "count": cum_viol[every - 1::every]}, **extra}
    for e in (env, eval_env):
        e.close()
    if arm == "autosafe":
        out["inference"] = inference_rate(agent, body, args.inference_calls)
        probe = torch.from_numpy(body.sample_states(np.random.default_rng(0), 512)).float()
        blend = agent.actor.blend(probe)
        out["sharpness_final"] = {"mean": float(blend["p"].mean()), "min": float(blend["p"].min()),
                                  "max": float(blend["p"].max())}
    return out


def inference_rate(agent: AutoSafeSAC, body: Body, calls: int) -> dict:
    """Deterministic AutoSafe action for one observation (policy forward + safe action + margin), one thread."""
    rng = np.random.default_rng(1)
    states = body.sample_states(rng, calls)
    for s in states[:20]:  # warm-up
        act(agent, None, s, deterministic=True)
    blocks = []
    n = max(1, calls // 5)
    for b in range(5):
        t0 = time.perf_counter()
        for s in states[b * n:(b + 1) * n]:
            act(agent, None, s, deterministic=True)
        blocks.append((time.perf_counter() - t0) / n)
    med = float(np.median(blocks))
    return {"calls": 5 * n, "ms_per_call_median": med * 1e3, "hz_median": 1.0 / med,
            "hz_slowest_block": 1.0 / max(blocks), "threads": torch.get_num_threads()}


def summarise(runs: list[dict]) -> dict:
    out = {}
    for arm in ARMS:
        rs = [r for r in runs if r["arm"] == arm]
        out[arm] = {k: float(np.mean([r[k] for r in rs])) for k in
                    ("violation_steps", "violation_episodes", "falls", "episodes", "final_return_mean",
                     "eval_violation_steps", "steps_per_s")}
        out[arm]["violation_steps_max_over_seeds"] = int(max(r["violation_steps"] for r in rs))
    return out


def plot(res: dict, path: pathlib.Path) -> None:
    plt = plots.pyplot()

    colors = {"sac": "#c44e52", "autosafe": "#4c72b0", "sac+simplex": "#55a868"}
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.4))
    for r in res["runs"]:
        col = colors[r["arm"]]
        label = r["arm"] if r["seed"] == res["config"]["seeds"][0] else None
        cv = r["cum_violations"]
        a.plot(cv["step"], cv["count"], c=col, label=label, alpha=0.8)
        eps = r["train_episodes"]
        if eps:
            b.plot([e["end_step"] for e in eps], [e["return"] for e in eps], ".-", c=col, label=label, alpha=0.6,
                   ms=3)
    a.set_xlabel("env step")
    a.set_ylabel("steps outside the safe set (cumulative)")
    a.set_title("violations during training", fontsize=9)
    a.legend(fontsize=8)
    b.set_xlabel("env step (episode end)")
    b.set_ylabel("training episode return")
    b.set_title(f"training returns (episodes of <= {res['config']['max_steps']} steps)", fontsize=9)
    s = res["summary"]
    vals = [s[arm]["final_return_mean"] for arm in ARMS]
    c.bar(range(len(ARMS)), vals, color=[colors[arm] for arm in ARMS])
    for i, arm in enumerate(ARMS):
        per_seed = [r["final_return_mean"] for r in res["runs"] if r["arm"] == arm]
        c.plot([i] * len(per_seed), per_seed, "k.", ms=6)
        c.text(i, vals[i] * 0.5, f"{vals[i]:.1f}\nviol {s[arm]['violation_steps']:.0f}", ha="center",
               color="white", fontsize=9)
    c.set_xticks(range(len(ARMS)), ARMS)
    c.set_ylabel("final return (deterministic, mean over seeds; dots: seeds)")
    inf = res["goals"]["inference_hz"]["measured"]
    c.set_title(f"AutoSafe inference {inf:.0f} Hz on 1 thread (policy + safe action)", fontsize=9)
    m = res["machine"]
    what = {"cartpole": "the continuous cart-pole", "arm": "the simulated Franka (workspace box)"}[res["env"]]
    fig.suptitle(f"AutoSafe on {what}: {res['config']['steps']} steps x "
                 f"{len(res['config']['seeds'])} seed(s) per arm; {m['cpu_count']} cores, load "
                 f"{m['loadavg_1m_start']:.1f} ({res['mode']})", fontsize=10)
    fig.tight_layout()
    plots.save(fig, path, dpi=110)


def _previous_runs(path: pathlib.Path, config: dict, seeds: list[int], quick: bool) -> list[dict]:
    """--append: the runs already in ``path`` for other seeds; refused (SystemExit naming the field) when the
    file is missing, is a quick run, or was made with different settings."""
    if not path.exists():
        raise SystemExit(f"--append: {path} does not exist (run without --append first)")
    old = json.loads(path.read_text())
    if old.get("quick") != quick:
        raise SystemExit(f"--append: {path} is a {'quick' if old.get('quick') else 'full'} run; this one is not")
    for k, v in config.items():
        if k not in ("seeds", "threads") and old["config"].get(k) != json.loads(json.dumps(v)):
            raise SystemExit(f"--append: config field {k!r} differs: {path} has {old['config'].get(k)!r}, this run "
                             f"{v!r}")
    return [r for r in old["runs"] if r["seed"] not in seeds]


def main(argv=None) -> int:
    ap = flags.parser("autosafe", __doc__, out=False)
    ap.add_argument("--env", choices=sorted(BODIES), default="cartpole",
                    help="cartpole (LQR safe set; autosafe.json) or arm (simulated Franka, workspace box; "
                         "autosafe_arm.json)")
    flags.add_quick(ap, "150 steps, 40 updates, small networks, 1 seed (a smoke run, not a measurement)")
    flags.add_out(ap)
    ap.add_argument("--steps", type=int, default=None, help="env steps per arm and seed (cartpole 20000, arm 10000)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seed-start", type=int, default=0,
                    help="first seed: runs seeds seed-start .. seed-start + seeds - 1")
    ap.add_argument("--append", action="store_true",
                    help="add these seeds to the existing results file (same env, steps, episode length, "
                         "warm-up, evaluation and layer settings; refused otherwise) instead of replacing it")
    ap.add_argument("--max-steps", type=int, default=None, help="episode length (truncation; cartpole 500, arm 40)")
    ap.add_argument("--learning-starts", type=int, default=None, help="env steps before the first update; every arm acts with its own actor from step 0 (1000)")
    ap.add_argument("--eval-episodes", type=int, default=5)
    ap.add_argument("--inference-calls", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    body = BODIES[args.env]()
    for k, v in body.defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    hidden, batch = (256, 256), 256
    if args.quick:
        args.steps, args.seeds, args.max_steps, args.learning_starts = 150, 1, min(args.max_steps, 100), 110
        args.eval_episodes, args.inference_calls = 2, 500
        hidden, batch = (64, 64), 64
    torch.set_num_threads(args.threads)
    sac_cfg = SACConfig(num_critics=2, critic_subset=2, utd=1, hidden=hidden, batch_size=batch)
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    config = {"steps": args.steps, "seeds": seeds, "max_steps": args.max_steps,
              "learning_starts": args.learning_starts, "eval_episodes": args.eval_episodes,
              "threads": args.threads, "sac": {"hidden": list(hidden), "batch_size": batch, "num_critics": 2, "utd": 1},
              "autosafe": {k: v for k, v in vars(AutoSafeConfig(**body.autosafe)).items() if k != "sac"},
              **body.config}
    json_path, png_path = args.out / f"{body.result}.json", args.out / f"{body.result}.png"
    previous = _previous_runs(json_path, config, seeds, args.quick) if args.append else []
    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    runs = []
    for seed in seeds:
        for arm in ARMS:
            r = train(arm, seed, args, sac_cfg, body)
            runs.append(r)
            print(f"seed {seed} {arm:<12} violations {r['violation_steps']:6d} steps / {r['violation_episodes']:4d} "
                  f"episodes, falls {r['falls']:4d}, final return {r['final_return_mean']:8.2f}, "
                  f"{r['steps_per_s']:.0f} steps/s", flush=True)
    runs = previous + runs
    config["seeds"] = sorted({r["seed"] for r in runs})
    summary = summarise(runs)
    hz = float(np.mean([r["inference"]["hz_median"] for r in runs if r["arm"] == "autosafe"]))
    ratio = summary["autosafe"]["final_return_mean"] / max(summary["sac"]["final_return_mean"], 1e-9)
    res = {"bench": "autosafe", "env": body.name, "mode": "quick" if args.quick else "full", "quick": args.quick,
           "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                       "python": platform.python_version(), "loadavg_1m_start": load0,
                       "loadavg_1m_end": os.getloadavg()[0]},
           "config": config,
           "summary": summary,
           "goals": {"autosafe_zero_violations": {
                         "goal": "AutoSafe: 0 steps outside the safe set during training, every seed",
                         "measured": summary["autosafe"]["violation_steps_max_over_seeds"],
                         "met": summary["autosafe"]["violation_steps_max_over_seeds"] == 0},
                     "autosafe_return_vs_sac": {
                         "goal": f">= {GOAL_RETURN_RATIO}x plain SAC's final return", "measured": ratio,
                         "met": bool(ratio >= GOAL_RETURN_RATIO)},
                     "inference_hz": {"goal": f">= {GOAL_HZ} Hz on one thread (policy forward + safe action)",
                                      "measured": hz, "met": bool(hz >= GOAL_HZ)}},
           "runs": runs, "wall_s": None}
    res["wall_s"] = time.perf_counter() - t_start
    write_result(json_path, res, "autosafe", argv, args.quick)  # atomic: a killed run leaves no half-written file
    plot(res, png_path)
    print(f"\n{'arm':<12} {'viol steps':>10} {'viol eps':>9} {'falls':>6} {'final return':>13}")
    for arm in ARMS:
        s = summary[arm]
        print(f"{arm:<12} {s['violation_steps']:10.1f} {s['violation_episodes']:9.1f} {s['falls']:6.1f} "
              f"{s['final_return_mean']:13.2f}")
    for name, g in res["goals"].items():
        print(f"goal {name}: {g['measured']:.3g} -> {'MET' if g['met'] else 'NOT MET'}")
    print(f"wrote {json_path} and {png_path} in {res['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
