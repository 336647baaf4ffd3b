#!/usr/bin/env python
"""Policy server + thin client benchmark: `vla serve` and the client of `vla-client` on the sim Franka.

Run ``.venv/bin/python -m bench.serve [--quick] [--checkpoint RUN] [--out DIR]``. It writes
``DIR/serve.json`` and ``DIR/serve.png`` (default DIR: bench/results). In one run:

1. A bridge serves the simulated Franka and its two cameras, laid out as the ``sim-franka-fast``
   preset (physics advances one control period per command, cameras render on request) on free
   ports. ``vla serve`` (a subprocess, torch) serves ``--checkpoint`` -- by default a randomly
   initialised tiny compact VLA (the tests' architecture; its chunks are noise, but the serving
   path and the blending are the same) -- on a free loopback port.
2. The thin client (``deploy.runtime.client.run_client``, no torch, in this process) drives the arm
   at ``--hz`` for ``--seconds`` per blend mode -- ``none``, ``ensemble`` (ACT temporal ensembling),
   ``crossfade`` -- each after the same seeded reset of ``--task``'s scene: asynchronous requests
   when half a chunk is left, every call with a deadline.
3. The same three runs against a **synthetic source** (``SyntheticSource`` below, no model:
   one smooth trajectory, each chunk offset by +-0.004 per dimension with a seeded random sign, so
   consecutive plans disagree by 0.008 per dimension or agree; 30 ms per chunk): the
   boundary effect of blending alone, without a model whose rows are noisy within a chunk too
   (``--no-synthetic`` skips it).
4. Reported per mode: the **action change between consecutive commands** ``|a_t - a_(t-1)|`` (L2)
   on chunk-boundary ticks (the set of chunks behind the action changed) and on within-chunk ticks
   (mean, p95, max), for the arm's motion (``jump_arm``: dpos + drot, the figure to read) and for the
   whole action (``jump``: with the gripper, whose open / close is a step by design), achieved rate, tick deadline misses, starved ticks (queue ran dry), request
   round trip p50 / p99 (observation sent -> chunk received), the server's inference time, missed
   call deadlines, and the overlap (rows of the old chunk left when the new one landed).

The machine's load average is recorded at the start and end: simulator, renderer, server and client
share the CPU, and on a shared machine other jobs do too. Quick mode (tiny model, 64 px frames,
3 s per mode and source) is for the test suite; its figures are not meaningful.
"""

from __future__ import annotations

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


os.environ.setdefault("MUJOCO_GL", "egl")

INSTRUCTION = "pick up the red cube"
MODES = ("none", "ensemble", "crossfade")
SYNTHETIC = "synthetic-source"
"""``python -m bench.serve synthetic-source BIND DELAY_S SEED``: serve a :class:`SyntheticSource` (the child process)."""


class SyntheticSource:
    """A deterministic policy source (no torch; the one tests/deploy/fake_policy.py gives the server's tests):
    chunks that follow one smooth trajectory in the tick, each shifted by an offset whose sign is drawn at random
    (seeded: the same sequence every run), so two consecutive plans disagree by ``2 * offset`` or agree, as
    independent samples would."""

    def __init__(self, horizon: int = 10, offset: float = 0.004, delay_s: float = 0.0, seed: int = 0) -> None:
        self.horizon, self.offset, self.delay_s = horizon, offset, delay_s
        self.rng = np.random.default_rng(seed)

    def describe(self) -> dict:
        return {"policy": "offset", "horizon": self.horizon, "action_dim": 7, "cameras": [], "state_dim": 8,
                "instructions": ["test"]}

    def __call__(self, obs: dict) -> np.ndarray:
        if self.delay_s:
            time.sleep(self.delay_s)
        sign = 1.0 if self.rng.random() < 0.5 else -1.0
        t = np.asarray(obs["tick"] + np.arange(self.horizon), np.float64)[:, None]
        return (0.003 * np.sin(0.25 * t + np.arange(7))).astype(np.float32) + np.float32(sign * self.offset)


def serve_synthetic(bind: str, delay_s: float, seed: int) -> int:
    """Serve a :class:`SyntheticSource` on ``bind`` until killed; prints the bound endpoint first."""
    from deploy.server import PolicyServer

    srv = PolicyServer(SyntheticSource(delay_s=delay_s, seed=seed), bind)
    print(srv.bind(), flush=True)
    srv.serve()
    return 0


