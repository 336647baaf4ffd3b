#!/usr/bin/env python
"""Acceptance 1's protocol for multi-task checkpoints: ``vla eval`` on unseen scenes, every task the checkpoint
was trained on, several checkpoints side by side, paired.

Run ``.venv/bin/python -m bench.base_eval --model LABEL=CHECKPOINT [--model ...] [--episodes 50]
[--noise zero] [--gripper auto] [--jobs 2] [--name base_eval] [--runs-dir runs/base_eval] [--quick]``.

For each model the checkpoint's ``sim_tasks`` are split over ``--jobs`` ``vla eval`` processes, each on a
simulator bridge of its own (``--port`` + 10 j), the long tasks spread first, all on seeds 100000 ... (the
same scenes for every model, so two models are compared scene by scene). A model whose run directory already
holds a finished evaluation with the same settings is read back, not re-run. It writes ``OUT/NAME.json``:
per model and task the successes, rate and 95% Wilson interval, the per-scene outcomes (for later pairings),
each model's evaluation wall clock; and for each model after the first the exact McNemar test against the
first on the scenes both ran, per task and pooled. ``OUT/NAME.png``: grouped bars with the intervals and the
issue's goals.

``--quick`` (2 episodes of the checkpoint's first task, one job) is the smoke test.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import re
import subprocess
import sys
import time

from bench.harness import flags, plots, stats
from bench.harness.results import ROOT, write_result


GOALS = {"pick_red_cube": 0.85, "pick_blue_cube": 0.85, "lift_green_cube": 0.85, "place_cube_in_bowl": 0.75,
         "push_block_to_marker": 0.75, "stack_cubes": 0.60}
"""Issue 28's acceptance 1, per task."""
COST = {"stack_cubes": 3.0, "put_all_cubes_in_bowl": 4.0, "place_cube_in_bowl": 2.0, "push_block_to_marker": 1.5}
"""Relative wall clock of one episode (the long tasks run up to their step limit when they fail)."""
SEED_START = 100_000


def split_tasks(tasks: list[str], jobs: int) -> list[list[str]]:
    """Greedy longest-first: each task to the job with the least expected wall clock so far."""
    groups: list[list[str]] = [[] for _ in range(max(1, min(jobs, len(tasks))))]
    load = [0.0] * len(groups)
    for t in sorted(tasks, key=lambda t: -COST.get(t, 1.0)):
        j = load.index(min(load))
        groups[j].append(t)
        load[j] += COST.get(t, 1.0)
    return [g for g in groups if g]


def mcnemar(first: dict, second: dict) -> dict:
    """Exact two-sided McNemar test on the scenes both ran (``bench.harness.stats.mcnemar``): ``second_only`` scenes the
    second model solved and the first did not, ``first_only`` the reverse."""
    r = stats.mcnemar(first, second)
    return {"second_only": r["only_second"], "first_only": r["only_first"],
            "p_exact_mcnemar": float(f"{r['mcnemar_p']:.3g}"), "pairs": r["episodes"]}


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "model"


def _portable(path: str) -> str:
    """A path inside the repository relative to it; elsewhere its last two parts (no machine paths in results)."""
    p = pathlib.Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else os.path.join(*p.parts[-2:])


def _finished(out: pathlib.Path, want: dict) -> list[str]:
    """The tasks of a finished ``vla eval`` in ``out`` with the settings in ``want`` ([] if none)."""
    f = out / "eval.json"
    if not f.is_file() or not (out / "episodes.jsonl").is_file():
        return []
    rep = json.loads(f.read_text())
    return list(rep.get("tasks", {})) if all(rep.get(k) == v for k, v in want.items()) else []


