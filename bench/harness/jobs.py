"""Session jobs and sim workers.

* `vla rl` sessions as jobs (``run_jobs``): ``--jobs`` at a time, each on its own sim site (leased ports, or
  ``--port0``'s), a killed run's finished sessions kept, the base evaluation of a task shared between its
  sessions; ``collect`` reads a finished session's learning curve (``summary.json``, ``evals.jsonl``). A session
  runs in one process, or as learner + actor with ``--updates async`` (``SplitSession``).
* sim workers (``run_workers``): a function over (task, scene) pairs in a few processes, each with its own sim
  bridge, and the policy a worker runs as `vla eval` runs it (``eval_policy``).
* the GRPO-family session command line (``grpo_session``) and its logs (``session_logs``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench.harness.results import ROOT
from bench.harness.sites import bench_sites

GOAL_SUCCESS = 0.9
"""``collect``'s ``first_tick_at_90``: the first tick at which an evaluation reached this success rate."""
LEARNER_TIMEOUT_S = 180
"""The actor's ``--learner-timeout`` in a bench's split session (seconds)."""


def _env() -> dict:
    return {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


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


def collect(job: dict) -> dict:
    """A finished session's row: its job's task / method / seed / out, wall clock and return code, and (when it
    succeeded) its base, final and periodic evaluations as a curve of (tick, success rate)."""
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
    reached = next((t for t, r in curve[1:] if r >= GOAL_SUCCESS), None)
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


def summarize(rows: list[dict]) -> dict:
    """Per task and method: the sessions' final and base success, wall clock and first tick at 90%, with the final
    success's mean / min / max / std over seeds."""
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


class SplitSession:
    """A `vla rl` session as a learner process and an actor process on loopback (``--updates async`` needs the
    split), with ``Popen``'s ``poll`` / ``returncode`` so that ``run_jobs`` runs it like a local session: done when
    both have exited, failed when either fails (the other is then stopped). The learner's port is leased for the
    session's span."""

    def __init__(self, session_cmd: list[str], out: str) -> None:
        from robot_io.ports import PortLease

        self.lease = PortLease(1)
        endpoint = f"tcp://127.0.0.1:{self.lease.ports[0]}"
        self.log = open(out + ".log", "w")
        self.actor_log = open(out + ".actor.log", "w")
        self.learner = subprocess.Popen([*session_cmd, "--role", "learner", "--bind", endpoint], cwd=ROOT,
                                        stdout=self.log, stderr=subprocess.STDOUT, env=_env())
        # the learner loads the VLA and any demos (viewed through the VLA) before its first word: on a loaded
        # 2-core machine that takes longer than the actor's default 30 s of patience
        self.actor = subprocess.Popen([sys.executable, "-m", "vla.cli", "rl", "--role", "actor", "--learner", endpoint,
                                       "--learner-timeout", str(LEARNER_TIMEOUT_S), "--serve", "always", "--threads", "1"],
                                      cwd=ROOT, stdout=self.actor_log, stderr=subprocess.STDOUT, env=_env())
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
            self.lease.release()
        return self.returncode


def start_session(cmd: list[str], job: dict, updates: str = "lockstep"):
    """Start the `vla rl` session ``cmd`` (no --role) for ``job``: in one process (lockstep), or as learner +
    actor with ``--updates async``. -> a ``Popen``-like handle; the log is ``job["out"] + ".log"``."""
    job["t0"] = time.perf_counter()
    if updates == "async":
        return SplitSession([*cmd, "--updates", "async"], job["out"])
    log = open(job["out"] + ".log", "w")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=_env())


def run_jobs(jobs: list[dict], work: str, args, launch_fn) -> list[dict]:
    """Run the sessions ``jobs`` ``args.jobs`` at a time, each slot on its own sim site (leased ports, or
    ``args.port0``'s when given), started by ``launch_fn(job, site, args)``; a later session of a task reuses the
    first one's base evaluation. -> each session's ``collect`` result, in the order they finished."""
    with bench_sites(args.jobs, work, getattr(args, "port0", None)) as sites:
        return _run_jobs(jobs, sites, args, launch_fn)


