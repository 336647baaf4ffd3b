#!/usr/bin/env python
"""GRPO and LfH benchmark (issue 31): does GRPO lift the flow VLA on a task it is weak at, and does LfH's hindsight
relabelling get there in fewer steps, with more usable groups?

Every arm is a `vla rl` session from the same VLA checkpoint, the same chunk execution and the same evaluation scenes,
one sim bridge each (``bench/dsrl.py``'s job runner):

* ``grpo``              ``--method grpo``: groups of G rollouts from one scene, binary task reward, PPO-clip on the
                        stochastic sampler's log-probabilities, KL to the base;
* ``lfh``               ``--method lfh --judge sim``: + hindsight relabelling of groups below eta by the simulation
                        judge (PRIVILEGED: the tasks' success predicates and the pick sub-skills on the simulator's
                        state);
* ``instruction-only``, ``rescore-only``, ``random``: the paper's ablations (``--hindsight ...``).

The budget is ``--updates`` policy updates (``--group-size`` x ``--groups-per-update`` rollouts each); every
``--eval-every-updates`` updates the session evaluates the tuned policy on ``--eval-episodes`` fixed scenes. Reported
per arm: base and final success with 95% Wilson intervals, the curve of success against updates and rollouts, the
share of usable groups (reward variance > 0) with and without hindsight, the judge's relabel counts, the first
update at which LfH reached GRPO's final success, and the final evaluation against the base's scene by scene
(``paired_with_base``: scenes gained and lost, per seed and pooled; the seeds share the base's scenes, so the pooled
sign test is a guide, not a claim). Each session's tuned checkpoint stays in its run directory
(``--work``).

Writes ``bench/results/<name>.json`` and ``<name>.png``; ``bench/results/README.md`` keeps the table of rounds.

    .venv/bin/python -m bench.lfh --checkpoint vla/checkpoints/base --task place_cube_in_bowl
    .venv/bin/python -m bench.lfh --quick --checkpoint vla/checkpoints/base --task pick_blue_cube   # smoke run
"""

from __future__ import annotations

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
from bench.harness.jobs import grpo_session, session_logs
from bench.harness.results import portable, write_result
from bench.harness.stats import mcnemar, sign_test, wilson


ARMS = ("grpo", "lfh", "instruction-only", "rescore-only", "random")
COLORS = {"grpo": "#4c72b0", "lfh": "#c44e52", "instruction-only": "#dd8452", "rescore-only": "#8172b3",
          "random": "#8c8c8c"}
GOAL = {"lift_points": 0.15, "lfh_steps_fraction": 1 / 2, "usable_share": 0.70}
"""Issue 64's goals (issue 31 asked for 20 points and 1/3 of the updates): GRPO lifts the base by >= 15 points, LfH
reaches GRPO's final success in <= 1/2 of its updates (the paper: about 1/5), LfH's usable groups >= 70%."""


def launch(job: dict, site: str, args):
    arm = job["arm"]
    cmd = grpo_session(job, site, args, args.checkpoint, args.updates)
    if arm == "grpo":
        cmd += ["--method", "grpo"]
    else:
        cmd += ["--method", "lfh", "--judge", "sim", "--hindsight", "lfh" if arm == "lfh" else arm,
                "--hindsight-coef", str(args.hindsight_coef)]
    return sessions.start_session(cmd, job)


