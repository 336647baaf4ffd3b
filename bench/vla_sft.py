#!/usr/bin/env python
"""What limits the compact VLA on the sim pick tasks: an ablation of recording and training recipes.

Run ``.venv/bin/python -m bench.vla_sft [--row base --row crop ...] [--demos 60] [--steps 3000]
[--eval-episodes 50] [--data-dir data/sft] [--runs-dir runs/sft] [--out bench/results] [--quick]``.

Each row is one recipe: how the demos are recorded (``vla record --teleop scripted`` flags, e.g.
DART noise) and how the VLA is trained (``vla train`` flags, e.g. a camera crop) and evaluated
(``vla eval`` flags). For each row the bench records ``--demos`` full-quality scripted episodes per
task (seeds 0 ...; a dataset already recorded with the same flags is reused), trains one multi-task
VLA on all tasks, and rolls it out for ``--eval-episodes`` episodes per task on unseen seeds
(100000 ...). It times each stage (record / train / eval wall clock) and writes
``OUT/vla_sft.json`` (per row and task: successes, n, rate, 95% Wilson interval) and
``OUT/vla_sft.png`` (grouped bars with the intervals). A row whose run directory already holds a
finished evaluation with the same settings is read back instead of re-run, so a long ablation can
be resumed after an interruption. Every process runs against its own sim bridge (``--port``), so
the bench does not collide with another `vla` program on the default ports.

``--quick`` (one task, 2 demos, 30 steps, 2 evaluation episodes, a tiny output) is the smoke test.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

from bench.harness import flags, plots
from bench.harness.results import ROOT, write_result


TASKS = ("pick_red_cube", "pick_blue_cube", "lift_green_cube")
FRONT_CROP = "front=0.2,0.35,0.8,0.85"
"""The table's object region (x 0.35-0.65 m, y +-0.22 m) projects to about x 64-160, y 123-161 px of
the 224 px front frame; this box keeps it with a margin for the arm: 1.7x / 2x magnification."""


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    what: str
    record: tuple[str, ...] = ()
    train: tuple[str, ...] = ()
    eval: tuple[str, ...] = ()
    dagger_rounds: int = 0
    """DAgger rounds after the first training: the newest model drives ``--dagger-episodes`` episodes
    per task (``vla record --dagger``, seeds 1000 r ...), the privileged expert labels them, and
    ``vla train --init`` fine-tunes the newest model on every dataset so far for ``--dagger-steps``."""

    @property
    def data_key(self) -> str:
        """Datasets are shared between rows with the same record flags."""
        return "q1" + "".join(f"_{a.strip('-').replace('.', 'p')}" for a in self.record)

    @property
    def train_key(self) -> str:
        """So is a trained model between rows with the same record and train flags (rows that only
        evaluate differently)."""
        return self.data_key + "".join(f"_{a.strip('-').replace('.', 'p').replace(',', '-').replace('=', '-')}"
                                       for a in self.train)

    @property
    def eval_flags(self) -> tuple[str, ...]:
        """``vla eval`` flags: a row that names no execution mode runs whole chunks (`vla eval`'s
        default before round 8, when it became temporal ensembling)."""
        if any(f in self.eval for f in ("--exec-steps", "--temporal-ensemble")):
            return self.eval
        return (*self.eval, "--exec-steps", "8")

    def round_key(self, r: int) -> str:
        """The run after DAgger round r (round 0: the first training)."""
        return self.train_key + (f"_dagger{r}" if r else "")


WHOLE = ("--crop", "front=0,0,1,1")
"""The whole front frame (the sim site's front camera has a region of interest that `vla train` crops
to by default since round 7)."""
STRIDE8 = ("--fine-blocks", "5")
SHIFT4 = ("--shift-pad", "4")
"""The rows below spell out every setting whose default changed (crop, keypoint stride, shift), so a
row means what it meant when it was measured."""

ROWS = {r.name: r for r in (
    Row("base", "the defaults of rounds 1-6: 96 px, frozen trunk, whole frames, stride-8 keypoints, 4 px shift",
        train=(*WHOLE, *STRIDE8, *SHIFT4)),
    Row("crop", f"front camera cropped to the table ({FRONT_CROP})", train=("--crop", FRONT_CROP, *STRIDE8, *SHIFT4)),
    Row("crop_fine3", "front crop + keypoints from the stride-4 trunk map (--fine-blocks 3)",
        train=("--crop", FRONT_CROP, "--fine-blocks", "3", *SHIFT4)),
    Row("crop_fine3_exec4", "crop + stride-4 keypoints, re-plan every 4 ticks",
        train=("--crop", FRONT_CROP, "--fine-blocks", "3", *SHIFT4), eval=("--exec-steps", "4")),
    Row("fine3", "keypoints from the stride-4 trunk map, whole frames", train=(*WHOLE, "--fine-blocks", "3", *SHIFT4)),
    Row("crop_fine3_noshift", "crop + stride-4 keypoints, no random-shift augmentation (--shift-pad 0): the "
        "defaults of `vla record` / `vla train` since round 7",
        train=("--crop", FRONT_CROP, "--fine-blocks", "3", "--shift-pad", "0")),
    Row("crop_fine3_noshift_exec4", "crop + stride-4 keypoints, no random shift, re-plan every 4 ticks",
        train=("--crop", FRONT_CROP, "--fine-blocks", "3", "--shift-pad", "0"), eval=("--exec-steps", "4")),
    Row("crop_fine3_128", "crop + stride-4 keypoints at 128 px (32x32 keypoint map)",
        train=("--crop", FRONT_CROP, "--fine-blocks", "3", "--image-size", "128", *SHIFT4)),
    Row("crop_fine3_noshift_dagger1_exec4", "crop + stride-4 keypoints, no random shift, one DAgger round "
        "(the model drives, re-planning every 4 ticks; the expert labels), re-plan every 4 ticks",
        train=("--crop", FRONT_CROP, "--fine-blocks", "3", "--shift-pad", "0"), eval=("--exec-steps", "4"),
        dagger_rounds=1),
    Row("crop_fine3_noshift_te", "crop + stride-4 keypoints, no random shift, ACT temporal ensembling "
        "(`vla eval`'s default since round 8)", train=("--crop", FRONT_CROP, "--fine-blocks", "3", "--shift-pad", "0"),
        eval=("--temporal-ensemble", "0.01")),
    Row("b128_6k_te", "the defaults of round 8 at batch 128 for 6000 steps (twice the updates of 3000 x 256 at the "
        "same samples / s), temporal ensembling", train=("--crop", FRONT_CROP, "--fine-blocks", "3", "--shift-pad", "0",
                                                         "--batch-size", "128", "--steps", "6000"),
        eval=("--temporal-ensemble", "0.01")),
    Row("dart", "DART noise 1 cm per tick while recording", record=("--dart", "0.01"),
        train=(*WHOLE, *STRIDE8, *SHIFT4)),
    Row("dart_crop", "DART 1 cm + front crop", record=("--dart", "0.01"), train=("--crop", FRONT_CROP, *STRIDE8, *SHIFT4)),
    Row("dart_crop_exec4", "DART 1 cm + front crop, re-plan every 4 ticks", record=("--dart", "0.01"),
        train=("--crop", FRONT_CROP, *STRIDE8, *SHIFT4), eval=("--exec-steps", "4")),
)}


def _run(cmd: list[str], log: pathlib.Path) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                           env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed (exit {r.returncode}); see {log}")
    return time.perf_counter() - t0


def _augment_flags(train: tuple[str, ...]) -> list[str]:
    """The augmentation flags of a row's ``vla train`` flags (a fine-tuning run takes the model's
    settings from its --init checkpoint, but not how the data is augmented)."""
    out = []
    for flag, value in zip(train, train[1:]):
        if flag in ("--shift-pad", "--jitter"):
            out += [flag, value]
    return out


def run_row(row: Row, args, site: str) -> dict:
    vla = [sys.executable, "-m", "vla.cli"]
    data_dir, runs_dir = pathlib.Path(args.data_dir), pathlib.Path(args.runs_dir)
    run_dir = runs_dir / row.train_key
    settings = {"demos": args.demos, "steps": args.steps, "batch_size": args.batch_size,
                **({"dagger_rounds": row.dagger_rounds, "dagger_episodes": args.dagger_episodes,
                    "dagger_steps": args.dagger_steps} if row.dagger_rounds else {}), "eval_episodes": args.eval_episodes, "tasks": list(args.task),
                "record": list(row.record), "train": list(row.train), "eval": list(row.eval_flags)}
    done = run_dir / f"bench_{row.name}.json"
    if done.is_file():
        prev = json.loads(done.read_text())
        if prev.get("settings") == settings:
            print(f"{row.name}: reusing {done}")
            return prev
    record_s = None  # None: every dataset was there already
    datasets = []
    for task in args.task:
        root = data_dir / f"{row.data_key}_{task}"
        datasets.append(str(root))
        if (root / "meta" / "info.json").is_file():
            continue  # recorded by an earlier row (or an interrupted run: vla record appends up to --episodes)
        record_s = (record_s or 0.0) + _run([*vla, "record", "--robot", site, "--task", task, "--teleop", "scripted", "--episodes",
                          str(args.demos), "--root", str(root), *row.record], data_dir / f"{root.name}.log")
    if run_dir.exists() and not (run_dir / "model").is_dir():
        raise RuntimeError(f"{run_dir} holds an unfinished training run: `vla train --resume {run_dir}` it or remove it")
    train_s = 0.0
    if not (run_dir / "model").is_dir():
        runs_dir.mkdir(parents=True, exist_ok=True)
        train_s = _run([*vla, "train", *sum((["--dataset", d] for d in datasets), []), "--out", str(run_dir),
                        "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--aug-views", "1",
                        "--threads", str(args.threads),
                        "--save-every", str(max(1, args.steps // 3)), *row.train], runs_dir / f"{row.train_key}.train.log")
    for r in range(1, row.dagger_rounds + 1):
        prev, run_dir = run_dir, runs_dir / row.round_key(r)
        for task in args.task:
            root = data_dir / f"{row.round_key(r)}_{task}"
            datasets.append(str(root))
            if not (root / "meta" / "info.json").is_file():
                record_s = (record_s or 0.0) + _run(
                    [*vla, "record", "--robot", site, "--task", task, "--teleop", "scripted", "--dagger", str(prev),
                     "--episodes", str(args.dagger_episodes), "--seed", str(1000 * r), "--root", str(root)],
                    data_dir / f"{root.name}.log")
        if run_dir.exists() and not (run_dir / "model").is_dir():
            raise RuntimeError(f"{run_dir} holds an unfinished training run: `vla train --resume {run_dir}` it or "
                               "remove it")
        if not (run_dir / "model").is_dir():
            train_s += _run([*vla, "train", *sum((["--dataset", d] for d in datasets), []), "--init", str(prev),
                             "--out", str(run_dir), "--steps", str(args.dagger_steps), "--warmup-steps", "100",
                             "--aug-views", "1", "--threads", str(args.threads),
                             "--save-every", str(max(1, args.dagger_steps // 3)),
                             *_augment_flags(row.train)],
                            runs_dir / f"{run_dir.name}.train.log")
    eval_dir = run_dir / f"eval_{row.name}"
    eval_s = _run([*vla, "eval", "--checkpoint", str(run_dir), "--robot", site, "--episodes", str(args.eval_episodes),
                   "--videos", "1", "--threads", str(args.threads), "--out", str(eval_dir),
                   *sum((["--task", t] for t in args.task), []), *row.eval_flags], runs_dir / f"{row.name}.eval.log")
    rep = json.loads((eval_dir / "eval.json").read_text())
    tasks = {}
    for name, t in rep["tasks"].items():
        k, n = int(t["successes"]), int(t["episodes"])
        tasks[name] = {"successes": k, "episodes": n, "rate": k / n, "ci95": list(t["ci95"])}  # vla eval's Wilson interval
    summary = json.loads((run_dir / "train_summary.json").read_text())
    out = {"row": row.name, "what": row.what, "settings": settings, "tasks": tasks,
           "mean_rate": sum(t["rate"] for t in tasks.values()) / len(tasks),
           "frames": summary.get("frames"), "episodes": summary.get("episodes"),
           "run_dir": run_dir.name,
           "wall_s": {"record": None if record_s is None else round(record_s, 1),
                      "train": round(train_s or summary.get("wall_s", 0.0), 1), "eval": round(eval_s, 1)}}
    done.write_text(json.dumps(out, indent=2))
    return out


def _portable(arg: str) -> str:
    """An absolute path in the recorded command becomes its last two parts (no machine paths in results)."""
    return os.path.join(*pathlib.Path(arg).parts[-2:]) if os.path.isabs(arg) else arg


def plot(rows: list[dict], path: pathlib.Path) -> None:
    plt = plots.pyplot()
    import numpy as np

    tasks = list(rows[0]["tasks"])
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows) * len(tasks) / 2), 4))
    w = 0.8 / len(tasks)
    x = np.arange(len(rows))
    for j, t in enumerate(tasks):
        rate = np.array([r["tasks"][t]["rate"] for r in rows])
        lo = np.array([r["tasks"][t]["ci95"][0] for r in rows])
        hi = np.array([r["tasks"][t]["ci95"][1] for r in rows])
        ax.bar(x + (j - (len(tasks) - 1) / 2) * w, 100 * rate, w, yerr=100 * np.stack([rate - lo, hi - rate]),
               capsize=3, label=t)
    ax.axhline(85, color="k", lw=0.8, ls="--")
    ax.text(len(rows) - 0.5, 86, "goal 85%", ha="right", fontsize=8)
    ax.set_xticks(x, [r["row"] for r in rows], rotation=15)
    ax.set_ylabel("success, % (95% Wilson interval)")
    ax.set_ylim(0, 100)
    n = rows[0]["settings"]
    ax.set_title(f"compact VLA: {n['demos']} demos/task, {n['steps']} steps, {n['eval_episodes']} eval episodes/task")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plots.save(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = flags.parser("vla_sft", __doc__, out=False)
    ap.add_argument("--row", action="append", choices=sorted(ROWS), help=f"rows to run (default all: {', '.join(ROWS)})")
    ap.add_argument("--task", action="append", help=f"tasks (default {', '.join(TASKS)})")
    ap.add_argument("--demos", type=int, default=60, help="scripted demos per task (default 60)")
    ap.add_argument("--steps", type=int, default=3000, help="vla train steps (default 3000; a row may set its own)")
    ap.add_argument("--batch-size", type=int, default=256,
                    help="vla train batch size (default 256, what rounds 1-7 used; a row may set its own)")
    ap.add_argument("--dagger-episodes", type=int, default=40, help="DAgger rows: policy-driven episodes per task "
                    "and round (default 40)")
    ap.add_argument("--dagger-steps", type=int, default=1500, help="DAgger rows: fine-tuning steps per round "
                    "(default 1500)")
    ap.add_argument("--eval-episodes", type=int, default=50, help="evaluation episodes per task (default 50)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=None,
                    help="first port of the bench's own sim bridge (default: ports leased on this machine)")
    ap.add_argument("--data-dir", default="data/sft")
    ap.add_argument("--runs-dir", default="runs/sft")
    flags.add_out(ap, type=str)
    flags.add_quick(ap, "smoke test: 1 task, 2 demos, 30 steps, 2 episodes")
    args = ap.parse_args(argv)
    args.task = args.task or (["pick_red_cube"] if args.quick else list(TASKS))
    args.data_dir, args.runs_dir = os.path.abspath(args.data_dir), os.path.abspath(args.runs_dir)
    if args.quick:
        args.demos, args.steps, args.eval_episodes = 2, 30, 2
        args.dagger_episodes, args.dagger_steps = 2, 10
        args.row = args.row or ["dart_crop"]
    rows = [ROWS[r] for r in (args.row or ROWS)]
    from bench.harness.sites import site_copy

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    site = site_copy(str(pathlib.Path(args.data_dir) / f"site-{args.port or os.getpid()}.yaml"), args.port)
    from tqdm import tqdm

    results = []
    for row in tqdm(rows, desc="rows", unit="row"):
        r = run_row(row, args, site)
        results.append(r)
        tqdm.write(f"{row.name:>16}: " + "  ".join(f"{t} {v['successes']}/{v['episodes']}" for t, v in r["tasks"].items())
                   + f"   (record {r['wall_s']['record'] or 0:.0f} s, train {r['wall_s']['train']:.0f} s)")
    report = {"bench": "vla_sft", "date": _dt.date.today().isoformat(), "machine": f"{platform.machine()}, "
              f"{os.cpu_count()} cpus", "command": "bench/vla_sft.py " + " ".join(
                  _portable(a) for a in (argv if argv is not None else sys.argv[1:])),
              "goal": ">= 85% on each pick task from full-quality demos, record + train <= 30 min (issue 13)",
              "rows": results}
    write_result(out / "vla_sft.json", report, "vla_sft", argv, args.quick, indent=2)
    plot(results, out / "vla_sft.png")
    print(f"report: {out / 'vla_sft.json'}  plot: {out / 'vla_sft.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
