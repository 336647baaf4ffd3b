#!/usr/bin/env python
"""SafeExplorer ablation: falls until the return threshold for PPO, masked PG, masked + analytic value and the
full SafeExplorer (``policies.safety.safeexplorer``; variants ``policies.safety.config.SAFEEXPLORER_VARIANTS``).

Bodies (``--body``):

* ``balance`` (default, cheap): ``policies.safety.balance.BalanceCartEnv``, a MuJoCo cart balancing a pole
  while it learns to run at 1 m/s (reward 0.5 alive + 0.5 speed term per step, 250-step episodes); a fall
  is a pole tilt beyond 0.8 rad; R_level = {|theta| <= 0.35 level, |theta_dot| <= 2.5 level}; recovery:
  the LQR that stops the cart and stands the pole up.
* ``go1``: the MuJoCo Go1 (``hardware.sim_go1``, in process, fast mode) through ``bench/go1_safe.py``:
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

    .venv/bin/python bench/safeexplorer.py [--quick] [--body balance|go1] [--steps N] [--seeds N] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from policies.safety.config import SAFEEXPLORER_VARIANTS, SafeExplorerConfig  # noqa: E402
from policies.safety.safeexplorer import SafeExplorer  # noqa: E402
from vla.data.atomic import atomic_write_bytes  # noqa: E402

VARIANTS = tuple(SAFEEXPLORER_VARIANTS)
INIT_LOG_STD = {"balance": 0.0, "go1": -0.8}
"""The policy's initial log std per body: CleanRL's 0 on the 1-d cart; -0.8 (std 0.45) on the Go1. There, 12 joint
targets at std 1 (0.4 rad of noise every 20 ms) throw the trunk out of R in 1-3 steps (the learner acted on 2% of
the steps); at std 0.3 PPO never fell in 40K steps (nothing to protect against); at 0.45 a random policy falls in
3 of 8 episodes and stays about 6 steps in R_0.4."""
GOAL_FALLS_RATIO, GOAL_RETURN_RATIO = 10.0, 0.95


def make_body(name: str, max_steps: int | None):
    """-> (make_env(), spec(env), default threshold, default episode length)."""
    if name == "balance":
        from policies.safety.balance import BalanceCartEnv, recovery_spec
        T = max_steps or 250
        return (lambda: BalanceCartEnv(max_steps=T)), recovery_spec, 0.72 * T, T
    if name == "go1":
        sys.path.insert(0, str(ROOT / "bench"))
        from go1_safe import Go1SafeEnv, recovery_spec
        T = max_steps or 500
        return (lambda: Go1SafeEnv(max_steps=T)), recovery_spec, 0.8 * T, T  # standing still earns 0.5 T
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 rollouts of 256 steps, 1 seed (a smoke run, not a measurement)")
    ap.add_argument("--body", choices=("balance", "go1"), default="balance")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
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
    args.out.mkdir(parents=True, exist_ok=True)
    # a killed run never leaves a half-written results file
    atomic_write_bytes(args.out / f"{stem}.json", json.dumps(res, indent=2).encode())
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
