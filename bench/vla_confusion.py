#!/usr/bin/env python
"""What a multi-task VLA does with the instruction: which cube it acts on, and why it fails.

Every scene of the sim suite holds all three cubes (red, green, blue), the bowl and the marker, so
any rollout shows which cube the policy went for. For each task (instruction) and each unseen scene
(`vla eval`'s seeds, 100000 ...) the VLA drives the fast sim Franka as `vla eval` runs it (temporal
ensembling by default, the sampler's noise seeded per episode) while this bench reads the
simulator's object poses every tick (privileged state, read only here, never by the policy) and
records

* the first cube grasped (``grasped``: between the fingers, gripper closed on it), and the cube
  nearest the fingers at the first close command (the intent, when no grasp followed) with its
  centre's offset from the tcp then (``close_offset_m``, world x / y / z: how far off the grasp was);
* the first cube moved more than 2 cm (the object acted on, for pushes too);
* every registered task whose success predicate held at some tick (``achieved_tasks``), how high each
  cube was lifted while grasped, the cubes in the bowl and the cube held at the end;
* the first release: at the first open command after a cube was grasped, the cube grasped last (``release_cube``)
  and its centre's offset from every other object's (``release_offset_m``, world x / y / z: where a place or a
  stack let go), and its offset from the same objects at the end (``end_offset_m``); before that, the tick at
  which a grasped cube first left the closed fingers (``slipped_at``: dropped in the air or knocked out, not let go);
* every object's x / y at the start and the end (``xy_start``, ``xy_end``); for a push task the summary says where
  the pushes moved the named cube: towards the marker, sideways, away from it, or not at all (``push_moved_the_cube``);
* where the tcp first came down to pushing height (``touchdown``: its x / y and tick, the first below
  TOUCHDOWN_Z); for a push task the summary gives that point in the push's frame (``push_touchdown``: cm along the
  cube's start -> marker line and across it, from the cube's start) against where the scripted expert comes down
  (``expert_push_start_cm``).

Each episode gets one outcome:

* ``success``;
* ``wrong object``: the first cube grasped (or, with no grasp, moved) is not the one the
  instruction names (the task's first skill's cube);
* ``right object, grasp missed``: it closed nearest the named cube but never grasped any cube;
* ``right object, skill not completed``: it grasped the named cube (a push: moved it) but the task's predicate never
  held (``achieved`` tells whether it did another task instead: the wrong skill);
* ``nothing``: it never closed on or moved any cube (a push: never moved one; its fingers are shut from the first
  tick, so the cube nearest them then is not a choice).

Writes ``bench/results/<name>.json`` (confusion matrices instruction x cube, outcome counts per task,
every episode) and ``.png`` (the grasp confusion matrix and the outcomes per task).

    .venv/bin/python -m bench.vla_confusion --checkpoint runs/sft/five --episodes 20 --jobs 2
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import sys
import time

import numpy as np

from bench.harness import flags, plots
from bench.harness.results import portable, write_result


CUBES = ("red_cube", "green_cube", "blue_cube")
OUTCOMES = ("success", "wrong object", "right object, grasp missed", "right object, skill not completed", "nothing")
MOVED_M = 0.02
TOUCHDOWN_Z = 0.035  # the tcp below this (m) is down at pushing height (the expert pushes at 2 cm)


def named_cube(task) -> str:
    """The cube the instruction names first: the first skill's cube (pick / push / place)."""
    for skill in task.skills:
        if len(skill) > 1 and skill[1] in CUBES:
            return skill[1]
    raise ValueError(f"task {task.name} names no cube in its skills {task.skills}")


def episode_wording(task, i: int, wording: str, instruction: str | None = None) -> str | None:
    """The instruction episode ``i`` of ``task`` is given: ``instruction`` (None: the task's own),
    or for ``wording`` "paraphrases" / "held-out" the task's paraphrases / held-out ones in turn."""
    if wording == "instruction":
        return instruction
    words = {"paraphrases": task.paraphrases, "held-out": task.held_out}[wording]
    if not words:
        raise ValueError(f"task {task.name} has no {'paraphrases' if wording == 'paraphrases' else 'held-out wording'}")
    return words[i % len(words)]


