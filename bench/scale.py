#!/usr/bin/env python
"""Scale-out on Ray (issue 35): how much faster ``vla eval --workers N`` and ``vla rl --actors N`` go with N.

Every row is one real command on the simulated Franka (sim-franka-fast), run one at a time so that no two share the
machine, each worker / actor with its own simulator bridge on ports of its own (``vla.cluster``):

* ``vla eval --workers N``: episodes / s, from the report's timing once every worker is up (loading the model and
  starting a bridge is the startup, reported apart), and over the whole command; the per-episode outcomes of every
  N are compared with the first N's (the same seeds must give the same episodes);
* ``vla rl --actors N --updates async``: control ticks / s with learning, over the learner's episode log (the
  first to the last logged episode: every actor acting, the learner storing and updating as they arrive), and
  over the whole command; the update rounds the learner afforded.

Ratios are against the first N of each list; ``machine_busy`` is the fraction of the machine's CPU in use while
a row ran (its own processes and anything else): near 1 with the first N, more workers cannot go faster.
Writes ``bench/results/<name>.json`` (with the date, host, CPU count, load average, the threads each worker /
actor uses, and the versions) and ``<name>.png`` beside it.

On this machine (2 cores, shared):

    .venv/bin/python -m bench.scale --checkpoint vla/checkpoints/base
    .venv/bin/python -m bench.scale --quick --checkpoint vla/checkpoints/base     # smoke run, seconds of work

On a larger machine or a Ray cluster (`pip install -e .[scale]` on every node, the checkpoint at the same path;
start the cluster with `ray start --head` here and `ray start --address HEAD:6379` on the other nodes):

    .venv/bin/python -m bench.scale --checkpoint vla/checkpoints/base --workers 1 16 --actors 1 16 \\
        --ray-address auto --episodes 160 --total-ticks 20000 --name scale_16

With --ray-address on several machines the learner must be reachable from the actors: add
``--rl-args "--bind tcp://*:5800 --keys keys/"``. A local Ray cluster (no --ray-address) takes one CPU per worker.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import tempfile
import time

from bench.harness import flags, plots
from bench.harness.results import ROOT, portable, write_result


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of every CPU of this machine (Linux ``/proc/stat``; zeros elsewhere)."""
    try:
        with open("/proc/stat") as f:
            v = [float(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = v[3] + (v[4] if len(v) > 4 else 0.0)
    return sum(v) - idle, sum(v)


def _run(cmd: list[str], log: pathlib.Path, timeout_s: float) -> tuple[int, float, float | None]:
    """Run ``cmd`` (its output to ``log``) -> (return code, wall seconds, the machine's busy fraction meanwhile:
    this command's processes and anything else running; 1.0 means no CPU was left)."""
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "OMP_NUM_THREADS": "1"}
    b0, t0_cpu = _cpu_times()
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env,
                                timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    b1, t1_cpu = _cpu_times()
    return rc, time.perf_counter() - t0, round((b1 - b0) / (t1_cpu - t0_cpu), 3) if t1_cpu > t0_cpu else None


def eval_row(n: int, args, work: pathlib.Path) -> dict:
    out = work / f"eval-w{n}"
    cmd = [sys.executable, "-m", "vla.cli", "eval", "--checkpoint", args.checkpoint, "--task", args.task,
           "--episodes", str(args.episodes), "--videos", "0", "--threads", "1", "--out", str(out),
           "--seed-start", "100000", "--workers", str(n), *(["--exec-steps", str(args.exec_steps)] if args.exec_steps
                                                           else []),
           *(["--ray-address", args.ray_address] if args.ray_address else [])]
    rc, wall, busy = _run(cmd, work / f"eval-w{n}.log", args.timeout)
    row = {"kind": "eval", "n": n, "returncode": rc, "command_wall_s": round(wall, 2), "machine_busy": busy}
    if rc != 0:
        return {**row, "error": (work / f"eval-w{n}.log").read_text()[-1500:]}
    rep = json.loads((out / "eval.json").read_text())
    t = rep["timing"]
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    s = rep["tasks"][args.task]
    return {**row, "episodes": len(episodes), "successes": s["successes"], "startup_s": t["startup_s"],
            "episodes_s": t["episodes_s"], "rate": t["episodes_per_s"], "rate_wall": len(episodes) / wall,
            "outcomes": [[e["seed"], e["success"], e["ticks"], e["final_state"]] for e in episodes]}


def rl_row(n: int, args, work: pathlib.Path) -> dict:
    out = work / f"rl-a{n}"
    cmd = [sys.executable, "-m", "vla.cli", "rl", "--actors", str(n), "--updates", "async", "--method", args.method,
           "--checkpoint", args.checkpoint, "--task", args.task, "--out", str(out), "--seed", "0",
           "--total-ticks", str(args.total_ticks), "--warmup-steps", str(args.warmup_steps), "--eval-every", "0",
           "--eval-episodes", "1", "--videos", "0", "--threads", "1", "--exec-steps", str(args.rl_exec_steps),
           *shlex.split(args.rl_args), *(["--ray-address", args.ray_address] if args.ray_address else [])]
    rc, wall, busy = _run(cmd, work / f"rl-a{n}.log", args.timeout)
    row = {"kind": "rl", "n": n, "returncode": rc, "command_wall_s": round(wall, 2), "machine_busy": busy}
    if rc != 0:
        return {**row, "error": (work / f"rl-a{n}.log").read_text()[-1500:]}
    eps = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines() if x.strip()]
    summary = json.loads((out / "summary.json").read_text())
    a, b = eps[0], eps[-1]
    window = b["wall_s"] - a["wall_s"]
    per_actor = {}
    for e in eps:
        per_actor[str(e.get("actor", 0))] = per_actor.get(str(e.get("actor", 0)), 0) + e["ticks"]
    return {**row, "episodes": len(eps), "ticks": summary["ticks"], "update_rounds": summary["update_rounds"],
            "window_s": round(window, 2), "window_ticks": b["total_ticks"] - a["total_ticks"],
            "rate": (b["total_ticks"] - a["total_ticks"]) / window if window > 0 else None,
            "rate_wall": summary["ticks"] / wall, "ticks_per_actor": per_actor,
            "update_rounds_per_s": ((b.get("update_rounds", 0) - a.get("update_rounds", 0)) / window
                                    if window > 0 else None),
            "vla_weights_unchanged": summary["vla_weights_unchanged"]}