def evaluate(label: str, ckpt: str, tasks: list[str], args, runs: pathlib.Path) -> dict:
    """The model's episodes (task, seed) -> success and its evaluation wall clock. Finished evaluations in its
    run directory with the same settings are read back (any split of the tasks); the tasks none covers are run,
    split over ``args.jobs`` processes."""
    from bench.harness.sites import site_copy

    want = {"episodes_per_task": args.episodes, "noise": args.noise, "seed_start": SEED_START}
    if args.gripper != "auto":
        want["gripper"] = args.gripper
    base = runs / _slug(label)
    done = {d: _finished(d, want) for d in sorted(base.glob("*")) if d.is_dir()} if base.is_dir() else {}
    covered = {t for ts in done.values() for t in ts}
    if covered & set(tasks):
        print(f"{label}: {', '.join(t for t in tasks if t in covered)} evaluated already (in {base})", flush=True)
    todo = [t for t in tasks if t not in covered]
    procs, t0 = [], time.perf_counter()
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for j, group in enumerate(split_tasks(todo, args.jobs) if todo else []):
        out = base / f"{stamp}-job{j}"
        out.mkdir(parents=True, exist_ok=True)
        site = site_copy(str(out / "site.yaml"), None if args.port is None else args.port + 10 * j)
        cmd = [sys.executable, "-m", "vla.cli", "eval", "--checkpoint", ckpt, "--robot", site,
               "--episodes", str(args.episodes), "--noise", args.noise, "--gripper", args.gripper,
               "--videos", "0", "--threads", "1", "--seed-start", str(SEED_START), "--out", str(out)]
        for t in group:
            cmd += ["--task", t]
        log = open(out / "eval.log", "w")
        procs.append((out, subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})))
        print(f"{label}: job {j} evaluates {', '.join(group)} ({args.episodes} scenes each); log {out}/eval.log",
              flush=True)
    failed = [out for out, p in procs if p.wait() != 0]
    if failed:
        raise SystemExit(f"{label}: evaluation failed; see {', '.join(str(o / 'eval.log') for o in failed)}")
    wall = time.perf_counter() - t0 if procs else None
    episodes, gripper = {}, set()
    for d in [d for d, ts in done.items() if ts] + [out for out, _ in procs]:
        rep = json.loads((d / "eval.json").read_text())
        gripper.add(rep.get("gripper"))
        for line in (d / "episodes.jsonl").read_text().splitlines():
            e = json.loads(line)
            if e["task"] in tasks:
                episodes[(e["task"], int(e["seed"]))] = bool(e["success"])
    return {"episodes": episodes, "wall_s": wall, "gripper": sorted(g for g in gripper if g)}


def summarize(label: str, ckpt: str, tasks: list[str], res: dict) -> dict:
    from vla.evaluate import wilson_interval

    rows = {}
    for t in tasks:
        seeds = sorted(s for (tt, s) in res["episodes"] if tt == t)
        k = sum(res["episodes"][(t, s)] for s in seeds)
        rows[t] = {"episodes": len(seeds), "successes": k, "rate": k / len(seeds) if seeds else None,
                   "ci95": [round(x, 4) for x in wilson_interval(k, len(seeds))],
                   "goal": GOALS.get(t), "meets_goal": (k / len(seeds) >= GOALS[t]) if t in GOALS and seeds else None,
                   "successful_seeds": [s for s in seeds if res["episodes"][(t, s)]]}
    return {"label": label, "checkpoint": _portable(ckpt), "executed_gripper": res["gripper"],
            "tasks": rows, "total": {"successes": sum(r["successes"] for r in rows.values()),
                                     "episodes": sum(r["episodes"] for r in rows.values())},
            "eval_wall_s": None if res["wall_s"] is None else round(res["wall_s"], 1)}


def plot(models: list[dict], path: pathlib.Path, title: str) -> None:
    plt = plots.pyplot()
    import numpy as np

    tasks = list(models[0]["tasks"])
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(tasks) + 1), 4))
    w = 0.8 / len(models)
    x = np.arange(len(tasks))
    for i, m in enumerate(models):
        rate = np.array([m["tasks"][t]["rate"] or 0.0 for t in tasks])
        lo = np.array([m["tasks"][t]["ci95"][0] for t in tasks])
        hi = np.array([m["tasks"][t]["ci95"][1] for t in tasks])
        tot = m["total"]
        ax.bar(x + (i - (len(models) - 1) / 2) * w, 100 * rate, w, yerr=100 * np.stack([rate - lo, hi - rate]),
               capsize=2, label=f"{m['label']}: {tot['successes']}/{tot['episodes']}")
    for j, t in enumerate(tasks):
        if t in GOALS:
            ax.plot([j - 0.45, j + 0.45], [100 * GOALS[t]] * 2, color="k", lw=1, ls="--")
    ax.set_xticks(x, [t.replace("_", " ") for t in tasks], rotation=12, fontsize=8)
    ax.set_ylabel("success, % (95% Wilson interval)")
    ax.set_ylim(0, 105)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    plots.save(fig, path, dpi=110)
    from PIL import Image  # matplotlib's own dependency

    Image.open(path).convert("RGB").quantize(64).save(path, optimize=True)  # a palette PNG: a third of the bytes