def site_yaml(path: Path, ports: list[int], size: int) -> Path:
    """The sim-franka-fast preset's layout on free ports (cameras at ``size`` px)."""
    text = textwrap.dedent(f"""\
        name: bench-serve
        description: sim-franka-fast on free ports (bench/serve.py)
        robot: {{arm: arm, cameras: [front, wrist]}}
        devices:
          arm:
            driver: sim_franka
            command: tcp://127.0.0.1:{ports[0]}
            stream: tcp://127.0.0.1:{ports[1]}
            command_timeout_ms: 2000
            params: {{realtime: false, seed: 0}}
        """)
    for i, cam in enumerate(("front", "wrist")):
        text += textwrap.indent(textwrap.dedent(f"""\
            {cam}:
              driver: sim_camera
              command: tcp://127.0.0.1:{ports[2 + i]}
              streaming: false
              params: {{sim: "@arm", camera: {cam}, width: {size}, height: {size}, fps: 30}}
            """), "  ")
    path.write_text(text)
    return path


def tiny_checkpoint(path: Path) -> str:
    """A randomly initialised tiny compact VLA (the tests' architecture), saved as `vla serve` loads it."""
    import torch

    from vla.models.compact import CompactVLA, CompactVLAConfig

    torch.manual_seed(0)
    m = CompactVLA(CompactVLAConfig(image_size=64, hidden=64, cond_dim=64, keypoints=8, pretrained=False))
    m.set_normalization(np.zeros(8), np.ones(8), -np.full(7, 0.02), np.full(7, 0.02))
    m.save(str(path), extra={"instructions": [INSTRUCTION]})
    return str(path)


def start_server(ckpt: str, port: int, device: str, log_path: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vla.cli", "serve", "--checkpoint", ckpt, "--bind", f"tcp://127.0.0.1:{port}",
           "--device", device, "--threads", "1"]
    log_f = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log_f, stderr=subprocess.STDOUT, cwd=str(ROOT),
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    log_f.close()
    return proc


def run_mode(site: Path, endpoint: str, mode: str, hz: float, seconds: float, deadline: float, seed: int,
             task: str | None) -> dict:
    from deploy.runtime.client import ClientConfig, PolicyLink, run_client
    from robot_io.robot import RobotClient

    trace = {"tick": [], "action": [], "sources": []}

    def on_tick(k, row, src):
        trace["tick"].append(k)
        trace["action"].append(None if row is None else [float(x) for x in row])
        trace["sources"].append(list(src))

    cfg = ClientConfig(hz=hz, seconds=seconds, blend=mode, deadline_s=deadline, first_deadline_s=120.0)
    with PolicyLink(endpoint) as link:
        desc = link.describe(900.0)  # the server warms up before it binds (slow on a loaded CPU)
        # only the cameras the policy reads are observed (rendered, in the fast sim): none for the synthetic source
        with RobotClient(str(site), cameras=desc["cameras"], timeout_s=30.0) as robot:
            robot.reset(seed, task=task, timeout_s=120.0)
            stats = run_client(robot, link, INSTRUCTION, cfg, horizon=desc["horizon"], cameras=desc["cameras"],
                               on_tick=on_tick)
    stats["trace"] = trace
    return stats


