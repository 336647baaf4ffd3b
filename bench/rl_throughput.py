#!/usr/bin/env python
"""RL session throughput (issue 32): control ticks per second *with learning*, and the gradient steps the learner
affords, for residual RL and DSRL-NA, in lockstep and with asynchronous updates.

Every row is one real `vla rl` session on the simulated Franka (sim-franka-fast: physics advances one control
period per command, the cameras render on request) from the same frozen VLA, run one at a time so that no two
share the CPU:

* ``lockstep``: ``vla rl`` in one process; one update round per macro-step, so acting waits for every round;
* ``async``: ``vla rl --role learner --updates async`` and ``vla rl --role actor`` on loopback (SERL's split):
  the actor drives the robot at its own rate and streams transitions; the learner stores them as they arrive
  and runs update rounds whenever it is free, never more than lockstep would.

Measured from the run directory's ``episodes.jsonl`` (each finished episode's wall clock, tick count and the
agent's update rounds) over the learning window (from the first episode that ended after an update round to the
last one): ticks/s, update rounds/s, critic gradient steps/s (rounds x the method's UTD) and update rounds per
macro-step (1 in lockstep: what async gives up for speed). Evaluations are off (one base and one final episode),
so the window holds acting and learning only. Goal (issue 32): >= 30 ticks/s with learning, residual and DSRL.

Writes ``bench/results/rl_throughput.json`` and ``rl_throughput.png``.

    .venv/bin/python -m bench.rl_throughput --checkpoint vla/checkpoints/base
    .venv/bin/python -m bench.rl_throughput --quick --checkpoint vla/checkpoints/base   # smoke run
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

from bench.harness import flags, plots
from bench.harness import jobs as sessions
from bench.harness.results import portable, write_result


METHODS = {"residual": ["--method", "residual"], "dsrl-na": ["--method", "dsrl", "--variant", "na"]}
"""bench method -> its `vla rl` flags"""
MODES = ("lockstep", "async")
GOAL_TICKS_PER_S = 30.0


def launch(job: dict, site: str, args):
    m = job["method"]
    cmd = [sys.executable, "-m", "vla.cli", "rl", *METHODS[m], "--checkpoint", args.checkpoint, "--task", args.task,
           "--out", job["out"], "--robot", site, "--seed", "0", "--total-ticks", str(args.total_ticks),
           "--eval-every", "0", "--eval-episodes", "1", "--warmup-steps", str(args.warmup_steps),
           "--exec-steps", str(args.exec_steps), "--threads", "1", "--videos", "0",
           "--utd", str(args.utd[m]), "--num-critics", str(args.num_critics), "--batch-size", str(args.batch_size)]
    if job["mode"] == "lockstep":
        cmd += ["--serve", "always"]
    return sessions.start_session(cmd, job, job["mode"])


def window(out: str) -> dict:
    """Rates over the learning window of a finished session's ``episodes.jsonl``."""
    rows = [json.loads(x) for x in open(os.path.join(out, "episodes.jsonl")) if x.strip()]
    learning = [r for r in rows if r.get("update_rounds", 0) > 0]
    if len(learning) < 2:
        return {"episodes": len(rows), "error": "fewer than two episodes ended after an update round"}
    a, b = learning[0], learning[-1]
    dt = b["wall_s"] - a["wall_s"]
    return {"episodes": len(learning), "window_s": dt, "window_ticks": b["total_ticks"] - a["total_ticks"],
            "ticks_per_s": (b["total_ticks"] - a["total_ticks"]) / dt,
            "update_rounds_per_s": (b["update_rounds"] - a["update_rounds"]) / dt,
            "update_rounds_per_step": (b["update_rounds"] - a["update_rounds"]) / max(b["step"] - a["step"], 1)}


def plot(rows: list[dict], path: pathlib.Path) -> None:
    plt = plots.pyplot()

    ok = [r for r in rows if "ticks_per_s" in r]
    labels = [f"{r['method']}\n{r['mode']}" for r in ok]
    colors = ["#8c8c8c" if r["mode"] == "lockstep" else "#55a868" for r in ok]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(labels, [r["ticks_per_s"] for r in ok], color=colors)
    ax1.axhline(GOAL_TICKS_PER_S, color="k", ls="--", lw=1, label=f"goal {GOAL_TICKS_PER_S:g} ticks/s")
    ax1.set_ylabel("control ticks / s, learning")
    ax1.legend(loc="upper left", fontsize=8)
    ax2.bar(labels, [r["critic_steps_per_s"] for r in ok], color=colors)
    for i, r in enumerate(ok):
        ax2.text(i, r["critic_steps_per_s"], f"{r['update_rounds_per_step']:.2f} rounds\nper macro-step",
                 ha="center", va="bottom", fontsize=7)
    ax2.set_ylabel("critic gradient steps / s")
    fig.suptitle("RL session throughput on the sim Franka (2-core machine, one session at a time)", fontsize=10)
    fig.tight_layout()
    plots.save(fig, path, dpi=110)


