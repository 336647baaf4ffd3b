#!/usr/bin/env python
"""The sim-to-rig gap: a DQN trained in pure emulation, evaluated in emulation and through the emulated rig.

1. Train Nature-DQN (``policies.dqn``) on Pong in ``AleEnv`` (ale-py straight, action repeat 4)
   for ``--steps`` agent steps into ``--run`` (resumable: ``--resume`` after a kill).
2. Evaluate it in emulation (``AleEnv``, epsilon 0.05, whole games or ``--max-steps``).
3. Evaluate it through the emulated rig: host screen, simulated camera, emulated microcontroller
   and the edge agent as separate processes (``bench/rig.py``'s ``RigProcesses``); the agent sees
   camera frames rectified with the ArUco homography found at start-up, acts every 2 camera
   frames (30 fps: 4 game ticks, as in training) and presses keys through the microcontroller.
   The game runs in real time: an episode of Pong is minutes of wall time, hence ``--rig-max-steps``.

Scores are human-normalised, 100 * (score - random) / (human - random), with Pong's constants from
the DQN literature: random -20.7, human 9.3 (Mnih et al. 2015, "Human-level control through deep
reinforcement learning", Nature 518, Extended Data Table 2). The rig's noise parameters (the
camera's perspective, distortion, blur, noise, flicker, jitter, drops, latency) are listed in the
JSON. A cut episode (``max_steps``) is scored as it stood.

Writes ``bench/results/rig_gap.json`` and ``rig_gap.png``. The real run (about an hour here):

    .venv/bin/python bench/rig_gap.py --steps 150000 --run runs/rig_gap_dqn [--resume]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.rig import RigProcesses, free_base_port, rig_site  # noqa: E402
from policies.dqn.config import DQNConfig  # noqa: E402
from policies.dqn.dqn import DQN, evaluate, train  # noqa: E402
from policies.dqn.preprocess import AleEnv  # noqa: E402

# Pong, Mnih et al. 2015 (Nature), Extended Data Table 2: random play and the professional human tester
PONG_RANDOM, PONG_HUMAN = -20.7, 9.3


def human_normalised(score: float) -> float:
    return 100.0 * (score - PONG_RANDOM) / (PONG_HUMAN - PONG_RANDOM)


def plot(res: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    ep = res["training"]["episodes_log"]
    if ep:
        ax[0].plot([e["step"] for e in ep], [e["score"] for e in ep], ".", alpha=0.5)
    ax[0].set_xlabel("agent steps")
    ax[0].set_ylabel("training episode score")
    ax[0].set_title(f"DQN on Pong in emulation ({res['training']['steps']} steps)")
    names = ["emulation", "emulated rig"]
    vals = [res["emulation"]["human_normalised"], res["rig"]["human_normalised"]]
    ax[1].bar(names, vals, color=["tab:blue", "tab:red"])
    ax[1].axhline(100, color="k", ls="--", lw=1, label="human")
    ax[1].axhline(0, color="gray", lw=1, label="random")
    for i, v in enumerate(vals):
        ax[1].text(i, v, f"{v:.1f}%", ha="center", va="bottom")
    ax[1].set_ylabel("human-normalised score (%)")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(str(path) + ".tmp.png", dpi=110)
    plt.close(fig)
    os.replace(str(path) + ".tmp.png", path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny budget, seconds (the test)")
    ap.add_argument("--steps", type=int, default=150_000, help="training budget in agent steps (about an hour here)")
    ap.add_argument("--run", default=None, help="the DQN run directory (default: runs/rig_gap_dqn; quick: a temp dir)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --run from its last checkpoint")
    ap.add_argument("--eval-episodes", type=int, default=None, help="games in each evaluation (default 5; quick 1)")
    ap.add_argument("--max-steps", type=int, default=None, help="cut an emulation episode here (default: whole games)")
    ap.add_argument("--rig-max-steps", type=int, default=None,
                    help="cut a rig episode here (15 steps/s of real time; default 1800 = 2 min; quick 30)")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tmp = tempfile.TemporaryDirectory(prefix="rig-gap-")
    if args.quick:
        cfg = DQNConfig(total_steps=min(args.steps, 200), learning_starts=100, buffer_size=1000, batch_size=8,
                        train_every=4, target_update_every=50, checkpoint_every=1000)
        run = args.run or os.path.join(tmp.name, "dqn")
        episodes, max_steps, rig_max = args.eval_episodes or 1, args.max_steps or 60, args.rig_max_steps or 30
    else:
        cfg = DQNConfig(total_steps=args.steps, learning_starts=min(10_000, args.steps // 5 + 32),
                        checkpoint_every=25_000)
        run = args.run or str(ROOT / "runs" / "rig_gap_dqn")
        episodes, max_steps, rig_max = args.eval_episodes or 5, args.max_steps, args.rig_max_steps or 1800

    # 1. train in pure emulation
    def make_env(c: DQNConfig) -> AleEnv:
        return AleEnv(c.game, c.frame_skip, c.noop_max, c.max_episode_steps, seed=c.seed)

    summary = train(cfg, make_env, run, resume=args.resume, progress=not args.quick)
    agent = DQN.from_checkpoint(run)
    ep_path = os.path.join(run, "episodes.jsonl")  # absent when no game ended within the budget
    ep_log = [json.loads(ln) for ln in open(ep_path) if ln.strip()] if os.path.isfile(ep_path) else []

    # 2. evaluate in emulation (whole games, no life-loss terminals)
    emu = evaluate(agent, make_env(cfg), episodes, epsilon=cfg.eval_epsilon, seed=10_000, max_steps=max_steps)
    emu["human_normalised"] = human_normalised(emu["mean"])

    # 3. evaluate through the emulated rig, every part its own process
    site = rig_site(tmp.name, free_base_port())
    stats = os.path.join(tmp.name, "rig_agent.json")
    rig_budget_s = episodes * rig_max / 15.0 + 60
    with RigProcesses(site, tmp.name, duration=rig_budget_s + 60) as rig:
        time.sleep(1.0)
        r = rig.agent(["--policy", "dqn", "--checkpoint", run, "--epsilon", str(cfg.eval_epsilon), "--episodes",
                       str(episodes), "--max-steps", str(rig_max), "--seed", "10000", "--stats", stats],
                      timeout=rig_budget_s + 60)
        if r.returncode != 0:
            print(r.stdout[-2000:], r.stderr[-4000:], rig.logs(), sep="\n", file=sys.stderr)
            return 1
    with open(stats) as f:
        rig_res = json.load(f)
    rig_scores = rig_res["scores"]
    cam = rig_res["camera"]
    res = {
        "bench": "rig_gap", "mode": "quick" if args.quick else "full",
        "date": _dt.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
        "python": platform.python_version(), "torch": torch.__version__, "threads": 1,
        "constants": {"pong_random": PONG_RANDOM, "pong_human": PONG_HUMAN,
                      "source": "Mnih et al. 2015, Nature 518, Extended Data Table 2"},
        "training": {"steps": summary["steps"], "episodes": summary["episodes"], "updates": summary["updates"],
                     "sps": summary["sps"], "wall_s": summary["wall_s"], "run": run, "config": cfg.to_dict(),
                     "episodes_log": [{"step": e["step"], "score": e["score"]} for e in ep_log]},
        "emulation": {**emu, "max_steps": max_steps},
        "rig": {"scores": rig_scores, "mean": float(np.mean(rig_scores)), "episodes": len(rig_scores),
                "human_normalised": human_normalised(float(np.mean(rig_scores))), "max_steps": rig_max,
                "latency_and_frames": rig_res["rig"]},
        "rig_noise": {k: cam.get(k) for k in ("width", "height", "fps", "yaw_deg", "pitch_deg", "roll_deg", "hfov_deg",
                                              "fill", "dist_true", "blur_sigma", "noise_std", "exposure", "flicker",
                                              "flicker_hz", "jitter_ms", "drop_prob", "latency_ms")},
        "note": "episodes cut at max_steps are scored as they stood; with a cut, the random / human constants "
                "(whole games) flatter neither side equally -- compare emulation and rig at equal cuts",
    }
    res["gap_points"] = res["emulation"]["human_normalised"] - res["rig"]["human_normalised"]
    res["wall_s"] = round(time.time() - t0, 1)
    with open(args.out / "rig_gap.json.tmp", "w") as f:
        json.dump(res, f, indent=2)
    os.replace(args.out / "rig_gap.json.tmp", args.out / "rig_gap.json")
    plot(res, args.out / "rig_gap.png")
    tmp.cleanup()
    print(f"emulation {emu['mean']:.1f} ({res['emulation']['human_normalised']:.1f}% human), rig "
          f"{res['rig']['mean']:.1f} ({res['rig']['human_normalised']:.1f}% human); wrote {args.out / 'rig_gap.json'} "
          f"in {res['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
