#!/usr/bin/env python
"""Residual RL benchmark (issue 32): does a learned, bounded per-row correction on top of the frozen VLA's
chunk lift its success on the pick tasks, against DSRL-NA and SAC on raw actions at the same control ticks?

For every task x method x seed this runs one `vla rl` session (a subprocess with its own sim bridge on its
own ports, ``--jobs`` at a time) from the same frozen VLA checkpoint, all with the same ``--exec-steps``:

* ``residual``  ``vla rl --method residual`` (ResFiT's TD3 residual, policies/residual),
* ``dsrl-na``   ``vla rl --method dsrl --variant na`` (steers the sampler's noise),
* ``sac-raw``   ``vla rl --method dsrl --variant action`` (plain SAC on the raw chunk, the VLA gives features).

Reported per task and method: the base VLA's success in chunk execution (the session's base evaluation on the
evaluation seeds), the learning curve, the final success (mean / min / max over seeds), the first tick at
which an evaluation reached 50 / 80 / 90%, wall clock and control ticks per second of the whole session
(acting, learning and evaluating). Goal (issue 32): residual >= 90% within 20K ticks on >= 2 pick tasks from a
base at 20-60%, 3 seeds.

Writes ``bench/results/residual.json`` and ``residual.png`` (mean over seeds with the min-max band, the base
dashed); ``bench/results/README.md`` keeps the table of rounds.

    .venv/bin/python -m bench.residual --checkpoint vla/checkpoints/base --task pick_blue_cube --task lift_green_cube
    .venv/bin/python -m bench.residual --quick --checkpoint vla/checkpoints/base --task pick_red_cube   # smoke run
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
import tempfile
import time

import numpy as np

from bench.harness import flags, plots
from bench.harness import jobs as sessions
from bench.harness.results import portable, write_result


METHODS = {"residual": ["--method", "residual"], "dsrl-na": ["--method", "dsrl", "--variant", "na"],
           "sac-raw": ["--method", "dsrl", "--variant", "action"]}
"""bench method -> its `vla rl` flags"""
COLORS = {"residual": "#55a868", "dsrl-na": "#c44e52", "sac-raw": "#8c8c8c"}
GOAL = {"success": 0.9, "ticks": 20_000}
LEVELS = (0.5, 0.8, 0.9)


def launch(job: dict, site: str, args):
    m = job["method"]
    cmd = [sys.executable, "-m", "vla.cli", "rl", *METHODS[m], "--checkpoint", args.checkpoint, "--task", job["task"],
           "--out", job["out"], "--robot", site, "--seed", str(job["seed"]), "--total-ticks", str(args.total_ticks),
           "--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes),
           "--warmup-steps", str(args.warmup_steps), "--exec-steps", str(args.exec_steps),
           "--batch-size", str(args.batch_size), "--num-critics", str(args.num_critics), "--threads", "1",
           "--serve", "always", "--videos", "0"]
    if m == "residual":
        cmd += ["--utd", str(args.utd), "--residual-bound", str(args.residual_bound), "--rows", args.rows,
                "--encoder", args.encoder, "--n-step", str(args.n_step), "--residual-penalty", str(args.residual_penalty),
                "--base-noise", args.base_noise]
    else:
        cmd += ["--utd", str(args.dsrl_utd), "--distill-steps", str(args.distill_steps)]
    if args.demos and m in ("residual", "dsrl-na"):  # the methods whose critic reads executed chunks
        cmd += ["--demos", args.demos.format(task=job["task"])]
    return sessions.start_session(cmd, job, args.updates)


def first_ticks(curve: list, level: float) -> int | None:
    return next((int(t) for t, r in curve[1:] if r >= level), None)


def main(argv=None) -> int:
    ap = flags.parser("residual", __doc__, out=False)
    ap.add_argument("--checkpoint", required=True, help="the frozen VLA (a `vla train` run or checkpoint)")
    ap.add_argument("--task", action="append", dest="tasks", required=True)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--total-ticks", type=int, default=GOAL["ticks"])
    ap.add_argument("--exec-steps", type=int, default=4, help="chunk rows per macro-step, every method")
    ap.add_argument("--utd", type=int, default=4, help="residual: critic steps per macro-step")
    ap.add_argument("--residual-bound", type=float, default=0.1)
    ap.add_argument("--rows", choices=("each", "shared"), default="each")
    ap.add_argument("--n-step", type=int, default=1, help="residual: TD over this many macro-steps")
    ap.add_argument("--residual-penalty", type=float, default=0.0,
                    help="residual: the Q a residual at its bound must gain (0: off, ResFiT)")
    ap.add_argument("--base-noise", choices=("sample", "zero"), default="sample",
                    help="residual: the base VLA's sampler noise under the correction, drawn per chunk (sample) or "
                         "none (zero: a deterministic base, as ResFiT's); the residual's base row is then evaluated "
                         "noise-free too")
    ap.add_argument("--encoder", choices=("vla", "oracle", "cnn"), default="vla",
                    help="residual: what actor and critic read (oracle: + the simulator's object poses, a labelled "
                         "diagnostic of whether the VLA's features are what limits the correction)")
    ap.add_argument("--dsrl-utd", type=int, default=20, help="dsrl-na / sac-raw: gradient steps per macro-step")
    ap.add_argument("--distill-steps", type=int, default=10)
    ap.add_argument("--num-critics", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--warmup-steps", type=int, default=250, help="macro-steps of the base + noise before learning")
    ap.add_argument("--eval-every", type=int, default=10, help="episodes between evaluations")
    ap.add_argument("--eval-episodes", type=int, default=20)
    ap.add_argument("--demos", default=None, metavar="PATTERN",
                    help="residual and dsrl-na: a recorded dataset per task for the demo buffer, {task} filled in")
    ap.add_argument("--updates", choices=("lockstep", "async"), default="lockstep",
                    help="async: each session as a learner + actor pair, the learner updating whenever it is free "
                         "(vla rl --updates async); lockstep: one process, one update round per macro-step")
    flags.add_jobs(ap, 2, "sessions run in parallel (one sim bridge each)")
    flags.add_port0(ap)
    flags.add_quick(ap, "1 seed, 96 ticks, tiny updates: a smoke run")
    ap.add_argument("--name", default="residual", help="result files bench/results/<name>.json / .png")
    flags.add_out(ap)
    ap.add_argument("--work", default=None, help="where the session run directories go (default a temp dir)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.total_ticks, args.utd, args.dsrl_utd, args.num_critics, args.batch_size = 1, 96, 1, 1, 2, 8
        args.warmup_steps, args.eval_every, args.eval_episodes, args.distill_steps = 2, 0, 1, 1
    work = args.work or tempfile.mkdtemp(prefix="bench-residual-")
    os.makedirs(work, exist_ok=True)
    jobs = [{"task": t, "method": m, "seed": s, "out": os.path.join(work, f"{t}-{m}-s{s}"),
             "base_key": "zero-noise" if m == "residual" and args.base_noise == "zero" else "sampled"}
            for t in args.tasks for s in range(args.seeds) for m in args.methods]
    t_start = time.perf_counter()
    done = sessions.run_jobs(jobs, work, args, launch)
    for r in done:
        if "curve" in r:
            r["first_ticks"] = {f"{int(lv * 100)}%": first_ticks(r["curve"], lv) for lv in LEVELS}
            r["ticks_per_s"] = r["ticks"] / r["wall_s"]
    summary = sessions.summarize(done)
    for task, ms in summary.items():
        for method, m in ms.items():
            runs = [r for r in done if r["task"] == task and r["method"] == method and "curve" in r]
            m["first_ticks"] = {lv: [r["first_ticks"][lv] for r in runs] for lv in runs[0]["first_ticks"]}
            m["ticks_per_s_mean"] = float(np.mean([r["ticks_per_s"] for r in runs]))
    goals = {}
    for task, ms in summary.items():
        if "residual" in ms:
            m = ms["residual"]
            hits = m["first_ticks"]["90%"]
            goals[f"{task}/residual"] = {"goal": f">= 90% within {GOAL['ticks'] // 1000}K ticks, 3 seeds",
                                         "final_mean": m["final_mean"], "seeds": len(m["final"]), "first_tick_at_90": hits,
                                         "met": len(hits) >= 3 and all(x is not None and x <= GOAL["ticks"] for x in hits)}
    keys = ("checkpoint", "tasks", "methods", "seeds", "total_ticks", "exec_steps", "utd", "residual_bound", "rows",
            "n_step", "residual_penalty", "base_noise", "encoder",
            "dsrl_utd", "distill_steps", "num_critics", "batch_size", "warmup_steps", "eval_every", "eval_episodes",
            "jobs", "demos", "updates")
    res = {"bench": "residual", "quick": args.quick, "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
           "settings": {k: getattr(args, k) for k in keys}, "wall_s_total": time.perf_counter() - t_start,
           "summary": summary, "goals": goals, "runs": [{**r, "out": portable(r["out"])} for r in done]}
    for k in ("checkpoint", "demos"):
        res["settings"][k] = portable(res["settings"][k])
    write_result(args.out / f"{args.name}.json", res, "residual", argv, args.quick)
    plots.learning_curves(
        done, summary, args.out / f"{args.name}.png",
        f"residual RL vs DSRL-NA vs SAC on raw actions, frozen VLA, {args.total_ticks} ticks, exec {args.exec_steps}, "
        f"{args.seeds} seed(s), {args.eval_episodes} eval episodes"
        + (", ORACLE residual input (sim object poses)" if args.encoder == "oracle" else ""),
        METHODS, COLORS, GOAL["success"])
    for task, ms in summary.items():
        for method, m in ms.items():
            print(f"{task:<18} {method:<9} final {m['final_mean']:.0%} [{m['final_min']:.0%}, {m['final_max']:.0%}] "
                  f"base {m['base_mean']:.0%}  {m['ticks_per_s_mean']:.1f} ticks/s  wall {m['wall_s_mean'] / 60:.1f} min")
    print(f"wrote {args.out / (args.name + '.json')} and {args.name}.png")
    return 0 if all("final" in r for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
