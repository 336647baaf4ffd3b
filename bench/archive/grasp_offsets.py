#!/usr/bin/env python
"""Where a VLA's grasps land: the named cube's offset from the tcp at the first close command.

Reads the episodes of ``bench/vla_confusion.py`` result files (their ``close_offset_m``: the centre of
the cube nearest the fingers minus the tcp, world x / y / z, when the policy first commanded the
gripper shut; privileged simulator state, read by that bench only) and, for the episodes that closed
beside the cube their instruction names, compares successes and failures: the offsets' spread per
axis, and the share of each group whose offset exceeds a threshold on one axis. Writes
``OUT/NAME.json`` and ``OUT/NAME.png`` (the x / y and y / z offsets, success vs failure, per file).

    .venv/bin/python -m bench.archive.grasp_offsets bench/archive/results/vla_confusion_r19_zero.json \\
        bench/archive/results/vla_confusion_r19_mean8.json --name grasp_offsets_r19
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

from bench.harness.results import ROOT  # noqa: E402
AXES = ("x", "y", "z")


def offsets(episodes: list[dict], tasks: list[str] | None) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [N, 3] in metres, success [N]) of the episodes that closed beside the named cube."""
    rows = [(e["close_offset_m"], bool(e["success"])) for e in episodes
            if e.get("close_offset_m") is not None and e.get("close_nearest") == e.get("named")
            and (tasks is None or e["task"] in tasks)]
    if not rows:
        return np.zeros((0, 3)), np.zeros(0, bool)
    return np.array([r[0] for r in rows], float), np.array([r[1] for r in rows], bool)


def describe(off: np.ndarray, ok: np.ndarray, threshold_m: float) -> dict:
    """Per group (success / failure): count, per-axis median |offset| and 90th percentile, and the share
    beyond ``threshold_m`` on each axis."""
    out = {}
    for name, sel in (("success", ok), ("failure", ~ok)):
        a = np.abs(off[sel])
        out[name] = {"n": int(sel.sum()),
                     "median_abs_cm": {ax: round(float(np.median(a[:, i])) * 100, 2) if len(a) else None
                                       for i, ax in enumerate(AXES)},
                     "p90_abs_cm": {ax: round(float(np.percentile(a[:, i], 90)) * 100, 2) if len(a) else None
                                    for i, ax in enumerate(AXES)},
                     "beyond_threshold": {ax: [int((a[:, i] > threshold_m).sum()), int(len(a))]
                                          for i, ax in enumerate(AXES)}}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("files", nargs="+", type=pathlib.Path, help="bench/vla_confusion.py result files")
    ap.add_argument("--task", action="append", dest="tasks",
                    help="only these tasks (repeat; default: pick_red_cube, pick_blue_cube, lift_green_cube)")
    ap.add_argument("--threshold-cm", type=float, default=1.5, help="the per-axis offset counted as off (default 1.5)")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "archive" / "results")
    ap.add_argument("--name", default="grasp_offsets")
    args = ap.parse_args(argv)
    tasks = args.tasks or ["pick_red_cube", "pick_blue_cube", "lift_green_cube"]
    per_file, pooled_off, pooled_ok = {}, [], []
    for f in args.files:
        try:
            data = json.loads(f.read_text())
            eps = data["episodes"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"{f}: not a bench/vla_confusion.py result file ({e})")
        off, ok = offsets(eps, tasks)
        if not len(off):
            ap.error(f"{f}: no episode records close_offset_m (files written before the bench recorded it)")
        per_file[f.stem] = {"execution": data.get("execution"), "checkpoint": data.get("checkpoint"),
                            **describe(off, ok, args.threshold_cm / 100)}
        pooled_off.append(off)
        pooled_ok.append(ok)
    off, ok = np.concatenate(pooled_off), np.concatenate(pooled_ok)
    out = {"bench": "grasp_offsets", "files": [f.name for f in args.files], "tasks": tasks,
           "threshold_cm": args.threshold_cm, "pooled": describe(off, ok, args.threshold_cm / 100),
           "per_file": per_file}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(out, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    for ax, (i, j) in zip(axes, ((1, 0), (1, 2))):
        for sel, colour, label in ((ok, "tab:green", "success"), (~ok, "tab:red", "failure")):
            ax.scatter(100 * off[sel, i], 100 * off[sel, j], s=14, c=colour, alpha=0.7,
                       label=f"{label} ({int(sel.sum())})")
        t = args.threshold_cm
        ax.axvline(t, color="grey", lw=0.8, ls="--")
        ax.axvline(-t, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(f"cube - tcp, world {AXES[i]} (cm)")
        ax.set_ylabel(f"cube - tcp, world {AXES[j]} (cm)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    p = out["pooled"]
    fig.suptitle(f"grasp offset at the first close, {', '.join(tasks)} ({len(args.files)} files): |y| > {t:g} cm in "
                 f"{p['failure']['beyond_threshold']['y'][0]}/{p['failure']['n']} failures, "
                 f"{p['success']['beyond_threshold']['y'][0]}/{p['success']['n']} successes", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out / f"{args.name}.png", dpi=110)
    plt.close(fig)
    for g in ("success", "failure"):
        print(f"{g:<8} n={p[g]['n']:<4} median |offset| cm {p[g]['median_abs_cm']}  beyond {t:g} cm "
              f"{ {a: f'{k}/{n}' for a, (k, n) in p[g]['beyond_threshold'].items()} }")
    print(f"wrote {args.out / args.name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
