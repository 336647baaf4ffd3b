#!/usr/bin/env python
"""Which behaviour token works in which crowded scene? (issue 33, ExToken)

Run ``.venv/bin/python -m bench.archive.token_scenes --checkpoint runs/extoken/paired --tokens data/extoken/tokens_paired_k2.json
[--baseline-checkpoint runs/extoken/notok_paired] [--episodes 20] [--seed-start 200000]``.
It writes ``bench/archive/results/<name>.json`` and ``<name>.png`` (default name ``extoken_scenes``).

What the selector of ``vla rl --method extoken`` can gain before any RL: the token-conditioned VLA is rolled out on the
same ``pick_red_cube_crowded`` scenes (the RL sessions' evaluation seeds by default) under every token held for the
whole episode (as ``vla eval --token K`` runs it: chunk execution ``--exec-steps 4``, the same noise per episode seed
under every token), and by the token-free baseline. Each scene is labelled with its free grasp turn, read off the layout the way ``bench/archive/expert_modes.py`` does
(the turn whose finger axis does not land on the neighbour). Each token's turn comes from the tokens file's purity
table (``vla tokens --purity-field expert_mode``). Reported:

* success per token, split by whether the token's turn is the scene's free turn ("matched") or the blocked one;
* the **oracle token** (PRIVILEGED: the free turn read off the simulator's layout, what a perfect selector would
  pick), against a random token (the no-selector ablation's expectation) and the token-free baseline;
* best-of-tokens: scenes where some token succeeded (a selector's ceiling at this base's grasp precision);
* where each episode ended (PRIVILEGED object poses, diagnostics only): success, the red cube lifted but the
  neighbour knocked, another object lifted, nothing lifted; and the finger turn at the first closing command
  (ccw > 0), which says whether the token chose the turn.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import platform
import math
import sys
import tempfile
import time

os.environ.setdefault("MUJOCO_GL", "egl")
from bench.harness.results import ROOT  # noqa: E402

import numpy as np  # noqa: E402

from hardware.sim_tasks import HOME_FINGER_ANGLE, get_task, quat_to_mat  # noqa: E402
from hardware.teleop.scripted import finger_angle, turned_angle  # noqa: E402
from vla.evaluate import wilson_interval  # noqa: E402


# bench/archive/expert_modes.py's (a copy: an archived probe imports no other)
def blocked_mode(layout: dict, cube: str = "red_cube", neighbour: str = "blue_cube") -> str:
    """The turning mode whose finger axis (turned from the home finger angle) lies along the neighbour's side."""
    (x, y, yaw), (nx, ny, _) = layout[cube], layout[neighbour]
    toward = math.atan2(ny - y, nx - x)
    off = {m: abs(math.remainder(turned_angle(yaw, HOME_FINGER_ANGLE, m) - toward, math.pi)) for m in ("ccw", "cw")}
    return min(off, key=off.get)


TASK = "pick_red_cube_crowded"
TARGET, NEIGHBOUR = "red_cube", "blue_cube"


def token_modes(tokens_file: str) -> dict[int, str]:
    """Token -> the expert mode most of its episodes were recorded in (the file's purity table)."""
    with open(tokens_file) as f:
        meta = json.load(f)
    pur = meta.get("purity")
    if not pur or pur.get("field") != "expert_mode":
        raise ValueError(f"{tokens_file}: no purity table against expert_mode (make it with `vla tokens "
                         f"--purity-field expert_mode`)")
    return {int(k): max(v, key=v.get) for k, v in pur["table"].items()}


def free_turns(task_name: str, seeds: list[int]) -> dict[int, str]:
    """Scene seed -> the grasp turn that does not land a finger on the neighbour (read off the layout)."""
    task = get_task(task_name)
    out = {}
    for s in seeds:
        blocked = blocked_mode(task.layout(np.random.default_rng(s)))
        out[s] = "cw" if blocked == "ccw" else "ccw"
    return out


LIFT_M, DISTURBED_M, DISTURBED_DEG = 0.03, 0.01, 10.0


def _tilt_deg(q) -> float:
    return math.degrees(math.acos(min(1.0, abs(float(quat_to_mat(np.asarray(q, np.float64))[2, 2])))))


