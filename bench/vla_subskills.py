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

The hand-written prompt sequence (``--handover own`` or ``both``, the default; ``--chain`` is ``--handover
own``): from the scene's start the VLA gets each sub-skill's instruction in turn, moving on when that sub-skill
is done (the same PRIVILEGED predicate; a pick once its cube is held above the carry height where the labels
switch) or ``--budget`` ticks pass; success is the task's own predicate. It is the ceiling of a prompt policy
with a privileged terminator. The same episodes give each sub-skill from the VLA's OWN hand-over: of the scenes
where the VLA carried out sub-skills 0 .. k-1 itself, the share where it then carried out k. With ``both`` each
sub-skill has the two rows side by side (expert's hand-over, own hand-over).

The task prompts alone (``--task-prompt``, on by default): the VLA with the task's own instruction from the
start for the task's tick limit, as `vla eval` runs it (the zero-shot long task).

The policy runs as `vla eval` does by default: temporal ensembling, ``--noise zero``, ``--gripper auto`` (the
checkpoint's executed opening).

Writes ``bench/results/<name>.json`` (per row: successes, 95% interval, the hand-over tick, every episode)
and ``.png`` (success per row with its interval).

    .venv/bin/python -m bench.vla_subskills --checkpoint vla/checkpoints/base_subskills --episodes 50 --jobs 2
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import pathlib
import sys
import time

from bench.harness import flags  # noqa: E402
from bench.harness.results import write_result  # noqa: E402

import numpy as np  # noqa: E402

DEFAULT_TASKS = ("place_cube_in_bowl", "stack_cubes", "put_all_cubes_in_bowl")
CHAIN, TASK_PROMPT = -1, -2
"""``k`` of the rows that are not one sub-skill: the prompt sequence from the start, the task's own prompt."""
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


def _arm(obs) -> tuple[np.ndarray, float]:
    """The tcp position and the gripper opening of an observation's state ``[ee_pos, quat, gripper]``."""
    return np.asarray(obs["state"][:3], float), float(obs["state"][7])


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
            ee, grip = _arm(obs)
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
    ticks, success, done_skills, reached, starts = 0, False, 0, [], []
    for k, skill in enumerate(task.skills):
        if success:  # the task's goal holds (a place let go early): the sub-skills left are moot
            break
        starts.append(ticks)
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
                ee, grip = _arm(obs)
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
            "skills_done": done_skills, "ticks_per_skill": reached, "skill_start_ticks": starts}


def rollout_task_prompt(env, client, policy, task, seed: int, names: list[str]) -> dict:
    """The task's own instruction from the scene's start for its tick limit (the zero-shot long task, as `vla
    eval` runs it); success: the task's predicate at any tick."""
    obs, _ = env.reset(seed=seed)
    env.instruction = task.instruction
    obs = {**obs, "instruction": task.instruction}
    if hasattr(policy, "reset"):
        policy.reset(seed)
    ticks, success = 0, False
    while ticks < task.max_steps and not success:
        for row in policy(obs):
            obs, *_ = env.step(row)
            ticks += 1
            objs, _ = _state(client, names)
            success = task.success(objs, *_arm(obs))
            if success or ticks >= task.max_steps:
                break
    return {"seed": seed, "reached": True, "handover_tick": 0, "success": bool(success), "ticks": ticks}


def work(job: dict) -> list[dict]:
    """One worker: its own sim bridge, the VLA, the oracle expert, its share of (task, k, seed)."""
    from hardware.sim_tasks import get_task
    from hardware.teleop.scripted import ScriptedExpert
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from robot_io.bridge_process import running_bridge
    from vla.envs import task_env
    from bench.harness.jobs import eval_policy

    from vla.envs import resolve_gripper
    from vla.models import resolve_checkpoint

    gripper = resolve_gripper(job["gripper"], resolve_checkpoint(job["checkpoint"]))
    policy = eval_policy(job["checkpoint"], job["exec_steps"], noise=job["noise"], gripper=gripper)
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
                if k == TASK_PROMPT:
                    ep = rollout_task_prompt(env, client, policy, get_task(task), seed, names)
                elif k == CHAIN:
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


def own_handover(chain: list[dict], k: int) -> list[dict]:
    """Sub-skill k from the VLA's own hand-over, read off prompt-sequence episodes: one entry per scene, reached when
    the VLA carried out sub-skills 0 .. k-1 itself (none needed for k = 0), success when it then carried out k (or
    the task's goal came to hold while k was prompted)."""
    out = []
    for e in chain:
        done = e["ticks_per_skill"]
        reached = len(done) > k and all(t is not None for t in done[:k])
        ok = reached and (done[k] is not None or (e["success"] and len(done) == k + 1))
        out.append({"seed": e["seed"], "reached": reached, "success": bool(ok),
                    "handover_tick": e["skill_start_ticks"][k] if reached else None,
                    "ticks": (done[k] if ok and done[k] is not None else e["ticks"] - e["skill_start_ticks"][k])
                    if reached else 0})
    return out


def _row(task, k, instruction, handover, eps) -> dict:
    from vla.evaluate import wilson_interval

    reached = [e for e in eps if e["reached"]]
    ok = sum(e["success"] for e in reached)
    return {"task": task, "k": k, "instruction": instruction, "handover": handover, "episodes": len(eps),
            "reached": len(reached), "successes": ok,
            "success_rate": ok / len(reached) if reached else None,
            "success_ci95": list(wilson_interval(ok, len(reached))) if reached else None,
            "handover_tick_median": float(np.median([e["handover_tick"] for e in reached])) if reached else None,
            "ticks_to_success_median": (float(np.median([e["ticks"] for e in reached if e["success"]]))
                                        if ok else None),
            # the tick budget that a sub-skill's successes fit in 9 times out of 10 (a budget terminator's setting)
            "ticks_to_success_q90": (float(np.quantile([e["ticks"] for e in reached if e["success"]], 0.9))
                                     if ok else None)}


def summarize(episodes: list[dict], skills: list[tuple[str, int, str]], handover: str = "expert",
              task_prompt: bool = False) -> list[dict]:
    """One row per sub-skill and hand-over (``expert``: the oracle carried out the ones before; ``own``: the VLA did,
    in the prompt-sequence episodes), per task one row for the prompt sequence (k = CHAIN) and, with
    ``task_prompt``, one for the task's own prompt (k = TASK_PROMPT)."""
    from hardware.sim_tasks import get_task

    rows = []
    for task in dict.fromkeys(t for t, _, _ in skills):
        chain = [e for e in episodes if e["task"] == task and e["k"] == CHAIN]
        for t, k, instruction in skills:
            if t != task:
                continue
            if handover in ("expert", "both"):
                rows.append(_row(task, k, instruction, "expert",
                                 [e for e in episodes if e["task"] == task and e["k"] == k]))
            if handover in ("own", "both"):
                rows.append(_row(task, k, instruction, "own", own_handover(chain, k)))
        if handover in ("own", "both"):
            rows.append(_row(task, CHAIN, " -> ".join(i for t, _, i in skills if t == task), "none", chain))
        if task_prompt:
            rows.append(_row(task, TASK_PROMPT, get_task(task).instruction, "none",
                             [e for e in episodes if e["task"] == task and e["k"] == TASK_PROMPT]))
    return rows


def summary_table(rows: list[dict]) -> dict:
    """``summary[task][method]`` for readers: ``task prompt``, ``prompt sequence`` (the hand-written sub-skill
    prompts with the privileged terminator) and, per sub-skill, ``k: 'instruction' from the expert's / VLA's
    hand-over``; each {successes, episodes (the scenes where it was reached), rate, ci95}."""
    out: dict = {}
    for r in rows:
        if r["k"] == TASK_PROMPT:
            method = "task prompt"
        elif r["k"] == CHAIN:
            method = "prompt sequence"
        else:
            method = f"{r['k']}: {r['instruction']!r} from the {'expert' if r['handover'] == 'expert' else 'VLA'}'s hand-over"
        out.setdefault(r["task"], {})[method] = {"successes": r["successes"], "episodes": r["reached"],
                                                 "rate": r["success_rate"], "ci95": r["success_ci95"]}
    return out


def label(r: dict) -> str:
    """A row's name on the plot and in the terminal."""
    if r["k"] == CHAIN:
        return f"{r['task']}: the sub-skill prompts in order"
    if r["k"] == TASK_PROMPT:
        return f"{r['task']}: the task prompt {r['instruction']!r}"
    return f"{r['task']} {r['k']}: {r['instruction']!r} from the {'expert' if r['handover'] == 'expert' else 'VLA'}'s hand-over"


def plot(rows: list[dict], path: pathlib.Path, title: str, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.42 * len(rows) + 1.6))
    y = np.arange(len(rows))
    rate = np.array([r["success_rate"] or 0.0 for r in rows])
    lo = np.array([r["success_ci95"][0] if r["success_ci95"] else 0.0 for r in rows])
    hi = np.array([r["success_ci95"][1] if r["success_ci95"] else 0.0 for r in rows])
    colours = {"expert": "tab:gray", "own": "tab:blue", "none": "tab:green"}
    names = {"expert": "sub-skill from the expert's hand-over (oracle)", "own": "sub-skill from the VLA's own hand-over",
             "none": "whole task from the start"}
    for h in colours:
        sel = np.array([r.get("handover", "expert") == h for r in rows])
        if sel.any():
            # a Wilson bound equals the rate at 0 / n and n / n up to rounding: clip, matplotlib refuses < 0
            err = np.clip([(rate - lo)[sel], (hi - rate)[sel]], 0.0, None)
            ax.barh(y[sel], rate[sel], color=colours[h], xerr=err, capsize=3,
                    label=names[h])
    for i, r in enumerate(rows):
        ax.text(0.01, i, f"{r['successes']}/{r['reached']}", va="center", color="white", fontsize=7)
    ax.axvline(target, color="tab:red", ls="--", lw=1, label=f"target {target:.0%}")
    ax.set_yticks(y, [label(r) if "handover" in r else r["instruction"] for r in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("success (95% interval); a sub-skill's: of the scenes where it was reached")
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.6 / (0.42 * len(rows))), ncol=2)
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the long row names widen the figure instead of being cut
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
    ap.add_argument("--handover", choices=("expert", "own", "both"), default="both",
                    help="where each sub-skill starts. expert: the scripted oracle carries out the ones before; own: the "
                         "hand-written prompt sequence from the scene's start (each sub-skill's instruction in turn, the "
                         "next when the PRIVILEGED done predicate fires or --budget ticks pass; SARL's upper bound with a "
                         "privileged terminator), each sub-skill counted from the scenes where the VLA carried out the "
                         "ones before; both (default): the two side by side")
    ap.add_argument("--chain", action="store_true", help="same as --handover own (the prompt sequence alone)")
    ap.add_argument("--task-prompt", action=argparse.BooleanOptionalAction, default=True,
                    help="also the task's own instruction from the start, for its tick limit (the zero-shot long "
                         "task, as `vla eval` runs it; default on)")
    ap.add_argument("--noise", default="zero", metavar="sample|zero|mean:N",
                    help="the sampler's starting noise, as `vla eval --noise` (default zero)")
    ap.add_argument("--gripper", default="auto", choices=("auto", "raw", "binary"),
                    help="the executed gripper opening, as `vla eval --gripper` (default auto: the checkpoint's)")
    ap.add_argument("--target", type=float, default=0.8, help="the line drawn on the plot (issue 28: 0.8)")
    flags.add_out(ap)
    ap.add_argument("--name", default="vla_subskills", help="result file names: OUT/NAME.json and .png")
    ap.add_argument("--replot", action="store_true", help="draw OUT/NAME.png again from OUT/NAME.json (no episodes run)")
    args = ap.parse_args(argv)
    if args.replot:
        import json

        res = json.loads((args.out / f"{args.name}.json").read_text())
        plot(res["subskills"], args.out / f"{args.name}.png",
             f"{os.path.basename(os.path.normpath(res['checkpoint']))}: each sub-skill from where it starts, "
             f"{res['episodes_per_subskill']} unseen scenes", args.target)
        print(f"wrote {args.out / args.name}.png")
        return 0
    if args.episodes < 1 or args.jobs < 1 or args.budget < 1:
        ap.error("--episodes, --jobs and --budget must be >= 1")
    os.environ.setdefault("MUJOCO_GL", "egl")
    from bench.harness.jobs import run_workers
    from bench.harness.results import portable as portable_path

    try:
        skills = subskills(args.tasks or DEFAULT_TASKS)
    except (KeyError, ValueError) as e:
        ap.error(str(e).strip('"'))
    if args.chain:
        args.handover = "own"
    from vla.envs import noise_option

    try:
        noise_option(args.noise)
    except ValueError as e:
        ap.error(f"--noise: {e}")
    tasks = list(dict.fromkeys(t for t, _, _ in skills))
    runs = [(t, k, ins) for t, k, ins in skills] if args.handover in ("expert", "both") else []
    if args.handover in ("own", "both"):  # one prompt-sequence run per task gives every own-hand-over row
        runs += [(t, CHAIN, " -> ".join(i for tt, _, i in skills if tt == t)) for t in tasks]
    if args.task_prompt:
        from hardware.sim_tasks import get_task

        runs += [(t, TASK_PROMPT, get_task(t).instruction) for t in tasks]
    args.out.mkdir(parents=True, exist_ok=True)
    # the longest runs first, so that the workers finish together
    cost = {TASK_PROMPT: 3, CHAIN: 2}
    runs.sort(key=lambda r: -cost.get(r[1], 1))
    pairs = [(t, k, ins, args.seed_start + i) for t, k, ins in runs for i in range(args.episodes)]
    jobs = min(args.jobs, len(pairs))
    t0 = time.perf_counter()
    parts = run_workers(work, pairs, jobs, args.port0, str(args.out / args.name), checkpoint=args.checkpoint,
                        exec_steps=args.exec_steps, budget=args.budget, noise=args.noise, gripper=args.gripper)
    episodes = sorted((e for p in parts for e in p), key=lambda e: (e["task"], e["k"], e["seed"]))
    rows = summarize(episodes, skills, args.handover, args.task_prompt)
    for r in rows:
        rate = "n/a" if r["success_rate"] is None else f"{r['success_rate']:.0%}"
        who = "the expert" if r["handover"] == "expert" else "the VLA"
        print(f"{label(r):<90} {r['successes']:>2}/{r['reached']} ({rate})"
              + (f"; {who} did not get there in {r['episodes'] - r['reached']}" if r["reached"] < r["episodes"] else ""))
    out = {"bench": "vla_subskills", "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "checkpoint": portable_path(args.checkpoint), "episodes_per_subskill": args.episodes,
           "budget_ticks": args.budget, "seed_start": args.seed_start, "exec_steps": args.exec_steps,
           "execution": f"chunks of {args.exec_steps}" if args.exec_steps else "temporal ensembling (m = 0.01)",
           "noise": args.noise, "gripper": args.gripper, "handover_mode": args.handover,
           "handover": {"expert": "the scripted expert (privileged oracle) carries out the sub-skills before k",
                        "own": "the VLA carried out the sub-skills before k, in the prompt-sequence episodes (rows of "
                               "the scenes where it did)",
                        "none": "the whole task from the scene's start: k = -1 the sub-skill instructions in order, "
                                "switching on the privileged done predicate or the budget; k = -2 the task's own "
                                "instruction for its tick limit"},
           "jobs": jobs, "wall_s": time.perf_counter() - t0, "subskills": rows,
           "summary": summary_table(rows), "episodes": episodes}
    write_result(args.out / f"{args.name}.json", out, "vla_subskills", argv, False, indent=1)
    plot(rows, args.out / f"{args.name}.png",
         f"{os.path.basename(os.path.normpath(args.checkpoint))}: "
         + f": each sub-skill from where it starts, {args.episodes} unseen scenes", args.target)
    print(f"wrote {args.out / args.name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
