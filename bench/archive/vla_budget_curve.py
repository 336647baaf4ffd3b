#!/usr/bin/env python
"""Success of a `vla train` recipe against its training budget: optimiser steps and demos per task.

Reads a round file of ``bench/results/vla_sft/`` (``roundN.json``, written from the runs' own
``train_config.json`` / ``train_summary.json`` and their ``bench/vla_confusion.py`` results) and plots, per
task and pooled, the success of the runs that differ from the round's first run only in steps or in demos
(with 95% Wilson intervals), so the budget a target needs can be read off, or its absence seen.

    .venv/bin/python -m bench.archive.vla_budget_curve --round bench/results/vla_sft/round15.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from bench.harness.results import ROOT  # noqa: E402


def budget(run: dict) -> tuple[int, int]:
    """(optimiser steps in all, counting an ``--init`` run's parent; demos per task) of one run."""
    return int(run["total_steps"]), int(run["demos_per_task"])


def points(rnd: dict) -> dict[str, list[dict]]:
    """``{"steps": [...], "demos": [...]}``: per run, its budget and per-task successes."""
    out: dict[str, list[dict]] = {"steps": [], "demos": []}
    base = rnd["runs"][0]
    b_steps, b_demos = budget(base)
    for run in rnd["runs"]:
        ev = run["evals"].get("trained wording")
        if ev is None or run["train_config"].get("paraphrases") != base["train_config"].get("paraphrases"):
            continue
        steps, demos = budget(run)
        row = {"run": run["run"], "steps": steps, "demos_per_task": demos,
               "tasks": {t: [v["successes"], v["episodes"]] for t, v in ev["tasks"].items()}}
        if demos == b_demos:
            out["steps"].append(row)
        if steps == b_steps:
            out["demos"].append(row)
    for k in out:
        out[k].sort(key=lambda r: r["steps" if k == "steps" else "demos_per_task"])
    return out


def plot(pts: dict[str, list[dict]], path: pathlib.Path, title: str, targets: dict[str, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from vla.evaluate import wilson_interval

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (kind, key, label) in zip(axes, (("steps", "steps", "optimiser steps (batch 128)"),
                                             ("demos", "demos_per_task", "demos per task"))):
        rows = pts[kind]
        if not rows:
            ax.set_visible(False)
            continue
        x = np.array([r[key] for r in rows], float)
        tasks = list(rows[0]["tasks"])
        for t in tasks:
            k = np.array([r["tasks"][t][0] for r in rows], float)
            n = np.array([r["tasks"][t][1] for r in rows], float)
            line, = ax.plot(x, k / n, "o-", lw=1.2, label=t)
            if t in targets:
                ax.axhline(targets[t], color=line.get_color(), ls=":", lw=0.8)
        k = np.array([sum(v[0] for v in r["tasks"].values()) for r in rows], float)
        n = np.array([sum(v[1] for v in r["tasks"].values()) for r in rows], float)
        ci = np.array([wilson_interval(int(a), int(b)) for a, b in zip(k, n)])
        ax.errorbar(x, k / n, yerr=[k / n - ci[:, 0], ci[:, 1] - k / n], fmt="s-", color="black", lw=2, capsize=4,
                    label="pooled (95% interval)")
        ax.set_xticks(x)
        ax.set_xlabel(label)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success, unseen scenes (dotted: the issue's targets)")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    from PIL import Image  # a 64-colour palette PNG: the same plot in a third of the bytes

    Image.open(path).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


TARGETS = {"pick_red_cube": 0.85, "pick_blue_cube": 0.85, "lift_green_cube": 0.85, "place_cube_in_bowl": 0.75,
           "push_block_to_marker": 0.75, "stack_cubes": 0.60}
"""Issue 28's per-task targets."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--round", type=pathlib.Path, required=True, help="bench/results/vla_sft/roundN.json")
    args = ap.parse_args(argv)
    rnd = json.loads(args.round.read_text())
    pts = points(rnd)
    path = args.round.with_name(args.round.stem + "_budget.png")
    plot(pts, path, f"round {rnd['round']}: success against training budget (each run differs from "
                    f"{rnd['runs'][0]['run']} in steps or demos only)", TARGETS)
    for kind, rows in pts.items():
        for r in rows:
            k = sum(v[0] for v in r["tasks"].values())
            n = sum(v[1] for v in r["tasks"].values())
            print(f"{kind:<5} {r['run']:<16} steps {r['steps']:>6} demos/task {r['demos_per_task']:>4}: {k}/{n}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