def classify(ep: dict, target: str, grasps: bool = True) -> str:
    """One episode's outcome (module docstring) from its record. ``grasps`` False: a task that moves
    its cube without grasping it (a push), where moving the named cube is the right skill begun."""
    if ep["success"]:
        return "success"
    acted = ep["first_grasped"] or ep["first_moved"]
    if acted is not None and acted != target:
        return "wrong object"
    if ep["first_grasped"] == target or (not grasps and ep["first_moved"] == target):
        return "right object, skill not completed"
    if not grasps:  # a push's fingers are shut from its first tick: where they "closed" says nothing
        return "nothing"
    if ep["close_nearest"] == target or acted == target:
        return "right object, grasp missed"
    if ep["close_nearest"] is not None:
        return "wrong object"
    return "nothing"


def rollout(env, client, policy, seed: int, names: list[str]) -> dict:
    """One episode of ``policy`` on ``env`` (a sim task env), stepped row by row with the simulator's
    object poses read after every tick. -> the episode's record."""
    from hardware.sim_tasks import achieved_tasks, grasped, in_bowl, objects_from_state

    obs, _ = env.reset(seed=seed)
    if hasattr(policy, "reset"):
        policy.reset(seed)
    objs0 = objects_from_state({k: np.asarray(v) for k, v in client.last_state.arrays.items()}, names)
    first_grasped = first_moved = close_nearest = close_offset = None
    achieved: dict[str, int] = {}
    max_lift = {c: 0.0 for c in CUBES}  # the most each cube rose above where it started, while grasped
    ticks, success, done, last_grip = 0, False, False, 1.0
    objs = objs0
    # the cube held after the last tick, the last one grasped, the first one let go and the first slip
    held = last_held = release_cube = release_offset = slipped_at = touchdown = None
    while ticks < env.max_ticks and not done:
        for row in policy(obs):
            obs, reward, terminated, truncated, info = env.step(row)
            objs = objects_from_state({k: np.asarray(v) for k, v in client.last_state.arrays.items()}, names)
            ee, gripper = np.asarray(obs["state"][:3], float), float(obs["state"][7])  # [ee_pos, quat, gripper]
            if close_nearest is None and row[6] < 0.5 <= last_grip:  # the first close command
                close_nearest = min(CUBES, key=lambda c: float(np.linalg.norm(objs[c][:2] - ee[:2])))
                close_offset = [round(float(v), 4) for v in objs[close_nearest][:3] - ee]
            if release_cube is None and last_held is not None and row[6] >= 0.5 > last_grip:  # the first open
                release_cube = last_held
                release_offset = _offsets(objs, last_held)
            now = next((c for c in CUBES if grasped(objs[c], ee, gripper)), None)
            if release_cube is None and slipped_at is None and held is not None and now is None and row[6] < 0.5:
                slipped_at = ticks  # the fingers were told to stay closed but no longer hold it
            held, last_grip = now, float(row[6])
            last_held = now or last_held
            if first_grasped is None:
                first_grasped = next((c for c in CUBES if grasped(objs[c], ee, gripper)), None)
            if touchdown is None and ee[2] < TOUCHDOWN_Z:
                touchdown = {"tick": ticks, "xy": [round(float(v), 4) for v in ee[:2]]}
            if first_moved is None:
                first_moved = next((c for c in CUBES if np.linalg.norm(objs[c][:3] - objs0[c][:3]) > MOVED_M), None)
            for c in CUBES:
                if grasped(objs[c], ee, gripper):
                    max_lift[c] = max(max_lift[c], float(objs[c][2] - objs0[c][2]))
            for t in achieved_tasks(objs, ee, gripper):
                achieved.setdefault(t, ticks)
            ticks += 1
            success = bool(info.get("success", reward > 0))
            if terminated or truncated or success or ticks >= env.max_ticks:
                done = True
                break
    return {"seed": seed, "success": success, "ticks": ticks, "first_grasped": first_grasped,
            "first_moved": first_moved, "close_nearest": close_nearest, "close_offset_m": close_offset,
            "achieved": achieved,
            "max_lift_m": max_lift, "in_bowl_at_end": [c for c in CUBES if in_bowl(objs[c], objs["bowl"])],
            "held_at_end": next((c for c in CUBES if grasped(objs[c], np.asarray(obs["state"][:3], float),
                                                            float(obs["state"][7]))), None),
            "release_cube": release_cube, "release_offset_m": release_offset, "slipped_at": slipped_at,
            "end_offset_m": None if release_cube is None else _offsets(objs, release_cube),
            "xy_start": {o: [round(float(v), 4) for v in objs0[o][:2]] for o in objs0},
            "xy_end": {o: [round(float(v), 4) for v in objs[o][:2]] for o in objs}, "touchdown": touchdown}


