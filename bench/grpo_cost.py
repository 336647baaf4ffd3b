#!/usr/bin/env python
"""The cost of one GRPO update on a CPU (issue 64): where an update's seconds go, before and after the trunk cache.

A GRPO update of ``--groups-per-update`` x ``--group-size`` rollouts spends its time in two places: the rollouts (the
VLA's stochastic sampler once per macro-step, the simulated robot behind its bridge) and the update itself (PPO-clip
over every macro-step, ``epochs`` times, plus the reference's log-probabilities once). Before issue 64 the update ran
the compact VLA's frozen vision trunk again for every macro-step in every epoch and for the reference; with
``--cache-features`` (now the default) the trunk maps the rollout computed are kept and the update never runs the
trunk. Both arms are ``vla rl --method grpo`` sessions from the same checkpoint, seed, scenes and settings, run one
after the other (never side by side: they are timed). Per update the agent logs ``time/rollouts_s`` (from the first
rollout of its groups to the update), ``time/sampling_s`` (of which the VLA's stochastic sampler: what batching a
group's rollouts or fewer denoising steps could save) and ``time/update_s``; the final evaluation's wall clock gives
the seconds per evaluation episode.

Reported per arm (``summary[task][arm]``): median seconds per update, split into rollouts (sampler, robot) and update,
macro-steps per update, the update's milliseconds per macro-step, and seconds per evaluation episode;
``summary[task]["speedup"]``:
the ratio of the medians (update, and the whole update). ``projection`` turns the cached arm's figures into the wall
clock of issue 64's ``bench/lfh.py`` plan (a PROJECTION, not a measurement: 2 tasks x 9 sessions of ``--plan-updates``
updates, an evaluation on ``--plan-eval-episodes`` scenes every 10 updates, ``--jobs`` sessions side by side on as
many cores).

    .venv/bin/python -m bench.grpo_cost --checkpoint vla/checkpoints/base --task place_cube_in_bowl --updates 3
    .venv/bin/python -m bench.grpo_cost --quick --checkpoint vla/checkpoints/base   # smoke run (about 2 min)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np

from bench.harness import flags, plots
from bench.harness.jobs import max_steps, session_logs, start_session
from bench.harness.results import portable, write_result
from bench.harness.sites import bench_sites

ARMS = {"recompute": "--no-cache-features", "cached": "--cache-features"}
COLORS = {"sampling_s": "#55a868", "robot_s": "#4c72b0", "update_s": "#c44e52"}
PARTS = {"sampling_s": "rollouts: the VLA's stochastic sampler", "robot_s": "rollouts: the simulated robot (bridge, "
         "physics, rendering) and the session", "update_s": "update: PPO-clip epochs + the reference"}


def session_cmd(args, arm: str, site: str, out: str) -> list[str]:
    per_update = args.group_size * args.groups_per_update
    return [sys.executable, "-m", "vla.cli", "rl", "--method", "grpo", "--checkpoint", args.checkpoint,
            "--task", args.task, "--out", out, "--robot", site, "--seed", str(args.seed),
            "--exec-steps", str(args.exec_steps), "--eval-episodes", str(args.eval_episodes), "--eval-every", "0",
            "--threads", "1", "--serve", "always", "--videos", "0", "--warmup-steps", "0",
            "--total-ticks", str(args.updates * per_update * max_steps(args.task)),
            "--total-episodes", str(args.updates * per_update), "--checkpoint-every", str(per_update),
            "--group-size", str(args.group_size), "--groups-per-update", str(args.groups_per_update),
            "--train", args.train, ARMS[arm]]


def measure(out: str) -> dict:
    """One finished session's cost per update (from ``episodes.jsonl``'s update lines) and per evaluation episode
    (the final evaluation: the session's wall clock after its last training episode)."""
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    _, eps, ups = session_logs(out)
    roll = [u["time/rollouts_s"] for u in ups if "time/rollouts_s" in u]
    sampling = [u["time/sampling_s"] for u in ups if "time/sampling_s" in u]
    upd = [u["time/update_s"] for u in ups]
    steps = [u["diag/macro_steps"] for u in ups if "diag/macro_steps" in u]
    eval_s = s["wall_s_this_process"] - eps[-1]["wall_s"]
    return {"updates": len(ups), "rollouts_s": roll, "sampling_s": sampling, "update_s": upd, "macro_steps": steps,
            "train_ticks": int(sum(e["ticks"] for e in eps)), "final_eval_s": eval_s,
            "eval_episodes": s["eval_episodes"], "wall_s_session": s["wall_s_this_process"]}


def cell(m: dict) -> dict:
    roll, upd = np.median(m["rollouts_s"]), np.median(m["update_s"])
    return {"per_update_s": float(roll + upd), "rollouts_s": float(roll), "update_s": float(upd),
            "sampling_s": float(np.median(m["sampling_s"])),
            "robot_s": float(np.median(np.subtract(m["rollouts_s"], m["sampling_s"]))),
            "macro_steps_per_update": float(np.mean(m["macro_steps"])) if m["macro_steps"] else None,
            "update_ms_per_macro_step": (float(1e3 * np.sum(m["update_s"]) / np.sum(m["macro_steps"]))
                                         if np.sum(m["macro_steps"]) > 0 else None),
            "s_per_eval_episode": m["final_eval_s"] / m["eval_episodes"], "updates": m["updates"]}


def projection(c: dict, updates: int, eval_episodes: int, jobs: int) -> dict:
    sessions = 2 * 9  # issue 64: 2 tasks x (3 GRPO + 3 LfH + 3 ablations)
    evals = updates // 10 + 1  # every 10 updates and the base (the final one is the last of them)
    per_session = updates * c["per_update_s"] + evals * eval_episodes * c["s_per_eval_episode"]
    return {"what": "PROJECTION from this run's cached arm (not a measurement)", "sessions": sessions,
            "updates": updates, "eval_episodes": eval_episodes, "evaluations_per_session": evals,
            "per_session_s": per_session, "jobs": jobs, "wall_s": sessions * per_session / jobs}


def plot(summary: dict, path, title: str) -> None:
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    arms = [a for a in ARMS if a in summary]
    x = np.arange(len(arms))
    bottom = np.zeros(len(arms))
    for part, label in PARTS.items():
        v = np.array([summary[a][part] for a in arms])
        ax.bar(x, v, bottom=bottom, color=COLORS[part], label=label)
        bottom += v
    for i, a in enumerate(arms):
        ax.text(i, bottom[i], f"{summary[a]['per_update_s']:.0f} s", ha="center", va="bottom")
    ax.set_xticks(x, [f"{a}\n({ARMS[a]})" for a in arms])
    ax.set_ylabel("seconds per update (median)")
    ax.set_ylim(0, 1.15 * max(bottom.max(), max(summary[a]["per_update_s"] for a in arms)))
    ax.set_title(title, fontsize=9, wrap=True)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False)
    plots.save(fig, path, dpi=110, tight=True)


