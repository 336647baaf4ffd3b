#!/usr/bin/env python
"""DSRL benchmark: does steering the frozen compact VLA's noise lift its success rate, and how
fast (in environment steps and wall clock)?

For every task x method x seed this runs one `vla rl` session (a subprocess with its own sim
bridge on its own ports, ``--jobs`` at a time) from the same frozen VLA checkpoint:

* ``dsrl-na``  DSRL noise-aliased (action critic + distilled noise critic),
* ``dsrl-sac`` DSRL with SAC directly in noise space,
* ``sac-raw``  the baseline: plain SAC on the raw action chunk (the VLA only gives features),
* ``dsrl-na-legacy`` / ``dsrl-sac-legacy``  the ablation of issue 15's schedule fix: the same agents
  with ``--update-schedule legacy`` (UTD critic steps but one actor and one temperature step per
  macro-step, as rounds 1-6 ran); opt-in with ``--methods``,

all with the same budget of environment steps (control ticks), and reads back each session's
base-VLA evaluation (the plain VLA on the same evaluation seeds), its periodic
evaluations (the learning curve) and its final evaluation. Reported per task and method: final
success mean / min / max over seeds, the first tick at which an evaluation reached 90%, wall
clock. Goal (issue 15): >= 90% within 20K control ticks for both DSRL variants, 3 seeds.

Writes ``bench/results/dsrl.json`` and ``dsrl.png`` (learning curves: mean over seeds with the
min-max band, base VLA dashed): the latest run. ``bench/results/README.md`` keeps one table of every
round; the sessions' run directories stay in ``--work`` (``bench/archive/dsrl_episodes.py`` read them).

    .venv/bin/python -m bench.dsrl --checkpoint runs/vla_low --task pick_red_cube --task lift_green_cube
    .venv/bin/python -m bench.dsrl --quick --checkpoint ... --task pick_red_cube   # smoke run
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
import tempfile
import time

from bench.harness import flags, plots
from bench.harness import jobs as sessions
from bench.harness.results import portable, write_result


METHODS = {"dsrl-na": ("na", "per_step"), "dsrl-sac": ("sac", "per_step"), "sac-raw": ("action", "per_step"),
           "dsrl-na-legacy": ("na", "legacy"), "dsrl-sac-legacy": ("sac", "legacy")}
"""bench method -> (vla rl --variant, --update-schedule)"""
DEFAULT_METHODS = ("dsrl-na", "dsrl-sac", "sac-raw")
GOAL = {"success": 0.9, "ticks": 20_000}
COLORS = {"dsrl-na": "#c44e52", "dsrl-sac": "#4c72b0", "sac-raw": "#8c8c8c", "dsrl-na-legacy": "#e8a0a2",
          "dsrl-sac-legacy": "#9fb6d8"}


def launch(job: dict, site: str, args):
    cmd = [sys.executable, "-m", "vla.cli", "rl", "--checkpoint", args.checkpoint, "--task", job["task"],
           "--variant", METHODS[job["method"]][0], "--update-schedule", METHODS[job["method"]][1], "--out", job["out"], "--robot", site, "--seed", str(job["seed"]),
           "--total-ticks", str(args.total_ticks), "--utd", str(args.utd), "--distill-steps", str(args.distill_steps),
           "--num-critics", str(args.num_critics),
           "--batch-size", str(args.batch_size), "--eval-every", str(args.eval_every),
           "--eval-episodes", str(args.eval_episodes), "--warmup-steps", str(args.warmup_steps),
           "--noise-bound", str(args.noise_bound), "--threads", "1", "--serve", "always"]
    if args.exec_steps:
        cmd += ["--exec-steps", str(args.exec_steps)]
    if args.noise_dims:
        cmd += ["--noise-dims", str(args.noise_dims), "--noise-subspace", args.noise_subspace]
    if args.encoder != "vla" and METHODS[job["method"]][0] != "action":
        cmd += ["--encoder", args.encoder]
    if args.demos and METHODS[job["method"]][0] == "na":  # only NA has an action critic for demos to train
        cmd += ["--demos", args.demos.format(task=job["task"])]
    return sessions.start_session(cmd, job)


def main(argv=None) -> int:
    ap = flags.parser("dsrl", __doc__, quick="1 seed, 96 ticks, tiny updates: a smoke run",
                      jobs=(2, "sessions run in parallel (one sim bridge each)"), port0=True)
    ap.add_argument("--checkpoint", required=True, help="the frozen VLA (a `vla train` run or checkpoint)")
    ap.add_argument("--task", action="append", dest="tasks", required=True)
    ap.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=list(METHODS),
                    help=f"default {' '.join(DEFAULT_METHODS)}; the *-legacy ones are the schedule ablation")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--total-ticks", type=int, default=GOAL["ticks"])
    ap.add_argument("--utd", type=int, default=20)
    ap.add_argument("--num-critics", type=int, default=10)
    ap.add_argument("--distill-steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--noise-bound", type=float, default=1.5)
    ap.add_argument("--exec-steps", type=int, default=None)
    ap.add_argument("--noise-dims", type=int, default=None,
                    help="DSRL: one noise row of this many dims tiled over the chunk (the pi0 option; the VLA's "
                         "action dim, 7 for the arm); default the whole chunk's noise")
    ap.add_argument("--noise-subspace", choices=("tile", "mean"), default="tile",
                    help="with --noise-dims: tile w over the rows (pi0) or set the rows' mean and draw the rest "
                         "(keeps the VLA's N(0, I) noise)")
    ap.add_argument("--encoder", choices=("vla", "oracle"), default="vla",
                    help="what the DSRL agents' actor and critics read: the VLA's features (default) or, as a "
                         "labelled oracle diagnostic, those plus the simulator's object poses (DSRL only)")
    ap.add_argument("--eval-every", type=int, default=10, help="episodes between evaluations")
    ap.add_argument("--eval-episodes", type=int, default=20)
    ap.add_argument("--demos", default=None, metavar="PATTERN",
                    help="dsrl-na only: a recorded dataset per task for its demo buffer, {task} filled in, "
                         "e.g. data/q0.75_{task}")
    ap.add_argument("--work", default=None, help="where the session run directories go (default a temp dir)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.total_ticks, args.utd, args.num_critics, args.batch_size = 1, 96, 1, 2, 8
        args.warmup_steps, args.eval_every, args.eval_episodes, args.distill_steps = 2, 0, 1, 1
    work = args.work or tempfile.mkdtemp(prefix="bench-dsrl-")
    os.makedirs(work, exist_ok=True)
    session_jobs = [{"task": t, "method": m, "seed": s, "out": os.path.join(work, f"{t}-{m}-s{s}")}
            for t in args.tasks for s in range(args.seeds) for m in args.methods]
    t_start = time.perf_counter()
    done = sessions.run_jobs(session_jobs, work, args, launch)
    summary = sessions.summarize(done)
    goals = {}
    for task, ms in summary.items():
        for method in ("dsrl-na", "dsrl-sac", "dsrl-na-legacy", "dsrl-sac-legacy"):
            if method in ms:
                m = ms[method]
                met = all(x is not None and x <= GOAL["ticks"] for x in m["first_tick_at_90"]) and \
                    len(m["first_tick_at_90"]) >= 3
                goals[f"{task}/{method}"] = {"goal": f">= 90% within {GOAL['ticks'] // 1000}K ticks, 3 seeds",
                                             "final_mean": m["final_mean"], "seeds": len(m["final"]),
                                             "first_tick_at_90": m["first_tick_at_90"], "met": met}
    res = {"bench": "dsrl", "quick": args.quick, "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
           "settings": {k: getattr(args, k) for k in ("checkpoint", "tasks", "methods", "seeds", "total_ticks", "utd",
                                                       "distill_steps", "num_critics", "batch_size", "warmup_steps",
                                                       "noise_bound", "noise_dims", "noise_subspace", "encoder",
                                                       "exec_steps", "eval_every", "eval_episodes", "jobs",
                                                       "demos")},
           "wall_s_total": time.perf_counter() - t_start, "summary": summary, "goals": goals,
           "runs": [{**r, "out": portable(r["out"])} for r in done]}
    for k in ("checkpoint", "demos"):
        res["settings"][k] = portable(res["settings"][k])
    write_result(args.out / "dsrl.json", res, "dsrl", argv, args.quick)
    plots.learning_curves(done, summary, args.out / "dsrl.png",
         f"DSRL on the frozen compact VLA: {args.total_ticks} ticks, UTD {args.utd}, {args.num_critics} critics, "
         f"{args.seeds} seed(s), {args.eval_episodes} eval episodes"
         + (f", {args.noise_dims}-d noise ({args.noise_subspace})" if args.noise_dims else "")
         + (", ORACLE critic input (sim object poses)" if args.encoder == "oracle" else ""), METHODS, COLORS, GOAL["success"])
    for task, ms in summary.items():
        for method, m in ms.items():
            print(f"{task:<18} {method:<9} final {m['final_mean']:.0%} [{m['final_min']:.0%}, {m['final_max']:.0%}] "
                  f"base {m['base_mean']:.0%}  wall {m['wall_s_mean'] / 60:.1f} min")
    print(f"wrote {args.out / 'dsrl.json'} and dsrl.png")
    return 0 if all("final" in r for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
