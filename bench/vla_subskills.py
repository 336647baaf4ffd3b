#!/usr/bin/env python
"""Each sub-skill instruction of the long tasks, prompted from the state where that sub-skill starts.

A task made of sub-skills (``place_cube_in_bowl``: pick up the red cube, then put it in the bowl;
``stack_cubes``: pick up the green cube, then put it on the red cube) is the vocabulary a prompt
policy (SARL) composes: each sub-skill must work when prompted on its own, from the states where it
begins. For every sub-skill k of each task and every unseen scene (seeds 100000 ...):

1. the scripted expert (a PRIVILEGED ORACLE: it reads the simulator's object poses) carries out
   sub-skills 0 .. k-1 from the scene's start, so the robot stands where sub-skill k starts (for
   k = 0, the scene's start; for "put it in the bowl", the red cube held at the carry height);
2. the VLA takes over with sub-skill k's instruction (``Task.skill_instruction``) and drives for
   ``--budget`` ticks, as `vla eval` runs it (temporal ensembling by default, seeded noise);
3. success: the sub-skill's done predicate (``hardware.sim_tasks.skill_done``: a pick holds its cube
   above 6 cm; a place has let go of it in the bowl / on the cube), read from the simulator by this
   bench only, at any tick.

``--chain`` measures the hand-written prompt sequence instead: from the scene's start the VLA gets each
sub-skill's instruction in turn, moving on when that sub-skill is done (the same PRIVILEGED predicate; a
pick once its cube is held above the carry height where the labels switch) or ``--budget`` ticks pass;
success is the task's own predicate. It is the ceiling of a prompt policy with a privileged terminator.

Writes ``bench/results/<name>.json`` (per sub-skill: successes, 95% interval, the hand-over tick,
every episode) and ``.png`` (success per sub-skill instruction with its interval).

    .venv/bin/python -m bench.vla_subskills --checkpoint vla/checkpoints/base --episodes 20 --jobs 2
"""

from __future__ import annotations

import datetime as _dt
import os
import pathlib
import sys
import time

from bench.harness import flags  # noqa: E402
from bench.harness.results import write_result  # noqa: E402

import numpy as np  # noqa: E402

DEFAULT_TASKS = ("place_cube_in_bowl", "stack_cubes")
CHAIN_PICK_Z = 0.12
"""``--chain``: a pick is done once its cube is grasped and the tcp is above this height (m): where the
scripted expert, and so the sub-skill labels, switch to the place (its carry height less 3 cm)."""


def subskills(tasks) -> list[tuple[str, int, str]]:
    """``(task, k, instruction)`` for every sub-skill of the given segmented tasks."""
    from hardware.sim_tasks import get_task

    out = []
    for name in tasks:
        t = get_task(name)
        if not t.segmented:
            raise ValueError(f"task {name} is one skill (its own instruction prompts it): give a task made of "
                             "sub-skills, e.g. " + ", ".join(DEFAULT_TASKS))
        out += [(name, k, t.skill_instruction(s)) for k, s in enumerate(t.skills)]
    return out


def _state(client, names):
    from hardware.sim_tasks import objects_from_state

    arrays = {k: np.asarray(v) for k, v in client.last_state.arrays.items()}
    return objects_from_state(arrays, names), arrays


def rollout(env, client, expert, policy, task, k: int, seed: int, names: list[str], budget: int) -> dict:
    """One episode: the expert to sub-skill k's start, then ``policy`` with its instruction."""
    from hardware.sim_tasks import grasped, skill_done

    obs, _ = env.reset(seed=seed)
    expert.begin_episode(task.name, seed, task.instruction)
    handover = 0
    while expert.k < k:  # the oracle carries out the sub-skills before k
        if expert.finished or handover >= task.max_steps:
            return {"seed": seed, "reached": False, "handover_tick": handover, "success": False, "ticks": 0}
        _, arrays = _state(client, names)
        cmd = expert.read(obs, {**arrays, "object_names": names})
        obs, *_ = env.step(np.asarray(cmd.action, np.float32))
        handover += 1
    skill = expert.plan[k]
    if hasattr(policy, "reset"):
        policy.reset(seed)
    ticks, success, first_grasped = 0, False, None
    while ticks < budget and not success:
        for row in policy(obs):
            obs, *_ = env.step(row)
            ticks += 1
            objs, _ = _state(client, names)
            ee, grip = np.asarray(obs["state"][:3], float), float(obs["state"][7])  # [ee_pos, quat, gripper]
            if first_grasped is None:
                first_grasped = next((c for c in ("red_cube", "green_cube", "blue_cube")
                                      if grasped(objs[c], ee, grip)), None)
            success = skill_done(skill, objs, ee, grip)
            if success or ticks >= budget:
                break
    return {"seed": seed, "reached": True, "handover_tick": handover, "success": bool(success), "ticks": ticks,
            "first_grasped": first_grasped}