def rollout(env, policy, seed: int, names: list[str], target: str, neighbour: str) -> dict:
    """One episode exactly as ``vla eval`` runs it (``vla.envs.step_chunk``, the episode's noise seeds), plus what
    the simulator's object poses (PRIVILEGED, diagnostics only) say happened: the finger turn at the first closing
    command (deg, ccw > 0, read at the end of that chunk), which object rose > 3 cm, whether the neighbour moved
    > 1 cm or tilted > 10 degrees."""
    from vla.envs import step_chunk

    n = len(names)
    obs, _ = env.reset(seed=seed)
    policy.reset(seed)

    def objects(o) -> np.ndarray:
        v = np.asarray(o["privileged"], np.float64)
        ee = v[7 * n: 7 * n + 3]
        return np.concatenate([v[: 3 * n].reshape(n, 3) + ee, v[3 * n: 7 * n].reshape(n, 4)], axis=1)

    o0 = objects(obs)
    a0 = finger_angle(obs["state"][3:7])
    rise = np.zeros(n)
    moved = tilt = 0.0
    turn = None
    ticks, success, done = 0, False, False
    j = names.index(neighbour)
    while ticks < env.max_ticks and not done:
        chunk = policy(obs)[: env.max_ticks - ticks]
        st = step_chunk(env, chunk, chunked=True)
        obs, ticks = st.obs, ticks + st.rows
        success = success or bool(st.info.get("success", st.reward > 0))
        done = st.terminated or st.truncated
        ob = objects(obs)
        rise = np.maximum(rise, ob[:, 2] - o0[:, 2])
        moved = max(moved, float(np.linalg.norm(ob[j, :2] - o0[j, :2])))
        tilt = max(tilt, _tilt_deg(ob[j, 3:7]))
        if turn is None and float(np.min(chunk[:, 6])) < 0.5:
            turn = math.degrees(math.remainder(finger_angle(obs["state"][3:7]) - a0, 2 * math.pi))
    lifted = [names[i] for i in range(n) if rise[i] > LIFT_M]
    disturbed = bool(moved > DISTURBED_M or tilt > DISTURBED_DEG)
    if success:
        outcome = "success"
    elif target in lifted and disturbed:
        outcome = "lifted, neighbour knocked"
    elif target in lifted:
        outcome = "lifted, other"
    elif lifted:
        outcome = "lifted another object"
    elif disturbed:
        outcome = "no lift, neighbour knocked"
    else:
        outcome = "no lift"
    return {"success": success, "ticks": ticks, "turn_deg": turn, "lifted": lifted, "neighbour_moved_m": moved,
            "neighbour_tilt_deg": tilt, "neighbour_disturbed": disturbed, "outcome": outcome}


def run_arm(checkpoint: str, token: int | None, args, seeds: list[int]) -> dict[int, dict]:
    """Every scene of ``seeds`` with ``checkpoint`` under ``token`` (None: the model's own default)."""
    import torch
    from tqdm import tqdm

    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from robot_io.bridge_process import running_bridge
    from vla.envs import VLAPolicy, task_env
    from vla.models import load_vla
    from vla.models import resolve_checkpoint

    torch.set_num_threads(args.threads)
    model = load_vla(resolve_checkpoint(checkpoint)).eval()
    policy = VLAPolicy(model, args.exec_steps, token=token)
    out: dict[int, dict] = {}
    log = os.path.join(args.work, "bridge.log")
    with running_bridge(load_site(args.robot), log, start="auto"):
        client = RobotClient(load_site(args.robot))
        try:
            env = task_env(client, args.task, privileged=True)
            names = list(client.description["objects"])
            bar = tqdm(seeds, desc=f"token {token}" if token is not None else "baseline", unit="ep")
            for s in bar:
                out[s] = rollout(env, policy, s, names, TARGET, NEIGHBOUR)
                bar.set_postfix_str(f"{sum(r['success'] for r in out.values())}/{len(out)}")
            env.close()
        finally:
            client.close()
    return out


def rate(k: int, n: int) -> dict:
    lo, hi = wilson_interval(k, n) if n else (0.0, 0.0)
    return {"successes": k, "episodes": n, "rate": k / n if n else None, "ci95": [lo, hi]}


