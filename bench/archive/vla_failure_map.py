#!/usr/bin/env python
"""Where on the table does the VLA fail? Success against the target object's placement.

Reads the episode logs of one or more `vla eval` runs on the sim tasks (``DIR/episodes.jsonl``: task,
seed, success) and rebuilds each episode's scene from its seed (the sim's own seeded layout,
``hardware.sim_tasks.get_task(task).layout``, exactly what ``reset(seed, task)`` places). For the
object each task acts on first (the pick task's cube) it splits the objects' region into two halves of
equal area, an outer band along the region's border and the inner core (the region scaled by
1/sqrt(2) about its centre), and reports per run and task: the failure rate in each half and Fisher's
exact test of "the half does not matter". Uniform placements put about half the scenes in each.

Why: scripted demos are recorded on the same uniform layout distribution, so a placement near the
border has about half as many demo scenes around it as one in the middle; if the model fails there
more often, the lever is demo coverage of the border (issue 13, round 11).

Writes ``OUT/NAME.json`` and ``OUT/NAME.png`` (one panel per run: every evaluated placement, failures
marked, the core drawn).

    .venv/bin/python -m bench.archive.vla_failure_map --eval runs/sft/b128_6k_d120/evalte50 \
        --eval runs/sft/d120_cont/evalte50 --out bench/archive/results/vla_sft
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import pathlib
import sys

import numpy as np

from bench.harness.results import ROOT  # noqa: E402

from hardware.sim_tasks import OBJECT_REGION, get_task  # noqa: E402
from vla.data.atomic import atomic_write_bytes  # noqa: E402

CORE_SCALE = 1 / math.sqrt(2)  # the core's sides: half the region's area


def target_object(task: str) -> str:
    """The object the task's first skill acts on (a pick task's cube)."""
    return get_task(task).skills[0][1]


def in_core(x: float, y: float, region=OBJECT_REGION, scale: float = CORE_SCALE) -> bool:
    (x0, x1), (y0, y1) = region
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    return abs(x - cx) <= scale * (x1 - x0) / 2 and abs(y - cy) <= scale * (y1 - y0) / 2


def placements(eval_dir: str) -> list[dict]:
    """Every episode of a `vla eval` run with its target object's (x, y) and whether it lies in the core."""
    path = os.path.join(eval_dir, "episodes.jsonl")
    if not os.path.isfile(path):
        raise SystemExit(f"--eval {eval_dir}: no episodes.jsonl there (not a `vla eval` output directory)")
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                e = json.loads(line)
                task, seed, success = e["task"], int(e["seed"]), bool(e["success"])
            except (ValueError, KeyError) as err:
                raise SystemExit(f"{path} line {n}: not an episode record ({err})") from None
            obj = target_object(task)
            x, y, _ = get_task(task).layout(np.random.default_rng(seed))[obj]
            rows.append({"task": task, "seed": seed, "success": success, "object": obj, "x": x, "y": y,
                         "core": in_core(x, y)})
    return rows


def split(rows: list[dict]) -> dict:
    """Failures in the outer band and in the core, and Fisher's exact test between them."""
    from scipy.stats import fisher_exact

    out = {}
    for name, sel in (("band", [r for r in rows if not r["core"]]), ("core", [r for r in rows if r["core"]])):
        fails = sum(not r["success"] for r in sel)
        out[name] = {"episodes": len(sel), "failures": fails, "failure_rate": fails / len(sel) if sel else None}
    table = [[out["band"]["failures"], out["band"]["episodes"] - out["band"]["failures"]],
             [out["core"]["failures"], out["core"]["episodes"] - out["core"]["failures"]]]
    out["fisher_p"] = float(fisher_exact(table)[1]) if out["band"]["episodes"] and out["core"]["episodes"] else None
    return out


def portable(path: str, parts: int = 3) -> str:
    """A directory as its last ``parts`` path parts (no machine paths in committed results)."""
    return os.path.join(*pathlib.Path(os.path.abspath(path)).parts[-parts:])


def plot(res: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    runs = res["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 5.2), squeeze=False)
    markers = dict(zip(sorted({r["task"] for run in runs for r in run["episodes"]}), "os^Dv<>"))
    (x0, x1), (y0, y1) = OBJECT_REGION
    cx, cy, s = (x0 + x1) / 2, (y0 + y1) / 2, CORE_SCALE
    for ax, run in zip(axes[0], runs):
        ax.add_patch(Rectangle((y0, x0), y1 - y0, x1 - x0, fill=False, lw=1.0, color="0.4"))
        ax.add_patch(Rectangle((cy - s * (y1 - y0) / 2, cx - s * (x1 - x0) / 2), s * (y1 - y0), s * (x1 - x0),
                               fill=False, lw=1.0, ls="--", color="0.4"))
        for task, m in markers.items():
            eps = [r for r in run["episodes"] if r["task"] == task]
            ok = [r for r in eps if r["success"]]
            bad = [r for r in eps if not r["success"]]
            ax.scatter([r["y"] for r in ok], [r["x"] for r in ok], marker=m, s=18, facecolors="none",
                       edgecolors="tab:green", label=f"{task} success")
            ax.scatter([r["y"] for r in bad], [r["x"] for r in bad], marker=m, s=30, color="tab:red",
                       label=f"{task} failure")
        a = run["all_tasks"]
        ax.set_title(f"{run['name']}\nfailures: band {a['band']['failures']}/{a['band']['episodes']}, "
                     f"core {a['core']['failures']}/{a['core']['episodes']} (p = {a['fisher_p']:.2g})", fontsize=9)
        ax.set_xlabel("y (m, robot base frame)")
        ax.set_ylabel("x (m, away from the base)")
        ax.set_aspect("equal")
        ax.invert_xaxis()  # as the front camera looks at the table
    axes[0][0].legend(fontsize=6, loc="lower left")
    fig.suptitle("Target object placements of the evaluation scenes: core (dashed) vs border band, equal areas",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--eval", action="append", required=True, metavar="DIR",
                    help="a `vla eval` output directory on the sim tasks (repeat to compare runs)")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "archive" / "results" / "vla_sft")
    ap.add_argument("--name", default="failure_map", help="OUT/NAME.json and OUT/NAME.png")
    args = ap.parse_args(argv)
    runs = []
    for d in args.eval:
        rows = placements(d)
        run = {"name": portable(os.path.dirname(os.path.abspath(d))), "eval_dir": portable(d, 4),
               "all_tasks": split(rows), "tasks": {t: split([r for r in rows if r["task"] == t])
                                                   for t in sorted({r["task"] for r in rows})},
               "episodes": rows}
        runs.append(run)
        a = run["all_tasks"]
        print(f"{run['name']}: failures in the border band {a['band']['failures']}/{a['band']['episodes']}, "
              f"in the core {a['core']['failures']}/{a['core']['episodes']} (Fisher p = {a['fisher_p']:.3g})")
        for t, s in run["tasks"].items():
            print(f"    {t:<18} band {s['band']['failures']}/{s['band']['episodes']}  "
                  f"core {s['core']['failures']}/{s['core']['episodes']}  p = {s['fisher_p']:.3g}")
    res = {"bench": "vla_failure_map", "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "region": OBJECT_REGION, "core_scale": CORE_SCALE, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / f"{args.name}.json", json.dumps(res, indent=1).encode())
    plot(res, args.out / f"{args.name}.png")
    print(f"wrote {args.out / (args.name + '.json')} and .png")
    return res


if __name__ == "__main__":
    main()
