#!/usr/bin/env python
"""Scripted-expert benchmark: success rate of the privileged oracle on every sim task.

Run ``.venv/bin/python -m bench.experts [--episodes 50] [--qualities 0.8 0.5 0.2]
[--low-episodes 20] [--tasks a,b] [--quick] [--workers 2] [--out DIR] [--replot]``. It writes
``DIR/experts.json`` and ``DIR/experts.png`` (default DIR: bench/results) and prints a table.

Each episode runs directly on ``SimFranka(realtime=False)`` (no bridge, for speed) and applies
the expert's action exactly as ``robot_io.server.ArmService`` does for an ``ee_delta`` command:
``robot_io.limits.clip_ee_delta`` (max step 5 cm, 0.25 rad, workspace box), the target
orientation ``axis_angle(drot) * measured quat``, ``command_ee_pose``, then one control period
(``step()``, 0.1 s). An episode is a success when the task's predicate holds at some tick (what
``rewards.sim_success`` terminates on) within ``task.max_steps`` ticks; its length is the number
of ticks until then (or until the expert raised ``success`` / ``failure``). Episode ``i`` of a
task uses reset seed ``1000 + i`` (the same scenes at every quality level), which also keys
the expert's random streams and its mistake schedule (expert seed 0).

Full quality runs ``--episodes`` (default 50) per task; each lowered quality ``--low-episodes``
(default 20), next to its predicted rate (``hardware.teleop.scripted.expected_success`` times the
measured full-quality rate). ``--quick`` (3 episodes, one lowered quality) is a smoke test.
Work is spread over ``--workers`` processes (default 2), one simulator each.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import multiprocessing as mp
import os
import pathlib
import platform
import sys
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402

from hardware.sim_tasks import TASKS, get_task, objects_from_state  # noqa: E402
from hardware.teleop.scripted import ScriptedExpert, expected_success  # noqa: E402
from robot_io import limits as L  # noqa: E402

from bench.harness import flags, plots  # noqa: E402
from bench.harness.results import write_result  # noqa: E402


RESET_SEED0 = 1000


def apply_ee_delta(sim, action: np.ndarray, lim: L.ArmLimits) -> None:
    """One ``ee_delta`` command, applied the way ``ArmService.handle`` does, then one control period."""
    a = np.asarray(action, np.float32).tolist()
    s = sim.read_state()
    target, _, drot, grip, _ = L.clip_ee_delta(lim, s.ee_pos, a[:3], a[3:6], a[6])
    quat = L.quat_mul(L.axis_angle_to_quat(drot), s.ee_quat)
    sim.command_ee_pose(target, quat / math.sqrt(float(quat @ quat)), grip)
    sim.step()


def privileged_from_state(s, names) -> dict:
    """What a recorder hands a scripted expert: the raw state arrays and the object names."""
    return {"objects": s.extras["objects"], "object_names": list(names), "ee_pos": s.ee_pos,
            "ee_quat": s.ee_quat, "gripper": np.array([s.gripper])}


def run_episode(sim, task_name: str, expert: ScriptedExpert, seed: int, lim: L.ArmLimits | None = None) -> dict:
    """One expert episode on ``sim`` (fast mode, connected). Returns success, length, subgoals."""
    lim = lim or L.ArmLimits()
    task = get_task(task_name)
    names = sim.describe()["objects"]
    s = sim.reset(seed=seed, task=task_name)
    expert.begin_episode(task_name, seed=seed, instruction=task.instruction)
    success, length, events, achieved = False, task.max_steps, frozenset(), {}
    for t in range(task.max_steps):
        cmd = expert.read(None, privileged_from_state(s, names))
        apply_ee_delta(sim, cmd.action, lim)
        s = sim.read_state()
        objs = objects_from_state(s, names)
        for k, v in task.subgoals(objs, s.ee_pos, s.gripper).items():
            achieved[k] = achieved.get(k, False) or v
        if task.success(objs, s.ee_pos, s.gripper):
            success, length = True, t + 1
            break
        if cmd.events & {"success", "failure"}:
            events, length = cmd.events, t + 1
            break
    return {"success": success, "length": length, "events": sorted(events), "subgoals": achieved,
            "mistake": expert.mistake is not None, "regrasps": expert.regrasps}


def _work(job: tuple) -> dict:
    task_name, quality, episode = job
    global _SIM
    if "_SIM" not in globals():
        from hardware.sim_franka import SimFranka

        _SIM = SimFranka(realtime=False, seed=0)
        _SIM.connect()
    expert = ScriptedExpert(quality=quality, seed=0)  # its random streams are keyed by the episode seed
    t0 = time.perf_counter()
    r = run_episode(_SIM, task_name, expert, RESET_SEED0 + episode)
    r.update(task=task_name, quality=quality, episode=episode, wall_s=time.perf_counter() - t0)
    return r


def summarise(rows: list[dict], tasks: list[str], qualities: list[float]) -> dict:
    out: dict = {}
    for tn in tasks:
        full = [r for r in rows if r["task"] == tn and r["quality"] == 1.0]
        s_full = float(np.mean([r["success"] for r in full])) if full else float("nan")
        out[tn] = {"instruction": TASKS[tn].instruction, "max_steps": TASKS[tn].max_steps, "by_quality": {}}
        for q in qualities:
            rs = [r for r in rows if r["task"] == tn and r["quality"] == q]
            if not rs:
                continue
            succ = [r["success"] for r in rs]
            ok_len = [r["length"] for r in rs if r["success"]]
            p = float(np.mean(succ))
            out[tn]["by_quality"][str(q)] = {
                "episodes": len(rs), "success_rate": p,
                "ci95": 1.96 * math.sqrt(max(p * (1 - p), 1e-9) / len(rs)),
                "expected_success": expected_success(q, 1.0 if math.isnan(s_full) else s_full),
                "mean_length": float(np.mean([r["length"] for r in rs])),
                "mean_length_success": float(np.mean(ok_len)) if ok_len else None,
                "wall_s": float(np.sum([r["wall_s"] for r in rs])),
                "wall_s_per_episode": float(np.mean([r["wall_s"] for r in rs])),
                "mistake_episodes": int(sum(r["mistake"] for r in rs)),
                "regrasps_mean": float(np.mean([r["regrasps"] for r in rs])),
                "failed_seeds": [RESET_SEED0 + r["episode"] for r in rs if not r["success"]],
            }
    return out


def plot(summary: dict, qualities: list[float], path: pathlib.Path) -> None:
    plt = plots.pyplot()

    tasks = list(summary)
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(tasks)), 4.8))
    w = 0.8 / len(qualities)
    colors = plt.cm.viridis(np.linspace(0.15, 0.85, len(qualities)))
    for j, q in enumerate(qualities):
        xs, ys, es, ex = [], [], [], []
        for i, tn in enumerate(tasks):
            b = summary[tn]["by_quality"].get(str(q))
            if b is None:
                continue
            xs.append(i + (j - (len(qualities) - 1) / 2) * w)
            ys.append(b["success_rate"])
            es.append(b["ci95"])
            ex.append(b["expected_success"])
        n = summary[tasks[0]]["by_quality"].get(str(q), {}).get("episodes", 0)
        ax.bar(xs, ys, w * 0.95, yerr=es, capsize=2, color=colors[j], label=f"quality {q:g} (n={n}/task)")
        if q < 1.0:
            ax.scatter(xs, ex, marker="_", s=200, color="red", zorder=3,
                       label="predicted" if j == len(qualities) - 1 else None)
    ax.axhline(0.95, color="gray", ls="--", lw=0.8)
    ax.set_xticks(range(len(tasks)), [t.replace("_", "\n", 1) for t in tasks], fontsize=8)
    ax.set_ylim(0, 1.3)
    ax.set_ylabel("success rate")
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_title("Scripted (privileged oracle) expert on SimFranka tasks; bars: 95% CI; dashed: 0.95")
    ax.legend(fontsize=7, loc="upper center", ncol=len(qualities) + 1, frameon=False)
    fig.tight_layout()
    plots.save(fig, path, dpi=110)


def main(argv=None) -> dict:
    ap = flags.parser("experts", out=False, doc=__doc__.split("\n")[1])
    ap.add_argument("--episodes", type=int, default=50, help="episodes per task at full quality")
    ap.add_argument("--low-episodes", type=int, default=20, help="episodes per task at each lowered quality")
    ap.add_argument("--qualities", type=float, nargs="*", default=[0.8, 0.5, 0.2], help="lowered quality levels")
    ap.add_argument("--tasks", default="", help="comma-separated task names (default: all)")
    flags.add_quick(ap, "3 episodes per task, one lowered quality")
    ap.add_argument("--workers", type=int, default=2)
    flags.add_out(ap, type=str)
    ap.add_argument("--replot", action="store_true", help="redraw DIR/experts.png from DIR/experts.json and exit")
    args = ap.parse_args(argv)
    if args.replot:
        res = json.loads((pathlib.Path(args.out) / "experts.json").read_text())
        plot(res["tasks"], res["config"]["qualities"], pathlib.Path(args.out) / "experts.png")
        return res
    tasks = [get_task(t.strip()).name for t in args.tasks.split(",") if t.strip()] or list(TASKS)
    if args.quick:
        args.episodes, args.low_episodes, args.qualities = 3, 3, [0.5]
    qualities = ([1.0] if args.episodes > 0 else []) + [q for q in args.qualities if q != 1.0]
    jobs = [(tn, q, i) for tn in tasks for q in qualities
            for i in range(args.episodes if q == 1.0 else args.low_episodes)]
    jobs.sort(key=lambda j: -TASKS[j[0]].max_steps)  # long episodes first: better load balance
    t0 = time.perf_counter()
    rows: list[dict] = []
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    ctx = mp.get_context("spawn")
    with ctx.Pool(max(1, args.workers)) as pool:
        it = pool.imap_unordered(_work, jobs, chunksize=1)
        if tqdm is not None:
            it = tqdm(it, total=len(jobs), desc="expert episodes", file=sys.stderr)
        for r in it:
            rows.append(r)
    wall = time.perf_counter() - t0
    summary = summarise(rows, tasks, qualities)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "when": _dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "config": {"episodes": args.episodes, "low_episodes": args.low_episodes, "qualities": qualities,
                   "workers": args.workers, "quick": args.quick, "reset_seed0": RESET_SEED0},
        "wall_s": wall, "tasks": summary,
        "full_quality_min_success": min((s["by_quality"]["1.0"]["success_rate"] for s in summary.values()
                                         if "1.0" in s["by_quality"]), default=None),
        "episodes": [[r["task"], r["quality"], r["episode"], int(r["success"]), r["length"], int(r["mistake"])]
                     for r in sorted(rows, key=lambda r: (r["task"], -r["quality"], r["episode"]))],
        "episodes_columns": ["task", "quality", "episode", "success", "length", "mistake"],
    }
    write_result(out / "experts.json", result, "experts", argv, args.quick, indent=1)
    plot(summary, qualities, out / "experts.png")
    hdr = f"{'task':24s}" + "".join(f"  q={q:<4g} succ (pred)  len" for q in qualities)
    print(hdr)
    for tn, s in summary.items():
        line = f"{tn:24s}"
        for q in qualities:
            b = s["by_quality"].get(str(q))
            if b is None:
                continue
            pred = "" if q == 1.0 else f"({b['expected_success']:.2f})"
            line += f"  {b['success_rate']:5.2f} {pred:6s} {b['mean_length']:5.1f}  "
        print(line)
    print(f"wall {wall:.0f} s with {args.workers} workers; json + png in {out}")
    return result


if __name__ == "__main__":
    main()
