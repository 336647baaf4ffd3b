#!/usr/bin/env python
"""Recorder benchmark: can `vla record` keep up at 30 fps, and what does encoding cost?

Runs the exact loop `vla record` uses (``vla.data.recording.record_episode``: teleop read ->
``RobotEnv.step`` over the bridge -> ``EpisodeWriter.add_frame``; ``save_episode`` encodes the
videos) against a bridge served by `vla bridge serve` in its own process. The devices are a
transport-only arm (``null_arm``) and synthetic test-pattern cameras, so what is measured is the
recorder and the bridge, not a simulator's rendering; an optional row (``--with-sim``) records
the real-time MuJoCo Franka with its two rendered cameras, labelled as such.

Per configuration (cameras x resolution at a target rate) it reports the achieved control rate,
the loop's lateness (jitter: how late each tick fired, p50 / p99 / max), the time per recorded
tick, and the encoding time of ``save_episode`` per episode and per second of video. Writes
``bench/results/record.json`` and ``record.png``.

    .venv/bin/python -m bench.record [--quick] [--out DIR] [--with-sim]
"""

from __future__ import annotations

import datetime as _dt
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from hardware.teleop.base import Teleop, TeleopCommand  # noqa: E402

from bench.harness import flags, plots  # noqa: E402
from bench.harness.results import write_result  # noqa: E402
from bench.harness.sites import lease_ports  # noqa: E402


GOAL = {"cams": 2, "size": (224, 224), "fps": 30.0}


class HoldStill(Teleop):
    """Bench-only operator: no motion, gripper open, never ends an episode (the step limit does)."""

    def _connect(self):
        pass

    def _disconnect(self):
        pass

    def read(self, obs=None, privileged=None):
        return TeleopCommand(np.array([0, 0, 0, 0, 0, 0, 1], np.float32), intervening=False)


def synthetic_site(path: str, n_cams: int, width: int, height: int, fps: float, ports: list[int]) -> str:
    """A site of a transport-only arm and ``n_cams`` synthetic cameras on ``ports`` (2 + 2 n_cams of them)."""
    devices = {"arm": {"driver": "null_arm", "command": f"tcp://127.0.0.1:{ports[0]}",
                       "stream": f"tcp://127.0.0.1:{ports[1]}"}}
    for i in range(n_cams):
        devices[f"cam{i}"] = {"driver": "synthetic_camera", "command": f"tcp://127.0.0.1:{ports[2 + 2 * i]}",
                              "stream": f"tcp://127.0.0.1:{ports[3 + 2 * i]}",
                              "params": {"width": width, "height": height, "fps": fps}}
    site = {"name": f"bench-{n_cams}x{width}x{height}", "robot": {"arm": "arm", "cameras": list(devices)[1:]},
            "devices": devices}
    with open(path, "w") as f:
        yaml.safe_dump(site, f)
    return path


def run_config(label: str, site_path: str, fps: float, episodes: int, seconds: float, tmp: str) -> dict:
    from robot_io.env import RobotEnv
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from robot_io.bridge_process import running_bridge
    from vla.data import EpisodeWriter, make_features
    from vla.data.recording import record_episode

    site = load_site(site_path)
    root = os.path.join(tmp, label.replace(" ", "_"))
    rows = []
    with running_bridge(site, os.path.join(tmp, label.replace(" ", "_") + ".log"), start="always"), HoldStill() as op:
        client = RobotClient(site)
        env = RobotEnv(client, instruction="hold still", control_hz=fps)
        obs = client.observe()
        feats = make_features({c: im.shape[:2] for c, im in obs["images"].items()}, state_dim=8, action_dim=7)
        writer = EpisodeWriter(root, "local/bench", fps=int(fps), features=feats, robot_type="bench")
        try:
            for ep in range(episodes):
                res = record_episode(env, op, writer, "hold still", max_steps=int(seconds * fps), seed=ep)
                t0 = time.perf_counter()
                writer.save_episode()
                save_s = time.perf_counter() - t0
                rows.append({"frames": res.frames, "achieved_hz": res.loop["achieved_hz"],
                             "late_ms_p50": res.loop["late_ms_p50"], "late_ms_p99": res.loop["late_ms_p99"],
                             "late_ms_max": res.loop["late_ms_max"], "period_ms_std": res.loop["period_ms_std"],
                             "tick_ms_p50": float(np.percentile(res.step_ms, 50)),
                             "tick_ms_p99": float(np.percentile(res.step_ms, 99)),
                             "save_episode_s": save_s, "encode_s_per_video_s": save_s / (res.frames / fps)})
                print(f"  {label:<28} ep {ep}: {res.loop['achieved_hz']:6.2f} Hz, late p99 "
                      f"{res.loop['late_ms_p99']:6.2f} ms, save/encode {save_s:5.2f} s for {res.frames} frames",
                      flush=True)
        finally:
            writer.close()
            env.close()
    agg = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    agg["late_ms_p99_worst"] = float(max(r["late_ms_p99"] for r in rows))
    agg["achieved_hz_min"] = float(min(r["achieved_hz"] for r in rows))
    return {"label": label, "target_hz": fps, "episodes": rows, "mean": agg}


