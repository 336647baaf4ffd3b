#!/usr/bin/env python
"""AutoSafe on the continuous cart-pole: SAC vs AutoSafe-SAC vs SAC + a hard safety filter (Simplex).

The env is ``policies.safety.cartpole.ContinuousCartPoleEnv`` (gymnasium's CartPole physics, force
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

Reported per arm (mean over seeds, and per seed): violations during training (steps outside the safe
set, episodes with one), falls (terminations), the training return per episode, the final return
(deterministic policy, under its safety layer, ``--eval-episodes`` episodes), and for AutoSafe the
inference rate on one thread: a deterministic policy forward of one observation with the LQR and the
margin inside it, in Hz. Goals (issue 18): AutoSafe 0 violations; its final return >= 0.9x SAC's;
>= 50 Hz with margin (here on this machine's one core; the issue's 50 Hz is on a Raspberry Pi).

Writes ``bench/results/autosafe.json`` and ``autosafe.png``.

    .venv/bin/python bench/autosafe.py [--quick] [--out DIR] [--steps N] [--seeds N]
"""

from __future__ import annotations

import argparse
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

from policies.common.replay import ReplayBuffer  # noqa: E402
from policies.common.sac import SAC, SACConfig  # noqa: E402
from policies.safety.autosafe import AutoSafeSAC, SimplexFilter  # noqa: E402
from policies.safety.cartpole import ContinuousCartPoleEnv, lqr, safety_spec, step_dynamics  # noqa: E402
from policies.safety.config import AutoSafeConfig  # noqa: E402

ARMS = ("sac", "autosafe", "sac+simplex")
X_GOAL, X_SCALE, FORCE = 0.5, 2.0, 10.0
GOAL_RETURN_RATIO, GOAL_HZ = 0.9, 50.0


def make_env(ctrl, max_steps: int) -> ContinuousCartPoleEnv:
    return ContinuousCartPoleEnv(force_mag=FORCE, max_steps=max_steps, x_goal=X_GOAL, x_scale=X_SCALE, safe_set=ctrl)


def make_agent(arm: str, ctrl, sac_cfg: SACConfig, seed: int):
    spec = safety_spec(ctrl)
    if arm == "autosafe":
        return AutoSafeSAC(4, 1, spec, AutoSafeConfig(sac=sac_cfg), seed=seed), None
    filt = None
    if arm == "sac+simplex":
        def predict(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:  # the env's own step, one step ahead
            return torch.from_numpy(step_dynamics(obs.double().numpy(), FORCE * action.double().numpy()[:, 0])).float()
        filt = SimplexFilter(spec, threshold=0.0, predict=predict)
    return SAC(4, 1, sac_cfg, seed=seed), filt


def act(agent, filt, obs: np.ndarray, deterministic: bool = False) -> tuple[np.ndarray, bool]:
    o = torch.from_numpy(obs)[None]
    a = agent.act(o, deterministic=deterministic)
    switched = False
    if filt is not None:
        a, sw = filt(o, a)
        switched = bool(sw[0])
    return a[0].numpy(), switched


def train(arm: str, seed: int, args, sac_cfg: SACConfig, ctrl) -> dict:
    torch.manual_seed(seed)
    agent, filt = make_agent(arm, ctrl, sac_cfg, seed)
    env = make_env(ctrl, args.max_steps)
    buf = ReplayBuffer(args.steps, {"x": ((4,), np.float32)}, 1)
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
    eval_env = make_env(ctrl, args.max_steps)
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
                                                          "count": cum_viol[every - 1::every]}}
    if arm == "autosafe":
        out["inference"] = inference_rate(agent, ctrl, args.inference_calls)
        probe = torch.from_numpy(ctrl.sample_inside(np.random.default_rng(0), 512)).float()
        blend = agent.actor.blend(probe)
        out["sharpness_final"] = {"mean": float(blend["p"].mean()), "min": float(blend["p"].min()),
                                  "max": float(blend["p"].max())}
    return out