def main(argv=None) -> int:
    ap = flags.parser("rl_throughput", __doc__, out=False)
    ap.add_argument("--checkpoint", required=True, help="the frozen VLA (a `vla train` run or checkpoint)")
    ap.add_argument("--task", default="pick_blue_cube")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--total-ticks", type=int, default=2000)
    ap.add_argument("--warmup-steps", type=int, default=100, help="macro-steps before learning (outside the window)")
    ap.add_argument("--exec-steps", type=int, default=4)
    ap.add_argument("--residual-utd", type=int, default=4, help="residual: critic steps per update round")
    ap.add_argument("--dsrl-utd", type=int, default=20, help="dsrl-na: gradient steps per update round")
    ap.add_argument("--num-critics", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=256)
    flags.add_port0(ap)
    flags.add_quick(ap, "tiny updates, a few hundred ticks: a smoke run")
    ap.add_argument("--name", default="rl_throughput", help="result files bench/results/<name>.json / .png")
    flags.add_out(ap)
    ap.add_argument("--work", default=None, help="where the session run directories go (default a temp dir)")
    args = ap.parse_args(argv)
    if args.quick:
        args.total_ticks, args.warmup_steps, args.residual_utd, args.dsrl_utd = 160, 4, 1, 1
        args.num_critics, args.batch_size = 2, 8
    args.utd = {"residual": args.residual_utd, "dsrl-na": args.dsrl_utd}
    args.jobs = 1  # one session at a time: the rates are the machine's, not shared
    work = args.work or tempfile.mkdtemp(prefix="bench-rl-throughput-")
    os.makedirs(work, exist_ok=True)
    jobs = [{"task": args.task, "method": m, "mode": mode, "seed": 0, "out": os.path.join(work, f"{m}-{mode}")}
            for m in args.methods for mode in args.modes]
    t_start = time.perf_counter()
    done = sessions.run_jobs(jobs, work, args, launch)
    by_out = {j["out"]: j for j in jobs}
    rows = []
    for r in done:
        row = {"method": r["method"], "mode": by_out[r["out"]]["mode"], "returncode": r["returncode"],
               "session_wall_s": r["wall_s"]}
        if r["returncode"] == 0:
            row.update(window(r["out"]), ticks=r["ticks"], steps=r["steps"], update_rounds=r["update_rounds"],
                       utd=args.utd[r["method"]], vla_weights_unchanged=r["vla_weights_unchanged"])
            if "update_rounds_per_s" in row:
                row["critic_steps_per_s"] = row["update_rounds_per_s"] * row["utd"]
        else:
            row["error"] = r.get("error", "")
        rows.append(row)
    rows.sort(key=lambda x: (list(METHODS).index(x["method"]), MODES.index(x["mode"])))
    for row in rows:
        if "ticks_per_s" in row:
            print(f"{row['method']:>9} {row['mode']:>8}: {row['ticks_per_s']:6.1f} ticks/s, "
                  f"{row['critic_steps_per_s']:6.1f} critic steps/s, {row['update_rounds_per_step']:.2f} rounds "
                  f"per macro-step (window {row['window_ticks']} ticks, {row['window_s']:.0f} s)")
        else:
            print(f"{row['method']:>9} {row['mode']:>8}: FAILED {row.get('error', '')[-300:]}")
    goals = {f"{r['method']}/{r['mode']}": {"goal": f">= {GOAL_TICKS_PER_S:g} ticks/s with learning",
                                           "ticks_per_s": r.get("ticks_per_s"),
                                           "met": r.get("ticks_per_s", 0) >= GOAL_TICKS_PER_S}
             for r in rows}
    settings = {k: getattr(args, k) for k in ("checkpoint", "task", "methods", "modes", "total_ticks", "warmup_steps",
                                              "exec_steps", "utd", "num_critics", "batch_size")}
    settings["checkpoint"] = portable(settings["checkpoint"])
    res = {"bench": "rl_throughput", "quick": args.quick, "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()}, "settings": settings,
           "wall_s_total": time.perf_counter() - t_start, "rows": rows, "goals": goals}
    write_result(args.out / f"{args.name}.json", res, "rl_throughput", argv, args.quick)
    plot(rows, args.out / f"{args.name}.png")
    print(f"wrote {args.out / (args.name + '.json')} and .png")
    return 0 if all(r["returncode"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