def main(argv=None) -> int:
    ap = flags.parser("record", __doc__, out=False)
    flags.add_quick(ap, "short episodes, fewer configurations (for tests)")
    flags.add_out(ap)
    ap.add_argument("--with-sim", action="store_true", help="add a row with the real-time sim Franka and its cameras")
    args = ap.parse_args(argv)
    episodes, seconds = (1, 2.0) if args.quick else (3, 10.0)
    configs = [(2, 224, 224)] if args.quick else [(2, 224, 224), (3, 224, 224), (3, 640, 480)]
    tmp = tempfile.mkdtemp(prefix="bench_record_")
    results = []
    t_start = time.perf_counter()
    try:
        for i, (n, w, h) in enumerate(configs):
            label = f"{n} cams {w}x{h} @30"
            site = synthetic_site(os.path.join(tmp, f"site{i}.yaml"), n, w, h, 30.0, lease_ports(2 + 2 * n))
            results.append(run_config(label, site, 30.0, episodes, seconds, tmp))
        if args.with_sim:
            results.append(run_config("sim Franka 2 rendered cams 224x224 @30", "sim-franka", 30.0, episodes,
                                      seconds, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    goal_row = next(r for r in results if r["label"].startswith(f"{GOAL['cams']} cams 224x224"))
    keeps_up = goal_row["mean"]["achieved_hz"] >= 0.98 * GOAL["fps"] and goal_row["mean"]["achieved_hz_min"] >= 0.95 * GOAL["fps"]
    import lerobot

    out = {"benchmark": "vla record loop (teleop -> RobotEnv over the bridge -> EpisodeWriter)",
           "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "mode": "quick" if args.quick else "full",
           "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                       "lerobot": lerobot.__version__},
           "config": {"episodes": episodes, "seconds_per_episode": seconds,
                      "devices": "null_arm + synthetic_camera served by `vla bridge serve`"},
           "results": results,
           "goals": {"keeps_up_30fps_2cams_224": {"target": "achieved >= 0.98 x 30 Hz on average, >= 0.95 x 30 in "
                                                             "every episode", "value": goal_row["mean"]["achieved_hz"],
                                                   "met": bool(keeps_up)}},
           "wall_s": time.perf_counter() - t_start}
    write_result(args.out / "record.json", out, "record", argv, args.quick)
    plot(out, args.out / "record.png")
    print("\n" + f"{'configuration':<42} {'Hz':>7} {'late p50':>9} {'late p99':>9} {'tick p99':>9} {'encode s/s':>11}")
    for r in results:
        m = r["mean"]
        print(f"{r['label']:<42} {m['achieved_hz']:7.2f} {m['late_ms_p50']:8.2f}ms {m['late_ms_p99']:8.2f}ms "
              f"{m['tick_ms_p99']:8.2f}ms {m['encode_s_per_video_s']:10.2f}")
    print(f"goal (2 cams 224x224 keep up at 30 fps): {'MET' if keeps_up else 'NOT MET'}")
    print(f"wrote {args.out / 'record.json'} and {args.out / 'record.png'}")
    return 0


def plot(res: dict, path: pathlib.Path) -> None:
    plt = plots.pyplot()

    rs = res["results"]
    labels = [r["label"] for r in rs]
    x = np.arange(len(rs))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    axes[0].bar(x, [r["mean"]["achieved_hz"] for r in rs])
    axes[0].axhline(30, ls="--", c="k", label="target 30 Hz")
    axes[0].set_ylabel("achieved control/record rate (Hz)")
    axes[1].bar(x - 0.2, [r["mean"]["late_ms_p50"] for r in rs], 0.4, label="p50")
    axes[1].bar(x + 0.2, [r["mean"]["late_ms_p99"] for r in rs], 0.4, label="p99")
    axes[1].set_ylabel("tick lateness / jitter (ms)")
    axes[2].bar(x, [r["mean"]["encode_s_per_video_s"] for r in rs])
    axes[2].set_ylabel("save_episode (encode) s per s of video")
    for ax in axes:
        ax.set_xticks(x, labels, rotation=15, fontsize=8)
        ax.legend() if ax.get_legend_handles_labels()[0] else None
    fig.suptitle(f"vla record loop, {res['mode']} mode, {res['timestamp']}")
    fig.tight_layout()
    plots.save(fig, path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
