"""`vla demo`: the main job on the simulated default (`make demo` runs ``--slice``).

``--slice``: on the fast sim Franka, a residual RL session (`vla rl`) on the shipped base VLA
(``vla/checkpoints/base``, stack_cubes by default), then base vs RL on the same evaluation scenes with a
plain verdict (a sign test on the scenes only one of them solved) and the learning curve's path;
``--smoke`` instead runs every stage at toy size (record, train, DSRL-NA), an install check. Without it: start the simulated Franka
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
        "directory."), epilog="examples:\n  vla demo --slice                 # RL from the shipped base, base vs RL (make demo)\n"
                  "  vla demo --slice --smoke         # every stage at toy size: an install check\n"
                  "  vla demo --out runs/ --control-hz 10   # the bridge demo alone\n")
    p.add_argument("--site", default="sim-franka", help="site YAML file or preset name to serve and drive (default: sim-franka)")
    p.add_argument("--out", default="runs", help="parent folder of the run directory (default: runs/)")
    p.add_argument("--control-hz", type=float, default=10.0, help="control rate of the scripted motion (default 10)")
    p.add_argument("--seed", type=int, default=0, help="scene seed (object placement)")
    p.add_argument("--frame-every", type=int, default=10, help="save camera frames every N control steps (default 10)")
    p.add_argument("--slice", action="store_true",
                   help="the main job instead: a residual RL session on the shipped base VLA (vla/checkpoints/base), "
                        "then base vs RL on the same 20 evaluation scenes and the learning-curve path (about 15 min "
                        "on 2 CPU cores; --full: 20000 ticks and 50 scenes)")
    p.add_argument("--full", action="store_true", help="with --slice: 20000 RL ticks, 50 evaluation scenes")
    p.add_argument("--smoke", action="store_true", help="with --slice: a ~2-minute run of every stage at toy size "
                   "(record 2 demos, 20 SFT steps, 48 DSRL ticks) that checks an install end to end; its success "
                   "rates mean nothing")
    p.add_argument("--task", default=None, help="with --slice: the sim task (default stack_cubes; --smoke: "
                   "pick_red_cube)")
    p.add_argument("--checkpoint", default=None, help="with --slice: the base VLA (default the shipped "
                   "vla/checkpoints/base)")
    p.set_defaults(run=run)


SLICE = {  # (default) and --full settings of `vla demo --slice`: RL from the shipped base
    "quick": {"ticks": 8000, "eval_episodes": 20, "eval_every": 0},
    "full": {"ticks": 20_000, "eval_episodes": 50, "eval_every": 25},
}
SMOKE = {"tasks": ["pick_red_cube"], "episodes": 2, "quality": 0.5, "steps": 20, "ticks": 48, "eval_episodes": 1,
         "utd": 1, "critics": 2, "eval_every": 0, "train_args": ["--batch-size", "16"],
         "rl_args": ["--batch-size", "16", "--warmup-steps", "2", "--max-episode-ticks", "24"]}
"""``--smoke``: an install check through every stage (record, train, RL) at toy size; its rates mean nothing."""
SHIPPED_BASE = "vla/checkpoints/base"
SLICE_METHOD = ["--method", "residual", "--exec-steps", "4"]
"""The method the slice runs: residual RL at the sessions' execution (4-row chunks), with the value target's
defaults (``policies.common.sac_config.ValueTargetConfig``; ``bench/critic_truth.py`` measures them)."""


def paired_counts(base: list[dict], final: list[dict]) -> tuple[int, int, int, int]:
    """Per-episode outcomes of two evaluations on the same seeds -> (base successes, RL successes, scenes only RL
    solved, scenes only the base solved)."""
    b = {e["seed"]: bool(e["success"]) for e in base}
    f = {e["seed"]: bool(e["success"]) for e in final}
    if set(b) != set(f):
        raise ValueError("the base and the RL evaluation ran different scenes")
    return (sum(b.values()), sum(f.values()), sum(f[k] and not b[k] for k in b), sum(b[k] and not f[k] for k in b))


def verdict(n: int, base_k: int, rl_k: int, only_rl: int, only_base: int) -> str:
    """One plain line: did RL lift the base on these scenes? An exact sign test on the discordant scenes (McNemar)."""
    from scipy.stats import binomtest

    disc = only_rl + only_base
    p = binomtest(only_rl, disc, 0.5, alternative="greater").pvalue if disc else 1.0
    if rl_k > base_k and p < 0.05:
        return f"RL lifted the base: {rl_k}/{n} against {base_k}/{n} on the same scenes (sign test p = {p:.3f})"
    p_worse = binomtest(only_base, disc, 0.5, alternative="greater").pvalue if disc else 1.0
    what = "RL made it worse" if p_worse < 0.05 else "no lift"
    p_shown = p_worse if p_worse < 0.05 else p
    return (f"{what}: RL {rl_k}/{n} against the base's {base_k}/{n} on the same scenes ({only_rl} scenes only RL "
            f"solved, {only_base} only the base; sign test p = {p_shown:.2f}). No RL setting of this project has lifted "
            f"the shipped base yet (bench/results/README.md); this run shows the session, not a lift")


def run_slice(args) -> int:
    """RL from the shipped base (``--smoke``: record -> train -> DSRL at toy size), each stage through its own `vla`
    subcommand, on the fast sim Franka."""
    import json as _json

    from robot_io.bridge_process import running_bridge
    from robot_io.site import load_site
    from vla.cli import main as vla_main

    if args.full and args.smoke:
        raise ValueError("--full and --smoke: choose one")
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
        if args.smoke:
            return _smoke(args, run_dir, step, t0)
        cfg = SLICE["full" if args.full else "quick"]
        task = args.task or "stack_cubes"
        checkpoint = args.checkpoint or SHIPPED_BASE
        rl_dir = os.path.join(run_dir, "rl")
        step(f"residual RL on {task} from {checkpoint}",
             ["rl", *SLICE_METHOD, "--checkpoint", checkpoint, "--task", task, "--out", rl_dir,
              "--total-ticks", str(cfg["ticks"]), "--eval-every", str(cfg["eval_every"]),
              "--eval-episodes", str(cfg["eval_episodes"]), "--serve", "never", "--videos", "0"])
    with open(os.path.join(rl_dir, "summary.json")) as f:
        s = _json.load(f)
    with open(os.path.join(rl_dir, "base_eval.json")) as f:
        base = _json.load(f)
    with open(os.path.join(rl_dir, "final_eval.json")) as f:
        final = _json.load(f)
    n = len(final["per_episode"])
    base_k, rl_k, only_rl, only_base = paired_counts(base["per_episode"], final["per_episode"])
    print(f"\n== done in {(time.monotonic() - t0) / 60:.1f} min: {run_dir}")
    rows = [(f"base VLA ({checkpoint})", base_k), (f"residual RL, {s['ticks']} ticks", rl_k)]
    w = max(len(r[0]) for r in rows) + 2
    print(f"   {'policy':<{w}}success on {task}")
    for label, k in rows:
        print(f"   {label:<{w}}{k}/{n}")
    print(f"   {verdict(n, base_k, rl_k, only_rl, only_base)}")
    print(f"   learning curve: {os.path.join(rl_dir, 'learning_curve.png')}")
    return 0


def _smoke(args, run_dir: str, step, t0: float) -> int:
    """``--smoke``: every stage at toy size (record scripted demos, train a compact VLA, DSRL-NA with those demos in
    its critic): an install check."""
    import json as _json

    cfg = SMOKE
    task = args.task or "pick_red_cube"
    root = os.path.join(run_dir, "data", task)
    step(f"record {cfg['episodes']} scripted demos of {task} (expert quality {cfg['quality']}, failures kept)",
         ["record", "--robot", "sim-franka-fast", "--task", task, "--teleop", "scripted", "--expert-quality",
          str(cfg["quality"]), "--keep-failures", "--episodes", str(cfg["episodes"]), "--root", root,
          "--serve", "never"])
    vla_dir = os.path.join(run_dir, "vla")
    step("train the compact VLA", ["train", "--dataset", root, "--out", vla_dir, "--steps", str(cfg["steps"]),
                                   "--save-every", str(cfg["steps"] // 2), "--aug-views", "1", "--threads", "1",
                                   *cfg["train_args"]])
    rl_dir = os.path.join(run_dir, "dsrl")
    step(f"DSRL-NA on {task}", ["rl", "--checkpoint", vla_dir, "--task", task, "--out", rl_dir, "--demos", root,
                                "--total-ticks", str(cfg["ticks"]), "--utd", str(cfg["utd"]),
                                "--num-critics", str(cfg["critics"]), "--eval-every", str(cfg["eval_every"]),
                                "--eval-episodes", str(cfg["eval_episodes"]), "--serve", "never", *cfg["rl_args"]])
    with open(os.path.join(rl_dir, "summary.json")) as f:
        s = _json.load(f)
    print(f"\n== done in {(time.monotonic() - t0) / 60:.1f} min: {run_dir}")
    print(f"   {'policy':<22}{'success on ' + task:>26}")
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

    from robot_io.bridge_process import running_bridge
    from robot_io.env import RobotEnv
    from robot_io.robot import RobotClient
    from robot_io.site import load_site

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
