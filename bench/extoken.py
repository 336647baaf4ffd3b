#!/usr/bin/env python
"""ExToken benchmark (issue 33): do behaviour tokens let the same RL method reach, at a quarter of the interaction
budget, what the token-free VLA reaches at the full budget, on a task whose best behaviour depends on the scene?

Every arm is a `vla rl` session on the same evaluation scenes, chunk execution and RL method (GRPO: groups of G
rollouts from one scene, binary task reward), one sim bridge each (``bench/dsrl.py``'s job runner):

* ``grpo``          ``--method grpo`` on the token-free VLA (``--baseline-checkpoint``), the FULL budget;
* ``no-tokens``     the same at a quarter of the budget (the "no token conditioning" ablation: ExToken's budget
                    without its tokens);
* ``extoken``       ``--method extoken`` on the token-conditioned VLA (``--checkpoint``), a quarter of the budget:
                    every group tries every token (stratified), GRPO improves pi(a | s, c), the selector p(c | s)
                    learns from the groups' returns and picks the token at evaluation;
* ``no-selector``   the same, but a uniformly random token at evaluation (``--deploy random``);
* ``bandit``        (optional) the selector alone, the VLA frozen (``--no-learn-policy``): a contextual bandit
                    over tokens;
* ``extoken-full``  (optional) ``extoken`` at GRPO's full budget: ExToken's own curve of success against rollouts.

``--tokens FILE`` (the token file with its purity against ``expert_mode``) adds a PRIVILEGED diagnostic on the crowded
task: how often the token each ExToken arm deployed at its final evaluation is the scene's free turn (read off the
layout), and the success when it is and when it is not.

The budget is ``--updates`` policy updates of ``--group-size`` x ``--groups-per-update`` rollouts for ``grpo``; the
quarter-budget arms get ``--updates // 4`` (at least 1). Reported per arm: base and final success with 95% Wilson
intervals (pooled over seeds), the curve of success against rollouts, token usage and return per token (ExToken
arms), and trajectory diversity per update (end-effector voxels visited per group, mean pairwise distance of the
groups' first chunks). The headline: ExToken's pooled final success at 1/4 of the rollouts >= GRPO's at the full
budget, with higher diversity.

The default task, ``pick_red_cube_crowded``, puts the blue cube 1 cm from the red one along one of the red cube's
face axes: only one of the two grasp yaws (turning the fingers clockwise or counter-clockwise) fits, and which one
depends on the scene. The demonstrations (``vla record --task pick_red_cube_yaw45 --expert-mode random``) show both
modes in uncrowded scenes, so the base VLA picks either. ``bench/results/README.md`` ("ExToken") has the commands
that make both checkpoints.

Writes ``bench/results/<name>.json`` and ``<name>.png``.

    .venv/bin/python -m bench.extoken --checkpoint runs/extoken/tok --baseline-checkpoint runs/extoken/notok
    .venv/bin/python -m bench.extoken --quick --checkpoint T --baseline-checkpoint B       # smoke run
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

import numpy as np

from bench.harness import flags, plots
from bench.harness import jobs as sessions
from bench.harness.results import portable, write_result
from bench.harness.stats import wilson


ARMS = ("grpo", "no-tokens", "extoken", "no-selector", "bandit", "extoken-full")
DEFAULT_ARMS = ("grpo", "no-tokens", "extoken", "no-selector")
QUARTER = ("no-tokens", "extoken", "no-selector", "bandit")
TOKEN_ARMS = ("extoken", "no-selector", "bandit", "extoken-full")
COLORS = {"grpo": "#4c72b0", "no-tokens": "#8c8c8c", "extoken": "#c44e52", "no-selector": "#dd8452",
          "bandit": "#8172b3", "extoken-full": "#937860"}


CROWDED = "pick_red_cube_crowded"
"""The crowded pick whose scenes have a free grasp turn (the neighbour blocks the other one)."""


def token_modes(tokens_file: str) -> dict[int, str]:
    """Token -> the expert mode most of its episodes were recorded in (the tokens file's purity table)."""
    with open(tokens_file) as f:
        meta = json.load(f)
    pur = meta.get("purity")
    if not pur or pur.get("field") != "expert_mode":
        raise ValueError(f"{tokens_file}: no purity table against expert_mode (make it with `vla tokens "
                         f"--purity-field expert_mode`)")
    return {int(k): max(v, key=v.get) for k, v in pur["table"].items()}


def free_turns(task_name: str, seeds: list[int]) -> dict[int, str]:
    """Scene seed -> the grasp turn that does not land a finger on the neighbour (PRIVILEGED: read off the layout):
    the turning mode whose finger axis lies along the blue neighbour's side is blocked."""
    import math

    from hardware.sim_tasks import HOME_FINGER_ANGLE, get_task
    from hardware.teleop.scripted import turned_angle

    task = get_task(task_name)
    out = {}
    for s in seeds:
        layout = task.layout(np.random.default_rng(s))
        (x, y, yaw), (nx, ny, _) = layout["red_cube"], layout["blue_cube"]
        toward = math.atan2(ny - y, nx - x)
        off = {m: abs(math.remainder(turned_angle(yaw, HOME_FINGER_ANGLE, m) - toward, math.pi)) for m in ("ccw", "cw")}
        out[s] = "cw" if min(off, key=off.get) == "ccw" else "ccw"
    return out


def arm_updates(arm: str, updates: int) -> int:
    return max(1, updates // 4) if arm in QUARTER else updates


def launch(job: dict, site: str, args):
    arm = job["arm"]
    ckpt = args.checkpoint if arm in TOKEN_ARMS else args.baseline_checkpoint
    cmd = sessions.grpo_session(job, site, args, ckpt, arm_updates(arm, args.updates))
    if arm in ("grpo", "no-tokens"):
        cmd += ["--method", "grpo"]
    else:
        cmd += ["--method", "extoken", "--token-unit", args.token_unit, "--explore", "stratified",
                "--deploy", "random" if arm == "no-selector" else "selector"]
        if arm == "bandit":
            cmd += ["--no-learn-policy"]
    return sessions.start_session(cmd, job)


def _series(ups: list[dict], key: str) -> list:
    return [e.get(key) for e in ups]


def collect(job: dict) -> dict:
    r = sessions.collect({**job, "method": job["arm"]})
    r.update(arm=job["arm"])
    out = job["out"]
    if "final" not in r:
        return r
    s, counts = sessions.eval_counts(out)
    r.update(counts)
    per_update = job["group_size"] * job["groups_per_update"]
    evals, eps, ups = sessions.session_logs(out)
    r["curve_rollouts"] = [(0, s["base_success_rate"])] + [(e["episode"] + 1, e["success_rate"]) for e in evals]
    if not evals or (evals[-1]["episode"] + 1) != s["episodes"]:
        r["curve_rollouts"].append((s["episodes"], s["final_success_rate"]))
    r["updates"] = len(ups)
    r["rollouts_per_update"] = per_update
    r["train_success_per_update"] = _series(ups, "charts/group_success")
    r["usable_per_update"] = _series(ups, "charts/usable_groups")
    r["kl_to_base_per_update"] = _series(ups, "losses/kl")
    r["ee_coverage_per_update"] = _series(ups, "diversity/ee_coverage")
    r["chunk_distance_per_update"] = _series(ups, "diversity/chunk_distance")
    r["selector_entropy_per_update"] = _series(ups, "selector/entropy")
    r["selector_best_token_accuracy_per_update"] = _series(ups, "selector/best_token_accuracy")
    tokens = [e.get("token") for e in eps if e.get("token") is not None and not e.get("eval")]
    r["token_counts"] = {str(t): tokens.count(t) for t in sorted(set(map(str, tokens)))} if tokens else {}
    r["episodes"] = s["episodes"]
    r["agent"] = s.get("agent", {})
    fe = os.path.join(out, "final_eval.json")  # the final evaluation's episodes (sessions since final_eval.json)
    if os.path.isfile(fe):
        with open(fe) as f:
            r["final_episodes"] = [{"seed": e["seed"], "success": e["success"], "token": e.get("token")}
                                   for e in json.load(f)["per_episode"]]
    return r


def deployed_turns(r: dict, modes: dict[int, str], free: dict[int, str]) -> dict | None:
    """PRIVILEGED diagnostic (the scene's layout): how often the token the session deployed at its final evaluation
    is the scene's free turn, and the success rate when it is and when it is not."""
    eps = [e for e in r.get("final_episodes", []) if e.get("token") in modes and e["seed"] in free]
    if not eps:
        return None
    hit = [e for e in eps if modes[e["token"]] == free[e["seed"]]]
    miss = [e for e in eps if modes[e["token"]] != free[e["seed"]]]
    return {"episodes": len(eps), "free_turn_token": len(hit), "success_free_turn_token": sum(e["success"] for e in hit),
            "success_blocked_turn_token": sum(e["success"] for e in miss),
            "tokens": {str(c): sum(e["token"] == c for e in eps) for c in sorted(modes)}}


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def summarize(done: list[dict], args) -> dict:
    out: dict = {}
    for task in args.tasks:
        cell = {}
        for arm in args.arms:
            rs = [r for r in done if r["task"] == task and r["arm"] == arm and "final" in r]
            if not rs:
                continue
            k = sum(r["final_successes"] for r in rs)
            n = sum(r["eval_episodes"] for r in rs)
            kb = sum(r["base_successes"] for r in rs)
            nb = sum(r["base_episodes"] for r in rs)
            cell[arm] = {"seeds": len(rs), "updates": arm_updates(arm, args.updates),
                         "rollouts": arm_updates(arm, args.updates) * args.group_size * args.groups_per_update,
                         "final": [r["final"] for r in rs], "rate": k / n, "ci95": wilson(k, n),
                         "base_rate": kb / nb, "base_ci95": wilson(kb, nb), "lift_points": k / n - kb / nb,
                         "ee_coverage": _mean(x for r in rs for x in r["ee_coverage_per_update"]),
                         "chunk_distance": _mean(x for r in rs for x in r["chunk_distance_per_update"]),
                         "train_success": _mean(x for r in rs for x in r["train_success_per_update"])}
            turns = [r["deployed_turns"] for r in rs if r.get("deployed_turns")]
            if turns:  # PRIVILEGED: the deployed token against the scene's free turn, pooled over seeds
                cell[arm]["deployed_turns"] = {k: sum(t[k] for t in turns) for k in
                                               ("episodes", "free_turn_token", "success_free_turn_token",
                                                "success_blocked_turn_token")}
        out[task] = cell
    return out


def goals_of(summary: dict) -> dict:
    goals = {}
    for task, cell in summary.items():
        g = {}
        if "extoken" in cell and "grpo" in cell:
            e, b = cell["extoken"], cell["grpo"]
            g["quarter_budget"] = {"goal": "ExToken at 1/4 of the rollouts >= token-free GRPO at the full budget",
                                   "extoken": e["rate"], "grpo_full": b["rate"], "seeds": [e["seeds"], b["seeds"]],
                                   "met": e["rate"] >= b["rate"] and e["seeds"] >= 3 and b["seeds"] >= 3}
            if e["ee_coverage"] is not None and b["ee_coverage"] is not None:
                g["diversity"] = {"goal": "trajectory diversity higher with tokens",
                                  "ee_coverage": [e["ee_coverage"], b["ee_coverage"]],
                                  "chunk_distance": [e["chunk_distance"], b["chunk_distance"]],
                                  "met": e["ee_coverage"] > b["ee_coverage"]}
        goals[task] = g
    return goals


def plot(done: list[dict], summary: dict, path: pathlib.Path, title: str) -> None:
    plt = plots.pyplot()

    tasks = list(summary)
    fig, axes = plt.subplots(len(tasks), 3, figsize=(17, 4.2 * len(tasks)), squeeze=False)
    for row, task in enumerate(tasks):
        ax, ax2, ax3 = axes[row]
        for arm in ARMS:
            rs = [r for r in done if r["task"] == task and r["arm"] == arm and "final" in r]
            for i, r in enumerate(rs):
                u, v = zip(*r["curve_rollouts"])
                ax.plot(u, v, "-o", color=COLORS[arm], alpha=0.9 if len(rs) == 1 else 0.5, ms=4,
                        label=arm if i == 0 else None)
                ups = np.arange(1, r["updates"] + 1) * r["rollouts_per_update"]
                cov = r["ee_coverage_per_update"]
                if any(c is not None for c in cov):
                    ax2.plot(ups, [np.nan if c is None else c for c in cov], "-", color=COLORS[arm], alpha=0.7,
                             label=arm if i == 0 else None)
                ax3.plot(ups, [np.nan if c is None else c for c in r["train_success_per_update"]], "-",
                         color=COLORS[arm], alpha=0.7, label=arm if i == 0 else None)
        base = next(iter(summary[task].values()), {}).get("base_rate")
        if base is not None:
            ax.axhline(base, color="k", ls=":", lw=1, label="base VLA")
        ax.set_title(f"{task}: evaluation success")
        ax.set_xlabel("training rollouts")
        ax.set_ylim(-0.03, 1.03)
        ax.legend(fontsize=8)
        ax2.set_title(f"{task}: end-effector voxels (2 cm) per group")
        ax2.set_xlabel("training rollouts")
        ax2.legend(fontsize=8)
        ax3.set_title(f"{task}: training rollouts' success per update")
        ax3.set_xlabel("training rollouts")
        ax3.set_ylim(-0.03, 1.03)
        ax3.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    plots.save(fig, path, dpi=110)


def main(argv=None) -> int:
    ap = flags.parser("extoken", __doc__, out=False)
    ap.add_argument("--checkpoint", required=True,
                    help="the token-conditioned VLA (`vla train --tokens`) the ExToken arms start from")
    ap.add_argument("--baseline-checkpoint", required=True,
                    help="the token-free VLA (the same demos, `vla train` without --tokens) the GRPO arms start from")
    ap.add_argument("--task", action="append", dest="tasks", default=None,
                    help="sim task (default pick_red_cube_crowded)")
    ap.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=ARMS)
    ap.add_argument("--seeds", type=int, default=3, help="sessions per arm and task")
    ap.add_argument("--updates", type=int, default=8, help="GRPO's full budget in policy updates")
    ap.add_argument("--group-size", type=int, default=8, help="G: rollouts per group")
    ap.add_argument("--groups-per-update", type=int, default=2)
    ap.add_argument("--token-unit", default="episode", choices=("episode", "chunk"))
    ap.add_argument("--sigma", type=float, default=0.1, help="the stochastic sampler's noise per denoising step")
    ap.add_argument("--lr", type=float, default=5e-6)
    ap.add_argument("--train", default="policy", choices=("head", "policy", "lora"))
    ap.add_argument("--exec-steps", type=int, default=4, help="chunk rows executed per VLA query, every arm")
    ap.add_argument("--eval-every-updates", type=int, default=2)
    ap.add_argument("--eval-episodes", type=int, default=20)
    flags.add_jobs(ap, 2, "sessions run in parallel (one sim bridge each)")
    flags.add_port0(ap)
    flags.add_quick(ap, "1 seed, 1 update of 1 x 2 rollouts, 2 evaluation episodes")
    ap.add_argument("--collect-only", action="store_true",
                    help="report the sessions of --work that finished (a bench cut short); run nothing")
    ap.add_argument("--name", default="extoken", help="result files bench/results/<name>.json / .png")
    flags.add_out(ap)
    ap.add_argument("--work", default=None, help="where the session run directories go (default a temp dir)")
    ap.add_argument("--tokens", default=None,
                    help="the token file the ExToken VLA was trained with (`vla tokens --purity-field expert_mode`): "
                         "reports, from the scene layouts (PRIVILEGED, crowded task only), how often the deployed "
                         "token was the scene's free turn")
    args = ap.parse_args(argv)
    args.tasks = args.tasks or ["pick_red_cube_crowded"]
    if args.quick:
        args.seeds, args.updates, args.group_size, args.groups_per_update = 1, 1, 2, 1
        args.eval_every_updates, args.eval_episodes = 1, 2
    work = args.work or tempfile.mkdtemp(prefix="bench-extoken-")
    os.makedirs(work, exist_ok=True)
    jobs = [{"task": t, "arm": arm, "method": arm, "seed": s, "group_size": args.group_size,
             "groups_per_update": args.groups_per_update, "out": os.path.join(work, f"{t}-{arm}-s{s}"),
             "base_key": "tokens" if arm in TOKEN_ARMS else "baseline"}
            for s in range(args.seeds) for t in args.tasks for arm in args.arms]  # seed-major
    t0 = time.perf_counter()
    if args.collect_only:
        jobs = [j for j in jobs if os.path.isfile(os.path.join(j["out"], "summary.json"))]
        print(f"collecting {len(jobs)} finished session(s) from {work}", flush=True)
    done = sessions.run_jobs(jobs, work, args, launch)
    done = [collect(next(j for j in jobs if j["out"] == r["out"]) | {"returncode": r["returncode"],
                                                                      "wall_s": r["wall_s"]}) for r in done]
    if args.tokens:
        modes = token_modes(args.tokens)
        for r in done:
            if r["task"] == CROWDED and r["arm"] in TOKEN_ARMS and r.get("final_episodes"):
                r["deployed_turns"] = deployed_turns(
                    r, modes, free_turns(CROWDED, sorted({e["seed"] for e in r["final_episodes"]})))
    summary = summarize(done, args)
    goals = goals_of(summary)
    args.collected_only = args.collect_only
    keys = ("checkpoint", "baseline_checkpoint", "tokens", "tasks", "arms", "seeds", "collected_only", "updates", "group_size",
            "groups_per_update", "token_unit", "sigma", "lr", "train", "exec_steps", "eval_every_updates",
            "eval_episodes", "jobs")
    res = {"bench": "extoken", "quick": args.quick, "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
           "settings": {k: getattr(args, k) for k in keys}, "wall_s_total": time.perf_counter() - t0,
           "summary": summary, "goals": goals,
           "runs": [{k: v for k, v in {**r, "out": portable(r["out"])}.items() if k not in ("t0",)}
                    for r in done]}
    for k in ("checkpoint", "baseline_checkpoint", "tokens"):
        res["settings"][k] = getattr(args, k) and portable(getattr(args, k))
    write_result(args.out / f"{args.name}.json", res, "extoken", argv, args.quick)
    plot(done, summary, args.out / f"{args.name}.png",
         f"ExToken vs GRPO: full budget {args.updates} updates of {args.groups_per_update} x {args.group_size} "
         f"rollouts (quarter arms {arm_updates('extoken', args.updates)}), exec {args.exec_steps}; seeds: "
         + ", ".join(f"{a} {sum(1 for r in done if r['arm'] == a and 'final' in r)}" for a in args.arms))
    for task, cell in summary.items():
        base = next((m["base_rate"] for m in cell.values()), None)
        print(f"{task}: base {base:.0%}" if base is not None else task)
        for arm, m in cell.items():
            cov = "" if m["ee_coverage"] is None else f"  voxels/group {m['ee_coverage']:.1f}"
            print(f"  {arm:<12} {m['rollouts']:>4} rollouts  {m['rate']:.0%} "
                  f"[{m['ci95'][0]:.0%}, {m['ci95'][1]:.0%}] over {m['seeds']} seed(s){cov}")
            if t := m.get("deployed_turns"):
                print(f"  {'':<12} deployed token = the scene's free turn (PRIVILEGED) {t['free_turn_token']}/"
                      f"{t['episodes']}: success {t['success_free_turn_token']} then, "
                      f"{t['success_blocked_turn_token']} otherwise")
    print(f"wrote {args.out / (args.name + '.json')} and {args.name}.png")
    return 0 if all("final" in r for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
