#!/usr/bin/env python
"""Does the simulated Panda hold a grasped cube? The cube's slide in the closed fingers, per contact setting.

For each contact setting of ``hardware.sim_franka`` (MuJoCo's defaults, pyramidal friction cones with impratio 1,
the scene every figure before bench/results/vla_sft/README.md round 22 was measured on; and elliptic cones with impratio 10,
the default since) and each scene seed, the scripted expert picks the red cube of ``pick_red_cube`` and lifts it
above 10 cm. Then the arm holds that pose for ``--hold-ticks`` control ticks (0.1 s each) with the gripper
commanded to each opening of ``--openings`` (0: shut, as every demonstration holds a cube; 0.45: an opening a
flow VLA puts out near its close decision), and the bench records every tick how far the cube's centre has slid
down relative to the tcp, and whether the cube is still grasped (``hardware.sim_tasks.grasped``).

Writes ``bench/archive/results/sim_grip.json`` (per setting and opening: the slide after 5 s and at the end, the scenes
that dropped the cube, the mean slide curve; the physics time per tick) and ``sim_grip.png`` (the curves).

    .venv/bin/python -m bench.archive.sim_grip            # 10 scenes, 150 ticks: about a minute
    .venv/bin/python -m bench.archive.sim_grip --quick    # 2 scenes, 40 ticks: a smoke test
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import pathlib
import sys
import time

os.environ.setdefault("MUJOCO_GL", "egl")
from bench.harness.results import ROOT  # noqa: E402

import numpy as np  # noqa: E402

SETTINGS = {"pyramidal, impratio 1 (MuJoCo default; before round 22)": ("pyramidal", 1.0),
            "elliptic, impratio 10 (default)": ("elliptic", 10.0)}


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


TASK, CUBE = "pick_red_cube", "red_cube"
LIFT_Z = 0.10


def grasp_and_lift(sim, seed: int, max_ticks: int = 120) -> bool:
    """The scripted expert picks ``CUBE`` and lifts it above ``LIFT_Z`` (tcp height). -> whether it got there."""
    from hardware.sim_tasks import grasped, objects_from_state
    from hardware.teleop.scripted import ScriptedExpert
    from robot_io import limits as L

    lim = L.ArmLimits()
    names = sim.describe()["objects"]
    s = sim.reset(seed=seed, task=TASK)
    expert = ScriptedExpert(seed=0)
    expert.begin_episode(TASK, seed=seed)
    for _ in range(max_ticks):
        objs = objects_from_state(s, names)
        if expert.phase == "lift" and grasped(objs[CUBE], s.ee_pos, s.gripper) and s.ee_pos[2] > LIFT_Z:
            return True
        apply_ee_delta(sim, expert.read(None, privileged_from_state(s, names)).action, lim)
        s = sim.read_state()
    return False


def hold(sim, opening: float, ticks: int) -> tuple[list[float], int | None]:
    """Hold the present pose with the gripper at ``opening`` for ``ticks`` ticks. -> the cube's slide (m, down
    positive) relative to the tcp after every tick, and the tick at which it left the fingers (None: held)."""
    from hardware.sim_tasks import grasped, objects_from_state

    names = sim.describe()["objects"]
    s = sim.read_state()
    pos, quat = s.ee_pos.copy(), s.ee_quat.copy()
    z0 = float(objects_from_state(s, names)[CUBE][2] - s.ee_pos[2])
    slide, dropped = [], None
    for t in range(ticks):
        sim.command_ee_pose(pos, quat, opening)
        sim.step()
        s = sim.read_state()
        c = objects_from_state(s, names)[CUBE]
        slide.append(z0 - float(c[2] - s.ee_pos[2]))
        if dropped is None and not grasped(c, s.ee_pos, s.gripper):
            dropped = t
    return slide, dropped


def run(scenes: int, ticks: int, openings: list[float]) -> dict:
    from hardware.sim_franka import SimFranka

    out = {}
    for label, (cone, impratio) in SETTINGS.items():
        sim = SimFranka(realtime=False, cone=cone, impratio=impratio)
        sim.connect()
        rows, t_phys, n_phys = {}, 0.0, 0
        try:
            for g in openings:
                curves, drops, skipped = [], [], []
                for seed in range(scenes):
                    if not grasp_and_lift(sim, seed):
                        skipped.append(seed)
                        continue
                    t0 = time.perf_counter()
                    slide, dropped = hold(sim, g, ticks)
                    t_phys, n_phys = t_phys + time.perf_counter() - t0, n_phys + ticks
                    curves.append(slide)
                    if dropped is not None:
                        drops.append({"seed": seed, "tick": dropped})
                c = np.array(curves)
                at5 = min(50, ticks) - 1
                rows[str(g)] = {
                    "scenes": len(curves), "not_lifted": skipped, "dropped": drops,
                    "slide_at_5s_mm": {"mean": round(1e3 * float(c[:, at5].mean()), 2),
                                       "max": round(1e3 * float(c[:, at5].max()), 2)},
                    "slide_at_end_mm": {"mean": round(1e3 * float(c[:, -1].mean()), 2),
                                        "max": round(1e3 * float(c[:, -1].max()), 2)},
                    "mean_slide_mm": [round(1e3 * float(v), 3) for v in c.mean(0)]}
        finally:
            sim.disconnect()
        out[label] = {"cone": cone, "impratio": impratio, "openings": rows,
                      "hold_ms_per_tick": round(1e3 * t_phys / max(n_phys, 1), 3)}
    return out


def plot(res: dict, ticks: int, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    t = np.arange(1, ticks + 1) * 0.1
    styles = ["-", "--", ":"]
    for (label, r), color in zip(res.items(), ["tab:red", "tab:blue"]):
        for (g, row), ls in zip(r["openings"].items(), styles):
            drops = len(row["dropped"])
            ax.plot(t, row["mean_slide_mm"], ls, color=color,
                    label=f"{label}, opening {g}: {drops}/{row['scenes']} dropped")
    ax.set_xlabel("seconds held (gripper commanded, arm still)")
    ax.set_ylabel("cube's slide down the fingers, mm (mean)")
    ax.set_title("A lifted cube in the simulated Panda's fingers")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--scenes", type=int, default=10, help="scene seeds 0..N-1 (default 10)")
    ap.add_argument("--hold-ticks", type=int, default=150, help="control ticks held, 0.1 s each (default 150)")
    ap.add_argument("--openings", type=float, nargs="+", default=[0.0, 0.45],
                    help="gripper openings commanded while holding, 0 shut .. 1 open (default 0 0.45)")
    ap.add_argument("--quick", action="store_true", help="2 scenes, 40 ticks (a smoke test)")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "archive" / "results")
    ap.add_argument("--name", default="sim_grip")
    args = ap.parse_args(argv)
    if args.quick:
        args.scenes, args.hold_ticks = 2, 40
    if args.scenes < 1 or args.hold_ticks < 1:
        ap.error("--scenes and --hold-ticks must be >= 1")
    bad = [g for g in args.openings if not (math.isfinite(g) and 0.0 <= g <= 1.0)]
    if bad:
        ap.error(f"--openings must lie in [0, 1], got {bad}")
    t0 = time.perf_counter()
    res = run(args.scenes, args.hold_ticks, args.openings)
    for label, r in res.items():
        for g, row in r["openings"].items():
            print(f"{label:<55} opening {g:<4}: slide after 5 s {row['slide_at_5s_mm']['mean']:6.2f} mm, at "
                  f"{args.hold_ticks / 10:.0f} s {row['slide_at_end_mm']['mean']:6.2f} mm (max "
                  f"{row['slide_at_end_mm']['max']:.2f}); dropped {len(row['dropped'])}/{row['scenes']}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = {"bench": "sim_grip", "date": _dt.datetime.now().isoformat(timespec="seconds"), "task": TASK,
           "scenes": args.scenes, "hold_ticks": args.hold_ticks, "control_dt_s": 0.1,
           "wall_s": round(time.perf_counter() - t0, 1), "settings": res}
    (args.out / f"{args.name}.json").write_text(json.dumps(out, indent=1))
    plot(res, args.hold_ticks, args.out / f"{args.name}.png")
    print(f"wrote {args.out / args.name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
