#!/usr/bin/env python
"""Edge benchmark: the exported compact VLA run by the edge runner (`vla-edge`) over the sim bridge.

Run ``.venv/bin/python -m bench.edge [--quick] [--edge-python PY] [--out DIR]``. It writes
``DIR/edge.json`` and ``DIR/edge.png`` (default DIR: bench/results). In one run:

1. **Export** the compact VLA (``--checkpoint``, or a randomly initialised one with the default
   architecture -- the same compute as a trained one; quick mode: the tiny test architecture) with
   ``vla export``'s code: parity against torch is part of it and recorded.
2. **Chunk latency on one thread**: one observation (two 224 px camera frames, state,
   instruction) -> one chunk, ONNX (``OnnxPolicy``: numpy crop / resize + onnxruntime, 1 thread)
   against torch (``CompactVLA.sample_actions``, ``torch.set_num_threads(1)``, the instruction's
   MiniLM embedding cached as it is in a session), in alternating blocks so a slow patch of the
   machine hits both. Goal: ONNX at least 1.5x faster (p50).
3. **Control loop at 10 / 30 / 50 Hz on one core**: ``python -m deploy.runtime`` (the edge runner,
   a subprocess pinned to one core with ``--cpu``, run by ``--edge-python``: e.g. a Python 3.11
   venv with ``pip install .`` and no torch) drives the simulated Franka over a bridge on free
   ports, executing whole chunks; then the same loop (``deploy.runtime.edge.run_edge``) with the
   torch policy, in this process pinned to the same core. Each run starts with a seeded reset.
   Reported: achieved rate, loop latency p50 / p99 (tick due -> command answered), deadline misses
   (latency over one period), skipped ticks, inference time. Goal: 0 misses at 10 Hz with the
   whole VLA.

The machine's load average is recorded at the start and end: the simulator (physics + camera
rendering) runs on the same CPU, and on a shared machine other jobs do too, so the figures are an
upper bound on what a dedicated edge board with real cameras would see. Quick mode (tiny model,
2 s per rate) is for the test suite; its figures are not meaningful.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

# One BLAS thread (as the edge runtime sets for itself): the ONNX side's frame resize and the torch
# side (torch.set_num_threads(1)) then both compute on one thread. Set before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from bench.harness import flags, plots  # noqa: E402
from bench.harness.results import ROOT, write_result  # noqa: E402


os.environ.setdefault("MUJOCO_GL", "egl")

INSTRUCTION = "pick up the red cube"
RATES = (10, 30, 50)


def site_yaml(path: Path, ports: list[int], size: int, fps: int) -> Path:
    text = textwrap.dedent(f"""\
        name: bench-edge
        description: the simulated Franka and its two cameras on free ports (bench/edge.py)
        robot: {{arm: arm, cameras: [front, wrist]}}
        devices:
          arm:
            driver: sim_franka
            command: tcp://127.0.0.1:{ports[0]}
            stream: tcp://127.0.0.1:{ports[1]}
            command_timeout_ms: 500
            state_hz: 100
            params: {{realtime: true, seed: 0}}
        """)
    for i, cam in enumerate(("front", "wrist")):
        text += textwrap.indent(textwrap.dedent(f"""\
            {cam}:
              driver: sim_camera
              command: tcp://127.0.0.1:{ports[2 + 2 * i]}
              stream: tcp://127.0.0.1:{ports[3 + 2 * i]}
              params: {{sim: "@arm", camera: {cam}, width: {size}, height: {size}, fps: {fps}}}
            """), "  ")
    path.write_text(text)
    return path


def make_vla(args):
    import torch

    from vla.models.compact import CompactVLA, CompactVLAConfig

    if args.checkpoint:
        from vla.models import load_vla
        from vla.models import resolve_checkpoint

        return load_vla(resolve_checkpoint(args.checkpoint)), "checkpoint " + Path(args.checkpoint).name
    torch.manual_seed(0)
    if args.quick:
        cfg = CompactVLAConfig(image_size=64, hidden=64, cond_dim=64, keypoints=8, pretrained=False)
    else:
        cfg = CompactVLAConfig(pretrained=False)  # the default architecture, random weights: the same compute
    vla = CompactVLA(cfg).eval()
    vla.set_normalization(np.zeros(8), np.ones(8), -np.full(7, 0.01), np.full(7, 0.01))
    return vla, ("tiny random-init compact VLA (quick)" if args.quick else "default-architecture compact VLA, random init")


def pct(xs, q):
    return float(np.percentile(np.asarray(xs) * 1e3, q))


def chunk_latency(vla, onnx_path: str, reps: int, frame: int) -> dict:
    """ONNX vs torch, one observation -> one chunk, one thread each, alternating blocks."""
    import torch

    from deploy.runtime import OnnxPolicy

    torch.set_num_threads(1)
    pol = OnnxPolicy(onnx_path, threads=1)
    rng = np.random.default_rng(0)
    obs = {"images": {c: rng.integers(0, 256, (frame, frame, 3), dtype=np.uint8) for c in vla.cfg.cameras},
           "state": np.zeros(8, np.float32), "instruction": INSTRUCTION}
    batch = {"images": {c: v[None] for c, v in obs["images"].items()}, "state": obs["state"][None],
             "instruction": [INSTRUCTION]}
    pol(obs), vla.sample_actions(batch)  # warm up (MiniLM embedding cached, onnxruntime arenas)
    t = {"onnx": [], "torch": []}
    block = max(reps // 5, 1)
    for _ in range(5):
        for side in ("onnx", "torch"):
            for _ in range(block):
                t0 = time.perf_counter()
                pol(obs) if side == "onnx" else vla.sample_actions(batch)
                t[side].append(time.perf_counter() - t0)
    out = {s: {"n": len(v), "p50_ms": pct(v, 50), "p99_ms": pct(v, 99), "min_ms": pct(v, 0)} for s, v in t.items()}
    out["speedup_p50"] = out["torch"]["p50_ms"] / out["onnx"]["p50_ms"]
    return out


def edge_run(py: str, policy: str, site: Path, hz: int, seconds: float, core: int, seed: int, tmp: Path) -> dict:
    stats = tmp / f"onnx_{hz}.json"
    cmd = [py, "-m", "deploy.runtime", "--policy", policy, "--site", str(site), "--hz", str(hz),
           "--seconds", str(seconds), "--cpu", str(core), "--reset", str(seed), "--timeout", "10",
           "--stats", str(stats)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 240, env=env, cwd=str(tmp))
    if r.returncode != 0:
        raise RuntimeError(f"vla-edge at {hz} Hz failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(stats.read_text())


def torch_run(vla, site: Path, hz: int, seconds: float, core: int, seed: int) -> dict:
    import torch

    from deploy.runtime.edge import EdgeConfig, run_edge
    from robot_io.robot import RobotClient

    def policy(obs, noise=None):
        batch = {"images": {c: v[None] for c, v in obs["images"].items()}, "state": obs["state"][None],
                 "instruction": [obs["instruction"]]}
        return vla.sample_actions(batch, noise=torch.from_numpy(noise[None]))[0].numpy()

    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        with RobotClient(str(site), sync=False, timeout_s=10.0) as client:
            client.reset(seed, timeout_s=120)
            return run_edge(client, policy, INSTRUCTION, EdgeConfig(hz=hz, seconds=seconds, seed=seed),
                            noise_shape=tuple(vla.noise_shape), exec_steps=vla.cfg.horizon)
    finally:
        os.sched_setaffinity(0, before)


def edge_python_facts(py: str) -> dict:
    code = ("import sys, importlib.util, onnxruntime; print(sys.version.split()[0]); "
            "print(importlib.util.find_spec('torch') is not None); print(onnxruntime.__version__)")
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120, cwd=tempfile.gettempdir())
    if r.returncode != 0:
        raise RuntimeError(f"--edge-python {py} cannot run the edge runtime: {r.stderr[-500:]}")
    v, has_torch, ort = r.stdout.split()
    return {"python": v, "torch_installed": has_torch == "True", "onnxruntime": ort}


def plot(res: dict, path: Path) -> None:
    plt = plots.pyplot()

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    rates = [r["target_hz"] for r in res["loop"]]
    x = np.arange(len(rates))
    for i, (side, color) in enumerate((("onnx", "tab:blue"), ("torch", "tab:orange"))):
        ach = [r[side]["achieved_hz"] or 0 for r in res["loop"]]
        p99 = [r[side]["latency_ms"]["p99"] or 0 for r in res["loop"]]
        miss = [r[side]["deadline_misses"] for r in res["loop"]]
        axes[0].bar(x + (i - 0.5) * 0.38, ach, 0.38, color=color, label=side)
        axes[1].bar(x + (i - 0.5) * 0.38, p99, 0.38, color=color, label=side)
        axes[2].bar(x + (i - 0.5) * 0.38, miss, 0.38, color=color, label=side)
    axes[0].plot(x, rates, "k_", ms=30, label="target")
    axes[1].plot(x, [1e3 / r for r in rates], "k_", ms=30, label="period")
    for ax, t in zip(axes[:3], ("achieved rate (Hz)", "loop latency p99 (ms)", "deadline misses")):
        ax.set_xticks(x, [f"{r:g} Hz" for r in rates])
        ax.set_title(t)
        ax.legend(fontsize=8)
    c = res["chunk_latency"]
    axes[3].bar(["onnx", "torch"], [c["onnx"]["p50_ms"], c["torch"]["p50_ms"]], color=["tab:blue", "tab:orange"])
    axes[3].set_title(f"chunk latency p50, 1 thread ({c['speedup_p50']:.2f}x)")
    axes[3].set_ylabel("ms")
    fig.suptitle(f"edge runner ({res['config']['model']}); edge python {res['edge_python']['python']}, "
                 f"load {res['machine']['loadavg_start'][0]:.1f} -> {res['machine']['loadavg_end'][0]:.1f}",
                 fontsize=9)
    fig.tight_layout()
    plots.save(fig, path, dpi=90)


def main(argv=None) -> int:
    p = flags.parser("edge", out=False, doc=__doc__.split("\n\n")[0],
                                epilog="example: python -m bench.edge --edge-python /opt/edge311/bin/python")
    flags.add_quick(p, "tiny model, 2 s per rate (the test suite's smoke run)")
    p.add_argument("--checkpoint", default=None, help="a compact VLA checkpoint (default: random init)")
    p.add_argument("--edge-python", default=sys.executable,
                   help="the Python that runs the edge runner (e.g. a 3.11 venv without torch; default this one)")
    p.add_argument("--seconds", type=float, default=None, help="run time per rate (default 15; quick 2)")
    p.add_argument("--reps", type=int, default=None, help="chunks timed per side (default 100; quick 10)")
    p.add_argument("--core", type=int, default=None, help="CPU core for the loops (default the last one)")
    flags.add_out(p, type=str)
    args = p.parse_args(argv)
    seconds = args.seconds or (2.0 if args.quick else 15.0)
    reps = args.reps or (10 if args.quick else 100)
    core = args.core if args.core is not None else max(os.sched_getaffinity(0))
    frame = 64 if args.quick else 224
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    t_start = time.time()

    import torch

    from deploy.export import export_vla
    from robot_io.site import load_site
    from bench.harness.sites import lease_ports as free_ports
    from robot_io.bridge_process import running_bridge

    edge_py = edge_python_facts(args.edge_python)
    vla, model = make_vla(args)
    res = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mode": "quick" if args.quick else "full",
           "config": {"model": model, "cameras": list(vla.cfg.cameras), "image_size": vla.cfg.image_size,
                      "horizon": vla.cfg.horizon, "num_steps": vla.cfg.num_steps, "camera_frames_px": frame,
                      "seconds_per_rate": seconds, "reps": reps, "core": core, "exec_steps": vla.cfg.horizon},
           "edge_python": edge_py,
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                       "torch": torch.__version__, "loadavg_start": list(load0)}}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        policy = str(tmp / "policy.onnx")
        rep = export_vla(vla, policy, [INSTRUCTION], samples=4)
        res["export"] = {"parity": rep["parity"], "mb": rep["bytes"] / 1e6}
        print(f"exported ({rep['bytes'] / 1e6:.1f} MB), parity max abs diff {rep['parity']['max_abs_diff']:.2e}",
              flush=True)
        res["chunk_latency"] = chunk_latency(vla, policy, reps, frame)
        c = res["chunk_latency"]
        print(f"chunk latency p50: onnx {c['onnx']['p50_ms']:.1f} ms, torch {c['torch']['p50_ms']:.1f} ms "
              f"({c['speedup_p50']:.2f}x)", flush=True)
        site = site_yaml(tmp / "site.yaml", free_ports(6), frame, 15)
        res["loop"] = []
        with running_bridge(load_site(str(site)), str(tmp / "bridge.log"), start="always"):
            for i, hz in enumerate(RATES):
                row = {"target_hz": hz, "onnx": edge_run(args.edge_python, policy, site, hz, seconds, core, i, tmp),
                       "torch": torch_run(vla, site, hz, seconds, core, i)}
                res["loop"].append(row)
                for side in ("onnx", "torch"):
                    s = row[side]
                    print(f"{hz:>3} Hz {side:>5}: {s['achieved_hz'] or 0:6.2f} Hz achieved, p99 latency "
                          f"{s['latency_ms']['p99'] or 0:7.1f} ms, {s['deadline_misses']} misses / {s['ticks']} ticks, "
                          f"{s['skipped_ticks']} skipped, inference p50 {s['inference_ms']['p50'] or 0:.1f} ms",
                          flush=True)
    res["machine"]["loadavg_end"] = list(os.getloadavg())
    ten = res["loop"][0]["onnx"]
    res["goals"] = {
        "zero_misses_at_10hz": {"value": ten["deadline_misses"], "met": ten["deadline_misses"] == 0},
        "onnx_chunk_1.5x_faster": {"value": res["chunk_latency"]["speedup_p50"],
                                   "met": res["chunk_latency"]["speedup_p50"] >= 1.5},
        "no_torch_in_edge_python": {"value": not edge_py["torch_installed"], "met": not edge_py["torch_installed"]},
    }
    res["wall_s"] = time.time() - t_start
    write_result(out / "edge.json", res, "edge", argv, args.quick, indent=2)
    plot(res, out / "edge.png")
    print("Goals: " + ", ".join(f"{k} {'met' if v['met'] else 'NOT met'} ({v['value']})" for k, v in res["goals"].items()))
    print(f"wrote {out / 'edge.json'} and {out / 'edge.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
