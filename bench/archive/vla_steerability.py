#!/usr/bin/env python
"""How much of a task the frozen VLA's noise space reaches: K noise streams per scene.

DSRL can only steer a VLA to behaviour its sampler produces from *some* initial noise. This bench
measures that reach directly: for each evaluation scene (the seeds `vla rl` evaluates on, 200000
...) it rolls the frozen VLA out ``--streams`` times, each with its own stream of N(0, I) noise
(one draw per chunk, as the base VLA samples; ``--noise`` picks another distribution), and reports

* pass@1: the base VLA's success rate (the mean over scenes and streams);
* pass@k for k = 1 ... K (the unbiased estimator of Chen et al. 2021, averaged over scenes):
  the chance that at least one of k independent noise streams succeeds on a scene -- what an
  oracle that could try k noise streams per scene and keep the best would reach. It is an
  open-loop yardstick (one whole stream per episode, chosen with hindsight), not a bound on a
  closed-loop noise policy, which picks each chunk's noise from the current state;
* the scenes no stream solved, and the histogram of per-scene success rates.

Writes ``bench/archive/results/vla_steerability.json`` (with every episode's outcome) and ``.png`` (``--name``
for another file name).

    .venv/bin/python -m bench.archive.vla_steerability --checkpoint runs/mid3s --task pick_red_cube --task pick_blue_cube
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import pathlib
import sys
import tempfile
import time

from bench.harness.results import ROOT  # noqa: E402

import numpy as np  # noqa: E402

from bench.harness.sites import site_with_ports  # noqa: E402  (bench/dsrl.py: a sim preset on its own ports)
from bench.harness.stats import wilson  # noqa: E402

# bench/archive/vla_noise_scale.py's noises and rollout (a copy: an archived probe imports no other)
NOISES = {  # name -> (label, sampler(rng, shape))
    "zero": ("w = 0 (the mode)", lambda rng, shape: np.zeros(shape, np.float32)),
    "gauss0.33": ("N(0, 0.33^2 I) (about a default-init actor's spread, b = 1.5)",
                  lambda rng, shape: 0.33 * rng.standard_normal(shape)),
    "gauss1": ("N(0, I) (the base VLA)", lambda rng, shape: rng.standard_normal(shape)),
    "tanh1.5": ("1.5 tanh(N(0, I)) (init_log_std 0 actor, b = 1.5)",
                lambda rng, shape: 1.5 * np.tanh(rng.standard_normal(shape))),
}


def rollout(env, policy, noise_fn, seed: int, shape) -> bool:
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    ticks, info = 0, {}
    while ticks < env.max_ticks:
        chunk = policy(obs, noise=np.asarray(noise_fn(rng, shape), np.float32))[: env.max_ticks - ticks]
        obs, _, term, trunc, info = env.step(chunk)
        ticks += len(chunk)
        if term or trunc:
            break
    return bool(info.get("success", False))



def pass_at_k(outcomes: np.ndarray, k: int) -> float:
    """Mean over scenes (rows of the boolean [scenes, n] matrix) of 1 - C(n - c, k) / C(n, k):
    the chance that k of the scene's n streams, drawn without replacement, hold a success."""
    n = outcomes.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    c = outcomes.sum(axis=1)
    return float(np.mean([1.0 - math.comb(n - int(ci), k) / math.comb(n, k) for ci in c]))


def stream_rng(seed: int, stream: int) -> np.random.Generator:
    """Stream 0 is the noise bench's N(0, I) stream for the scene; others are independent of it."""
    return np.random.default_rng(seed if stream == 0 else [seed, stream])