def _run_jobs(jobs: list[dict], sites: list[str], args, launch_fn) -> list[dict]:
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


def max_steps(task: str) -> int:
    """The sim task's episode limit (ticks)."""
    from hardware.sim_tasks import get_task

    return int(get_task(task).max_steps)


def grpo_session(job: dict, site: str, args, checkpoint: str, updates: int) -> list[str]:
    """The `vla rl` command line every GRPO-family arm shares (``bench/lfh.py``'s and ``bench/extoken.py``'s):
    ``updates`` policy updates of ``args.group_size`` x ``args.groups_per_update`` rollouts from ``checkpoint``; the
    caller adds ``--method`` and the method's own flags."""
    per_update = args.group_size * args.groups_per_update
    ticks = updates * per_update * max_steps(job["task"])  # an upper bound: successes end episodes early
    return [sys.executable, "-m", "vla.cli", "rl", "--checkpoint", checkpoint, "--task", job["task"],
            "--out", job["out"], "--robot", site, "--seed", str(job["seed"]), "--exec-steps", str(args.exec_steps),
            "--eval-episodes", str(args.eval_episodes), "--threads", "1", "--serve", "always", "--videos", "0",
            "--total-ticks", str(ticks), "--eval-every", str(args.eval_every_updates * per_update),
            "--checkpoint-every", str(per_update), "--warmup-steps", "0",
            "--group-size", str(args.group_size), "--groups-per-update", str(args.groups_per_update),
            "--sigma", str(args.sigma), "--lr", str(args.lr), "--train", args.train,
            "--total-episodes", str(updates * per_update)]


def session_logs(out: str) -> tuple[list[dict], list[dict], list[dict]]:
    """A finished session's evaluations (``evals.jsonl``), training episodes (``episodes.jsonl``) and, among those,
    the ones that completed a policy update (they carry the update's ``charts/*``)."""
    path = os.path.join(out, "evals.jsonl")
    evals = [json.loads(x) for x in open(path)] if os.path.isfile(path) else []
    eps = [json.loads(x) for x in open(os.path.join(out, "episodes.jsonl"))]
    return evals, eps, [e for e in eps if "charts/usable_groups" in e]


def run_workers(work, pairs: list, jobs: int, port0: int | None, log_prefix: str, site: str = "sim-franka-fast",
                **common) -> list:
    """``work(spec)`` in ``jobs`` processes (spawned; in this one for a single job), each on its own copy of
    the ``site`` sim preset (leased ports, or port0 + 20 j ... when given; bridge log ``LOG_PREFIX.bridgeJ.log``)
    with every ``jobs``-th of ``pairs`` and ``common``. -> the workers' results, in worker order."""
    import multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp, bench_sites(jobs, tmp, port0, site) as sites:
        specs = [{"index": j, "pairs": pairs[j::jobs], "log": f"{log_prefix}.bridge{j}.log", "robot": sites[j],
                  **common} for j in range(jobs)]
        if jobs == 1:
            return [work(specs[0])]
        with mp.get_context("spawn").Pool(jobs) as pool:
            return pool.map(work, specs)


def eval_policy(checkpoint: str, exec_steps: int | None, window: int | None = None, noise: str = "sample",
                gripper: str = "raw"):
    """A sim worker's policy, run as `vla eval` runs it: one torch thread, the checkpoint's VLA, chunks of
    ``exec_steps`` rows, or temporal ensembling when None (over the newest ``window`` predictions of each tick;
    default all); ``noise`` and ``gripper`` as `vla eval --noise / --gripper`."""
    import torch

    from vla.envs import BinaryGripper, TemporalEnsemble, VLAPolicy, gripper_option, noise_option
    from vla.models import load_vla
    from vla.models import resolve_checkpoint

    torch.set_num_threads(1)
    model = load_vla(resolve_checkpoint(checkpoint)).eval()
    base = VLAPolicy(model, exec_steps, **noise_option(noise))
    policy = base if exec_steps else TemporalEnsemble(base, window=window)
    return BinaryGripper(policy) if gripper_option(gripper) == "binary" else policy
