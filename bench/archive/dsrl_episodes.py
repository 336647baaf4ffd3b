#!/usr/bin/env python
"""What happened inside the sessions of a `bench/dsrl.py` run: training-episode success over time.

`bench/dsrl.py` reports the evaluations (its learning curves). This script reads the
sessions' own episode logs, i.e. what the agent did while it learned, and answers two questions:

* Does the success rate of the training episodes rise or fall once the agent takes over from the
  base VLA (after ``--warmup-steps`` macro-steps)? It reports the rate over the warm-up episodes
  (the base VLA alone; for ``sac-raw`` random actions), then over the first and the second half of the agent's episodes, and plots
  a rolling mean per method, seeds pooled.
* What noise did the agent pick? For DSRL methods, from the replay buffer in the session's last
  checkpoint: the RMS of the noise actions, and how far their per-dimension mean drifts from 0
  (the base VLA samples w ~ N(0, I)).

Writes ``OUT/dsrl_episodes.json`` (per session: the success of every training episode, the rates
above, the noise statistics) and ``dsrl_episodes.png``. The JSON holds everything the plot needs:
without ``--work`` the plot is re-made from it alone, so the sessions' own logs need not be kept
with the results.

    .venv/bin/python -m bench.archive.dsrl_episodes --work runs/dsrl6 --out bench/archive/results
    .venv/bin/python -m bench.archive.dsrl_episodes --out bench/archive/results      # re-plot from dsrl_episodes.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys

import numpy as np

from bench.harness.results import portable

# bench/dsrl.py's session names and colours when this probe ran (a frozen copy)
METHODS = ("dsrl-na", "dsrl-sac", "sac-raw", "dsrl-na-legacy", "dsrl-sac-legacy")
COLORS = {"dsrl-na": "#c44e52", "dsrl-sac": "#4c72b0", "sac-raw": "#8c8c8c", "dsrl-na-legacy": "#e8a0a2",
          "dsrl-sac-legacy": "#9fb6d8"}

SESSION = re.compile(rf"^(?P<task>.+)-(?P<method>{'|'.join(map(re.escape, METHODS))})-s(?P<seed>\d+)$")
REPORT = "dsrl_episodes"


def read_jsonl(path: str) -> list[dict]:
    if not os.path.isfile(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:  # a torn last line of a killed session
                    break
    return out


def noise_stats(session_dir: str, warmup_steps: int) -> dict | None:
    """RMS and per-dimension mean drift of the noise actions stored after the warm-up."""
    path = os.path.join(session_dir, "checkpoint", "online.npz")
    if not os.path.isfile(path):
        return None
    with np.load(path) as d:
        a = np.asarray(d["action"], np.float64)
    after = a[warmup_steps:]
    if len(after) == 0:
        return None
    base = a[:warmup_steps]
    return {"macro_steps_after_warmup": int(len(after)),
            "rms_after_warmup": float(np.sqrt((after ** 2).mean())),
            "rms_warmup": float(np.sqrt((base ** 2).mean())) if len(base) else None,
            "mean_abs_dim_mean_after_warmup": float(np.abs(after.mean(0)).mean()),
            "max_abs_dim_mean_after_warmup": float(np.abs(after.mean(0)).max())}


def analyse(work: str, out: pathlib.Path, window: int) -> dict:
    sessions = sorted(d for d in os.listdir(work) if SESSION.match(d) and os.path.isdir(os.path.join(work, d)))
    if not sessions:
        raise SystemExit(f"{work}: no session directories named <task>-<method>-s<seed>")
    old = {}
    if (out / f"{REPORT}.json").is_file():  # sessions whose checkpoint is gone: keep the noise statistics
        old = {r["session"]: r for r in json.load(open(out / f"{REPORT}.json"))["sessions"]}
    rows = []
    for name in sessions:
        src = os.path.join(work, name)
        m = SESSION.match(name)
        eps = read_jsonl(os.path.join(src, "episodes.jsonl"))
        if not eps:
            continue
        cfg_path = os.path.join(src, "rl_config.json")
        warmup = json.load(open(cfg_path)).get("warmup_steps", 0) if os.path.isfile(cfg_path) else 0
        s = np.array([float(e["success"]) for e in eps])
        # episodes that ended within the warm-up: the base VLA alone (random actions for sac-raw)
        n_warm = sum(1 for e in eps if e.get("step", 0) <= warmup)
        agent = s[n_warm:]
        half = len(agent) // 2
        row = {"session": name, "task": m["task"], "method": m["method"], "seed": int(m["seed"]),
               "episodes": len(s), "warmup_episodes": n_warm,
               "success_warmup": float(s[:n_warm].mean()) if n_warm else None,
               "success_first_half": float(agent[:half].mean()) if half else None,
               "success_second_half": float(agent[half:].mean()) if len(agent) else None,
               "success": s.astype(int).tolist(),
               "noise": noise_stats(src, warmup) if m["method"] != "sac-raw" else None}
        if row["noise"] is None and name in old:
            row["noise"] = old[name].get("noise")
        rows.append(row)
    summary: dict = {}
    keys = ("warmup", "first_half", "second_half")
    for r in rows:
        t = summary.setdefault(r["task"], {}).setdefault(r["method"], {k: [] for k in keys})
        for k in keys:
            t[k].append(r[f"success_{k}"])
    for t in summary.values():
        for m in t.values():
            for k in keys:
                vals = [x for x in m[k] if x is not None]
                m[f"{k}_mean"] = float(np.mean(vals)) if vals else None
    res = {"bench": "dsrl_episodes", "work": portable(os.path.abspath(work)), "window": window,
           "summary": summary, "sessions": rows}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{REPORT}.json", "w") as f:
        json.dump(res, f, indent=2)
    plot(rows, out / f"{REPORT}.png", window)
    return res


def replot(out: pathlib.Path) -> dict:
    """``OUT/dsrl_episodes.png`` again from ``OUT/dsrl_episodes.json`` alone."""
    path = out / f"{REPORT}.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no report to re-plot (give --work, a bench/dsrl.py --work directory)")
    res = json.load(open(path))
    plot(res["sessions"], out / f"{REPORT}.png", res["window"])
    return res


def plot(rows: list[dict], path: pathlib.Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for method, color in COLORS.items():
            runs = [r["success"] for r in rows if r["task"] == task and r["method"] == method]
            if not runs:
                continue
            n = min(len(x) for x in runs)
            pooled = np.mean([x[:n] for x in runs], axis=0)
            k = min(window, n)
            rolling = np.convolve(pooled, np.ones(k) / k, mode="valid") * 100
            ax.plot(np.arange(k, n + 1), rolling, color=color, lw=2, label=f"{method} (n={len(runs)})")
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("training episode")
        ax.set_ylabel(f"success, rolling mean of {window} (%)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Training-episode success inside the DSRL sessions (seeds pooled)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=None,
                    help="the --work directory of a bench/dsrl.py run (omitted: re-plot OUT/dsrl_episodes.json)")
    ap.add_argument("--out", type=pathlib.Path, required=True, help="where dsrl_episodes.json / .png go")
    ap.add_argument("--window", type=int, default=10, help="rolling-mean window, episodes (with --work)")
    args = ap.parse_args(argv)
    res = analyse(args.work, args.out, args.window) if args.work else replot(args.out)
    for task, ms in res["summary"].items():
        for method, m in ms.items():
            pct = {k: "-" if m[f"{k}_mean"] is None else f"{m[f'{k}_mean']:.0%}" for k in ("warmup", "first_half",
                                                                                          "second_half")}
            print(f"{task:<18} {method:<9} training success: warm-up {pct['warmup']}, then first half "
                  f"{pct['first_half']}, second half {pct['second_half']} ({len(m['second_half'])} sessions)")
    print(f"wrote {args.out / (REPORT + '.json')} and {REPORT}.png" if args.work else
          f"wrote {args.out / (REPORT + '.png')} from {REPORT}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