def plot(summary: dict, path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(k, v) for k, v in summary.items() if isinstance(v, dict) and "ci95" in v]
    fig, ax = plt.subplots(figsize=(1.3 * len(rows) + 2, 3.6))
    for i, (name, v) in enumerate(rows):
        lo, hi = v["ci95"]
        ax.bar(i, 100 * v["rate"], color="tab:orange" if "oracle" in name else "tab:blue")
        ax.errorbar(i, 100 * v["rate"], yerr=[[100 * (v["rate"] - lo)], [100 * (hi - v["rate"])]], color="k",
                    capsize=3)
        ax.text(i, 100 * hi + 2, f"{v['successes']}/{v['episodes']}", ha="center", fontsize=8)
    ax.set_xticks(range(len(rows)), [n.replace("_", "\n") for n, _ in rows], fontsize=7)
    ax.set_ylabel("success (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summarize(runs: dict[int, dict[int, dict]], base: dict[int, dict] | None, modes: dict[int, str],
              free: dict[int, str], seeds: list[int]) -> tuple[dict, dict, dict, list]:
    """``runs``: token -> seed -> ``rollout`` record (token 0 = null); ``base``: the token-free VLA's (or None).
    Returns the success summary, the outcome counts and finger turns per arm, and the per-scene rows."""
    ok = {k: {s: r[s]["success"] for s in seeds} for k, r in runs.items()}

    n = len(seeds)
    summary: dict = {}
    for k, m in sorted(modes.items()):
        matched = [s for s in seeds if free[s] == m]
        summary[f"token_{k}_{m}"] = rate(sum(ok[k][s] for s in seeds), n)
        summary[f"token_{k}_{m}_matched"] = rate(sum(ok[k][s] for s in matched), len(matched))
        summary[f"token_{k}_{m}_blocked"] = rate(sum(ok[k][s] for s in seeds if s not in matched), n - len(matched))
    by_mode = {m: k for k, m in modes.items()}
    other = {"ccw": "cw", "cw": "ccw"}
    summary["null_token"] = rate(sum(ok[0][s] for s in seeds), n)
    summary["oracle_token"] = rate(sum(ok[by_mode[free[s]]][s] for s in seeds), n)
    summary["oracle_token"]["privileged"] = "the free turn read off the simulator's layout"
    summary["wrong_token"] = rate(sum(ok[by_mode[other[free[s]]]][s] for s in seeds), n)
    summary["random_token_expected"] = {"rate": float(np.mean([np.mean([ok[k][s] for k in modes]) for s in seeds]))}
    summary["best_of_tokens"] = rate(sum(any(ok[k][s] for k in modes) for s in seeds), n)
    if base is not None:
        summary["token_free_baseline"] = rate(sum(base[s]["success"] for s in seeds), n)
    # where the episodes end, and which way each token turned the fingers
    arms = {f"token {k} ({modes.get(k, 'null')})": runs[k] for k in runs}
    if base is not None:
        arms["token-free baseline"] = base
    outcomes = {name: dict(sorted({o: sum(r[s]["outcome"] == o for s in seeds)
                                   for o in {r[s]["outcome"] for s in seeds}}.items())) for name, r in arms.items()}
    turns = {}
    for name, r in arms.items():
        t = [r[s]["turn_deg"] for s in seeds if r[s]["turn_deg"] is not None]
        turns[name] = {"closed": len(t), "ccw_past_20deg": sum(x > 20 for x in t), "cw_past_20deg": sum(x < -20 for x in t),
                       "mean_deg": float(np.mean(t)) if t else None}
    scenes = [{"seed": s, "free_turn": free[s], **{name: r[s] for name, r in arms.items()}} for s in seeds]
    return summary, outcomes, turns, scenes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--checkpoint", required=True, help="the token-conditioned VLA (`vla train --tokens`)")
    ap.add_argument("--tokens", required=True, help="the tokens.json it trained with (token -> turn)")
    ap.add_argument("--baseline-checkpoint", help="the token-free VLA on the same demos (optional)")
    ap.add_argument("--task", default=TASK)
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--seed-start", type=int, default=200_000,
                    help="first scene seed (default 200000: the RL sessions' evaluation scenes)")
    ap.add_argument("--exec-steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="extoken_scenes")
    ap.add_argument("--out", default=str(ROOT / "bench" / "archive" / "results"))
    ap.add_argument("--robot", default="sim-franka-fast", help="the simulated arm (default sim-franka-fast)")
    ap.add_argument("--work", help="where the bridge log goes (default a temp dir)")
    args = ap.parse_args(argv)

    modes = token_modes(args.tokens)
    seeds = list(range(args.seed_start, args.seed_start + args.episodes))
    free = free_turns(args.task, seeds)
    args.work = args.work or tempfile.mkdtemp(prefix="token_scenes-")
    os.makedirs(args.work, exist_ok=True)
    t0 = time.perf_counter()
    runs: dict[int, dict[int, dict]] = {}
    for k in [0, *sorted(modes)]:
        runs[k] = run_arm(args.checkpoint, k, args, seeds)
    base = run_arm(args.baseline_checkpoint, None, args, seeds) if args.baseline_checkpoint else None
    wall = time.perf_counter() - t0
    summary, outcomes, turns, scenes = summarize(runs, base, modes, free, seeds)
    n = len(seeds)
    report = {
        "bench": "token_scenes", "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "settings": {"checkpoint": args.checkpoint, "tokens": args.tokens, "token_modes": modes,
                     "baseline_checkpoint": args.baseline_checkpoint, "task": args.task, "episodes": n,
                     "seed_start": args.seed_start, "exec_steps": args.exec_steps},
        "wall_s": wall, "summary": summary, "outcomes": outcomes, "turns": turns, "scenes": scenes,
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{args.name}.json.tmp"
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, out / f"{args.name}.json")
    plot(summary, out / f"{args.name}.png", f"{args.task}, {n} scenes: success per behaviour token")
    for name, v in summary.items():
        if "successes" in v:
            lo, hi = v["ci95"]
            print(f"{name:<28} {v['successes']:>3}/{v['episodes']:<3} {100 * v['rate']:5.1f}%  "
                  f"[{100 * lo:.0f}, {100 * hi:.0f}]")
        else:
            print(f"{name:<28} {100 * v['rate']:5.1f}%")
    print("\noutcomes:")
    for name, o in outcomes.items():
        print(f"  {name:<22} " + ", ".join(f"{k} {v}" for k, v in o.items()))
    print("finger turn at the first close (deg):")
    for name, t in turns.items():
        print(f"  {name:<22} closed {t['closed']}, ccw > 20: {t['ccw_past_20deg']}, cw < -20: {t['cw_past_20deg']}, "
              f"mean {t['mean_deg'] if t['mean_deg'] is None else round(t['mean_deg'], 1)}")
    print(f"wrote {out / (args.name + '.json')} ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