def inference_rate(agent: AutoSafeSAC, ctrl, calls: int) -> dict:
    """Deterministic AutoSafe action for one observation (policy forward + LQR + margin), one thread."""
    rng = np.random.default_rng(1)
    states = ctrl.sample_inside(rng, calls).astype(np.float32)
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    c.set_title(f"AutoSafe inference {inf:.0f} Hz on 1 thread (policy + LQR)", fontsize=9)
    m = res["machine"]
    fig.suptitle(f"AutoSafe on the continuous cart-pole: {res['config']['steps']} steps x "
                 f"{len(res['config']['seeds'])} seed(s) per arm; {m['cpu_count']} cores, load "
                 f"{m['loadavg_1m_start']:.1f} ({res['mode']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="150 steps, 40 updates, small networks, 1 seed (a smoke run, not a measurement)")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    ap.add_argument("--steps", type=int, default=20_000, help="env steps per arm and seed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=500, help="episode length (truncation)")
    ap.add_argument("--learning-starts", type=int, default=1000)
    ap.add_argument("--eval-episodes", type=int, default=5)
    ap.add_argument("--inference-calls", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    hidden, batch = (256, 256), 256
    if args.quick:
        args.steps, args.seeds, args.max_steps, args.learning_starts = 150, 1, 100, 110
        args.eval_episodes, args.inference_calls = 2, 500
        hidden, batch = (64, 64), 64
    torch.set_num_threads(args.threads)
    sac_cfg = SACConfig(num_critics=2, critic_subset=2, utd=1, hidden=hidden, batch_size=batch)
    ctrl = lqr(force_mag=FORCE)
    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    runs = []
    for seed in range(args.seeds):
        for arm in ARMS:
            r = train(arm, seed, args, sac_cfg, ctrl)
            runs.append(r)
            print(f"seed {seed} {arm:<12} violations {r['violation_steps']:6d} steps / {r['violation_episodes']:4d} "
                  f"episodes, falls {r['falls']:4d}, final return {r['final_return_mean']:8.2f}, "
                  f"{r['steps_per_s']:.0f} steps/s", flush=True)
    summary = summarise(runs)
    hz = float(np.mean([r["inference"]["hz_median"] for r in runs if r["arm"] == "autosafe"]))
    ratio = summary["autosafe"]["final_return_mean"] / max(summary["sac"]["final_return_mean"], 1e-9)
    res = {"bench": "autosafe", "mode": "quick" if args.quick else "full", "quick": args.quick,
           "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                       "python": platform.python_version(), "loadavg_1m_start": load0,
                       "loadavg_1m_end": os.getloadavg()[0]},
           "config": {"steps": args.steps, "seeds": list(range(args.seeds)), "max_steps": args.max_steps,
                      "learning_starts": args.learning_starts, "eval_episodes": args.eval_episodes,
                      "threads": args.threads, "sac": {"hidden": list(hidden), "batch_size": batch, "num_critics": 2,
                                                       "utd": 1},
                      "autosafe": {k: v for k, v in vars(AutoSafeConfig()).items() if k != "sac"},
                      "env": {"x_goal": X_GOAL, "x_scale": X_SCALE, "force_mag": FORCE},
                      "safe_set": {"c": ctrl.c, "K": ctrl.K.tolist(), "P": ctrl.P.tolist()}},
           "summary": summary,
           "goals": {"autosafe_zero_violations": {
                         "goal": "AutoSafe: 0 steps outside the safe set during training, every seed",
                         "measured": summary["autosafe"]["violation_steps_max_over_seeds"],
                         "met": summary["autosafe"]["violation_steps_max_over_seeds"] == 0},
                     "autosafe_return_vs_sac": {
                         "goal": f">= {GOAL_RETURN_RATIO}x plain SAC's final return", "measured": ratio,
                         "met": bool(ratio >= GOAL_RETURN_RATIO)},
                     "inference_hz": {"goal": f">= {GOAL_HZ} Hz on one thread (policy forward + LQR)",
                                      "measured": hz, "met": bool(hz >= GOAL_HZ)}},
           "runs": runs, "wall_s": None}
    res["wall_s"] = time.perf_counter() - t_start
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "autosafe.json", "w") as f:
        json.dump(res, f, indent=2)
    plot(res, args.out / "autosafe.png")
    print(f"\n{'arm':<12} {'viol steps':>10} {'viol eps':>9} {'falls':>6} {'final return':>13}")
    for arm in ARMS:
        s = summary[arm]
        print(f"{arm:<12} {s['violation_steps']:10.1f} {s['violation_episodes']:9.1f} {s['falls']:6.1f} "
              f"{s['final_return_mean']:13.2f}")
    for name, g in res["goals"].items():
        print(f"goal {name}: {g['measured']:.3g} -> {'MET' if g['met'] else 'NOT MET'}")
    print(f"wrote {args.out / 'autosafe.json'} and {args.out / 'autosafe.png'} in {res['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