def ratios(rows: list[dict]) -> None:
    """Each row's rate against the first row of its kind (speed-up), and per worker (efficiency)."""
    for kind in ("eval", "rl"):
        mine = [r for r in rows if r["kind"] == kind and r.get("rate")]
        if not mine:
            continue
        first = mine[0]
        for r in mine:
            r["speedup"] = r["rate"] / first["rate"]
            r["speedup_wall"] = r["rate_wall"] / first["rate_wall"]
            r["efficiency"] = r["speedup"] * first["n"] / r["n"]


def same_outcomes(rows: list[dict]) -> bool | None:
    """Did every eval row give the first one's per-episode outcomes (seed, success, ticks, final state)?"""
    evals = [r for r in rows if r["kind"] == "eval" and "outcomes" in r]
    if len(evals) < 2:
        return None
    ref = evals[0]["outcomes"]
    return all(len(r["outcomes"]) == len(ref) and all(
        a[:3] == b[:3] and max(abs(x - y) for x, y in zip(a[3], b[3])) < 1e-5 for a, b in zip(ref, r["outcomes"]))
        for r in evals[1:])


def plot(rows: list[dict], path: pathlib.Path, title: str) -> None:
    plt = plots.pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, kind, unit, colour in ((axes[0], "eval", "evaluation episodes / s", "#4c72b0"),
                                   (axes[1], "rl", "control ticks / s, learning", "#55a868")):
        ok = [r for r in rows if r["kind"] == kind and r.get("rate")]
        labels = [f"{r['n']} {'worker' if kind == 'eval' else 'actor'}{'s' if r['n'] > 1 else ''}" for r in ok]
        ax.bar(labels, [r["rate"] for r in ok], color=colour, label="steady (workers up)")
        ax.bar(labels, [r["rate_wall"] for r in ok], color="none", edgecolor="k", hatch="//", lw=0.8,
               label="whole command")
        for i, r in enumerate(ok):
            ax.text(i, r["rate"], f"x{r['speedup']:.2f}", ha="center", va="bottom", fontsize=9)
        ax.set_ylabel(unit)
        ax.set_title(f"vla {kind} --{'workers' if kind == 'eval' else 'actors'} N", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    plots.save(fig, path, dpi=110)


def main(argv=None) -> int:
    ap = flags.parser("scale", __doc__, out=False)
    ap.add_argument("--checkpoint", required=True, help="the VLA (a `vla train` run or checkpoint)")
    ap.add_argument("--task", default="pick_red_cube")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="`vla eval --workers` counts (default 1 2)")
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 2], help="`vla rl --actors` counts (default 1 2)")
    ap.add_argument("--ray-address", default=None, help="an existing Ray cluster (auto: the one on this machine)")
    ap.add_argument("--episodes", type=int, default=12, help="evaluation episodes per row")
    ap.add_argument("--exec-steps", type=int, default=None,
                    help="eval: rows of each chunk executed (default: vla eval's temporal ensembling)")
    ap.add_argument("--method", default="residual", help="the RL method of the rl rows")
    ap.add_argument("--total-ticks", type=int, default=1200, help="rl: the session's tick budget per row")
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--rl-exec-steps", type=int, default=4, help="rl: rows of each chunk per macro-step")
    ap.add_argument("--rl-args", default="", help="more `vla rl` flags, e.g. \"--utd 4 --bind tcp://*:5800 --keys k/\"")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per command")
    flags.add_quick(ap, "a smoke run: 4 episodes, 64 ticks, tiny updates")
    ap.add_argument("--name", default="scale", help="result files bench/results/<name>.json / .png")
    flags.add_out(ap)
    ap.add_argument("--work", default=None, help="where the runs go (default a temp dir)")
    args = ap.parse_args(argv)
    if min(args.workers + args.actors) < 1:
        ap.error("--workers and --actors take counts >= 1")
    if args.quick:
        args.episodes, args.exec_steps, args.total_ticks, args.warmup_steps = 4, args.exec_steps or 8, 64, 2
        args.rl_args = f"--max-episode-ticks 16 --utd 1 --batch-size 8 --num-critics 2 {args.rl_args}".strip()
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    rows = []
    for n in args.workers:
        rows.append(eval_row(n, args, work))
        print(f"vla eval --workers {n}: " + (f"{rows[-1]['rate']:.3f} episodes/s steady, {rows[-1]['rate_wall']:.3f} "
                                             f"over the command ({rows[-1]['command_wall_s']:.0f} s)"
                                             if rows[-1]["returncode"] == 0 else "FAILED " + rows[-1]["error"][-500:]),
              flush=True)
    for n in args.actors:
        rows.append(rl_row(n, args, work))
        r = rows[-1]
        print(f"vla rl --actors {n}: " + (f"{r['rate']:.1f} ticks/s in the episode log, {r['rate_wall']:.1f} over the "
                                          f"command ({r['command_wall_s']:.0f} s)" if r["returncode"] == 0
                                          else "FAILED " + r["error"][-500:]), flush=True)
    ratios(rows)
    same = same_outcomes(rows)
    for r in rows:
        if "speedup" in r:
            print(f"{r['kind']:>4} x{r['n']:<3} speed-up {r['speedup']:.2f} (whole command {r['speedup_wall']:.2f}), "
                  f"efficiency {r['efficiency']:.2f}, machine busy {r['machine_busy']:.0%} while it ran")
    if same is not None:
        print(f"eval: the same per-episode outcomes with every worker count: {same}")
    import ray
    import torch

    settings = {k: getattr(args, k) for k in ("checkpoint", "task", "workers", "actors", "ray_address", "episodes",
                                              "exec_steps", "method", "total_ticks", "warmup_steps", "rl_exec_steps",
                                              "rl_args")}
    settings["checkpoint"] = portable(settings["checkpoint"])
    res = {"bench": "scale", "quick": args.quick, "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": {"host": platform.node(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
                       "load_average_at_start": [round(x, 2) for x in load0],
                       "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
                       "threads_per_worker": 1, "python": platform.python_version(), "torch": torch.__version__,
                       "ray": ray.__version__, "cluster": args.ray_address or "local"},
           "settings": settings, "wall_s_total": round(time.perf_counter() - t_start, 1),
           "eval_same_outcomes": same,
           "rows": [{k: v for k, v in r.items() if k != "outcomes"} for r in rows]}
    write_result(args.out / f"{args.name}.json", res, "scale", argv, args.quick)
    plot(rows, args.out / f"{args.name}.png", f"scale-out on Ray, {os.cpu_count()} CPUs "
                                              f"({args.ray_address or 'local cluster'}), one command at a time")
    print(f"wrote {args.out / (args.name + '.json')} and .png")
    return 0 if all(r["returncode"] == 0 for r in rows) and same is not False else 1


if __name__ == "__main__":
    sys.exit(main())
