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
round; the sessions' run directories stay in ``--work`` (``bench/dsrl_episodes.py`` reads them).

    .venv/bin/python bench/dsrl.py --checkpoint runs/vla_low --task pick_red_cube --task lift_green_cube
    .venv/bin/python bench/dsrl.py --quick --checkpoint ... --task pick_red_cube   # smoke run
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import platform
import shutil
import subprocess
import textwrap
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import yaml  # noqa: E402

METHODS = {"dsrl-na": ("na", "per_step"), "dsrl-sac": ("sac", "per_step"), "sac-raw": ("action", "per_step"),
           "dsrl-na-legacy": ("na", "legacy"), "dsrl-sac-legacy": ("sac", "legacy")}
"""bench method -> (vla rl --variant, --update-schedule)"""
DEFAULT_METHODS = ("dsrl-na", "dsrl-sac", "sac-raw")
GOAL = {"success": 0.9, "ticks": 20_000}
COLORS = {"dsrl-na": "#c44e52", "dsrl-sac": "#4c72b0", "sac-raw": "#8c8c8c", "dsrl-na-legacy": "#e8a0a2",
          "dsrl-sac-legacy": "#9fb6d8"}


def site_with_ports(path: str, port0: int, base: str = "sim-franka-fast") -> str:
    """A copy of the ``base`` sim preset (default sim-franka-fast) on ports port0 ... port0 + 9 (parallel
    sessions)."""
    from robot_io.site import load_site

    src = load_site(base).path
    with open(src) as f:
        site = yaml.safe_load(f)
    ports = iter(range(port0, port0 + 10))
    for dev in site["devices"].values():
        for key in ("command", "stream"):
            if key in dev:
                dev[key] = f"tcp://127.0.0.1:{next(ports)}"
    site["name"] = f"bench-dsrl-{port0}"
    with open(path, "w") as f:
        yaml.safe_dump(site, f)
    return path


def reuse_base(job: dict, done: list[dict]) -> None:
    """The base VLA's evaluation is the same for every session of a task (same checkpoint, seeds and
    episodes): once one session of the task has finished it, later ones start with a copy of its
    ``base_eval.json`` (which `vla rl` then reads instead of re-running it) and say so in ``base_from``. Jobs
    from different checkpoints carry different ``base_key`` s and never share it."""
    for r in done:
        src = os.path.join(r["out"], "base_eval.json")
        if r["task"] == job["task"] and r.get("base_key") == job.get("base_key") and os.path.isfile(src):
            os.makedirs(job["out"], exist_ok=True)
            shutil.copyfile(src, os.path.join(job["out"], "base_eval.json"))
            job["base_from"] = os.path.basename(r["out"])
            return


def launch(job: dict, site: str, args) -> subprocess.Popen:
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
    return start_session(cmd, job)


def collect(job: dict) -> dict:
    out = job["out"]
    res = {k: job[k] for k in ("task", "method", "seed", "out")}
    res["base_from"] = job.get("base_from")
    res["base_key"] = job.get("base_key")
    res["wall_s"] = job["wall_s"]
    res["returncode"] = job["returncode"]
    if job["returncode"] != 0:
        with open(out + ".log") as f:
            res["error"] = f.read()[-1500:]
        return res
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    evals = [json.loads(x) for x in open(os.path.join(out, "evals.jsonl"))] \
        if os.path.isfile(os.path.join(out, "evals.jsonl")) else []
    curve = [(0, s["base_success_rate"])] + [(e["total_ticks"], e["success_rate"]) for e in evals]
    curve.append((s["ticks"], s["final_success_rate"]))
    reached = next((t for t, r in curve[1:] if r >= GOAL["success"]), None)
    res.update(steps=s["steps"], update_rounds=s.get("update_rounds"), updates=s.get("updates", "lockstep"))
    res.update(base=s["base_success_rate"], final=s["final_success_rate"], ticks=s["ticks"], curve=curve,
               first_tick_at_90=reached, vla_weights_unchanged=s["vla_weights_unchanged"])
    return res


def eval_counts(out: str) -> tuple[dict, dict]:
    """A finished session's ``summary.json`` and its counts: the final evaluation's and the base VLA's successes out
    of their episodes (``final_successes``, ``eval_episodes``, ``base_successes``, ``base_episodes``)."""
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    with open(os.path.join(out, "base_eval.json")) as f:
        b = json.load(f)
    return s, {"final_successes": int(round(s["final_success_rate"] * s["eval_episodes"])),
               "eval_episodes": s["eval_episodes"], "base_successes": int(b["successes"]),
               "base_episodes": int(b["episodes"])}


