#!/usr/bin/env python
"""How the frozen VLA's success depends on the initial noise its flow sampler starts from.

DSRL steers a VLA through that noise, and its noise policy's first draws decide where a session
starts: the base VLA samples w ~ N(0, I) per chunk; a fresh SAC actor with PyTorch's default
init draws w = b tanh(u) with u's std around 0.22 (so w's about 0.33) about a state-dependent
mean, close to one chunk per state; with
``init_log_std 0`` (the `vla rl` default) it draws b tanh(N(0, 1)). This bench rolls the VLA out
on the sim tasks with each of these noise distributions, on the evaluation seeds `vla rl` uses
(200000 ...), one noise draw per chunk from a generator seeded by the episode.

Writes ``bench/archive/results/vla_noise_scale.json`` and ``.png`` (success per task and noise, 95% Wilson
intervals).

    .venv/bin/python -m bench.archive.vla_noise_scale --checkpoint runs/mid3s --task pick_red_cube --task pick_blue_cube
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import sys
import time

from bench.harness.results import ROOT  # noqa: E402

import numpy as np  # noqa: E402

from bench.harness.stats import wilson  # noqa: E402

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


def plot(res: dict, path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(res)
    names = [n for n in NOISES if n in res[tasks[0]]]
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        x = np.arange(len(tasks)) + (j - (len(names) - 1) / 2) * width
        r = [res[t][name] for t in tasks]
        y = [100 * v["success_rate"] for v in r]
        err = [[100 * (v["success_rate"] - v["ci95"][0]) for v in r], [100 * (v["ci95"][1] - v["success_rate"]) for v in r]]
        ax.bar(x, y, width, yerr=err, capsize=3, label=NOISES[name][0])
    ax.set_xticks(np.arange(len(tasks)), tasks)
    ax.set_ylabel("success %")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="the frozen VLA (a `vla train` run or checkpoint)")
    ap.add_argument("--task", action="append", dest="tasks", required=True)
    ap.add_argument("--noise", nargs="+", default=list(NOISES), choices=list(NOISES))
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--seed-start", type=int, default=200_000, help="first evaluation seed (`vla rl`'s)")
    ap.add_argument("--robot", default="sim-franka-fast", help="site preset or YAML (another port set for parallel runs)")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "archive" / "results")
    args = ap.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    import torch
    from tqdm import tqdm

    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from robot_io.bridge_process import running_bridge
    from vla.envs import VLAPolicy, task_env
    from vla.models import load_vla
    from vla.models import resolve_checkpoint

    torch.set_num_threads(1)
    vla = load_vla(resolve_checkpoint(args.checkpoint))
    policy = VLAPolicy(vla)
    site = load_site(args.robot)
    res: dict = {}
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    with running_bridge(site, str(args.out / "vla_noise_scale.bridge.log")):
        client = RobotClient(site)
        try:
            for task in args.tasks:
                env = task_env(client, task)
                res[task] = {}
                for name in args.noise:
                    seeds = range(args.seed_start, args.seed_start + args.episodes)
                    ok = [rollout(env, policy, NOISES[name][1], s, tuple(vla.noise_shape))
                          for s in tqdm(seeds, desc=f"{task} {name}", unit="ep")]
                    k = int(sum(ok))
                    res[task][name] = {"successes": k, "episodes": args.episodes, "success_rate": k / args.episodes,
                                       "ci95": list(wilson(k, args.episodes)), "label": NOISES[name][0]}
                    print(f"{task:<16} {name:<10} {k}/{args.episodes}", flush=True)
        finally:
            client.close()
    os.remove(args.out / "vla_noise_scale.bridge.log")
    out = {"bench": "vla_noise_scale", "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "checkpoint": args.checkpoint, "episodes": args.episodes, "seed_start": args.seed_start,
           "wall_s": time.perf_counter() - t0, "results": res}
    with open(args.out / "vla_noise_scale.json", "w") as f:
        json.dump(out, f, indent=2)
    plot(res, args.out / "vla_noise_scale.png",
         f"frozen VLA {os.path.basename(os.path.normpath(args.checkpoint))}: success by initial-noise distribution "
         f"({args.episodes} episodes each)")
    print(f"wrote {args.out / 'vla_noise_scale.json'} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