def is_push(task: str) -> bool:
    """The task opens with a push: its fingers are shut throughout and it moves its cube without a grasp."""
    from hardware.sim_tasks import get_task

    return get_task(task).skills[0][0] == "push"


def push_progress(ep: dict, cube: str, goal: str = "target") -> dict | None:
    """Where a push moved ``cube``: its displacement (m), the cosine between that and the direction from its start to
    the ``goal`` marker, and its distance to the marker at the start and the end. None without the poses (a file
    written before they were recorded)."""
    if "xy_start" not in ep or goal not in ep["xy_start"]:
        return None
    c0, c1, g = (np.asarray(x, float) for x in (ep["xy_start"][cube], ep["xy_end"][cube], ep["xy_start"][goal]))
    moved, want = c1 - c0, g - c0
    m = float(np.linalg.norm(moved))
    return {"moved_m": round(m, 4), "cos_to_goal": round(float(moved @ want / max(m * np.linalg.norm(want), 1e-9)), 3),
            "dist_start_m": round(float(np.linalg.norm(want)), 4), "dist_end_m": round(float(np.linalg.norm(g - c1)), 4)}


def push_direction(progress: dict | None) -> str | None:
    """A push's cube movement in words: ``not moved`` (under MOVED_M), ``towards the marker`` (within 60 degrees of
    its direction), ``away from it`` (more than 120 degrees off), else ``sideways``."""
    if progress is None:
        return None
    if progress["moved_m"] < MOVED_M:
        return "not moved"
    c = progress["cos_to_goal"]
    return "towards the marker" if c > 0.5 else "away from it" if c < -0.5 else "sideways"


PUSH_DIRECTIONS = ("towards the marker", "sideways", "away from it", "not moved")


def push_touchdown(ep: dict, cube: str, goal: str = "target") -> list[float] | None:
    """Where the tcp first came down to pushing height, in the push's frame: [cm along the line from the cube's start
    to the ``goal`` marker, cm across it (to its left)], from the cube's start. None when it never came down or the
    episode has no poses."""
    td = ep.get("touchdown")
    if not td or "xy_start" not in ep or goal not in ep["xy_start"]:
        return None
    c0, g = np.asarray(ep["xy_start"][cube], float), np.asarray(ep["xy_start"][goal], float)
    d = (g - c0) / max(float(np.linalg.norm(g - c0)), 1e-9)
    rel = np.asarray(td["xy"], float) - c0
    return [round(float(rel @ d) * 100, 2), round(float(rel @ np.array([-d[1], d[0]])) * 100, 2)]


def expert_push_start_cm() -> tuple[float, float]:
    """Where the scripted expert comes down for a push, in the push frame (cm along, across): behind the cube on the
    line from the marker through it (hardware/teleop/scripted.py, ``_push``'s start point)."""
    from hardware.teleop.scripted import PUSH_CONTACT, PUSH_START_BACK

    return (round(-(PUSH_CONTACT + PUSH_START_BACK) * 100, 2), 0.0)


def touchdown_summary(points: list, ok: list[bool]) -> dict:
    """The touchdowns (push frame, cm) against the expert's start point: each one's distance from it, the median, and
    how many came down within 2 cm, for all episodes and the successes."""
    ref = np.asarray(expert_push_start_cm())
    dist = [None if p is None else round(float(np.linalg.norm(np.asarray(p) - ref)), 2) for p in points]
    got = [x for x in dist if x is not None]
    won = [x for x, s in zip(dist, ok) if x is not None and s]
    return {"expert_start_cm": ref.tolist(), "points_cm": points, "success": [bool(x) for x in ok],
            "off_expert_start_cm": dist,
            "came_down": len(got), "median_off_cm": round(float(np.median(got)), 2) if got else None,
            "within_2cm": sum(x <= 2.0 for x in got),
            "median_off_cm_successes": round(float(np.median(won)), 2) if won else None}


def _offsets(objs: dict, cube: str) -> dict[str, list[float]]:
    """``cube``'s centre minus every other object's, world x / y / z in m (4 decimals)."""
    return {o: [round(float(v), 4) for v in objs[cube][:3] - objs[o][:3]] for o in objs if o != cube}