def plot(res: dict, path: Path) -> None:
    plt = plots.pyplot()

    fig, axes = plt.subplots(2, 2, figsize=(14, 8), gridspec_kw={"width_ratios": [1, 1.6]})
    colors = {"none": "tab:red", "ensemble": "tab:blue", "crossfade": "tab:green"}

    def jump_bars(ax, runs, key, scale, ylabel, title):
        x = np.arange(len(runs))
        for i, (part, color) in enumerate((("boundary", "tab:red"), ("within", "tab:gray"))):
            mean = [(r[key][part]["mean"] or 0) * scale for r in runs]
            p95 = [(r[key][part]["p95"] or 0) * scale for r in runs]
            ax.bar(x + (i - 0.5) * 0.38, mean, 0.38, color=color, label=f"{part} mean")
            ax.plot(x + (i - 0.5) * 0.38, p95, "v", color=color, label=f"{part} p95")
        ax.set_xticks(x, [r["blend"] for r in runs])
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)

    jump_bars(axes[0, 0], res["runs"], "jump_arm", 1e3, "|a_t - a_(t-1)|, dpos m + drot rad (x 1e3)",
              f"{res['config']['model']}: change between consecutive commands")
    if res.get("synthetic_runs"):
        jump_bars(axes[1, 0], res["synthetic_runs"], "jump", 1e3, "|a_t - a_(t-1)| (x 1e3)",
                  "synthetic source (each plan offset by +-0.004 per dim)")
        for r in res["synthetic_runs"]:
            tr = r["trace"]
            n = min(len(tr["tick"]), 40)
            ticks = np.array(tr["tick"][:n])
            a = np.array([np.nan if v is None else v[0] for v in tr["action"][:n]])
            axes[1, 1].plot(ticks, a * 1e3, ".-", ms=3, lw=1, color=colors[r["blend"]], label=r["blend"])
            src = tr["sources"][:n]
            bnd = [ticks[i] for i in range(1, n) if src[i] and src[i - 1] and src[i] != src[i - 1]]
            axes[1, 1].plot(bnd, np.interp(bnd, ticks, a * 1e3), "o", mfc="none", color=colors[r["blend"]], ms=7)
        axes[1, 1].set_xlabel("control tick (circles: chunk boundaries)")
        axes[1, 1].set_ylabel("executed action dim 0 (x 1e3)")
        axes[1, 1].set_title("synthetic source: executed action, first ticks", fontsize=9)
        axes[1, 1].legend(fontsize=7)
    runs = res["runs"]
    x = np.arange(len(runs))
    axes[0, 1].bar(x - 0.19, [r["request_ms"]["p50"] or 0 for r in runs], 0.38, label="request p50")
    axes[0, 1].bar(x + 0.19, [r["request_ms"]["p99"] or 0 for r in runs], 0.38, label="request p99")
    axes[0, 1].set_xticks(x, [f"{r['blend']}: {r['achieved_hz'] or 0:.1f} Hz, {r['deadline_misses']} tick misses, "
                              f"{r['starved_ticks']} starved" for r in runs], fontsize=7)
    axes[0, 1].set_ylabel("ms")
    axes[0, 1].set_title(f"{res['config']['model']}: request round trip (observation sent -> chunk in)", fontsize=9)
    axes[0, 1].legend(fontsize=7)
    fig.suptitle(f"policy server + thin client on the fast sim Franka at {res['config']['hz']:g} Hz; "
                 f"load {res['machine']['loadavg_start'][0]:.1f} -> {res['machine']['loadavg_end'][0]:.1f}", fontsize=10)
    fig.tight_layout()
    plots.save(fig, path, dpi=90)


def start_synthetic_server(port: int, log_path: Path) -> subprocess.Popen:
    """The deterministic source (``SyntheticSource``, no torch): one smooth trajectory, each chunk offset by +-0.004
    (seeded random signs), 30 ms per chunk: the boundary effect of blending without a model's own noise."""
    log_f = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "bench.serve", SYNTHETIC, f"tcp://127.0.0.1:{port}", "0.03", "0"],
                            stdout=log_f, stderr=subprocess.STDOUT, cwd=str(ROOT),
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    log_f.close()
    return proc


def _print_run(source: str, s: dict) -> None:
    j, ja = s["jump"], s["jump_arm"]
    print(f"{source:>9} {s['blend']:>9}: arm jump at boundaries mean {ja['boundary']['mean'] or 0:.5f} p95 "
          f"{ja['boundary']['p95'] or 0:.5f} (n={ja['boundary']['n']}), within mean {ja['within']['mean'] or 0:.5f} "
          f"p95 {ja['within']['p95'] or 0:.5f}; whole action boundary mean {j['boundary']['mean'] or 0:.4f} max "
          f"{j['boundary']['max'] or 0:.4f}; {s['achieved_hz'] or 0:.2f} Hz, {s['deadline_misses']} tick misses, "
          f"{s['starved_ticks']} starved, request p50 {s['request_ms']['p50'] or 0:.0f} ms p99 "
          f"{s['request_ms']['p99'] or 0:.0f} ms, {s['call_deadline_misses']} call misses", flush=True)