def rollout_chain(env, client, policy, task, seed: int, names: list[str], budget: int) -> dict:
    """The hand-written prompt sequence (``--chain``): from the scene's start the VLA is given each
    sub-skill's instruction in turn, moving on when that sub-skill is done (PRIVILEGED: the
    simulator's ``skill_done``) or its ``budget`` ticks are spent; success is the task's own predicate.
    The upper bound a prompt policy (SARL) with a privileged terminator can reach with this VLA."""
    from hardware.sim_tasks import skill_done

    obs, _ = env.reset(seed=seed)
    ticks, success, done_skills, reached = 0, False, 0, []
    for k, skill in enumerate(task.skills):
        env.instruction = task.skill_instruction(skill)
        obs = {**obs, "instruction": env.instruction}  # the next observations carry it too
        if hasattr(policy, "reset"):
            policy.reset(seed)  # the ensemble must not average chunks made under the previous prompt
        t_k, done = 0, False
        while t_k < budget and not done and not success:
            for row in policy(obs):
                obs, *_ = env.step(row)
                ticks += 1
                t_k += 1
                objs, _ = _state(client, names)
                ee, grip = np.asarray(obs["state"][:3], float), float(obs["state"][7])
                # a pick hands over where the recorded sub-skill labels switch: the cube held up at the
                # scripted expert's carry height (tcp above 12 cm), not at the first lift
                done = skill_done(skill, objs, ee, grip) and (skill[0] != "pick" or ee[2] > CHAIN_PICK_Z)
                success = task.success(objs, ee, grip)
                if done or success or t_k >= budget:
                    break
        reached.append(t_k if done else None)
        done_skills += bool(done)
        if not done and not success:
            break
    return {"seed": seed, "reached": True, "handover_tick": 0, "success": bool(success), "ticks": ticks,
            "skills_done": done_skills, "ticks_per_skill": reached}


def work(job: dict) -> list[dict]:
    """One worker: its own sim bridge, the VLA, the oracle expert, its share of (task, k, seed)."""
    from hardware.sim_tasks import get_task
    from hardware.teleop.scripted import ScriptedExpert
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from robot_io.bridge_process import running_bridge
    from vla.envs import task_env
    from bench.harness.jobs import eval_policy

    policy = eval_policy(job["checkpoint"], job["exec_steps"])
    expert = ScriptedExpert(quality=1.0, seed=0)
    site = load_site(job["robot"])
    out = []
    with running_bridge(site, job["log"]):
        client = RobotClient(site)
        try:
            names = list(client.description.get("objects", []))
            envs: dict = {}
            for i, (task, k, instruction, seed) in enumerate(job["pairs"]):
                env = envs.setdefault((task, instruction), task_env(client, task, instruction=instruction))
                if k < 0:
                    ep = rollout_chain(env, client, policy, get_task(task), seed, names, job["budget"])
                else:
                    ep = rollout(env, client, expert, policy, get_task(task), k, seed, names, job["budget"])
                ep.update(task=task, k=k, instruction=instruction)
                out.append(ep)
                print(f"[worker {job['index']}] {i + 1}/{len(job['pairs'])} {instruction!r} {seed}: "
                      f"{'success' if ep['success'] else 'failure' if ep['reached'] else 'expert did not get there'}",
                      flush=True)
        finally:
            client.close()
    os.remove(job["log"])
    return out


def summarize(episodes: list[dict], skills: list[tuple[str, int, str]]) -> list[dict]:
    from vla.evaluate import wilson_interval

    rows = []
    for task, k, instruction in skills:
        eps = [e for e in episodes if e["task"] == task and e["k"] == k]
        reached = [e for e in eps if e["reached"]]
        ok = sum(e["success"] for e in reached)
        rows.append({"task": task, "k": k, "instruction": instruction, "episodes": len(eps),
                     "reached": len(reached), "successes": ok,
                     "success_rate": ok / len(reached) if reached else None,
                     "success_ci95": list(wilson_interval(ok, len(reached))) if reached else None,
                     "handover_tick_median": float(np.median([e["handover_tick"] for e in reached])) if reached else None,
                     "ticks_to_success_median": (float(np.median([e["ticks"] for e in reached if e["success"]]))
                                                 if ok else None)})
    return rows