def portable(arg: str | None) -> str | None:
    """An absolute path in the results becomes ``vla_steerability.portable_path``'s form (from its last ``runs``
    folder on): no machine paths in results."""
    from vla_steerability import portable_path

    return portable_path(arg) if arg and os.path.isabs(arg) else arg


def summarize(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        if "final" not in r:
            continue
        t = out.setdefault(r["task"], {})
        m = t.setdefault(r["method"], {"final": [], "base": [], "wall_s": [], "first_tick_at_90": []})
        m["final"].append(r["final"])
        m["base"].append(r["base"])
        m["wall_s"].append(r["wall_s"])
        m["first_tick_at_90"].append(r["first_tick_at_90"])
    for t in out.values():
        for m in t.values():
            f = np.asarray(m["final"])
            m.update(final_mean=float(f.mean()), final_min=float(f.min()), final_max=float(f.max()),
                     final_std=float(f.std()), base_mean=float(np.mean(m["base"])),
                     wall_s_mean=float(np.mean(m["wall_s"])))
    return out


def plot(rows: list[dict], summary: dict, path: pathlib.Path, title: str, methods=None, colors=None) -> None:
    """Learning curves per task: mean over seeds with the min-max band, the base dashed, the goal dotted
    (``methods`` / ``colors``: another bench's method table, default this one's)."""
    methods, colors = methods or METHODS, colors or COLORS
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(summary)
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(5.2 * max(1, len(tasks)), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        base = None
        for method in methods:
            runs = [r for r in rows if r["task"] == task and r["method"] == method and "curve" in r]
            if not runs:
                continue
            grid = np.array(sorted({t for r in runs for t, _ in r["curve"]}))
            ys = np.stack([np.interp(grid, [t for t, _ in r["curve"]], [v for _, v in r["curve"]]) for r in runs]) * 100
            ax.plot(grid, ys.mean(0), color=colors[method], lw=2, label=f"{method} (n={len(runs)})")
            ax.fill_between(grid, ys.min(0), ys.max(0), color=colors[method], alpha=0.15)
            base = np.mean([r["base"] for r in runs]) * 100
        if base is not None:
            ax.axhline(base, color="k", ls="--", lw=1, label=f"base VLA {base:.0f}%")
        ax.axhline(GOAL["success"] * 100, color="g", ls=":", lw=1, label="goal 90%")
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("environment steps (control ticks)")
        ax.set_ylabel("eval success (%)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(textwrap.fill(title, width=int(95 * max(1, len(tasks)) ** 0.5 * 0.6)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


LEARNER_TIMEOUT_S = 180
"""The actor's ``--learner-timeout`` in a bench's split session (seconds)."""


class SplitSession:
    """A `vla rl` session as a learner process and an actor process on loopback (``--updates async`` needs the
    split), with ``Popen``'s ``poll`` / ``returncode`` so that ``run_jobs`` runs it like a local session: done when
    both have exited, failed when either fails (the other is then stopped)."""

    def __init__(self, session_cmd: list[str], out: str, learner_port: int) -> None:
        env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
        endpoint = f"tcp://127.0.0.1:{learner_port}"
        self.log = open(out + ".log", "w")
        self.actor_log = open(out + ".actor.log", "w")
        self.learner = subprocess.Popen([*session_cmd, "--role", "learner", "--bind", endpoint], cwd=ROOT,
                                        stdout=self.log, stderr=subprocess.STDOUT, env=env)
        # the learner loads the VLA and any demos (viewed through the VLA) before its first word: on a loaded
        # 2-core machine that takes longer than the actor's default 30 s of patience
        self.actor = subprocess.Popen([sys.executable, "-m", "vla.cli", "rl", "--role", "actor", "--learner", endpoint,
                                       "--learner-timeout", str(LEARNER_TIMEOUT_S), "--serve", "always", "--threads", "1"],
                                      cwd=ROOT, stdout=self.actor_log,
                                      stderr=subprocess.STDOUT, env=env)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        codes = [self.learner.poll(), self.actor.poll()]
        if any(c not in (None, 0) for c in codes):
            for p in (self.learner, self.actor):
                if p.poll() is None:
                    p.terminate()
                    p.wait(30)
            codes = [self.learner.returncode, self.actor.returncode]
            self.returncode = next(c for c in codes if c not in (None, 0))
        elif all(c == 0 for c in codes):
            self.returncode = 0
        if self.returncode is not None:
            self.log.close()
            self.actor_log.close()
        return self.returncode


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_session(cmd: list[str], job: dict, updates: str = "lockstep"):
    """Start the `vla rl` session ``cmd`` (no --role) for ``job``: in one process (lockstep), or as learner +
    actor with ``--updates async``. -> a ``Popen``-like handle; the log is ``job["out"] + ".log"``."""
    job["t0"] = time.perf_counter()
    if updates == "async":
        return SplitSession([*cmd, "--updates", "async"], job["out"], free_port())
    log = open(job["out"] + ".log", "w")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})


def run_jobs(jobs: list[dict], work: str, args, launch_fn) -> list[dict]:
    """Run the sessions ``jobs`` ``args.jobs`` at a time, each on its own sim bridge (ports from ``args.port0``),
    started by ``launch_fn(job, site, args)``; a later session of a task reuses the first one's base evaluation.
    -> each session's ``collect`` result, in the order they finished."""
    sites = [site_with_ports(os.path.join(work, f"site{i}.yaml"), args.port0 + 20 * i) for i in range(args.jobs)]
    running: dict[int, tuple[dict, subprocess.Popen]] = {}
    pending, done = list(jobs), []
    t_start = time.perf_counter()
    for job in list(pending):  # --work of a killed bench: finished sessions are collected, unfinished ones re-run
        summary = os.path.join(job["out"], "summary.json")
        if os.path.isfile(summary):
            pending.remove(job)
            with open(summary) as f:
                job["returncode"], job["wall_s"] = 0, json.load(f)["wall_s_this_process"]
            done.append(collect(job))
            print(f"kept {job['task']} {job['method']} seed {job['seed']}: finished earlier in {job['out']}", flush=True)
        elif os.path.isdir(job["out"]):
            print(f"re-running {job['task']} {job['method']} seed {job['seed']}: {job['out']} was left unfinished",
                  flush=True)
            shutil.rmtree(job["out"])
    while pending or running:
        for slot in range(args.jobs):
            if slot not in running and pending:
                job = pending.pop(0)
                reuse_base(job, done)
                running[slot] = (job, launch_fn(job, sites[slot], args))
                print(f"[{time.perf_counter() - t_start:7.0f} s] start {job['task']} {job['method']} seed {job['seed']}",
                      flush=True)
        for slot, (job, proc) in list(running.items()):
            if proc.poll() is not None:
                job["returncode"], job["wall_s"] = proc.returncode, time.perf_counter() - job["t0"]
                r = collect(job)
                done.append(r)
                del running[slot]
                msg = f"final {r['final']:.0%} (base {r['base']:.0%})" if "final" in r else f"FAILED rc={proc.returncode}"
                print(f"[{time.perf_counter() - t_start:7.0f} s] done  {job['task']} {job['method']} seed {job['seed']}: "
                      f"{msg}, {job['wall_s']:.0f} s", flush=True)
        time.sleep(1.0)
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("--jobs", type=int, default=2, help="sessions run in parallel (one sim bridge each)")
    ap.add_argument("--port0", type=int, default=5700,
                    help="session j's sim bridge uses ports port0 + 20 j ... (default 5700; give a second bench run "
                         "on the same machine its own, e.g. 5800)")
    ap.add_argument("--quick", action="store_true", help="1 seed, 96 ticks, tiny updates: a smoke run")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    ap.add_argument("--work", default=None, help="where the session run directories go (default a temp dir)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.total_ticks, args.utd, args.num_critics, args.batch_size = 1, 96, 1, 2, 8
        args.warmup_steps, args.eval_every, args.eval_episodes, args.distill_steps = 2, 0, 1, 1
    work = args.work or tempfile.mkdtemp(prefix="bench-dsrl-")
    os.makedirs(work, exist_ok=True)
    jobs = [{"task": t, "method": m, "seed": s, "out": os.path.join(work, f"{t}-{m}-s{s}")}
            for t in args.tasks for s in range(args.seeds) for m in args.methods]
    t_start = time.perf_counter()
    done = run_jobs(jobs, work, args, launch)
    summary = summarize(done)
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
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "dsrl.json", "w") as f:
        json.dump(res, f, indent=2)
    plot(done, summary, args.out / "dsrl.png",
         f"DSRL on the frozen compact VLA: {args.total_ticks} ticks, UTD {args.utd}, {args.num_critics} critics, "
         f"{args.seeds} seed(s), {args.eval_episodes} eval episodes"
         + (f", {args.noise_dims}-d noise ({args.noise_subspace})" if args.noise_dims else "")
         + (", ORACLE critic input (sim object poses)" if args.encoder == "oracle" else ""))
    for task, ms in summary.items():
        for method, m in ms.items():
            print(f"{task:<18} {method:<9} final {m['final_mean']:.0%} [{m['final_min']:.0%}, {m['final_max']:.0%}] "
                  f"base {m['base_mean']:.0%}  wall {m['wall_s_mean'] / 60:.1f} min")
    print(f"wrote {args.out / 'dsrl.json'} and dsrl.png")
    return 0 if all("final" in r for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