def _ratios(runs: list[dict]) -> dict:
    """Each mode's boundary jump over the no-blending run's (the first)."""
    def ratio(r, key, stat):
        base, val = runs[0][key]["boundary"][stat], r[key]["boundary"][stat]
        return val / base if base and val is not None else None

    return {r["blend"]: {"arm_mean": ratio(r, "jump_arm", "mean"), "arm_p95": ratio(r, "jump_arm", "p95"),
                         "action_mean": ratio(r, "jump", "mean"), "action_max": ratio(r, "jump", "max")}
            for r in runs}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [SYNTHETIC]:
        return serve_synthetic(argv[1], float(argv[2]), int(argv[3]))
    p = flags.parser("serve", out=False, doc=__doc__.split("\n\n")[0],
                                epilog="example: python -m bench.serve --checkpoint runs/vla_pick --seconds 30")
    flags.add_quick(p, "tiny model, 64 px frames, 3 s per mode (the test suite's run)")
    p.add_argument("--checkpoint", default=None, help="a VLA checkpoint or run (default: tiny random-init compact VLA)")
    p.add_argument("--hz", type=float, default=10.0, help="control rate (default 10)")
    p.add_argument("--seconds", type=float, default=None, help="run time per blend mode and source (default 15; quick 3)")
    p.add_argument("--deadline", type=float, default=None,
                   help="the client's deadline per call, seconds (default 5, quick 15: server, simulator and "
                        "client share this CPU, and a late chunk ends the run)")
    p.add_argument("--device", default="auto", help="the server's torch device (default auto)")
    p.add_argument("--task", default="pick_red_cube", help="sim task laid out at each reset (default pick_red_cube)")
    p.add_argument("--no-synthetic", action="store_true", help="skip the synthetic-source control runs")
    flags.add_out(p, type=str)
    args = p.parse_args(argv)
    seconds = args.seconds or (3.0 if args.quick else 15.0)
    args.deadline = args.deadline or (15.0 if args.quick else 5.0)
    frame = 64 if args.quick else 224
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    t_start = time.time()

    from robot_io.site import load_site
    from bench.harness.sites import lease_ports as free_ports
    from robot_io.bridge_process import running_bridge

    res = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mode": "quick" if args.quick else "full",
           "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                       "python": platform.python_version(), "loadavg_start": list(load0)}}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        ckpt = args.checkpoint or tiny_checkpoint(tmp / "tiny_vla")
        model = ("checkpoint " + Path(args.checkpoint).name) if args.checkpoint else "tiny random-init compact VLA"
        ports = free_ports(6)
        site = site_yaml(tmp / "site.yaml", ports[:4], frame)
        servers = {"vla": (start_server(ckpt, ports[4], args.device, tmp / "server.log"), ports[4], tmp / "server.log")}
        if not args.no_synthetic:
            servers["synthetic"] = (start_synthetic_server(ports[5], tmp / "synthetic.log"), ports[5],
                                    tmp / "synthetic.log")
        try:
            with running_bridge(load_site(str(site)), str(tmp / "bridge.log"), start="always"):
                for source, (proc, port, log_path) in servers.items():
                    key = "runs" if source == "vla" else "synthetic_runs"
                    res[key] = []
                    for mode in MODES:
                        if proc.poll() is not None:
                            raise RuntimeError(f"the {source} server exited ({proc.returncode}): "
                                               f"{log_path.read_text()[-2000:]}")
                        s = run_mode(site, f"tcp://127.0.0.1:{port}", mode, args.hz, seconds, args.deadline, seed=7,
                                     task=args.task)
                        res[key].append(s)
                        _print_run(source, s)
        finally:
            for proc, _, _ in servers.values():
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        res["server_log_tail"] = (tmp / "server.log").read_text()[-1000:]
    first = res["runs"][0]
    res["config"] = {"model": model, "hz": args.hz, "seconds_per_mode": seconds, "deadline_s": args.deadline,
                     "camera_frames_px": frame, "horizon": first["horizon"], "refill": first["refill"],
                     "instruction": INSTRUCTION, "task": args.task, "device": args.device}
    res["machine"]["loadavg_end"] = list(os.getloadavg())
    res["boundary_jump_vs_none"] = _ratios(res["runs"])
    if res.get("synthetic_runs"):
        res["synthetic_boundary_jump_vs_none"] = _ratios(res["synthetic_runs"])
    res["wall_s"] = time.time() - t_start
    write_result(out / "serve.json", res, "serve", argv, args.quick, indent=1)
    plot(res, out / "serve.png")
    for key in ("boundary_jump_vs_none", "synthetic_boundary_jump_vs_none"):
        if key in res:
            print(f"{key}: " + ", ".join(f"{k} arm mean x{v['arm_mean'] or 0:.2f} p95 x{v['arm_p95'] or 0:.2f}, "
                                         f"action mean x{v['action_mean'] or 0:.2f} max x{v['action_max'] or 0:.2f}"
                                         for k, v in res[key].items()))
    print(f"wrote {out / 'serve.json'} and {out / 'serve.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
