#!/usr/bin/env python
"""Does an exported policy still do the task? Success rate in sim of the torch checkpoint, its fp32
ONNX export and its int8 (dynamically quantised) export, on the same evaluation scenes.

    .venv/bin/python -m bench.export_success --checkpoint runs/vla_pick --task pick_red_cube --episodes 50
    .venv/bin/python -m bench.export_success --quick --out /tmp/x    # smoke run (tiny random model)

1. ``vla export policy --int8`` (``deploy.export.export_vla``): the fp32 graph must match torch within
   1e-4 (the export fails otherwise); the int8 copy's max abs difference from torch is recorded.
2. ``vla eval`` on each variant (the ONNX files through ``vla.models.onnx_vla.OnnxVLA``, i.e. the edge
   runner's ``OnnxPolicy``: numpy crop / resize + onnxruntime), same tasks, same seeds (100000 ...),
   same execution (``vla eval``'s default temporal ensembling, or ``--exec-steps``), each in its own
   process with a sim bridge on this bench's ports.
3. Per task and variant: successes, Wilson 95% interval; int8 against fp32 and against torch: the
   change in success rate and the paired count over identical seeds (episodes one variant solved
   and the other did not) with an exact McNemar p-value. Chunk latency of each ONNX file on one
   thread (one observation of 224 px frames, 30 calls) beside it.

The sampler's initial noise is drawn by torch's generator for the torch variant and by the ONNX
runtime's numpy generator for the exported ones, so even the fp32 graph does not replay the torch
episodes exactly: the paired counts between torch and fp32 show how much the noise draw alone moves.

Writes ``OUT/export_success.json`` and ``OUT/export_success.png`` (default OUT: bench/results).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from bench.harness import flags, plots  # noqa: E402
from bench.harness.results import ROOT, write_result  # noqa: E402
from bench.harness.stats import mcnemar  # noqa: E402


os.environ.setdefault("MUJOCO_GL", "egl")

VARIANTS = ("torch", "fp32", "int8")


def make_quick_checkpoint(path: Path) -> str:
    """A tiny random compact VLA saved as a checkpoint directory (the smoke run's model)."""
    import torch

    from vla.models.compact import CompactVLA, CompactVLAConfig

    torch.manual_seed(0)
    vla = CompactVLA(CompactVLAConfig(image_size=64, hidden=64, cond_dim=64, keypoints=8, pretrained=False)).eval()
    vla.set_normalization(np.zeros(8), np.ones(8), -np.full(7, 0.01), np.full(7, 0.01))
    vla.save(str(path), extra={"instructions": ["pick up the red cube"], "sim_tasks": ["pick_red_cube"]})
    return str(path)


def export(checkpoint: str, work: Path, instructions: list[str] | None) -> dict:
    from deploy.export import export_vla
    from vla.models import load_vla
    from vla.models import resolve_checkpoint

    ckpt = resolve_checkpoint(checkpoint)
    vla = load_vla(ckpt)
    if not instructions:
        instructions = json.loads(Path(ckpt, "config.json").read_text()).get("instructions") or []
    if not instructions:
        raise ValueError(f"{checkpoint} records no training instructions: pass --instruction")
    t0 = time.perf_counter()
    rep = export_vla(vla, str(work / "policy.onnx"), instructions, quantize=True, source=checkpoint)
    return {"checkpoint": ckpt, "fp32": rep["path"], "int8": rep["int8"]["path"], "wall_s": time.perf_counter() - t0,
            "parity_fp32": rep["parity"], "parity_int8": rep["int8"]["parity"],
            "mb_fp32": rep["bytes"] / 1e6, "mb_int8": rep["int8"]["bytes"] / 1e6}


def chunk_ms(path: str, reps: int) -> dict:
    """One observation (two 224 px frames) -> one chunk on one thread, ``reps`` calls after a warm-up."""
    from deploy.runtime.onnx_policy import OnnxPolicy

    pol = OnnxPolicy(path, threads=1)
    rng = np.random.default_rng(0)
    obs = {"images": {c: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for c in pol.cameras},
           "state": rng.normal(size=8).astype(np.float32), "instruction": pol.instructions[0]}
    pol(obs)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        pol(obs)
        ts.append(time.perf_counter() - t0)
    return {"n": reps, "p50_ms": float(np.percentile(ts, 50) * 1e3), "p99_ms": float(np.percentile(ts, 99) * 1e3)}


def run_eval(variant: str, model: str, args, site: str, work: Path) -> dict:
    out = work / f"eval_{variant}"
    cmd = [sys.executable, "-m", "vla.cli", "eval", "--checkpoint", model, "--robot", site, "--episodes",
           str(args.episodes), "--seed-start", str(args.seed_start), "--videos", "0", "--threads", str(args.threads),
           "--out", str(out)]
    for t in args.tasks:
        cmd += ["--task", t]
    if args.exec_steps:
        cmd += ["--exec-steps", str(args.exec_steps)]
    t0 = time.perf_counter()
    with open(work / f"eval_{variant}.log", "w") as log:
        r = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                           env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if r.returncode != 0:
        raise RuntimeError(f"vla eval of {variant} failed (exit {r.returncode}); see {work / f'eval_{variant}.log'}")
    report = json.loads((out / "eval.json").read_text())
    seeds: dict[str, dict[int, bool]] = {}
    with open(out / "episodes.jsonl") as f:
        for line in f:
            e = json.loads(line)
            seeds.setdefault(e["task"], {})[int(e["seed"])] = bool(e["success"])
    return {"wall_s": time.perf_counter() - t0, "tasks": report["tasks"], "per_seed": seeds}


def summarize(evals: dict[str, dict], tasks: list[str]) -> dict:
    out = {}
    for task in tasks:
        row = {}
        for v, e in evals.items():
            t = e["tasks"][task]
            row[v] = {"successes": t["successes"], "episodes": t["episodes"], "rate": t["successes"] / t["episodes"],
                      "ci95": t["ci95"]}
        for a, b in (("int8", "fp32"), ("int8", "torch"), ("fp32", "torch")):
            if a in evals and b in evals:
                row[f"{a}_vs_{b}"] = {"change": row[a]["rate"] - row[b]["rate"],
                                      **mcnemar(evals[a]["per_seed"][task], evals[b]["per_seed"][task])}
        out[task] = row
    return out


def plot(summary: dict, path: Path, title: str) -> None:
    plt = plots.pyplot()

    tasks = list(summary)
    variants = [v for v in VARIANTS if v in summary[tasks[0]]]
    fig, ax = plt.subplots(figsize=(max(5.5, 1.8 + 1.6 * len(tasks) * len(variants) / 3), 3.8))
    w = 0.8 / len(variants)
    colors = {"torch": "#555555", "fp32": "#1f77b4", "int8": "#ff7f0e"}
    for j, v in enumerate(variants):
        xs = np.arange(len(tasks)) + (j - (len(variants) - 1) / 2) * w
        rates = [summary[t][v]["rate"] for t in tasks]
        lo = [summary[t][v]["rate"] - summary[t][v]["ci95"][0] for t in tasks]
        hi = [summary[t][v]["ci95"][1] - summary[t][v]["rate"] for t in tasks]
        ax.bar(xs, rates, w, yerr=[lo, hi], capsize=3, label=v, color=colors[v])
        for x, t in zip(xs, tasks):
            ax.text(x, 0.02, f"{summary[t][v]['successes']}/{summary[t][v]['episodes']}", ha="center", fontsize=7,
                    rotation=90, color="white")
    ax.set_xticks(np.arange(len(tasks)), tasks)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success (95% Wilson)")
    ax.set_title(textwrap.fill(title, 60), fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    plots.save(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = flags.parser("export_success", __doc__, out=False)
    ap.add_argument("--checkpoint", help="compact VLA checkpoint or `vla train` run directory")
    ap.add_argument("--task", action="append", dest="tasks", metavar="TASK", help="sim task (repeat)")
    ap.add_argument("--instruction", action="append", dest="instructions", metavar="TEXT",
                    help="instructions to export (default: the checkpoint's training instructions)")
    ap.add_argument("--episodes", type=int, default=50, help="evaluation episodes per task and variant (default 50)")
    ap.add_argument("--seed-start", type=int, default=100_000)
    ap.add_argument("--exec-steps", type=int, default=None,
                    help="vla eval --exec-steps (default: vla eval's temporal ensembling)")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--threads", type=int, default=2, help="threads of each vla eval (torch / onnxruntime)")
    ap.add_argument("--port", type=int, default=None,
                    help="first of the sim bridge's 10 ports (default: ports leased on this machine)")
    ap.add_argument("--work", default=None, help="exports, eval runs and logs (default a temp dir)")
    flags.add_out(ap, type=str)
    flags.add_quick(ap, "tiny random model, 1 episode, whole chunks: a smoke run")
    args = ap.parse_args(argv)
    from bench.harness.sites import site_copy

    work = Path(args.work or tempfile.mkdtemp(prefix="export_success_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.quick:
        args.checkpoint = args.checkpoint or make_quick_checkpoint(work / "quick_vla")
        args.tasks = args.tasks or ["pick_red_cube"]
        args.episodes, args.exec_steps = 1, args.exec_steps or 8
    if not args.checkpoint or not args.tasks:
        ap.error("--checkpoint and --task are required (or --quick)")
    if args.episodes < 1:
        ap.error("--episodes must be >= 1")
    t_start = time.perf_counter()
    ex = export(args.checkpoint, work, args.instructions)
    print(f"export: fp32 parity {ex['parity_fp32']['max_abs_diff']:.1e}, int8 max abs diff "
          f"{ex['parity_int8']['max_abs_diff']:.1e} ({ex['mb_fp32']:.1f} MB -> {ex['mb_int8']:.1f} MB)", flush=True)
    latency = {v: chunk_ms(ex[v], 5 if args.quick else 30) for v in ("fp32", "int8")}
    site = site_copy(str(work / "site.yaml"), args.port)
    models = {"torch": args.checkpoint, "fp32": ex["fp32"], "int8": ex["int8"]}
    evals = {}
    for v in args.variants:
        evals[v] = run_eval(v, models[v], args, site, work)
        print(f"{v}: " + ", ".join(f"{t} {r['successes']}/{r['episodes']}" for t, r in evals[v]["tasks"].items())
              + f"  ({evals[v]['wall_s'] / 60:.1f} min)", flush=True)
    summary = summarize(evals, args.tasks)
    res = {
        "bench": "export_success", "quick": args.quick, "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "settings": {"checkpoint": "/".join(Path(args.checkpoint).resolve().parts[-2:]),  # no machine path
                     "tasks": args.tasks, "episodes": args.episodes, "seed_start": args.seed_start,
                     "execution": f"chunks of {args.exec_steps}" if args.exec_steps else "temporal ensembling",
                     "threads": args.threads, "variants": args.variants},
        "export": {k: ex[k] for k in ("parity_fp32", "parity_int8", "mb_fp32", "mb_int8", "wall_s")},
        "chunk_latency_1_thread": latency,
        "summary": summary,
        "eval_wall_s": {v: e["wall_s"] for v, e in evals.items()},
        "wall_s": time.perf_counter() - t_start,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_result(out / "export_success.json", res, "export_success", argv, args.quick)
    plot(summary, out / "export_success.png", f"{res['settings']['checkpoint']}: torch vs ONNX fp32 vs int8, "
         f"{args.episodes} episodes, {res['settings']['execution']}")
    for task, row in summary.items():
        for key in ("int8_vs_fp32", "int8_vs_torch", "fp32_vs_torch"):
            if key in row:
                a, b = key.split("_vs_")
                r = row[key]
                print(f"{task}: {a} - {b} = {r['change']:+.0%} (only {a}: {r['only_first']}, only {b}: "
                      f"{r['only_second']}, McNemar p = {r['mcnemar_p']:.2f})")
    print(f"chunk on 1 thread: fp32 {latency['fp32']['p50_ms']:.1f} ms, int8 {latency['int8']['p50_ms']:.1f} ms (p50)")
    print(f"wrote {out / 'export_success.json'} and {out / 'export_success.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