def main(argv: list[str] | None = None) -> int:
    ap = flags.parser("base_eval", out=False, doc=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", action="append", required=True, metavar="LABEL=CHECKPOINT",
                    help="a checkpoint (directory or `vla train` run) and its label in the results; repeat; the "
                         "first is the one the others are paired with")
    ap.add_argument("--task", action="append", help="tasks (default: the first model's sim_tasks)")
    ap.add_argument("--episodes", type=int, default=50, help="unseen scenes per task (default 50)")
    ap.add_argument("--noise", default="zero", help="vla eval --noise (default zero)")
    ap.add_argument("--gripper", default="auto", choices=["auto", "raw", "binary"],
                    help="vla eval --gripper (default auto: what each checkpoint names)")
    flags.add_jobs(ap, 2, "vla eval processes per model, each with its own bridge")
    ap.add_argument("--port", type=int, default=None,
                    help="first port of the bench's bridges (job j: PORT + 10 j; default: ports leased on this machine)")
    ap.add_argument("--name", default="base_eval", help="results file name (OUT/NAME.json, .png)")
    ap.add_argument("--title", default=None, help="plot title")
    ap.add_argument("--runs-dir", default="runs/base_eval")
    flags.add_out(ap, type=str)
    flags.add_quick(ap, "smoke test: the first task, 2 scenes, one job")
    args = ap.parse_args(argv)
    models = []
    for spec in args.model:
        label, sep, ckpt = spec.partition("=")
        if not sep or not label.strip() or not ckpt.strip():
            ap.error(f"--model {spec!r}: give LABEL=CHECKPOINT")
        models.append((label.strip(), ckpt.strip()))
    if len({_slug(m[0]) for m in models}) != len(models):
        ap.error("--model labels must differ (each has a run directory of its own)")
    if args.episodes < 1 or args.jobs < 1:
        ap.error("--episodes and --jobs must be >= 1")
    from vla.envs import noise_option
    from vla.models import resolve_checkpoint

    noise_option(args.noise)
    ckpts = [(label, resolve_checkpoint(c)) for label, c in models]
    tasks = args.task or json.loads((pathlib.Path(ckpts[0][1]) / "config.json").read_text()).get("sim_tasks") or []
    if not tasks:
        ap.error("give --task: the first model does not record its sim tasks")
    if args.quick:
        tasks, args.episodes, args.jobs = tasks[:1], 2, 1
    runs = pathlib.Path(args.runs_dir)
    results = [(label, ckpt, evaluate(label, ckpt, tasks, args, runs)) for label, ckpt in ckpts]
    summaries = [summarize(label, ckpt, tasks, res) for label, ckpt, res in results]
    first = results[0][2]["episodes"]
    paired = {}
    for (label, _, res) in results[1:]:
        eps = res["episodes"]
        paired[f"{label} vs {results[0][0]}"] = {
            "pooled": mcnemar(first, eps),
            "tasks": {t: mcnemar({k: v for k, v in first.items() if k[0] == t}, {k: v for k, v in eps.items() if k[0] == t})
                      for t in tasks}}
    report = {"bench": "base_eval", "date": _dt.date.today().isoformat(), "tasks": tasks,
              "settings": {"episodes_per_task": args.episodes, "seed_start": SEED_START, "noise": args.noise,
                           "gripper": args.gripper, "jobs": args.jobs, "quick": args.quick},
              "command": "bench/base_eval.py " + " ".join(
                  f"--model '{label}={_portable(c)}'" for label, c in models) +
              f" --episodes {args.episodes} --noise {args.noise} --gripper {args.gripper} --jobs {args.jobs}",
              "models": summaries, "paired": paired}
    out = pathlib.Path(args.out)
    name = args.name + ("_quick" if args.quick and args.name == "base_eval" else "")
    write_result(out / f"{name}.json", report, "base_eval", argv, args.quick, indent=1)
    plot(summaries, out / f"{name}.png", args.title or f"vla eval, {args.episodes} unseen scenes per task, "
                                                       f"noise {args.noise}, gripper {args.gripper}")
    for m in summaries:
        cells = "  ".join(f"{t}: {r['successes']}/{r['episodes']}" for t, r in m["tasks"].items())
        print(f"{m['label']:<40} {m['total']['successes']}/{m['total']['episodes']}  {cells}")
    for k, v in paired.items():
        p = v["pooled"]
        print(f"{k}: {p['second_only']} scenes gained, {p['first_only']} lost (exact McNemar p = {p['p_exact_mcnemar']})")
    print(f"wrote {out / (name + '.json')} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
