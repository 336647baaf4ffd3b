#!/usr/bin/env python
"""Grasp modes of the scripted expert: does the scene decide which behaviour mode works? (issue 33, ExToken)

Run ``.venv/bin/python -m bench.archive.expert_modes [--scenes 20] [--gaps 0.01 0.005 0.0] [--quick] [--out DIR]``.
It writes ``DIR/expert_modes.json`` and ``DIR/expert_modes.png`` (default DIR: bench/archive/results) and prints a table.

The privileged expert at full quality (``ScriptedExpert(quality=1, grasp_mode=...)``) picks the red cube with
each grasp mode (``ccw`` and ``cw`` forced; ``near`` for reference) in scenes 0..N-1 of

* ``pick_red_cube_yaw45``: the red cube turned 45 degrees from the home finger axis; both turns should grasp;
* ``pick_red_cube_crowded``: the same, plus the blue cube ``gap`` from the red one along one of its face axes
  (``hardware.sim_tasks.NEIGHBOUR_GAP``, swept with ``--gaps``). The design wants exactly one mode to succeed per
  scene: the mode that turns the finger axis onto the neighbour's axis lands a finger on the neighbour
  ("blocked"), the other grasps clear of it ("free"); which is which is read off the layout. The blocked finger
  tips the 50 g neighbour over and slides in, so the task's success also needs the neighbour standing
  (``TurnedPickTask.success``): the crowded pick is "pick up the red cube without knocking the blue one over".

Each episode runs directly on ``SimFranka(realtime=False)`` the way ``bench/experts.py`` does (the bridge's
``ee_delta`` handling, one control period per tick): success = the task's predicate at some tick within
``task.max_steps`` (100). Also recorded: the finger turn when the fingers first close (signed, degrees: ccw > 0),
regrasps, and how far the neighbour was pushed (largest displacement and tilt over the episode; "disturbed" =
moved > 1 cm or tilted > 10 degrees). Expert seed 0; the scene seed also keys the expert's streams.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import pathlib
import platform
import sys
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402

from hardware import sim_tasks  # noqa: E402
from hardware.sim_tasks import HOME_FINGER_ANGLE, get_task, objects_from_state, quat_to_mat  # noqa: E402
from hardware.teleop.scripted import ScriptedExpert, finger_angle, turned_angle  # noqa: E402
from robot_io import limits as L  # noqa: E402

def apply_ee_delta(sim, action, lim) -> None:
    """One ``ee_delta`` command, applied the way ``ArmService.handle`` does, then one control period (a frozen
    copy of ``bench/experts.py``'s)."""
    import math

    from robot_io import limits as L

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


MODES = ("ccw", "cw", "near")
DISTURBED_M, DISTURBED_DEG = 0.01, 10.0


def blocked_mode(layout: dict, cube: str = "red_cube", neighbour: str = "blue_cube") -> str:
    """The turning mode whose finger axis (turned from the home finger angle) lies along the neighbour's side."""
    (x, y, yaw), (nx, ny, _) = layout[cube], layout[neighbour]
    toward = math.atan2(ny - y, nx - x)
    off = {m: abs(math.remainder(turned_angle(yaw, HOME_FINGER_ANGLE, m) - toward, math.pi)) for m in ("ccw", "cw")}
    return min(off, key=off.get)


def run_episode(sim, task_name: str, mode: str, seed: int) -> dict:
    task = get_task(task_name)
    lim = L.ArmLimits()
    names = sim.describe()["objects"]
    s = sim.reset(seed=seed, task=task_name)
    expert = ScriptedExpert(quality=1.0, seed=0, grasp_mode=mode)
    expert.begin_episode(task_name, seed=seed, instruction=task.instruction)
    a0 = finger_angle(s.ee_quat)
    nb0 = objects_from_state(s, names)["blue_cube"].copy()
    moved = tilt = 0.0
    success, length, turn = False, task.max_steps, None
    for t in range(task.max_steps):
        cmd = expert.read(None, privileged_from_state(s, names))
        if turn is None and cmd.action[6] < 0.5:  # the first close: the grasp's finger angle
            turn = math.degrees(math.remainder(finger_angle(s.ee_quat) - a0, 2 * math.pi))
        apply_ee_delta(sim, cmd.action, lim)
        s = sim.read_state()
        objs = objects_from_state(s, names)
        nb = objs["blue_cube"]
        moved = max(moved, float(np.linalg.norm(nb[:2] - nb0[:2])))
        tilt = max(tilt, math.degrees(math.acos(min(1.0, abs(quat_to_mat(nb[3:7])[2, 2])))))
        if task.success(objs, s.ee_pos, s.gripper):
            success, length = True, t + 1
            break
        if cmd.events & {"success", "failure"}:
            length = t + 1
            break
    return {"mode": expert.mode, "success": success, "length": length, "regrasps": expert.regrasps,
            "turn_deg": turn, "neighbour_moved_m": moved, "neighbour_tilt_deg": tilt,
            "neighbour_disturbed": bool(moved > DISTURBED_M or tilt > DISTURBED_DEG)}


def measure(sim, task_name: str, gap: float | None, scenes: int) -> dict:
    if gap is not None:
        sim_tasks.NEIGHBOUR_GAP = gap  # read by the layout at reset
    task = get_task(task_name)
    rows = []
    for seed in range(scenes):
        layout = task.layout(np.random.default_rng(seed))  # what SimFranka.reset(seed, task) lays out
        row = {"seed": seed, "modes": {m: run_episode(sim, task_name, m, seed) for m in MODES}}
        if gap is not None:
            row["blocked"] = blocked_mode(layout)
            row["free"] = "cw" if row["blocked"] == "ccw" else "ccw"
        rows.append(row)
    by_mode = {}
    for m in MODES:
        eps = [r["modes"][m] for r in rows]
        turns = [e["turn_deg"] for e in eps if e["turn_deg"] is not None]
        by_mode[m] = {"episodes": len(eps), "successes": int(sum(e["success"] for e in eps)),
                      "success_rate": float(np.mean([e["success"] for e in eps])),
                      "mean_length": float(np.mean([e["length"] for e in eps])),
                      "mean_turn_deg": float(np.mean(turns)) if turns else None,
                      "neighbour_disturbed": int(sum(e["neighbour_disturbed"] for e in eps))}
    out = {"task": task_name, "gap_m": gap, "scenes": rows, "by_mode": by_mode}
    if gap is not None:
        def ok(r, which):
            return r["modes"][r[which]]["success"]

        out["summary"] = {
            "exactly_one_succeeds": int(sum(r["modes"]["ccw"]["success"] != r["modes"]["cw"]["success"] for r in rows)),
            "free_mode_succeeds": int(sum(ok(r, "free") for r in rows)),
            "blocked_mode_succeeds": int(sum(ok(r, "blocked") for r in rows)),
            "free_is_ccw": int(sum(r["free"] == "ccw" for r in rows)),
            "blocked_mode_disturbs_neighbour": int(sum(r["modes"][r["blocked"]]["neighbour_disturbed"] for r in rows)),
            "free_mode_disturbs_neighbour": int(sum(r["modes"][r["free"]]["neighbour_disturbed"] for r in rows)),
            "blocked_mode_mean_length": float(np.mean([r["modes"][r["blocked"]]["length"] for r in rows])),
            "free_mode_mean_length": float(np.mean([r["modes"][r["free"]]["length"] for r in rows])),
        }
    return out


def label(res: dict) -> str:
    return res["task"] if res["gap_m"] is None else f"{res['task']} gap {res['gap_m'] * 100:.1f} cm"


def plot(results: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    labels = [label(r).replace("pick_red_cube_", "").replace(" gap", "\ngap") for r in results]
    w = 0.8 / len(MODES)
    for j, m in enumerate(MODES):
        xs = np.arange(len(results)) + (j - (len(MODES) - 1) / 2) * w
        ax.bar(xs, [r["by_mode"][m]["success_rate"] for r in results], w, label=f"grasp_mode={m}")
    ax.set_xticks(np.arange(len(results)), labels)
    ax.set_ylim(0, 1.3)
    ax.set_ylabel("success rate (full-quality expert, 100 ticks)")
    ax.set_title("success per forced grasp mode")
    ax.legend(loc="upper center", ncol=3, fontsize=8)
    crowded = [r for r in results if r["gap_m"] is not None]
    keys = [("exactly_one_succeeds", "exactly one of ccw/cw succeeds"),
            ("blocked_mode_succeeds", "blocked mode succeeds"),
            ("blocked_mode_disturbs_neighbour", "blocked mode disturbs neighbour"),
            ("free_mode_disturbs_neighbour", "free mode disturbs neighbour")]
    w = 0.8 / len(keys)
    for j, (k, name) in enumerate(keys):
        xs = np.arange(len(crowded)) + (j - (len(keys) - 1) / 2) * w
        bx.bar(xs, [r["summary"][k] / len(r["scenes"]) for r in crowded], w, label=name)
    bx.set_xticks(np.arange(len(crowded)), [f"gap {r['gap_m'] * 100:.1f} cm" for r in crowded])
    bx.set_ylim(0, 1.3)
    bx.set_ylabel("share of scenes")
    bx.set_title("crowded: does the scene pick the mode?")
    bx.legend(loc="upper center", ncol=2, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenes", type=int, default=20, help="scene seeds 0..N-1 per task (default 20)")
    ap.add_argument("--gaps", type=float, nargs="+", default=[0.01, 0.005, 0.0],
                    help="neighbour gaps of pick_red_cube_crowded to measure, m (default 0.01 0.005 0.0; the task's "
                    f"own is {sim_tasks.NEIGHBOUR_GAP})")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 scenes, the task's own gap")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    if args.quick:
        args.scenes, args.gaps = 2, [sim_tasks.NEIGHBOUR_GAP]
    from hardware.sim_franka import SimFranka

    own_gap = sim_tasks.NEIGHBOUR_GAP
    sim = SimFranka(realtime=False, seed=0)
    sim.connect()
    t0 = time.perf_counter()
    try:
        results = [measure(sim, "pick_red_cube_yaw45", None, args.scenes)]
        for gap in args.gaps:
            results.append(measure(sim, "pick_red_cube_crowded", gap, args.scenes))
    finally:
        sim_tasks.NEIGHBOUR_GAP = own_gap
        sim.disconnect()
    wall = time.perf_counter() - t0

    print(f"{'task':<40} " + " ".join(f"{m:>10}" for m in MODES) + "   exactly-one  blocked-ok  free=ccw  "
          "blocked/free disturb  blocked/free ticks")
    for r in results:
        line = f"{label(r):<40} " + " ".join(f"{r['by_mode'][m]['successes']:>5}/{r['by_mode'][m]['episodes']:<4}"
                                              for m in MODES)
        if "summary" in r:
            s, n = r["summary"], len(r["scenes"])
            line += (f"   {s['exactly_one_succeeds']:>5}/{n:<5} {s['blocked_mode_succeeds']:>5}/{n:<4} "
                     f"{s['free_is_ccw']:>4}/{n:<4} {s['blocked_mode_disturbs_neighbour']:>8}/"
                     f"{s['free_mode_disturbs_neighbour']:<11}"
                     f" {s['blocked_mode_mean_length']:6.1f}/{s['free_mode_mean_length']:.1f}")
        print(line)
    print("mean finger turn at the grasp (deg, ccw > 0): " + "; ".join(
        f"{label(r)}: " + ", ".join(f"{m} {r['by_mode'][m]['mean_turn_deg']:+.1f}" for m in MODES)
        for r in results[:2]))
    crowded = results[1] if len(results) > 1 else None
    works = bool(crowded and crowded["summary"]["exactly_one_succeeds"] >= 0.8 * args.scenes)
    verdict = ("the scene decides the mode: in most crowded scenes exactly one of ccw / cw succeeds" if works else
               "the scene does NOT decide the mode: the blocked mode still succeeds in most crowded scenes "
               "(see blocked_mode_succeeds and the neighbour disturbance)")
    print(f"verdict ({label(crowded) if crowded else '-'}): {verdict}  [{wall:.0f} s]")

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"bench": "expert_modes", "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "host": platform.node(), "python": platform.python_version(), "wall_s": wall,
           "args": {"scenes": args.scenes, "gaps": args.gaps, "quick": args.quick}, "task_gap_m": own_gap,
           "disturbed": {"moved_m": DISTURBED_M, "tilt_deg": DISTURBED_DEG}, "design_works": works,
           "verdict": verdict, "results": results}
    (out / "expert_modes.json").write_text(json.dumps(doc, indent=1))
    plot(results, out / "expert_modes.png")
    print(f"wrote {out / 'expert_modes.json'} and {out / 'expert_modes.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
