"""`vla demo`: the main job on the simulated default (`make demo` runs ``--slice``).

``--slice``: the whole slice on the fast sim Franka, each stage through its own `vla`
subcommand: record scripted demos, train the compact VLA, run a DSRL-NA session (with those demos
in its critic), print the base VLA's and DSRL's success. Without it: start the simulated Franka
bridge in its own process, drive the arm through a short scripted motion over the bridge with
``robot_io.RobotEnv`` at a fixed control rate, and save camera frames, a plot of commanded vs
measured end-effector positions and a summary (tracking error, control-loop jitter) in a run
directory.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time


def add_parser(sub, name: str, help_: str) -> None:
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "Start the simulated Franka bridge (MuJoCo Panda, front + wrist cameras) in a separate process, "
        "drive the arm through a scripted square-and-grasp motion over the bridge at a fixed control rate, "
        "and write camera frames, a commanded-vs-measured end-effector plot and summary.json to a run "
        "directory."), epilog="examples:\n  vla demo --slice                 # the whole slice (make demo)\n"
                  "  vla demo --slice --smoke         # every stage at toy size: an install check\n"
                  "  vla demo --out runs/ --control-hz 10   # the bridge demo alone\n")
    p.add_argument("--site", default="sim-franka", help="site YAML file or preset name to serve and drive (default: sim-franka)")
    p.add_argument("--out", default="runs", help="parent folder of the run directory (default: runs/)")
    p.add_argument("--control-hz", type=float, default=10.0, help="control rate of the scripted motion (default 10)")
    p.add_argument("--seed", type=int, default=0, help="scene seed (object placement)")
    p.add_argument("--frame-every", type=int, default=10, help="save camera frames every N control steps (default 10)")
    p.add_argument("--slice", action="store_true",
                   help="the whole slice instead: record scripted demos, train the compact VLA, run a DSRL "
                        "session, print base-vs-DSRL success (~11 min on 2 CPU cores; --full for the full length)")
    p.add_argument("--full", action="store_true", help="with --slice: full-length settings (60 demos per task, "
                   "3 tasks, 6000 SFT steps, 10000 RL ticks; hours on a CPU)")
    p.add_argument("--smoke", action="store_true", help="with --slice: a ~2-minute run of every stage at toy size "
                   "(2 demos, 20 SFT steps, 48 RL ticks) that checks an install end to end; its success rates mean nothing")
    p.add_argument("--task", default="pick_red_cube", help="with --slice: the task DSRL is run on")
    p.set_defaults(run=run)


SLICE = {  # quick (default) and --full settings of `vla demo --slice`
    "quick": {"tasks": ["pick_red_cube"], "episodes": 30, "quality": 0.5, "steps": 2000, "ticks": 1600,
              "eval_episodes": 10, "utd": 4, "critics": 2, "eval_every": 5},
    "full": {"tasks": ["pick_red_cube", "lift_green_cube", "pick_blue_cube"], "episodes": 60, "quality": 0.5,
             "steps": 6000, "ticks": 10_000, "eval_episodes": 20, "utd": 20, "critics": 10, "eval_every": 10},
    "smoke": {"tasks": ["pick_red_cube"], "episodes": 2, "quality": 0.5, "steps": 20, "ticks": 48,
              "eval_episodes": 1, "utd": 1, "critics": 2, "eval_every": 0,
              "train_args": ["--batch-size", "16"],
              "rl_args": ["--batch-size", "16", "--warmup-steps", "2", "--max-episode-ticks", "24"]},
}


def run_slice(args) -> int:
    """record -> train -> DSRL on the fast sim Franka, each step through its own `vla` subcommand."""
    import json as _json

    from robot_io.site import load_site
    from vla.cli import main as vla_main
    from vla.commands._bridge import running_bridge

    if args.full and args.smoke:
        raise ValueError("--full and --smoke: choose one")
    cfg = SLICE["full" if args.full else "smoke" if args.smoke else "quick"]
    tasks = list(dict.fromkeys([args.task] + cfg["tasks"])) if args.full else [args.task]
    run_dir = os.path.join(args.out, "slice-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(run_dir, exist_ok=True)
    site = load_site("sim-franka-fast")
    t0 = time.monotonic()

    def step(title: str, argv: list[str]) -> None:
        print(f"\n== {title} ({(time.monotonic() - t0) / 60:.1f} min in)\n   vla {' '.join(argv)}", flush=True)
        rc = vla_main(argv)
        if rc != 0:
            raise RuntimeError(f"`vla {argv[0]}` failed with exit code {rc}")

    with running_bridge(site, os.path.join(run_dir, "bridge.log"), start="auto"):
        datasets = []
        for t in tasks:
            root = os.path.join(run_dir, "data", t)
            step(f"record {cfg['episodes']} scripted demos of {t} (expert quality {cfg['quality']}, failures kept)",
                 ["record", "--robot", "sim-franka-fast", "--task", t, "--teleop", "scripted", "--expert-quality",
                  str(cfg["quality"]), "--keep-failures", "--episodes", str(cfg["episodes"]), "--root", root,
                  "--serve", "never"])
            datasets += ["--dataset", root]
        vla_dir = os.path.join(run_dir, "vla")
        step("train the compact VLA", ["train", *datasets, "--out", vla_dir, "--steps", str(cfg["steps"]),
                                       "--save-every", str(cfg["steps"] // 2), "--aug-views", "1", "--threads", "1",
                                       *cfg.get("train_args", [])])
        rl_dir = os.path.join(run_dir, "dsrl")
        # the demos just recorded also train DSRL-NA's action critic (--demos)
        step(f"DSRL-NA on {args.task}", ["rl", "--checkpoint", vla_dir, "--task", args.task, "--out", rl_dir,
                                         "--demos", os.path.join(run_dir, "data", args.task),
                                         "--total-ticks", str(cfg["ticks"]), "--utd", str(cfg["utd"]),
                                         "--num-critics", str(cfg["critics"]), "--eval-every", str(cfg["eval_every"]),
                                         "--eval-episodes", str(cfg["eval_episodes"]), "--serve", "never",
                                         *cfg.get("rl_args", [])])
    with open(os.path.join(rl_dir, "summary.json")) as f:
        s = _json.load(f)
    print(f"\n== done in {(time.monotonic() - t0) / 60:.1f} min: {run_dir}")
    print(f"   {'policy':<22}{'success on ' + args.task:>26}")
    print(f"   {'base VLA':<22}{s['base_success_rate']:>25.0%}  ({s['eval_episodes']} episodes)")
    print(f"   {'DSRL-NA, ' + str(s['ticks']) + ' ticks':<22}{s['final_success_rate']:>25.0%}  ({s['eval_episodes']} episodes)")
    print(f"   learning curve: {os.path.join(rl_dir, 'learning_curve.png')}")
    print(f"   VLA loss curve: {os.path.join(vla_dir, 'loss_curve.png')}")
    return 0


def scripted_waypoints(start):
    """A square in the horizontal plane 10 cm below the start, then down, close, up, open."""
    import numpy as np

    x0, y0, z0 = start
    z = z0 - 0.10
    pts = [(x0, y0, z, 1.0), (x0 + 0.1, y0 - 0.1, z, 1.0), (x0 + 0.1, y0 + 0.1, z, 1.0),
           (x0 - 0.05, y0 + 0.1, z, 1.0), (x0 - 0.05, y0 - 0.1, z, 1.0), (x0, y0, z, 1.0),
           (x0, y0, z - 0.08, 1.0), (x0, y0, z - 0.08, 0.0), (x0, y0, z, 0.0), (x0, y0, z, 1.0)]
    return [np.array(p) for p in pts]


def run(args) -> int:
    if args.slice:
        return run_slice(args)
    import cv2
    import numpy as np
    from tqdm import tqdm

    from robot_io.env import RobotEnv
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from vla.commands._bridge import running_bridge

    site = load_site(args.site)
    run_dir = os.path.join(args.out, "demo-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(os.path.join(run_dir, "frames"), exist_ok=True)
    log_path = os.path.join(run_dir, "bridge.log")
    with running_bridge(site, log_path, start="auto"):
        client = RobotClient(site)
        env = RobotEnv(client, instruction="demo: trace a square, then grasp", control_hz=args.control_hz)
        obs, _ = env.reset(seed=args.seed)
        start = obs["state"][:3].astype(float)
        rows = []  # t, commanded target xyz, measured xyz, gripper cmd, gripper measured
        step = 0
        waypoints = scripted_waypoints(start)
        bar = tqdm(total=len(waypoints), desc="demo waypoints", unit="wp")
        t0 = time.monotonic()
        for wp in waypoints:
            for _ in range(40):  # at most 4 s per waypoint at 10 Hz
                pos = obs["state"][:3]
                err = wp[:3] - pos
                action = np.zeros(7, np.float32)
                action[:3] = np.clip(err, -0.02, 0.02)
                action[6] = wp[3]
                obs, _, _, _, info = env.step(action)
                target = pos + info["applied"][0, :3]  # what the server applied after its limits
                rows.append([time.monotonic() - t0, *wp[:3], *target, *obs["state"][:3], wp[3], obs["state"][7]])
                if step % args.frame_every == 0:
                    for cam, img in obs["images"].items():
                        cv2.imwrite(os.path.join(run_dir, "frames", f"{step:04d}_{cam}.png"),
                                    cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
                step += 1
                if np.linalg.norm(err) < 0.01 and (abs(obs["state"][7] - wp[3]) < 0.1 or step % 15 == 0):
                    break
            bar.update(1)
        bar.close()
        loop = env.loop_stats()
        env.close()
    rows = np.asarray(rows)
    np.savetxt(os.path.join(run_dir, "ee_log.csv"), rows, delimiter=",",
               header="t_s,waypoint_x,waypoint_y,waypoint_z,target_x,target_y,target_z,meas_x,meas_y,meas_z,"
               "cmd_gripper,meas_gripper", comments="")
    plot_path = os.path.join(run_dir, "ee_tracking.png")
    plot_tracking(rows, plot_path)
    final_err = float(np.linalg.norm(rows[-1, 1:4] - rows[-1, 7:10]))
    # per-step tracking: the target applied at step k vs the position measured one period later
    track = np.linalg.norm(rows[:, 4:7] - rows[:, 7:10], axis=1)
    summary = {"site": site.name, "steps": int(step), "control_hz": args.control_hz, "loop": loop,
               "final_tracking_error_m": final_err, "step_tracking_error_m_p50": float(np.median(track)),
               "step_tracking_error_m_max": float(track.max()), "frames": len(os.listdir(os.path.join(run_dir, "frames")))}
    from vla.data.atomic import atomic_write_bytes

    atomic_write_bytes(os.path.join(run_dir, "summary.json"), json.dumps(summary, indent=2).encode())
    print(f"\nrun directory: {run_dir}")
    print(f"  frames:       {os.path.join(run_dir, 'frames')} ({summary['frames']} PNG)")
    print(f"  ee plot:      {plot_path}")
    print(f"  summary:      {os.path.join(run_dir, 'summary.json')}")
    print(f"  control loop: {loop.get('achieved_hz', 0):.2f} Hz achieved (target {args.control_hz:g}), "
          f"lateness p99 {loop.get('late_ms_p99', float('nan')):.2f} ms")
    print(f"  ee tracking: per-step target vs measured {summary['step_tracking_error_m_p50'] * 100:.2f} cm median, "
          f"final error to the last waypoint {final_err * 100:.2f} cm")
    return 0


def plot_tracking(rows, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(8, 9), sharex=True)
    t = rows[:, 0]
    for i, ax in enumerate(axes[:3]):
        ax.plot(t, rows[:, 1 + i], ":", color="grey", label="scripted waypoint")
        ax.step(t, rows[:, 4 + i], "--", where="pre", label="commanded target (after limits)")
        ax.plot(t, rows[:, 7 + i], label="measured")
        ax.set_ylabel(f"ee {'xyz'[i]} (m)")
    axes[3].plot(t, rows[:, 10], "--", label="commanded")
    axes[3].plot(t, rows[:, 11], label="measured")
    axes[3].set_ylabel("gripper opening")
    axes[3].set_xlabel("time (s)")
    axes[0].legend(loc="upper right")
    fig.suptitle("Simulated Franka over the bridge: commanded vs measured end effector")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
