#!/usr/bin/env python
"""SARL benchmark (issue 30): does RL over language prompts compose the frozen VLA's sub-skills into long tasks it
fails under the task's own prompt?

Every arm is a `vla rl` session from the same frozen VLA checkpoint and the same chunk execution (``--exec-steps``),
one sim bridge each (``bench/dsrl.py``'s job runner):

* ``task prompt``   the base VLA under the task's instruction (each session's base evaluation: zero-shot),
* ``random``        ``--method sarl --prompt-policy random --total-ticks 0``: a uniform prompt from the library at
                    every semantic step,
* ``subskills``     ``--method sarl --prompt-policy subskills --total-ticks 0``: the hand-written sequence, the
                    task's sub-skill instructions in order (the upper bound a prompt policy is held against),
* ``sarl``          ``--method sarl`` (the learned prompt policy), ``--seeds`` seeds, ``--episodes`` x the task's
                    episode length as its tick budget,
* ``dsrl-na``       ``--method dsrl --variant na`` at SARL's tick budget (``--dsrl-seeds``; 0: left out), the
                    action-space steering SARL is compared with.

per terminator (``--terminator``): ``subgoal`` (PRIVILEGED: the sim's sub-goals end a prompt) and / or ``budget``
(a fixed number of chunks per prompt: deployable). Reported per task: each arm's evaluation success with a 95%
Wilson interval, SARL's learning curve against episodes and ticks (mean, min, max over seeds), the first episode at
which an evaluation reached 80%, and the grounding of the sub-skill prompts over SARL's training episodes (how often
"pick up the red cube" lifted the red cube): the measured reason when SARL stays below its goal.

Writes ``bench/results/<name>.json`` and ``<name>.png``; ``bench/results/README.md`` keeps the table of rounds.

    .venv/bin/python -m bench.sarl --checkpoint runs/sft/r15_60 --task place_cube_in_bowl --task stack_cubes
    .venv/bin/python -m bench.sarl --quick --checkpoint runs/sft/r15_60 --task place_cube_in_bowl   # smoke run
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

import numpy as np

from bench.harness import flags, plots
from bench.harness import jobs as sessions
from bench.harness.jobs import max_steps
from bench.harness.results import portable, write_result
from bench.harness.stats import wilson


GOAL = {"success": 0.8, "episodes": 100}
ARMS = ("random", "subskills", "sarl", "dsrl-na")
COLORS = {"random": "#8c8c8c", "subskills": "#55a868", "sarl": "#4c72b0", "dsrl-na": "#c44e52", "task prompt": "k"}


def launch(job: dict, site: str, args):
    arm, term = job["arm"], job["terminator"]
    k = args.chunks_subgoal if term == "subgoal" else args.chunks_budget
    cmd = [sys.executable, "-m", "vla.cli", "rl", "--checkpoint", args.checkpoint, "--task", job["task"],
           "--out", job["out"], "--robot", site, "--seed", str(job["seed"]), "--exec-steps", str(args.exec_steps),
           "--eval-episodes", str(args.eval_episodes), "--threads", "1", "--serve", "always", "--videos", "0"]
    ticks = args.episodes * max_steps(job["task"])
    if arm in ("random", "subskills"):
        cmd += ["--method", "sarl", "--prompt-policy", arm, "--terminator", term, "--chunks-per-prompt", str(k),
                "--total-ticks", "0", "--eval-episodes", str(args.fixed_episodes)]
    elif arm == "sarl":
        cmd += ["--method", "sarl", "--terminator", term, "--chunks-per-prompt", str(k), "--total-ticks", str(ticks),
                "--eval-every", str(args.eval_every), "--warmup-steps", "0",
                "--explore-decay-steps", str(args.explore_decay_steps)]
        if not args.templates:
            cmd += ["--no-templates"]
    else:  # dsrl-na
        cmd += ["--method", "dsrl", "--variant", "na", "--total-ticks", str(ticks), "--eval-every",
                str(args.eval_every), "--warmup-steps", "250", "--utd", "20"]
    return sessions.start_session(cmd, job, "async" if arm == "dsrl-na" else "lockstep")


def collect(job: dict) -> dict:
    r = sessions.collect({**job, "method": job["arm"]})
    r.update(arm=job["arm"], terminator=job["terminator"])
    out = job["out"]
    if "final" not in r:
        return r
    s, counts = sessions.eval_counts(out)
    r.update(counts)
    evals = [json.loads(x) for x in open(os.path.join(out, "evals.jsonl"))] \
        if os.path.isfile(os.path.join(out, "evals.jsonl")) else []
    # the policy's evaluations (the base VLA under the task prompt is its own row: ``task prompt``)
    r["curve_episodes"] = [(e["episode"] + 1, e["success_rate"]) for e in evals] + [(s["episodes"], s["final_success_rate"])]
    r["episodes"] = s["episodes"]
    eps = [json.loads(x) for x in open(os.path.join(out, "episodes.jsonl"))] \
        if os.path.isfile(os.path.join(out, "episodes.jsonl")) else []
    r["train_success"] = float(np.mean([e["success"] for e in eps])) if eps else None
    if eps and "sarl_steps" in eps[0]:  # whether learning happens: training success and prompt choice, per 20 episodes
        vocab = task_vocabulary(job["task"])
        win = [eps[i:i + 20] for i in range(0, len(eps), 20)]
        r["train_success_per_20"] = [float(np.mean([e["success"] for e in w])) for w in win]
        r["task_vocabulary_share_per_20"] = [
            float(np.mean([st["prompt"] in vocab for e in w for st in e["sarl_steps"]] or [0.0])) for w in win]
        r["prompts_per_episode"] = float(np.mean([len(e["sarl_steps"]) for e in eps]))
    if os.path.isfile(os.path.join(out, "grounding.json")):
        with open(os.path.join(out, "grounding.json")) as f:
            r["grounding"] = {p: g for p, g in json.load(f).items() if g["chosen"]}
    return r


def task_vocabulary(task: str) -> set[str]:
    """The prompts that name the task or one of its sub-skills: its instruction, trained paraphrases and sub-skill
    instructions (the rest of a library is templates)."""
    from hardware.sim_tasks import get_task
    from policies.sarl.library import task_prompts

    return set(task_prompts(get_task(task)))


def subskill_grounding(runs: list[dict], task: str) -> dict:
    """Over SARL's training episodes: for each sub-skill prompt of a task made of sub-skills, how often it was
    chosen and how often its own sub-goal (pick: ``lifted_<colour>``; place: ``released``) became true under it."""
    from hardware.sim_tasks import get_task

    t = get_task(task)
    out = {}
    for skill in t.skills if t.segmented else ():  # pick / place sub-skills, each with its own instruction
        prompt = t.skill_instruction(skill)
        goal = f"lifted_{skill[1].split('_')[0]}" if skill[0] == "pick" else "released"
        chosen = sum(r.get("grounding", {}).get(prompt, {}).get("chosen", 0) for r in runs)
        hit = sum(r.get("grounding", {}).get(prompt, {}).get("subgoals", {}).get(goal, 0) for r in runs)
        out[prompt] = {"subgoal": goal, "chosen": chosen, "reached": hit,
                       "rate": hit / chosen if chosen else None}
    return out


def summarize(done: list[dict], args) -> dict:
    out: dict = {}
    for task in args.tasks:
        for term in args.terminators:
            rows = [r for r in done if r["task"] == task and r["terminator"] == term and "final" in r]
            if not rows:
                continue
            cell: dict = {}
            widest = max(rows, key=lambda r: r["base_episodes"])  # every base evaluation starts at the same seed
            k, n = widest["base_successes"], widest["base_episodes"]
            cell["task prompt"] = {"successes": k, "episodes": n, "rate": k / n if n else None, "ci95": wilson(k, n)}
            for arm in ARMS:
                runs = [r for r in rows if r["arm"] == arm]
                if not runs:
                    continue
                k, n = sum(r["final_successes"] for r in runs), sum(r["eval_episodes"] for r in runs)
                f = np.array([r["final"] for r in runs])
                m = {"seeds": len(runs), "successes": k, "episodes": n, "rate": k / n, "ci95": wilson(k, n),
                     "final_per_seed": f.tolist(), "final_mean": float(f.mean()), "final_min": float(f.min()),
                     "final_max": float(f.max())}
                if arm in ("sarl", "dsrl-na"):
                    m["first_episode_at_80"] = [next((int(e) for e, v in r["curve_episodes"] if v >= GOAL["success"]),
                                                     None) for r in runs]
                    m["train_episodes"] = [r["episodes"] for r in runs]
                    m["train_success"] = [r["train_success"] for r in runs]
                    if arm == "sarl":
                        m["train_success_per_20"] = [r.get("train_success_per_20") for r in runs]
                        m["task_vocabulary_share_per_20"] = [r.get("task_vocabulary_share_per_20") for r in runs]
                    m["ticks"] = [r["ticks"] for r in runs]
                    m["wall_s"] = [r["wall_s"] for r in runs]
                if arm == "sarl":
                    m["subskill_grounding"] = subskill_grounding(runs, task)
                cell[arm] = m
            out.setdefault(task, {})[term] = cell
    return out


def plot(done: list[dict], summary: dict, path: pathlib.Path, title: str) -> None:
    plt = plots.pyplot()

    panels = [(t, term) for t, terms in summary.items() for term in terms]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5.0 * max(1, len(panels)), 3.9), squeeze=False)
    for ax, (task, term) in zip(axes[0], panels):
        cell = summary[task][term]
        if not any(arm in cell for arm in ("sarl", "dsrl-na")):  # fixed arms only: their rates with 95% intervals
            names = list(cell)
            rates = np.array([cell[a]["rate"] for a in names]) * 100
            lo = rates - np.array([cell[a]["ci95"][0] for a in names]) * 100
            hi = np.array([cell[a]["ci95"][1] for a in names]) * 100 - rates
            ax.bar(names, rates, yerr=[lo, hi], capsize=4, color=[COLORS[a] for a in names], alpha=0.8)
            for i, a in enumerate(names):
                ax.text(i, rates[i] + 2, f"{cell[a]['successes']}/{cell[a]['episodes']}", ha="center", fontsize=8)
            ax.axhline(GOAL["success"] * 100, color="g", ls=":", lw=0.8)
            ax.set_ylim(0, 103)
            ax.set_ylabel("success (%), 95% interval")
            ax.set_title(f"{task}, terminator {term}" + (" (PRIVILEGED)" if term == "subgoal" else ""), fontsize=9)
            continue
        for arm in ("sarl", "dsrl-na"):
            runs = [r for r in done if r["task"] == task and r["terminator"] == term and r["arm"] == arm
                    and "curve_episodes" in r]
            if not runs:
                continue
            grid = np.array(sorted({e for r in runs for e, _ in r["curve_episodes"]}))
            ys = np.stack([np.interp(grid, [e for e, _ in r["curve_episodes"]], [v for _, v in r["curve_episodes"]])
                           for r in runs]) * 100
            ax.plot(grid, ys.mean(0), color=COLORS[arm], lw=2, marker="o", ms=3, label=f"{arm} (n={len(runs)})")
            ax.fill_between(grid, ys.min(0), ys.max(0), color=COLORS[arm], alpha=0.15)
        for arm, ls in (("task prompt", "--"), ("random", ":"), ("subskills", "-.")):
            if arm in cell:
                ax.axhline(cell[arm]["rate"] * 100, color=COLORS[arm], ls=ls, lw=1.2,
                           label=f"{arm} {cell[arm]['rate'] * 100:.0f}%")
        ax.axhline(GOAL["success"] * 100, color="g", ls=":", lw=0.8, label="goal 80%")
        ax.set_title(f"{task}, terminator {term}" + (" (PRIVILEGED)" if term == "subgoal" else ""), fontsize=9)
        ax.set_xlabel("training episodes")
        ax.set_ylabel("eval success (%)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    plots.save(fig, path, dpi=120)


def main(argv=None) -> int:
    ap = flags.parser("sarl", __doc__, out=False)
    ap.add_argument("--checkpoint", required=True, help="the frozen VLA, trained on the tasks' sub-skill instructions "
                                                        "(`make base-subskills`, or a `vla train` run)")
    ap.add_argument("--task", action="append", dest="tasks", required=True)
    ap.add_argument("--terminator", action="append", dest="terminators", choices=("subgoal", "budget"),
                    help="repeatable (default: subgoal and budget)")
    ap.add_argument("--arms", nargs="+", default=["random", "subskills", "sarl"], choices=ARMS)
    ap.add_argument("--seeds", type=int, default=3, help="SARL sessions per task and terminator")
    ap.add_argument("--dsrl-seeds", type=int, default=1, help="dsrl-na sessions per task (with --arms ... dsrl-na)")
    ap.add_argument("--episodes", type=int, default=GOAL["episodes"],
                    help="SARL's budget: this many episodes' worth of ticks (episodes x the task's max_steps)")
    ap.add_argument("--exec-steps", type=int, default=4, help="chunk rows executed per VLA query, every arm")
    ap.add_argument("--chunks-subgoal", type=int, default=16, help="chunks a prompt may hold, terminator subgoal")
    ap.add_argument("--chunks-budget", type=int, default=10, help="chunks every prompt holds, terminator budget")
    ap.add_argument("--explore-decay-steps", type=int, default=300, help="SARL: semantic steps of Boltzmann decay")
    ap.add_argument("--templates", action=argparse.BooleanOptionalAction, default=True,
                    help="SARL's library includes the verb / object / place templates")
    ap.add_argument("--eval-every", type=int, default=20, help="SARL / DSRL: episodes between evaluations")
    ap.add_argument("--eval-episodes", type=int, default=10, help="SARL / DSRL evaluations (and the final one)")
    ap.add_argument("--fixed-episodes", type=int, default=20, help="episodes of the random / subskills arms")
    flags.add_jobs(ap, 1, "sessions run in parallel (one sim bridge each)")
    flags.add_port0(ap)
    flags.add_quick(ap, "1 seed, 2 episodes, 1 evaluation episode: a smoke run")
    ap.add_argument("--name", default="sarl", help="result files bench/results/<name>.json / .png")
    flags.add_out(ap)
    ap.add_argument("--work", default=None, help="where the session run directories go (default a temp dir)")
    args = ap.parse_args(argv)
    args.terminators = args.terminators or ["subgoal", "budget"]
    if args.quick:
        args.seeds, args.dsrl_seeds, args.episodes, args.eval_every = 1, 1, 2, 0
        args.eval_episodes, args.fixed_episodes = 1, 1
    work = args.work or tempfile.mkdtemp(prefix="bench-sarl-")
    os.makedirs(work, exist_ok=True)
    jobs = []
    for t in args.tasks:
        for term in args.terminators:
            for arm in args.arms:
                if arm == "dsrl-na":
                    continue
                for s in range(args.seeds if arm == "sarl" else 1):
                    jobs.append({"task": t, "arm": arm, "method": arm, "terminator": term, "seed": s,
                                 "out": os.path.join(work, f"{t}-{term}-{arm}-s{s}")})
        if "dsrl-na" in args.arms:  # no prompts: one set of sessions per task, shown in every terminator's panel
            for s in range(args.dsrl_seeds):
                jobs.append({"task": t, "arm": "dsrl-na", "method": "dsrl-na", "terminator": "none", "seed": s,
                             "out": os.path.join(work, f"{t}-dsrl-na-s{s}")})
    t0 = time.perf_counter()
    done = sessions.run_jobs(jobs, work, args, launch)
    done = [collect(next(j for j in jobs if j["out"] == r["out"]) | {"returncode": r["returncode"],
                                                                      "wall_s": r["wall_s"]}) for r in done]
    for r in [r for r in done if r["terminator"] == "none"]:  # dsrl-na belongs to every panel of its task
        done += [{**r, "terminator": term} for term in args.terminators]
    summary = summarize(done, args)
    goals = {}
    for task, terms in summary.items():
        for term, cell in terms.items():
            if "sarl" in cell:
                hits = cell["sarl"]["first_episode_at_80"]
                goals[f"{task}/{term}"] = {
                    "goal": f">= {GOAL['success']:.0%} within {GOAL['episodes']} episodes, 3 seeds",
                    "final_mean": cell["sarl"]["final_mean"], "first_episode_at_80": hits,
                    "met": len(hits) >= 3 and all(h is not None and h <= GOAL["episodes"] for h in hits)}
    keys = ("checkpoint", "tasks", "terminators", "arms", "seeds", "dsrl_seeds", "episodes", "exec_steps",
            "chunks_subgoal", "chunks_budget", "explore_decay_steps", "templates", "eval_every", "eval_episodes",
            "fixed_episodes", "jobs")
    res = {"bench": "sarl", "quick": args.quick, "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
           "settings": {k: getattr(args, k) for k in keys}, "wall_s_total": time.perf_counter() - t0,
           "summary": summary, "goals": goals,
           "runs": [{k: v for k, v in {**r, "out": portable(r["out"])}.items() if k not in ("t0",)}
                    for r in done if r["terminator"] != "none" or r["arm"] != "dsrl-na"]}
    res["settings"]["checkpoint"] = portable(args.checkpoint)
    write_result(args.out / f"{args.name}.json", res, "sarl", argv, args.quick)
    plot(done, summary, args.out / f"{args.name}.png",
         f"SARL vs fixed prompt policies, frozen VLA {os.path.basename(os.path.normpath(args.checkpoint))}, "
         f"exec {args.exec_steps}" + (f", {args.episodes} episodes' ticks, {args.seeds} seed(s)" if "sarl" in args.arms
                                      else ", fixed prompt policies only"))
    for task, terms in summary.items():
        for term, cell in terms.items():
            row = "  ".join(f"{arm} {m['rate']:.0%}" for arm, m in cell.items())
            print(f"{task:<20} {term:<8} {row}")
    print(f"wrote {args.out / (args.name + '.json')} and {args.name}.png")
    return 0 if all("final" in r for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