def work(job: dict) -> list[dict]:
    """One worker: its own sim bridge, the VLA, its share of (task, seed) pairs."""
    from hardware.sim_tasks import get_task
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from robot_io.bridge_process import running_bridge
    from vla.envs import task_env
    from bench.harness.jobs import eval_policy

    policy = eval_policy(job["checkpoint"], job["exec_steps"], job.get("ensemble_window"), job.get("noise", "sample"),
                         job.get("gripper", "raw"))
    site = load_site(job["robot"])
    out = []
    with running_bridge(site, job["log"]):
        client = RobotClient(site)
        try:
            names = list(client.description.get("objects", []))
            envs: dict = {}
            for i, (task, seed, instruction) in enumerate(job["pairs"]):
                env = envs.setdefault((task, instruction), task_env(client, task, instruction=instruction))
                ep = rollout(env, client, policy, seed, names)
                t = get_task(task)
                ep.update(task=task, instruction=instruction or t.instruction, named=named_cube(t))
                ep["outcome"] = classify(ep, ep["named"], grasps=not is_push(task))
                out.append(ep)
                print(f"[worker {job['index']}] {i + 1}/{len(job['pairs'])} {task} {seed}: {ep['outcome']}"
                      f" (grasped {ep['first_grasped']})", flush=True)
        finally:
            client.close()
    os.remove(job["log"])
    return out


def summarize(episodes: list[dict], tasks: list[str]) -> dict:
    from vla.evaluate import wilson_interval

    res = {}
    for task in tasks:
        eps = [e for e in episodes if e["task"] == task]
        named = eps[0]["named"]
        grasped = [e["first_grasped"] for e in eps if e["first_grasped"]]
        k = sum(g == named for g in grasped)
        ok = sum(e["success"] for e in eps)
        others: dict[str, int] = {}
        for e in eps:
            if not e["success"]:
                for t in e["achieved"]:
                    if t != task:
                        others[t] = others.get(t, 0) + 1
        snc = [e for e in eps if e["outcome"] == "right object, skill not completed"]
        pushes = touch = None
        if is_push(task):
            dirs = [push_direction(push_progress(e, named)) for e in eps]
            if all(d is not None for d in dirs):  # where each push moved the named cube, relative to the marker
                pushes = {d: dirs.count(d) for d in PUSH_DIRECTIONS}
            if all("touchdown" in e for e in eps):  # where it came down to push, against the expert's start point
                touch = touchdown_summary([push_touchdown(e, named) for e in eps], [e["success"] for e in eps])
        res[task] = {
            "instruction": eps[0]["instruction"], "wordings": sorted({e["instruction"] for e in eps}),
            "named_cube": named, "episodes": len(eps),
            "successes": ok, "success_rate": ok / len(eps), "success_ci95": list(wilson_interval(ok, len(eps))),
            "grasped_first": {c: sum(g == c for g in [e["first_grasped"] for e in eps]) for c in (*CUBES, None)},
            "moved_first": {c: sum(g == c for g in [e["first_moved"] for e in eps]) for c in (*CUBES, None)},
            "named_of_grasped": [k, len(grasped)],
            "outcomes": {o: sum(e["outcome"] == o for e in eps) for o in OUTCOMES},
            "failures_that_achieved_another_task": others,
            "skill_not_completed": {  # where the episodes that grasped the named cube but failed ended
                "episodes": len(snc),
                "lift_m": sorted(round(e["max_lift_m"][named], 3) for e in snc if "max_lift_m" in e),
                "named_in_bowl_at_end": sum(named in e.get("in_bowl_at_end", []) for e in snc),
                "named_held_at_end": sum(e.get("held_at_end") == named for e in snc)},
            "push_moved_the_cube": pushes, "push_touchdown": touch}
    pooled = [sum(r["named_of_grasped"][i] for r in res.values()) for i in (0, 1)]
    return {"tasks": res, "named_of_grasped_pooled": pooled,
            "named_share_of_grasps": pooled[0] / pooled[1] if pooled[1] else None}