def run_workers(work, pairs: list, jobs: int, port0: int, log_prefix: str, site: str = "sim-franka-fast",
                **common) -> list:
    """``work(spec)`` in ``jobs`` processes (spawned; in this one for a single job), each on its own copy of
    the ``site`` sim bridge (ports ``port0 + 20 j ...``, log ``LOG_PREFIX.bridgeJ.log``) with every
    ``jobs``-th of ``pairs`` and ``common``. -> the workers' results, in worker order."""
    import multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        specs = [{"index": j, "pairs": pairs[j::jobs], "log": f"{log_prefix}.bridge{j}.log",
                  "robot": site_with_ports(os.path.join(tmp, f"site{j}.yaml"), port0 + 20 * j, site), **common}
                 for j in range(jobs)]
        if jobs == 1:
            return [work(specs[0])]
        with mp.get_context("spawn").Pool(jobs) as pool:
            return pool.map(work, specs)


def eval_policy(checkpoint: str, exec_steps: int | None, window: int | None = None, noise: str = "sample",
                gripper: str = "raw"):
    """A sim-bench worker's policy, run as `vla eval` runs it: one torch thread, the checkpoint's VLA,
    chunks of ``exec_steps`` rows, or temporal ensembling when None (over the newest ``window``
    predictions of each tick; default all); ``noise`` and ``gripper`` as `vla eval --noise / --gripper`."""
    import torch

    from vla.envs import BinaryGripper, TemporalEnsemble, VLAPolicy, gripper_option, noise_option
    from vla.models import load_vla
    from vla.models import resolve_checkpoint

    torch.set_num_threads(1)
    model = load_vla(resolve_checkpoint(checkpoint)).eval()
    base = VLAPolicy(model, exec_steps, **noise_option(noise))
    policy = base if exec_steps else TemporalEnsemble(base, window=window)
    return BinaryGripper(policy) if gripper_option(gripper) == "binary" else policy


def work(job: dict) -> dict:
    """One worker: its own sim bridge, the VLA, and its share of (task, scene) pairs, every stream."""
    import torch

    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from robot_io.bridge_process import running_bridge
    from vla.envs import VLAPolicy, task_env
    from vla.models import load_vla
    from vla.models import resolve_checkpoint

    torch.set_num_threads(1)
    vla = load_vla(resolve_checkpoint(job["checkpoint"]))
    policy = VLAPolicy(vla)
    shape = tuple(vla.noise_shape)
    draw = NOISES[job["noise"]][1]
    site = load_site(job["robot"])
    out: dict = {}
    with running_bridge(site, job["log"]):
        client = RobotClient(site)
        try:
            envs: dict = {}
            for i, (task, seed) in enumerate(job["pairs"]):
                env = envs.setdefault(task, task_env(client, task))
                row = []
                for s in range(job["streams"]):
                    rng = stream_rng(seed, s)
                    row.append(rollout(env, policy, lambda _r, sh: draw(rng, sh), seed, shape))
                out[f"{task}/{seed}"] = row
                print(f"[worker {job['index']}] {i + 1}/{len(job['pairs'])} {task} scene {seed}: "
                      f"{sum(row)}/{len(row)}", flush=True)
        finally:
            client.close()
    os.remove(job["log"])
    return out