def collect(job: dict) -> dict:
    r = sessions.collect({**job, "method": job["arm"]})
    r.update(arm=job["arm"])
    out = job["out"]
    if "final" not in r:
        return r
    s, counts = sessions.eval_counts(out)
    r.update(counts)
    per_update = job["group_size"] * job["groups_per_update"]
    evals, _, ups = session_logs(out)
    r["curve_updates"] = [(0, s["base_success_rate"])] + [((e["episode"] + 1) // per_update, e["success_rate"])
                                                          for e in evals]
    if not evals or (evals[-1]["episode"] + 1) != s["episodes"]:
        r["curve_updates"].append((s["episodes"] // per_update, s["final_success_rate"]))
    r["usable_per_update"] = [e["charts/usable_groups"] for e in ups]
    r["usable_with_hindsight_per_update"] = [e["charts/usable_groups_with_hindsight"] for e in ups]
    r["train_success_per_update"] = [e["charts/group_success"] for e in ups]
    # whether learning happens at all: how far each update moved the policy, and the hindsight term's size
    r["clip_fraction_per_update"] = [e.get("diag/clip_fraction") for e in ups]
    r["kl_to_base_per_update"] = [e.get("losses/kl") for e in ups]
    r["hindsight_loss_per_update"] = [e.get("losses/hindsight") for e in ups]
    r["episodes"] = s["episodes"]
    r["agent"] = s.get("agent", {})
    r["relabels"] = relabel_counts(out)
    r["paired"] = paired_with_base(out)
    return r


def paired_with_base(out: str) -> dict | None:
    """The final evaluation against the base's, scene by scene (the same seeds): scenes only the tuned policy solved,
    only the base solved, and the exact McNemar p (None when either file lacks its episodes)."""
    try:
        with open(os.path.join(out, "base_eval.json")) as f:
            base = {e["seed"]: e["success"] for e in json.load(f)["per_episode"]}
        with open(os.path.join(out, "final_eval.json")) as f:
            final = {e["seed"]: e["success"] for e in json.load(f)["per_episode"]}
    except (OSError, KeyError, ValueError):
        return None
    m = mcnemar(final, base)
    return {"scenes": m["episodes"], "gained": m["only_first"], "lost": m["only_second"], "mcnemar_p": m["mcnemar_p"]}


def relabel_counts(out: str) -> dict[str, int]:
    """How often each hindsight instruction was proposed (``relabels`` of the episodes that completed an update)."""
    counts: dict[str, int] = {}
    for line in open(os.path.join(out, "episodes.jsonl")):
        for g in json.loads(line).get("relabels", []):
            counts[g] = counts.get(g, 0) + 1
    return counts


def summarize(done: list[dict], args) -> dict:
    out: dict = {}
    for task in args.tasks:
        cell = {}
        for arm in args.arms:
            rs = [r for r in done if r["task"] == task and r["arm"] == arm and "final" in r]
            if not rs:
                continue
            k = sum(r["final_successes"] for r in rs)
            n = sum(r["eval_episodes"] for r in rs)
            kb = sum(r["base_successes"] for r in rs)
            nb = sum(r["base_episodes"] for r in rs)
            cell[arm] = {"seeds": len(rs), "final": [r["final"] for r in rs], "rate": k / n, "ci95": wilson(k, n),
                         "base_rate": kb / nb, "base_ci95": wilson(kb, nb), "lift_points": k / n - kb / nb,
                         "usable_share": float(np.mean([u for r in rs for u in r["usable_per_update"]] or [0.0])),
                         "usable_share_with_hindsight": float(np.mean(
                             [u for r in rs for u in r["usable_with_hindsight_per_update"]] or [0.0])),
                         "train_success_first_last": [[r["train_success_per_update"][0],
                                                       r["train_success_per_update"][-1]] for r in rs
                                                      if r["train_success_per_update"]],
                         "relabels": {g: sum(r["relabels"].get(g, 0) for r in rs)
                                      for g in sorted({g for r in rs for g in r["relabels"]})}}
            paired = [r["paired"] for r in rs if r.get("paired")]
            if paired:  # scene by scene against the base, pooled over seeds (the exact sign test on the pool)
                gained, lost = sum(p["gained"] for p in paired), sum(p["lost"] for p in paired)
                cell[arm]["paired_with_base"] = {"seeds": len(paired), "gained": gained, "lost": lost,
                                                 "sign_test_p": sign_test(gained, lost),
                                                 "per_seed": [[p["gained"], p["lost"]] for p in paired]}
        if "grpo" in cell and "lfh" in cell:  # the first update at which LfH reached GRPO's final success
            target = cell["grpo"]["rate"]
            firsts = []
            for r in [r for r in done if r["task"] == task and r["arm"] == "lfh" and "final" in r]:
                firsts.append(next((u for u, v in r["curve_updates"][1:] if v >= target), None))
            cell["lfh_first_update_at_grpo_final"] = firsts
        out[task] = cell
    return out


def plot(done: list[dict], summary: dict, path: pathlib.Path, title: str) -> None:
    plt = plots.pyplot()

    tasks = list(summary)
    fig, axes = plt.subplots(len(tasks), 3, figsize=(17, 4.2 * len(tasks)), squeeze=False)
    for row, task in enumerate(tasks):
        ax, ax2, ax3 = axes[row]
        for arm in ARMS:
            rs = [r for r in done if r["task"] == task and r["arm"] == arm and "final" in r]
            for i, r in enumerate(rs):
                u, v = zip(*r["curve_updates"])
                ax.plot(u, v, "-o", color=COLORS[arm], alpha=0.9 if len(rs) == 1 else 0.5, ms=4,
                        label=f"{arm}" if i == 0 else None)
                ups = np.arange(1, len(r["usable_per_update"]) + 1)
                ax2.plot(ups, r["usable_with_hindsight_per_update"], "-", color=COLORS[arm], alpha=0.7,
                         label=f"{arm} (with hindsight)" if i == 0 and arm != "grpo" else None)
                if arm == "grpo":
                    ax2.plot(ups, r["usable_per_update"], "-", color=COLORS[arm], alpha=0.9,
                             label="grpo" if i == 0 else None)
                ax3.plot(ups, r["train_success_per_update"], "-", color=COLORS[arm], alpha=0.7,
                         label=arm if i == 0 else None)
        base = next(iter(summary[task].values()), {}).get("base_rate")
        if base is not None:
            ax.axhline(base, color="k", ls=":", lw=1, label="base VLA")
        ax.set_title(f"{task}: evaluation success")
        ax.set_xlabel("policy updates")
        ax.set_ylim(-0.03, 1.03)
        ax.legend(fontsize=8)
        ax2.set_title(f"{task}: share of usable groups per update")
        ax2.set_xlabel("policy update")
        ax2.set_ylim(-0.03, 1.03)
        ax2.legend(fontsize=8)
        ax3.set_title(f"{task}: training rollouts' success per update")
        ax3.set_xlabel("policy update")
        ax3.set_ylim(-0.03, 1.03)
        ax3.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    plots.save(fig, path, dpi=110)


def main(argv=None) -> int:
    ap = flags.parser("lfh", __doc__, out=False)
    ap.add_argument("--checkpoint", required=True, help="the VLA GRPO starts from (its files are never changed)")
    ap.add_argument("--task", action="append", dest="tasks", required=True)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--seeds", type=int, default=3, help="sessions per arm and task")
    ap.add_argument("--ablation-seeds", type=int, default=None,
                    help="sessions per ablation arm (instruction-only, rescore-only, random); default --seeds")
    ap.add_argument("--updates", type=int, default=20, help="policy updates per session (the budget)")
    ap.add_argument("--group-size", type=int, default=8, help="G: rollouts per group (LfH sim: 8)")
    ap.add_argument("--groups-per-update", type=int, default=2)
    ap.add_argument("--sigma", type=float, default=0.1, help="the stochastic sampler's noise per denoising step")
    ap.add_argument("--lr", type=float, default=5e-6)
    ap.add_argument("--train", default="policy", choices=("head", "policy", "lora"))
    ap.add_argument("--hindsight-coef", type=float, default=0.1, help="lambda of the H-GRPO term (LfH: 0.1)")
    ap.add_argument("--exec-steps", type=int, default=4, help="chunk rows executed per VLA query, every arm")
    ap.add_argument("--eval-every-updates", type=int, default=5)
    ap.add_argument("--eval-episodes", type=int, default=20)
    flags.add_jobs(ap, 2, "sessions run in parallel (one sim bridge each)")
    flags.add_port0(ap)
    flags.add_quick(ap, "1 seed, 1 update of 2 x 2 rollouts, 2 evaluation episodes")
    ap.add_argument("--collect-only", action="store_true",
                    help="report the sessions of --work that finished (a bench cut short); run nothing")
    ap.add_argument("--name", default="lfh", help="result files bench/results/<name>.json / .png")
    flags.add_out(ap)
    ap.add_argument("--work", default=None, help="where the session run directories go (default a temp dir)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.updates, args.group_size, args.groups_per_update = 1, 1, 2, 1
        args.eval_every_updates, args.eval_episodes = 1, 2
    work = args.work or tempfile.mkdtemp(prefix="bench-lfh-")
    os.makedirs(work, exist_ok=True)
    ablation_seeds = args.seeds if args.ablation_seeds is None else args.ablation_seeds
    jobs = [{"task": t, "arm": arm, "method": arm, "seed": s, "group_size": args.group_size,
             "groups_per_update": args.groups_per_update, "out": os.path.join(work, f"{t}-{arm}-s{s}")}
            for s in range(args.seeds) for t in args.tasks for arm in args.arms
            if arm in ("grpo", "lfh") or s < ablation_seeds]  # seed-major: every arm's first seed comes first
    t0 = time.perf_counter()
    if args.collect_only:  # a bench cut short: report the sessions that finished, run nothing
        jobs = [j for j in jobs if os.path.isfile(os.path.join(j["out"], "summary.json"))]
        print(f"collecting {len(jobs)} finished session(s) from {work}", flush=True)
    done = sessions.run_jobs(jobs, work, args, launch)
    done = [collect(next(j for j in jobs if j["out"] == r["out"]) | {"returncode": r["returncode"],
                                                                      "wall_s": r["wall_s"]}) for r in done]
    summary = summarize(done, args)
    goals = {}
    for task, cell in summary.items():
        g = {}
        if "grpo" in cell:
            g["grpo_lift_points"] = {"goal": f">= {round(100 * GOAL['lift_points'])} points over the base",
                                     "value": cell["grpo"]["lift_points"],
                                     "met": cell["grpo"]["lift_points"] >= GOAL["lift_points"]}
        if "lfh" in cell and "grpo" in cell:
            firsts = cell["lfh_first_update_at_grpo_final"]
            g["lfh_steps"] = {"goal": f"LfH reaches GRPO's final success in <= {GOAL['lfh_steps_fraction']:.2g} "
                                      "of its updates",
                              "first_updates": firsts,
                              "met": bool(firsts) and all(f is not None and f <= args.updates * GOAL["lfh_steps_fraction"]
                                                          for f in firsts) and cell["grpo"]["lift_points"] > 0}
            g["lfh_usable"] = {"goal": ">= 70% usable groups", "value": cell["lfh"]["usable_share_with_hindsight"],
                               "grpo": cell["grpo"]["usable_share"],
                               "met": cell["lfh"]["usable_share_with_hindsight"] >= GOAL["usable_share"]}
        goals[task] = g
    args.ablation_seeds = ablation_seeds
    args.collected_only = args.collect_only
    keys = ("checkpoint", "tasks", "arms", "seeds", "ablation_seeds", "collected_only", "updates", "group_size", "groups_per_update", "sigma", "lr", "train",
            "hindsight_coef", "exec_steps", "eval_every_updates", "eval_episodes", "jobs")
    res = {"bench": "lfh", "quick": args.quick, "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
           "settings": {k: getattr(args, k) for k in keys}, "wall_s_total": time.perf_counter() - t0,
           "judge": "sim (PRIVILEGED: the simulator's success predicates and pick sub-skills)",
           "summary": summary, "goals": goals,
           "runs": [{k: v for k, v in {**r, "out": portable(r["out"])}.items() if k not in ("t0",)}
                    for r in done]}
    res["settings"]["checkpoint"] = portable(args.checkpoint)
    write_result(args.out / f"{args.name}.json", res, "lfh", argv, args.quick)
    plot(done, summary, args.out / f"{args.name}.png",
         f"GRPO / LfH from {os.path.basename(os.path.normpath(args.checkpoint))}: {args.updates} updates of "
         f"{args.groups_per_update} x {args.group_size} rollouts, exec {args.exec_steps}; seeds: "
         + ", ".join(f"{a} {sum(1 for r in done if r['arm'] == a and 'final' in r)}" for a in args.arms))
    for task, cell in summary.items():
        row = "  ".join(f"{arm} {m['rate']:.0%} (usable {m['usable_share_with_hindsight']:.0%})"
                        for arm, m in cell.items() if isinstance(m, dict) and "rate" in m)
        base = next((m["base_rate"] for m in cell.values() if isinstance(m, dict) and "base_rate" in m), None)
        print(f"{task:<20} base {base:.0%}  {row}" if base is not None else task)
    print(f"wrote {args.out / (args.name + '.json')} and {args.name}.png")
    return 0 if all("final" in r for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
