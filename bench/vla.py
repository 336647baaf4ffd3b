#!/usr/bin/env python
"""Compact VLA benchmark: chunk inference latency on one CPU thread, and SFT throughput.

Latency: ``CompactVLA.sample_actions`` at batch 1 on two 224 x 224 camera frames (resized to
the model's 96 px inside, as on the robot), the 8-d state and a cached instruction embedding,
10 Euler steps, ``torch.set_num_threads(1)``; p50 / p90 / p99 / max over ``--calls`` calls after
a warm-up, plus the split between the vision trunk (both cameras in one batch) and the rest.
Goal: p50 <= 30 ms per chunk.

SFT throughput: samples / s of full training steps (forward, backward, AdamW, EMA) at batch 256
(``--batch``) with the threads torch uses by default, for each mode: ``frozen`` (trunk features
cached, what `vla train` does), ``lora`` and ``full`` (the trunk runs forward and backward on
augmented 96 px frames). Random inputs: throughput does not depend on the data.

Writes ``bench/results/vla.json`` and ``vla.png``.

    .venv/bin/python -m bench.vla [--quick] [--out DIR]
"""

from __future__ import annotations

import datetime as _dt
import os
import pathlib
import platform
import sys
import time

import numpy as np
import torch

from bench.harness import flags, plots
from bench.harness.results import write_result


GOAL_LATENCY_MS = 30.0


VARIANTS = {
    "default": {},
    "crop_fine3": {"fine_blocks": 3, "crops": (("front", 0.2, 0.35, 0.8, 0.85),)},
    "head512": {"fine_blocks": 3, "crops": (("front", 0.2, 0.35, 0.8, 0.85),), "hidden": 512, "depth": 4},
    "head512_film": {"fine_blocks": 3, "crops": (("front", 0.2, 0.35, 0.8, 0.85),), "hidden": 512, "depth": 4,
                     "head_film": True},
    "head1024": {"fine_blocks": 3, "crops": (("front", 0.2, 0.35, 0.8, 0.85),), "hidden": 1024, "depth": 4},
}
"""Model configurations whose chunk latency is measured: the defaults, the front crop + stride-4
keypoints of bench/vla_sft.py's best rows, and round 14's larger action experts (``--variant``)."""


def latency(calls: int, **overrides) -> dict:
    from vla.models.compact import CompactVLA, CompactVLAConfig

    torch.set_num_threads(1)
    m = CompactVLA(CompactVLAConfig(**overrides)).eval()
    rng = np.random.default_rng(0)
    obs = {"images": {c: rng.integers(0, 255, (1, 224, 224, 3), dtype=np.uint8) for c in ("front", "wrist")},
           "state": rng.normal(size=(1, 8)).astype(np.float32), "instruction": ["pick up the red cube"]}
    for _ in range(10):
        m.sample_actions(obs)
    total, trunk = [], []
    with torch.no_grad():
        for _ in range(calls):
            t0 = time.perf_counter()
            m.sample_actions(obs)
            total.append(time.perf_counter() - t0)
        imgs = m.preprocess_images({c: torch.from_numpy(v) for c, v in obs["images"].items()})
        for _ in range(calls):
            t0 = time.perf_counter()
            m.trunk_features(imgs)
            trunk.append(time.perf_counter() - t0)
    ms = np.asarray(total) * 1e3
    tr = np.asarray(trunk) * 1e3
    return {"calls": calls, "threads": 1, "batch": 1, "cameras": 2, "camera_px": 224,
            "fine_blocks": m.cfg.fine_blocks, "crops": [list(c) for c in m.cfg.crops],
            "image_size": m.cfg.image_size, "euler_steps": m.cfg.num_steps, "horizon": m.cfg.horizon,
            "p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()),
            "trunk_p50_ms": float(np.percentile(tr, 50)), "samples_ms": ms.round(3).tolist()}


