#!/usr/bin/env python
"""SafeExplorer ablation: falls until the return threshold for PPO, masked PG, masked + analytic value and the
full SafeExplorer (``policies.safety.safeexplorer``; variants ``policies.safety.config.SAFEEXPLORER_VARIANTS``).

Bodies (``--body``):

* ``balance`` (default, cheap): ``policies.safety.balance.BalanceCartEnv``, a MuJoCo cart balancing a pole
  while it learns to run at 1 m/s (reward 0.5 alive + 0.5 speed term per step, 250-step episodes); a fall
  is a pole tilt beyond 0.8 rad; R_level = {|theta| <= 0.35 level, |theta_dot| <= 2.5 level}; recovery:
  the LQR that stops the cart and stands the pole up.
* ``go1``: the MuJoCo Go1 (``hardware.sim_go1``, in process, fast mode) through the Go1 body below:
  joint-target actions around the stand pose, reward forward speed; a fall is the simulator's (tilt /
  height / trunk contact); R_level bounds the trunk tilt and height; recovery: the Go1's deterministic
  stand-up / stabilise controller (``hardware.go1_control.RecoveryController``).

Per variant and seed: one PPO run of ``--steps`` env steps. After every rollout the learner is evaluated
alone (deterministic mean action, *no* recovery, ``--eval-episodes`` episodes on a separate env; these
falls are not counted as training falls). Reported: **falls until threshold** = training falls (episodes
that ended in a fall, with the recovery on where the variant has one) up to the first evaluation whose
return reaches ``--threshold``; when a run never reaches it, its total falls with ``reached: false`` (a lower
bound). Also the final evaluation return, recoveries that re-entered R / failed, wall time. Goal (issue 18):
>= 10x fewer falls than PPO at equal final return (SafeExplorer's final return >= 0.95x PPO's).

Writes ``bench/results/safeexplorer.json`` and ``safeexplorer.png`` (``--out``; ``safeexplorer_go1.*`` for the
Go1 body, ``--name`` to choose).

    .venv/bin/python -m bench.safeexplorer [--quick] [--body balance|go1] [--steps N] [--seeds N] [--out DIR]
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import pathlib
import platform
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from hardware import go1_control as gc

from policies.safety.config import SAFEEXPLORER_VARIANTS, SafeExplorerConfig
from policies.safety.safeexplorer import SafeExplorer

from bench.harness import flags, plots
from bench.harness.results import write_result


VARIANTS = tuple(SAFEEXPLORER_VARIANTS)
INIT_LOG_STD = {"balance": 0.0, "go1": -0.8}
"""The policy's initial log std per body: CleanRL's 0 on the 1-d cart; -0.8 (std 0.45) on the Go1. There, 12 joint
targets at std 1 (0.4 rad of noise every 20 ms) throw the trunk out of R in 1-3 steps (the learner acted on 2% of
the steps); at std 0.3 PPO never fell in 40K steps (nothing to protect against); at 0.45 a random policy falls in
3 of 8 episodes and stays about 6 steps in R_0.4."""
GOAL_FALLS_RATIO, GOAL_RETURN_RATIO = 10.0, 0.95


# ---- The Go1 body of ``bench/safeexplorer.py``: a gymnasium env over the MuJoCo Go1 (``hardware.sim_go1``, in
# process, fast mode) with a safe region and the Go1's deterministic recovery, as a SafeExplorer RecoverySpec.
#
# Lives in ``bench/`` because ``policies/`` never imports ``hardware/`` (DESIGN.md): the agent only sees the
# gymnasium env and the ``in_region`` / ``recovery`` callables built here. (Over the bridge the same body is
# ``robot_io.legged_env.LeggedEnv`` in ``joints`` mode; in process it skips the sockets for the budget.)
#
# * Action ``a`` [12] in [-A_MAX, A_MAX]: joint targets ``STAND_Q + JOINT_SCALE a`` with fixed PD gains (kp 60,
#   kd 2, the recovery controller's); one env step = one 50 Hz control period (10 physics steps at 500 Hz).
#   The bound is wide enough for the recovery's targets (the sit posture); the learner starts near 0.
# * Observation [36]: q(12), dq(12), trunk quat wxyz(4), gyro(3), base height(1), tilt(1), base linear
#   velocity in the trunk frame(3; privileged, simulation only).
# * Reward: ``clip(v_x, -1, 1) + 0.5`` per step (forward speed + alive) ``- 0.005 |a|^2``. A fall (the
#   simulator's: tilt > 1 rad, trunk below 6 cm or trunk / head on the floor) terminates the episode.
# * R_level = {tilt <= 0.25 level, base height >= 0.27 - 0.05 level, |roll / pitch rate| <= 3 rad/s} (level 1:
#   0.25 rad, 22 cm). R is sized to what the recovery can return from (``recovery_rate``: exits driven by random
#   joint targets of std 1.0 action units, seed 100, 60 trials): it re-enters (and settles) 56 / 60 at level 0.4
#   (the curriculum's start) and 56 / 60 at level 1. The rate bound hands over before the trunk has picked up
#   speed: without it the same trials gave 47 / 60 at level 1, and the first R (tilt 0.6 rad, 15 cm) 5 / 30,
#   the trunk still falling (gyro up to 12 rad/s) when it left R. The rate bound does not shrink with the level:
#   scaled (2 rad/s x level), a learner exploring with std 0.3 left R_0.4 after 1.4 steps on average and acted
#   on 2% of the steps of a 40K-step run; fixed at 3 rad/s it stays about 23 steps at either level.
# * Recovery: ``hardware.go1_control.RecoveryController`` (tuck, rise, stabilise), restarted from the measured
#   joints at the start of every segment; its targets are expressed as actions (its tuck gains of kp 30 are
#   replaced by the env's 60 -- the one difference to the simulator's own ``stand`` mode). It keeps control
#   until the state is back in R *and* the controller has settled (``RecoverySpec.settled``: level and still
#   for 0.3 s): handed back at the first re-entry, the learner took over mid-rise, often with the trunk still
#   tipping, and the robot left R again.

JOINT_SCALE, A_MAX, KP, KD = 0.4, 3.0, 60.0, 2.0
TILT_R, HEIGHT_STAND, HEIGHT_SPAN, GYRO_R = 0.25, 0.27, 0.05, 3.0
OBS_DIM = 36


class Go1SafeEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = 500, seed: int = 0) -> None:
        from hardware.sim_go1 import SimGo1  # MuJoCo: imported only for this body

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


def go1_recovery_spec(env: Go1SafeEnv):
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


def make_body(name: str, max_steps: int | None):
    """-> (make_env(), spec(env), default threshold, default episode length)."""
    if name == "balance":
        from policies.safety.balance import BalanceCartEnv, recovery_spec
        T = max_steps or 250
        return (lambda: BalanceCartEnv(max_steps=T)), recovery_spec, 0.72 * T, T
    if name == "go1":
        T = max_steps or 500
        return (lambda: Go1SafeEnv(max_steps=T)), go1_recovery_spec, 0.8 * T, T  # standing still earns 0.5 T
    raise ValueError(f"unknown body {name!r} (known: balance, go1)")


@torch.no_grad()
def evaluate(agent: SafeExplorer, env, episodes: int, seed: int) -> tuple[float, int]:
    """Mean return of the learner alone (deterministic, no recovery) and its falls."""
    rets, falls = [], 0
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        ret, done = 0.0, False
        while not done:
            a = np.clip(agent.act(obs, deterministic=True, with_recovery=False), env.action_space.low,
                        env.action_space.high)
            obs, r, term, trunc, _ = env.step(a)
            ret += r
            done = term or trunc
        falls += int(term)
        rets.append(ret)
    return float(np.mean(rets)), falls


def run(variant: str, seed: int, args, cfg_kw: dict, body) -> dict:
    make_env, make_spec, threshold, _ = body
    torch.manual_seed(seed)
    env, eval_env = make_env(), make_env()
    cfg = SafeExplorerConfig.variant(variant, **cfg_kw)
    agent = SafeExplorer(env.observation_space.shape[0], env.action_space.shape[0], cfg,
                         make_spec(env) if cfg.use_recovery else None, seed=seed, total_steps=args.steps)
    curve, reached = [], {"step": None, "falls": None}
    t0 = time.perf_counter()

    def callback(a: SafeExplorer, logs: dict) -> bool:
        ret, efalls = evaluate(a, eval_env, args.eval_episodes, 10_000 + 100 * seed)
        curve.append({"step": a.global_step, "falls": a.stats["falls"], "eval_return": ret, "eval_falls": efalls,
                      "level": a.level(), "learner_fraction": logs["charts/learner_fraction"]})
        if reached["step"] is None and ret >= args.threshold:
            reached.update(step=a.global_step, falls=a.stats["falls"])
        return False

    agent.train(env, args.steps, callback)
    wall = time.perf_counter() - t0
    final = float(np.mean([c["eval_return"] for c in curve[-3:]]))  # the last 3 evaluations
    return {"variant": variant, "seed": seed, "reached": reached["step"] is not None,
            "falls_to_threshold": reached["falls"] if reached["step"] is not None else agent.stats["falls"],
            "step_at_threshold": reached["step"], "falls_total": agent.stats["falls"],
            "episodes": agent.stats["episodes"], "takeovers": agent.stats["takeovers"],
            "recoveries_ok": agent.stats["recoveries_ok"], "recoveries_failed": agent.stats["recoveries_failed"],
            "final_eval_return": final, "wall_s": wall, "steps_per_s": args.steps / wall, "curve": curve}


def summarise(runs: list[dict]) -> dict:
    out = {}
    for v in VARIANTS:
        rs = [r for r in runs if r["variant"] == v]
        if not rs:
            continue
        out[v] = {"falls_to_threshold_mean": float(np.mean([r["falls_to_threshold"] for r in rs])),
                  "falls_to_threshold": [r["falls_to_threshold"] for r in rs],
                  "reached": [r["reached"] for r in rs],
                  "falls_total_mean": float(np.mean([r["falls_total"] for r in rs])),
                  "final_eval_return_mean": float(np.mean([r["final_eval_return"] for r in rs])),
                  "recoveries_ok_mean": float(np.mean([r["recoveries_ok"] for r in rs])),
                  "recoveries_failed_mean": float(np.mean([r["recoveries_failed"] for r in rs])),
                  "wall_s_mean": float(np.mean([r["wall_s"] for r in rs]))}
    return out


def plot(res: dict, path: pathlib.Path) -> None:
    plt = plots.pyplot()

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = dict(zip(VARIANTS, ("tab:red", "tab:orange", "tab:blue", "tab:green")))
    for r in res["runs"]:
        steps = [c["step"] for c in r["curve"]]
        lab = r["variant"] if r["seed"] == 0 else None
        ax1.plot(steps, [c["falls"] for c in r["curve"]], color=colors[r["variant"]], label=lab, alpha=0.8)
        ax2.plot(steps, [c["eval_return"] for c in r["curve"]], color=colors[r["variant"]], label=lab, alpha=0.8)
    ax1.set(xlabel="env steps", ylabel="training falls (cumulative)", yscale="symlog", title="falls")
    ax2.axhline(res["config"]["threshold"], color="k", ls="--", lw=1, label="threshold")
    ax2.set(xlabel="env steps", ylabel="learner return (no recovery)", title="evaluation return")
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"SafeExplorer ablation on {res['config']['body']} ({res['mode']})")
    fig.tight_layout()
    plots.save(fig, path, dpi=110)


def main(argv=None) -> int:
    ap = flags.parser("safeexplorer", __doc__, out=False)
    flags.add_quick(ap, "2 rollouts of 256 steps, 1 seed (a smoke run, not a measurement)")
    ap.add_argument("--body", choices=("balance", "go1"), default="balance")
    flags.add_out(ap)
    ap.add_argument("--name", default=None, help="results file stem (default safeexplorer for balance, "
                                                 "safeexplorer_go1 for go1)")
    ap.add_argument("--steps", type=int, default=60_000, help="env steps per variant and seed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    ap.add_argument("--max-steps", type=int, default=None, help="episode length (balance 250, go1 500)")
    ap.add_argument("--threshold", type=float, default=None, help="learner return to reach (balance 0.72 x episode length = 180, go1 0.8 x = 400)")
    ap.add_argument("--num-steps", type=int, default=2048, help="env steps per PPO rollout")
    ap.add_argument("--num-minibatches", type=int, default=8)
    ap.add_argument("--update-epochs", type=int, default=10)
    ap.add_argument("--init-log-std", type=float, default=None,
                    help="the policy's initial log std, every variant (balance 0.0, go1 -0.8 = log 0.45)")
    ap.add_argument("--curriculum-frac", type=float, default=0.4, help="R grows over this fraction of --steps")
    ap.add_argument("--eval-episodes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        SafeExplorerConfig.variant(v)  # a typo fails here, with a did-you-mean
    if args.quick:
        args.steps, args.seeds, args.num_steps, args.num_minibatches, args.update_epochs = 512, 1, 256, 4, 2
        args.eval_episodes, args.max_steps = 1, args.max_steps or 100
    torch.set_num_threads(args.threads)
    body = make_body(args.body, args.max_steps)
    if args.threshold is None:
        args.threshold = body[2]
    if args.init_log_std is None:
        args.init_log_std = INIT_LOG_STD[args.body]
    cfg_kw = dict(init_log_std=args.init_log_std, num_steps=args.num_steps, num_minibatches=args.num_minibatches,
                  update_epochs=args.update_epochs,
                  curriculum_steps=max(1, int(args.curriculum_frac * args.steps)))
    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    runs = []
    for seed in range(args.seeds):
        for v in variants:
            r = run(v, seed, args, cfg_kw, body)
            runs.append(r)
            print(f"seed {seed} {v:<13} falls to threshold {r['falls_to_threshold']:5d} "
                  f"({'reached at ' + str(r['step_at_threshold']) if r['reached'] else 'not reached'}), "
                  f"falls {r['falls_total']:5d}, final return {r['final_eval_return']:7.1f}, "
                  f"recoveries ok / failed {r['recoveries_ok']} / {r['recoveries_failed']}, "
                  f"{r['steps_per_s']:.0f} steps/s", flush=True)
    summary = summarise(runs)
    goals = {}
    if "ppo" in summary and "safeexplorer" in summary:
        p, s = summary["ppo"], summary["safeexplorer"]
        falls_ratio = p["falls_to_threshold_mean"] / max(s["falls_to_threshold_mean"], 1.0)
        ret_ratio = s["final_eval_return_mean"] / max(p["final_eval_return_mean"], 1e-9)
        goals = {"falls_vs_ppo": {"goal": f">= {GOAL_FALLS_RATIO}x fewer falls to the threshold than PPO "
                                          "(SafeExplorer's falls floored at 1; it must reach the threshold)",
                                  "measured": falls_ratio, "reached_every_seed": all(s["reached"]),
                                  "met": bool(falls_ratio >= GOAL_FALLS_RATIO and all(s["reached"]))},
                 "final_return_vs_ppo": {"goal": f">= {GOAL_RETURN_RATIO}x PPO's final learner return",
                                         "measured": ret_ratio, "met": bool(ret_ratio >= GOAL_RETURN_RATIO)}}
    res = {"bench": "safeexplorer", "mode": "quick" if args.quick else "full", "quick": args.quick,
           "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                       "python": platform.python_version(), "loadavg_1m_start": load0,
                       "loadavg_1m_end": os.getloadavg()[0]},
           "config": {"body": args.body, "steps": args.steps, "seeds": list(range(args.seeds)), "variants": variants,
                      "threshold": args.threshold, "max_steps": args.max_steps or body[3],
                      "eval_episodes": args.eval_episodes, "threads": args.threads,
                      "ppo": {k: (list(v) if isinstance(v, tuple) else v) for k, v in
                              dataclasses.asdict(SafeExplorerConfig.variant("safeexplorer", **cfg_kw)).items()
                              if k not in SAFEEXPLORER_VARIANTS["ppo"]}},
           "summary": summary, "goals": goals, "runs": runs, "wall_s": time.perf_counter() - t_start}
    stem = args.name or ("safeexplorer" if args.body == "balance" else f"safeexplorer_{args.body}")
    write_result(args.out / f"{stem}.json", res, "safeexplorer", argv, args.quick)  # atomic, as every result
    plot(res, args.out / f"{stem}.png")
    print(f"\n{'variant':<13} {'falls to thr':>12} {'falls':>7} {'final return':>13}")
    for v, s in summary.items():
        print(f"{v:<13} {s['falls_to_threshold_mean']:12.1f} {s['falls_total_mean']:7.1f} {s['final_eval_return_mean']:13.1f}")
    for name, g in goals.items():
        print(f"goal {name}: {g['measured']:.3g} -> {'MET' if g['met'] else 'NOT MET'}")
    print(f"wrote {args.out / (stem + '.json')} and {args.out / (stem + '.png')} in {res['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