def plot(summary: dict, path: pathlib.Path, title: str) -> None:
    plt = plots.pyplot()

    res = summary["tasks"]
    tasks = list(res)
    cols = [*CUBES, None]
    def first(t: str) -> dict[str, int]:  # "no grasp" is the key None here, "null" in a JSON file read back
        return {"None" if k in (None, "null") else str(k): n for k, n in res[t]["grasped_first"].items()}

    m = np.array([[first(t)[str(c)] for c in cols] for t in tasks], float)
    pushes = [t for t in tasks if res[t].get("push_touchdown")]
    if pushes:  # a third panel: where each push came down, in the push's frame
        fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(16, max(0.6 * len(tasks) + 2.2, 4.2)),
                                         gridspec_kw={"width_ratios": [1, 1.4, 1.1]})
        _plot_touchdowns(a3, res[pushes[0]])
    else:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 0.6 * len(tasks) + 2.2),
                                     gridspec_kw={"width_ratios": [1, 1.4]})
    frac = m / np.maximum(m.sum(1, keepdims=True), 1)
    a1.imshow(frac, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for i in range(len(tasks)):
        for j in range(len(cols)):
            a1.text(j, i, int(m[i, j]), ha="center", va="center", color="white" if frac[i, j] > 0.5 else "black")
    a1.set_xticks(range(len(cols)), ["red", "green", "blue", "no grasp"])
    def label(t: str) -> str:
        w = res[t].get("wordings", [res[t]["instruction"]])
        said = w[0] if len(w) == 1 else f"{t}: {len(w)} wordings"
        return f"{said}\n(names {res[t]['named_cube'].split('_')[0]})"

    a1.set_yticks(range(len(tasks)), [label(t) for t in tasks], fontsize=7)
    a1.set_xlabel("first cube grasped")
    a1.set_title("instruction x first grasp", fontsize=9)
    colours = ["tab:green", "tab:red", "tab:orange", "tab:purple", "tab:gray"]
    left = np.zeros(len(tasks))
    for o, c in zip(OUTCOMES, colours):
        v = np.array([res[t]["outcomes"][o] for t in tasks], float)
        a2.barh(range(len(tasks)), v, left=left, color=c, label=o)
        left += v
    a2.set_yticks(range(len(tasks)), tasks, fontsize=7)
    a2.invert_yaxis()  # first task on top, as in the matrix
    a2.set_xlabel("episodes")
    a2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
    a2.set_title("outcome per task", fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    plots.save(fig, path, dpi=110)
    from PIL import Image  # a 64-colour palette PNG: the same plot in a third of the bytes

    Image.open(path).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def _plot_touchdowns(ax, r: dict) -> None:
    """Where the tcp first came down for a push, cm in the push's frame (the marker lies along +x from the cube at the
    origin, its footprint drawn), successes filled; the scripted expert's start point as a cross."""
    from matplotlib.patches import Rectangle

    from hardware.sim_tasks import CUBE_HALF

    td = r["push_touchdown"]
    pts = [(p, ok) for p, ok in zip(td["points_cm"], td["success"]) if p]
    for ok, label, style in ((False, "failed", dict(facecolors="none", edgecolors="tab:red")),
                             (True, "succeeded", dict(color="tab:green"))):
        xy = np.array([p for p, o in pts if o is ok]).reshape(-1, 2)
        if len(xy):
            ax.scatter(xy[:, 0], xy[:, 1], s=18, label=label, **style)
    ax.plot(*td["expert_start_cm"], "kx", ms=10, mew=2, label="expert's start point")
    h = CUBE_HALF * 100  # the cube's footprint at its start
    ax.add_patch(Rectangle((-h, -h), 2 * h, 2 * h, fill=False, color="tab:blue"))
    ax.axhline(0, color="0.8", lw=0.8, zorder=0)
    ax.set_aspect("equal")
    ax.set_xlabel("cm along cube -> marker (cube at 0)")
    ax.set_ylabel("cm across")
    ax.set_title(f"where the push came down (cube's start frame)\nmedian {td['median_off_cm']} cm off the expert's "
                 f"start, {td['within_2cm']}/{td['came_down']} within 2 cm", fontsize=8)
    ax.legend(fontsize=7, loc="best")


def execution_label(exec_steps: int | None = None, window: int | None = None, noise: str = "sample",
                    gripper: str = "raw") -> str:
    """How the episodes were executed, in words (the result file's ``execution``)."""
    how = f"chunks of {exec_steps}" if exec_steps else \
        "temporal ensembling (m = 0.01" + (f", newest {window} predictions)" if window else ")")
    return how + ("" if noise == "sample" else f", noise {noise}") + ("" if gripper == "raw" else f", gripper {gripper}")


def checkpoint_label(path: str) -> str:
    """A checkpoint's short name for a title: ``RUN/model`` for the model inside a `vla train` run directory (every
    one of those is called ``model``), the folder's own name otherwise."""
    p = pathlib.PurePath(os.path.normpath(path))
    return f"{p.parent.name}/{p.name}" if p.name == "model" and p.parent.name not in ("", ".", "..") else p.name


def plot_title(out: dict) -> str:
    execution = out.get("execution", execution_label())
    return (f"{checkpoint_label(out['checkpoint'])}: {out['episodes_per_task']} unseen three-cube "
            "scenes per task" + {"paraphrases": ", the tasks' paraphrases in turn",
                                 "held-out": ", the held-out wordings"}.get(out.get("wording"), "")
            + ("" if execution == execution_label() else f"\n{execution}"))


def reclassify(path: pathlib.Path) -> int:
    """``--from-json``: the episodes of a result file classified again, the summary and plot redrawn."""
    out = json.loads(path.read_text())
    tasks = list(out["tasks"])
    for ep in out["episodes"]:
        ep["outcome"] = classify(ep, ep["named"], grasps=not is_push(ep["task"]))
    out.update(summarize(out["episodes"], tasks))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1))
    os.replace(tmp, path)
    plot(out, path.with_suffix(".png"), plot_title(out))
    print(f"rewrote {path} and its .png")
    return 0