def plot(rows: list[dict], path: pathlib.Path, title: str, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.55 * len(rows) + 1.6))
    y = np.arange(len(rows))
    rate = np.array([r["success_rate"] or 0.0 for r in rows])
    lo = np.array([r["success_ci95"][0] if r["success_ci95"] else 0.0 for r in rows])
    hi = np.array([r["success_ci95"][1] if r["success_ci95"] else 0.0 for r in rows])
    ax.barh(y, rate, color="tab:blue", xerr=[rate - lo, hi - rate], capsize=3)
    for i, r in enumerate(rows):
        ax.text(0.01, i, f"{r['successes']}/{r['reached']}", va="center", color="white", fontsize=8)
    ax.axvline(target, color="tab:red", ls="--", lw=1, label=f"target {target:.0%}")
    ax.set_yticks(y, [(f"{r['instruction']!r}\n({r['task']}, sub-skill {r['k']})" if r["k"] >= 0 else
                       f"{r['task']}:\n{r['instruction'].replace(' -> ', ' -> \n')}") for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("success from the state where the sub-skill starts (95% interval)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    from PIL import Image  # a 64-colour palette PNG: the same plot in a third of the bytes

    Image.open(path).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def main(argv=None) -> int:
    ap = flags.parser("vla_subskills", __doc__.split("\n\n")[0], out=False, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--checkpoint", required=True, help="a `vla train` run or checkpoint")
    ap.add_argument("--task", action="append", dest="tasks",
                    help=f"a sim task made of sub-skills (repeat; default {', '.join(DEFAULT_TASKS)})")
    ap.add_argument("--episodes", type=int, default=20, help="unseen scenes per sub-skill (default 20)")
    ap.add_argument("--budget", type=int, default=100, help="ticks the VLA gets for one sub-skill (default 100, "
                    "the pick tasks' limit)")
    ap.add_argument("--seed-start", type=int, default=100_000, help="first scene seed (default 100000, `vla eval`'s)")
    ap.add_argument("--exec-steps", type=int, default=None, help="chunk rows per re-plan (default: temporal ensembling)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes, one sim bridge each")
    flags.add_port0(ap)
    ap.add_argument("--chain", action="store_true",
                    help="the hand-written prompt sequence instead: from the scene's start the VLA gets each sub-skill's "
                         "instruction in turn (next one when the PRIVILEGED done predicate fires or --budget ticks "
                         "pass); success is the task's. SARL's upper bound with a privileged terminator")
    ap.add_argument("--target", type=float, default=0.8, help="the line drawn on the plot (issue 28: 0.8)")
    flags.add_out(ap)
    ap.add_argument("--name", default="vla_subskills", help="result file names: OUT/NAME.json and .png")
    args = ap.parse_args(argv)
    if args.episodes < 1 or args.jobs < 1 or args.budget < 1:
        ap.error("--episodes, --jobs and --budget must be >= 1")
    os.environ.setdefault("MUJOCO_GL", "egl")
    from bench.harness.jobs import run_workers
    from bench.harness.results import portable as portable_path

    try:
        skills = subskills(args.tasks or DEFAULT_TASKS)
    except (KeyError, ValueError) as e:
        ap.error(str(e).strip('"'))
    if args.chain:  # one row per task: its sub-skill instructions in order
        tasks = list(dict.fromkeys(t for t, _, _ in skills))
        skills = [(t, -1, " -> ".join(i for tt, _, i in skills if tt == t)) for t in tasks]
    args.out.mkdir(parents=True, exist_ok=True)
    pairs = [(t, k, ins, args.seed_start + i) for t, k, ins in skills for i in range(args.episodes)]
    jobs = min(args.jobs, len(pairs))
    t0 = time.perf_counter()
    parts = run_workers(work, pairs, jobs, args.port0, str(args.out / args.name), checkpoint=args.checkpoint,
                        exec_steps=args.exec_steps, budget=args.budget)
    episodes = sorted((e for p in parts for e in p), key=lambda e: (e["task"], e["k"], e["seed"]))
    rows = summarize(episodes, skills)
    for r in rows:
        rate = "n/a" if r["success_rate"] is None else f"{r['success_rate']:.0%}"
        print(f"{r['task']:<20} {r['k']} {r['instruction']!r:<28} {r['successes']:>2}/{r['reached']} ({rate})"
              + (f"; the expert did not reach it in {r['episodes'] - r['reached']}" if r["reached"] < r["episodes"] else ""))
    out = {"bench": "vla_subskills", "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "checkpoint": portable_path(args.checkpoint), "episodes_per_subskill": args.episodes,
           "budget_ticks": args.budget, "seed_start": args.seed_start, "exec_steps": args.exec_steps,
           "execution": f"chunks of {args.exec_steps}" if args.exec_steps else "temporal ensembling (m = 0.01)",
           "handover": ("none: the VLA runs the sub-skill instructions in order from the scene's start, switching on the "
                        "privileged done predicate or the budget (k = -1 rows)" if args.chain else
                        "the scripted expert (privileged oracle) carries out the sub-skills before k"),
           "jobs": jobs, "wall_s": time.perf_counter() - t0, "subskills": rows, "episodes": episodes}
    write_result(args.out / f"{args.name}.json", out, "vla_subskills", argv, False, indent=1)
    plot(rows, args.out / f"{args.name}.png",
         f"{os.path.basename(os.path.normpath(args.checkpoint))}: "
         + ("the sub-skill prompts in order, from the start" if args.chain else "each sub-skill from where it starts")
         + f", {args.episodes} unseen scenes", args.target)
    print(f"wrote {args.out / args.name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