def plot(res: dict, streams: int, path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
    ks = np.arange(1, streams + 1)
    for task, r in res.items():
        line, = ax.plot(ks, [100 * v for v in r["pass_at_k"]], marker="o", ms=3, label=task)
        rates = np.asarray(r["per_scene_success_rate"])
        bx.hist(100 * rates, bins=np.linspace(-5, 105, 12), alpha=0.5, color=line.get_color(), label=task)
    ax.axhline(90, color="k", ls="--", lw=0.8, label="DSRL goal 90%")
    ax.set_xlabel("noise streams tried per scene (k)")
    ax.set_ylabel("pass@k %  (some stream succeeds)")
    ax.set_ylim(0, 100)
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    bx.set_xlabel("per-scene success rate over the streams % (bins of 10, centred)")
    bx.set_xticks(range(0, 101, 20))
    bx.set_ylabel("scenes")
    bx.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def portable_path(path: str) -> str:
    """``path`` as committed results may hold it: relative to the working directory when it is
    inside it, else from its last ``runs`` folder on (no machine paths in bench/archive/results)."""
    p = pathlib.Path(path).resolve()
    try:
        return str(p.relative_to(pathlib.Path.cwd()))
    except ValueError:
        parts = p.parts
        i = max((k for k, x in enumerate(parts) if x == "runs"), default=len(parts) - 1)
        return str(pathlib.Path(*parts[i:]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="the frozen VLA (a `vla train` run or checkpoint)")
    ap.add_argument("--task", action="append", dest="tasks", required=True)
    ap.add_argument("--scenes", type=int, default=20, help="evaluation scenes per task")
    ap.add_argument("--streams", type=int, default=16, help="noise streams (episodes) per scene")
    ap.add_argument("--noise", default="gauss1", choices=list(NOISES),
                    help="what each stream draws per chunk (bench/archive/vla_noise_scale.py's distributions; "
                         "default N(0, I), the base VLA's)")
    ap.add_argument("--seed-start", type=int, default=200_000, help="first evaluation seed (`vla rl`'s)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes, one sim bridge each")
    ap.add_argument("--port0", type=int, default=5800, help="worker j's bridge uses ports port0 + 20 j ...")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "archive" / "results")
    ap.add_argument("--name", default="vla_steerability", help="result file names: OUT/NAME.json and .png")
    args = ap.parse_args(argv)
    for name in ("scenes", "streams", "jobs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    os.environ.setdefault("MUJOCO_GL", "egl")

    args.out.mkdir(parents=True, exist_ok=True)
    pairs = [(t, args.seed_start + i) for t in args.tasks for i in range(args.scenes)]
    jobs = min(args.jobs, len(pairs))
    t0 = time.perf_counter()
    parts = run_workers(work, pairs, jobs, args.port0, str(args.out / args.name), checkpoint=args.checkpoint,
                        streams=args.streams, noise=args.noise)
    outcomes = {k: v for p in parts for k, v in p.items()}
    res: dict = {}
    for task in args.tasks:
        seeds = [args.seed_start + i for i in range(args.scenes)]
        m = np.array([outcomes[f"{task}/{s}"] for s in seeds], bool)
        k1 = int(m.sum())
        res[task] = {
            "episodes": int(m.size), "successes": k1, "pass_at_1": float(m.mean()), "pass_at_1_ci95": list(wilson(k1, m.size)),
            "pass_at_k": [pass_at_k(m, k) for k in range(1, args.streams + 1)],
            "scenes_never_solved": [s for s, row in zip(seeds, m) if not row.any()],
            "per_scene_success_rate": [float(r.mean()) for r in m],
            "outcomes": {str(s): [int(x) for x in row] for s, row in zip(seeds, m)}}
        r = res[task]
        print(f"{task:<16} pass@1 {100 * r['pass_at_1']:.1f}%  pass@{args.streams} {100 * r['pass_at_k'][-1]:.1f}%  "
              f"never solved {len(r['scenes_never_solved'])}/{args.scenes} scenes", flush=True)
    out = {"bench": "vla_steerability", "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "checkpoint": portable_path(args.checkpoint), "scenes": args.scenes, "streams": args.streams,
           "seed_start": args.seed_start, "noise": args.noise, "noise_label": NOISES[args.noise][0], "jobs": jobs,
           "wall_s": time.perf_counter() - t0, "results": res}
    with open(args.out / f"{args.name}.json", "w") as f:
        json.dump(out, f, indent=2)
    plot(res, args.streams, args.out / f"{args.name}.png",
         f"frozen VLA {os.path.basename(os.path.normpath(args.checkpoint))}: reach of its noise space "
         f"({args.scenes} scenes x {args.streams} noise streams per task, noise {NOISES[args.noise][0]})")
    print(f"wrote {args.out / args.name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