def throughput(mode: str, batch: int, steps: int, threads: int) -> dict:
    from vla.models.compact import CompactVLA, CompactVLAConfig
    from vla.models.encoders import color_jitter, random_shift

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = CompactVLA(CompactVLAConfig()).set_mode(mode)
    ema = {k: v.detach().clone() for k, v in m.state_dict().items()}
    m.train()
    opt = torch.optim.AdamW(m.trainable_parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(0)
    hw = m.cfg.image_size // 16
    fm = {c: torch.randn(4 * batch, m.trunk.out_channels, hw, hw).half() for c in m.cfg.cameras}
    if m.trunk.fine_channels:
        fm.update({c + "@fine": torch.randn(4 * batch, m.trunk.fine_channels, 2 * hw, 2 * hw).half()
                   for c in m.cfg.cameras})
    imgs = {c: torch.randint(0, 255, (4 * batch, 96, 96, 3), dtype=torch.uint8) for c in m.cfg.cameras}
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        idx = torch.randint(0, 4 * batch, (batch,), generator=gen)
        b = {"state": torch.randn(batch, 8), "text": torch.randn(batch, 384), "action": torch.rand(batch, 8, 7)}
        if mode == "frozen":
            b["fmaps"] = {k: f[idx].float() for k, f in fm.items()}
        else:
            b["fmaps"] = m.trunk_features({c: color_jitter(random_shift(imgs[c][idx], 4, gen), 0.15, gen)
                                           for c in m.cfg.cameras})
        loss, _ = m.loss(b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            for k, v in m.state_dict().items():
                if v.dtype.is_floating_point:
                    ema[k].mul_(0.999).add_(v, alpha=0.001)
        if i >= 2:  # warm-up
            times.append(time.perf_counter() - t0)
    t = np.asarray(times)
    from vla.models.modes import count_parameters

    return {"mode": mode, "batch": batch, "threads": threads, "steps": steps,
            "step_s_median": float(np.median(t)), "samples_per_s": float(batch / np.median(t)),
            "parameters": count_parameters(m)}


def plot(res: dict, path: pathlib.Path) -> None:
    plt = plots.pyplot()

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    lat = res["latency"]
    ms = np.asarray(lat["samples_ms"])
    a.hist(ms, bins=40, color="#4c72b0")
    a.axvline(GOAL_LATENCY_MS, color="r", ls="--", label=f"goal {GOAL_LATENCY_MS:.0f} ms")
    a.axvline(lat["p50_ms"], color="k", label=f"p50 {lat['p50_ms']:.1f} ms")
    a.set_xlabel("ms per chunk (batch 1, 1 thread, 2 cams)")
    a.set_ylabel("calls")
    a.set_title(f"chunk inference (trunk p50 {lat['trunk_p50_ms']:.1f} ms)", fontsize=9)
    a.legend(fontsize=8)
    rows = res["throughput"]
    b.bar([r["mode"] for r in rows], [r["samples_per_s"] for r in rows], color="#55a868")
    for i, r in enumerate(rows):
        b.text(i, r["samples_per_s"], f"{r['samples_per_s']:.0f}", ha="center", va="bottom", fontsize=8)
    b.set_ylabel("samples / s")
    b.set_yscale("log")
    b.set_title(f"SFT throughput, batch {rows[0]['batch']}, {rows[0]['threads']} threads", fontsize=9)
    fig.suptitle(f"compact VLA on {res['machine']['cpu_count']} CPU cores", fontsize=10)
    fig.tight_layout()
    plots.save(fig, path, dpi=120)


def main(argv=None) -> int:
    ap = flags.parser("vla", __doc__, out=False)
    flags.add_quick(ap, "a few calls / steps (a smoke run, not a measurement)")
    flags.add_out(ap)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--variant", action="append", choices=sorted(VARIANTS),
                    help=f"model configurations to time besides the default (default: all of {sorted(VARIANTS)})")
    args = ap.parse_args(argv)
    calls, steps, batch = (20, 2, 32) if args.quick else (args.calls, args.steps, args.batch)
    threads = torch.get_num_threads()
    lat = latency(calls)
    print(f"latency: p50 {lat['p50_ms']:.1f} ms  p99 {lat['p99_ms']:.1f} ms  (trunk {lat['trunk_p50_ms']:.1f} ms)")
    variants = {}
    for name in args.variant or [v for v in VARIANTS if v != "default"]:
        if name == "default":
            continue
        v = latency(calls, **VARIANTS[name])
        variants[name] = {k: val for k, val in v.items() if k != "samples_ms"}
        print(f"latency {name}: p50 {v['p50_ms']:.1f} ms  p99 {v['p99_ms']:.1f} ms  (trunk {v['trunk_p50_ms']:.1f} ms)")
    rows = []
    for mode in ("frozen", "lora", "full"):
        r = throughput(mode, batch, steps if mode == "frozen" else max(2, steps // 4), threads)
        rows.append(r)
        print(f"SFT {mode:>6}: {r['samples_per_s']:.0f} samples/s ({r['parameters']['trainable']:,} trainable)")
    res = {"bench": "vla", "quick": args.quick, "date": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
           "latency": lat, "latency_variants": variants, "throughput": rows,
           "goals": {"latency_p50_le_30ms": {"goal_ms": GOAL_LATENCY_MS, "measured_ms": lat["p50_ms"],
                                             "met": lat["p50_ms"] <= GOAL_LATENCY_MS}}}
    write_result(args.out / "vla.json", res, "vla", argv, args.quick)
    plot(res, args.out / "vla.png")
    print(f"wrote {args.out / 'vla.json'} and vla.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