def main(argv=None) -> int:
    ap = flags.parser("grpo_cost", __doc__, out=False)
    ap.add_argument("--checkpoint", required=True, help="the VLA GRPO starts from (its files are never changed)")
    ap.add_argument("--task", default="place_cube_in_bowl")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--updates", type=int, default=3, help="policy updates per session")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--groups-per-update", type=int, default=2)
    ap.add_argument("--train", default="policy", choices=("head", "policy", "lora"),
                    help="lora trains the trunk: nothing to cache there (both arms then cost the same)")
    ap.add_argument("--exec-steps", type=int, default=4)
    ap.add_argument("--eval-episodes", type=int, default=10, help="the base and final evaluation's episodes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plan-updates", type=int, default=40, help="the projection's updates per session")
    ap.add_argument("--plan-eval-episodes", type=int, default=50, help="the projection's evaluation scenes")
    flags.add_jobs(ap, 2, "the projection's sessions side by side (this bench runs its arms one at a time)")
    flags.add_port0(ap)
    flags.add_quick(ap, "1 update of 2 x 2 rollouts on pick_blue_cube, 2 evaluation episodes")
    ap.add_argument("--name", default="grpo_cost", help="result files bench/results/<name>.json / .png")
    flags.add_out(ap)
    ap.add_argument("--work", default=None, help="where the session run directories go (default a temp dir)")
    args = ap.parse_args(argv)
    if args.quick:
        args.task, args.updates, args.group_size, args.groups_per_update, args.eval_episodes = \
            "pick_blue_cube", 1, 2, 1, 2
    work = args.work or tempfile.mkdtemp(prefix="bench-grpo-cost-")
    os.makedirs(work, exist_ok=True)
    t0 = time.perf_counter()
    runs, summary = {}, {}
    with bench_sites(1, work, args.port0) as (site,):
        for arm in args.arms:
            out = os.path.join(work, f"{args.task}-{arm}")
            job = {"out": out}
            proc = start_session(session_cmd(args, arm, site, out), job)
            rc = proc.wait()
            if rc != 0:
                print(f"{arm}: the session failed (rc {rc}); its log: {out}.log", file=sys.stderr)
                return 1
            runs[arm] = {**measure(out), "wall_s": time.perf_counter() - job["t0"]}
            summary[arm] = cell(runs[arm])
            c = summary[arm]
            each = ("no group had a signal" if not c["update_ms_per_macro_step"] else
                    f"{c['macro_steps_per_update']:.0f} macro-steps, {c['update_ms_per_macro_step']:.1f} ms each")
            print(f"{arm:<10} {c['per_update_s']:6.1f} s per update: rollouts {c['rollouts_s']:.1f} s (sampler "
                  f"{c['sampling_s']:.1f} s, robot {c['robot_s']:.1f} s), update "
                  f"{c['update_s']:.1f} s ({each}); {c['s_per_eval_episode']:.1f} s per evaluation episode",
                  flush=True)
    cell_t = {**summary}
    if "recompute" in summary and "cached" in summary:
        r, c = summary["recompute"], summary["cached"]
        cell_t["speedup"] = {"update": r["update_s"] / c["update_s"],
                             "per_update": r["per_update_s"] / c["per_update_s"]}
        sp = cell_t["speedup"]
        print(f"speed-up: update x{sp['update']:.1f}, whole update x{sp['per_update']:.2f}")
    res = {"settings": {k: getattr(args, k) for k in ("task", "arms", "updates", "group_size", "groups_per_update",
                                                       "train", "exec_steps", "eval_episodes", "seed")}
           | {"checkpoint": portable(args.checkpoint)},
           "summary": {args.task: cell_t}, "runs": runs, "wall_s_total": time.perf_counter() - t0}
    if "cached" in summary:
        res["projection"] = projection(summary["cached"], args.plan_updates, args.plan_eval_episodes, args.jobs)
        p = res["projection"]
        print(f"projection (not a measurement): issue 64's lfh plan, {p['sessions']} sessions x {p['updates']} "
              f"updates, {p['per_session_s'] / 60:.0f} min a session, {p['wall_s'] / 3600:.1f} h at {p['jobs']} side "
              "by side")
    path = write_result(args.out / f"{args.name}.json", res, "grpo_cost", argv, args.quick)
    plot(summary, args.out / f"{args.name}.png",
         f"GRPO on {args.task} from {os.path.basename(os.path.normpath(args.checkpoint))}: "
         f"{args.groups_per_update} x {args.group_size} rollouts per update, exec {args.exec_steps}, train "
         f"{args.train}\n{os.cpu_count()} cores, 1 torch thread, the arms one after the other")
    print(f"wrote {path} and {args.name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