def main(argv=None) -> int:
    ap = flags.parser("vla_confusion", out=False, doc=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--checkpoint", help="a `vla train` run or checkpoint")
    ap.add_argument("--from-json", type=pathlib.Path, default=None, metavar="FILE",
                    help="no rollouts: classify the episodes of an earlier result file again (this version's "
                         "outcome rules) and rewrite it and its plot")
    ap.add_argument("--task", action="append", dest="tasks", help="sim task (repeat; default: the checkpoint's tasks)")
    ap.add_argument("--instruction", default=None,
                    help="give every episode this instruction instead of the task's (a paraphrase, a held-out wording)")
    ap.add_argument("--wording", choices=["instruction", "paraphrases", "held-out"], default="instruction",
                    help="each task's instruction (default); its paraphrases in turn, one per episode (wordings a "
                         "model trained on the instructions alone has never seen); or its held-out paraphrases "
                         "(the ones `vla train --paraphrases sim` leaves out; `vla record --list-tasks` lists them)")
    ap.add_argument("--episodes", type=int, default=20, help="unseen scenes per task (default 20)")
    ap.add_argument("--seed-start", type=int, default=100_000, help="first scene seed (default 100000, `vla eval`'s)")
    ap.add_argument("--exec-steps", type=int, default=None, help="chunk rows per re-plan (default: temporal ensembling)")
    ap.add_argument("--ensemble-window", type=int, default=None, metavar="K",
                    help="temporal ensembling over the newest K predictions of each tick (default: every chunk "
                         "still covering it, as ACT and `vla eval` do)")
    ap.add_argument("--noise", default="sample", metavar="sample|zero|mean:N",
                    help="the sampler's starting noise per chunk, as `vla eval --noise`: one seeded draw (default), "
                         "zero, or the mean of N draws' chunks")
    ap.add_argument("--gripper", choices=["raw", "binary"], default="raw",
                    help="the executed gripper opening, as `vla eval --gripper`: raw (default) or snapped to 0 / 1")
    flags.add_jobs(ap, 2, "worker processes, one sim bridge each")
    ap.add_argument("--robot", default="sim-franka-fast",
                    help="sim site preset the workers copy onto their own ports (default sim-franka-fast); it must "
                         "deliver every camera the checkpoint reads, e.g. sim-franka-fast-3cam for a model trained "
                         "with the side camera")
    flags.add_port0(ap)
    flags.add_out(ap)
    ap.add_argument("--name", default="vla_confusion", help="result file names: OUT/NAME.json and .png")
    args = ap.parse_args(argv)
    if args.from_json:
        return reclassify(args.from_json)
    if not args.checkpoint:
        ap.error("give --checkpoint (or --from-json FILE)")
    if args.episodes < 1 or args.jobs < 1:
        ap.error("--episodes and --jobs must be >= 1")
    if args.ensemble_window is not None and (args.ensemble_window < 1 or args.exec_steps):
        ap.error("--ensemble-window must be >= 1 and goes with temporal ensembling (no --exec-steps)")
    from vla.envs import noise_option

    try:
        noise_option(args.noise)
    except ValueError as e:
        ap.error(str(e))
    os.environ.setdefault("MUJOCO_GL", "egl")
    from bench.harness.jobs import run_workers

    from hardware.sim_tasks import get_task
    from vla.models import resolve_checkpoint

    from robot_io.site import load_site

    ck_path = os.path.join(resolve_checkpoint(args.checkpoint), "config.json")
    ck_cfg = {}
    if os.path.isfile(ck_path):  # a compact VLA's; other backbones name no cameras there
        with open(ck_path) as f:
            ck_cfg = json.load(f)
    try:
        site_cams = load_site(args.robot).cameras
    except (FileNotFoundError, ValueError) as e:  # SiteError is a ValueError
        ap.error(f"--robot: {e}")
    missing = [c for c in (ck_cfg.get("config") or {}).get("cameras") or () if c not in site_cams]
    if missing:
        ap.error(f"--robot {args.robot} has no camera {', '.join(missing)} (it has {', '.join(site_cams)}), which "
                 f"the checkpoint reads: give a site that has it (sim-franka-fast-3cam has front, wrist and side)")
    tasks = args.tasks
    if not tasks:
        tasks = ck_cfg.get("sim_tasks")
        if not tasks:
            ap.error("give --task: the checkpoint does not record its sim tasks")
    for t in tasks:
        named_cube(get_task(t))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.instruction and args.wording != "instruction":
        ap.error(f"--instruction and --wording {args.wording}: choose one")

    try:
        pairs = [(t, args.seed_start + i, episode_wording(get_task(t), i, args.wording, args.instruction))
                 for t in tasks for i in range(args.episodes)]
    except ValueError as e:
        ap.error(str(e))
    jobs = min(args.jobs, len(pairs))
    t0 = time.perf_counter()
    parts = run_workers(work, pairs, jobs, args.port0, str(args.out / args.name), site=args.robot,
                        checkpoint=args.checkpoint, exec_steps=args.exec_steps,
                        ensemble_window=args.ensemble_window, noise=args.noise, gripper=args.gripper)
    episodes = sorted((e for p in parts for e in p), key=lambda e: (tasks.index(e["task"]), e["seed"]))
    summary = summarize(episodes, tasks)
    for t, r in summary["tasks"].items():
        print(f"{t:<22} success {r['successes']:>2}/{r['episodes']}  grasped first: "
              + ", ".join(f"{(c or 'none').split('_')[0]} {n}" for c, n in r["grasped_first"].items())
              + "  | " + ", ".join(f"{o} {n}" for o, n in r["outcomes"].items() if n))
        if r["push_moved_the_cube"]:
            print(f"{'':<22} the push moved the cube: "
                  + ", ".join(f"{d} {n}" for d, n in r["push_moved_the_cube"].items()))
        if r.get("push_touchdown"):
            td = r["push_touchdown"]
            print(f"{'':<22} came down to push in {td['came_down']}: {td['median_off_cm']} cm from the expert's start "
                  f"point (median), {td['within_2cm']} within 2 cm")
    if summary["named_share_of_grasps"] is not None:
        k, n = summary["named_of_grasped_pooled"]
        print(f"the grasped cube was the named one in {k}/{n} grasps ({100 * k / n:.0f}%)")
    out = {"bench": "vla_confusion", "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "checkpoint": portable(args.checkpoint), "episodes_per_task": args.episodes,
           "seed_start": args.seed_start, "exec_steps": args.exec_steps,
           "execution": execution_label(args.exec_steps, args.ensemble_window, args.noise, args.gripper),
           "ensemble_window": args.ensemble_window, "noise": args.noise, "gripper": args.gripper,
           "instruction_override": args.instruction, "wording": args.wording, "robot": args.robot, "jobs": jobs,
           "wall_s": time.perf_counter() - t0,
           **summary, "episodes": episodes}
    write_result(args.out / f"{args.name}.json", out, "vla_confusion", argv, False, indent=1,
                 default=lambda o: None if o is None else str(o))
    plot(summary, args.out / f"{args.name}.png", plot_title(out))
    print(f"wrote {args.out / args.name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
