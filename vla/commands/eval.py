"""`vla eval`: success rate of a VLA checkpoint on the sim tasks, with confidence intervals and videos."""

from __future__ import annotations

import argparse
import datetime as dt
import os



TE_DEFAULT = 0.01
"""ACT's temporal-ensembling weight (Zhao et al., 2023), `vla eval`'s default execution."""

def add_parser(sub, name: str, help_: str) -> None:
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "Roll a VLA checkpoint out through the bridge on simulated tasks: N seeded episodes per task, "
        "success rate with a 95%% Wilson interval, a bar chart, MP4 videos of the first episodes and "
        "a JSON report. Evaluation seeds start at 100000 by default, apart from the recorder's seeds "
        "(0 ...), so the scenes were not in the demonstrations."),
        epilog="""\
examples:
  vla eval --checkpoint runs/vla_pick --task pick_red_cube --task pick_blue_cube --episodes 20
  vla eval --checkpoint runs/vla_pick/checkpoints/0004000 --task pick_red_cube --videos 5
  vla eval --checkpoint runs/vla_pick --task pick_red_cube --exec-steps 4   # re-plan every 4 ticks
  vla eval --checkpoint runs/vla_pick --task pick_red_cube --exec-steps 8   # whole chunks, as vla rl runs them
  vla eval --checkpoint runs/my_vla --env my_pkg.envs:make_env --max-episode-ticks 200   # your own gymnasium env
  vla eval --checkpoint deploy/pick.int8.onnx --task pick_red_cube --episodes 50   # an exported policy
  vla eval --checkpoint runs/vla_pick --task pick_red_cube --episodes 100 --workers 4   # 4 simulators at once
  vla eval --checkpoint runs/vla_pick --task pick_red_cube --episodes 400 --workers 16 --ray-address auto

--workers N: N evaluation workers as Ray actors (`pip install -e .[scale]`), on a local Ray cluster, or on the
running one at --ray-address (`ray start --head` on this machine, then `auto`; or a cluster's address: every
node needs this project installed and the checkpoint at the same path). Each worker loads the checkpoint and
starts a simulator bridge of its own, on loopback ports it leases on its machine (no two workers or benchmarks
share one); the episodes go to whichever worker is free. An episode's outcome depends on its seed only, so
--workers N gives the same per-episode outcomes (episodes.jsonl, in the same order) as one process at the same
seeds and --threads (each worker uses --threads, default 1). Workers' bridge logs: OUT/workers/.

--env package.module:make_env: make_env() returns a gymnasium env whose observations are
{"images": {camera: HxWx3 uint8}, "state": float32 [S], "instruction": str} and whose step info
carries "success"; no bridge is started. An env whose action space is one action [A] is stepped
row by row (the episode ends at the first terminated / truncated row); one that declares chunk
actions (action space [H, A], or chunk_actions = True) gets whole chunks. `vla rl --env` steps and
limits episodes by the same rule, and draws the base VLA's noise the same way per seed.

CHECKPOINT is a checkpoint directory (config.json + model.safetensors: compact VLA, or a LeRobot
pi0 / pi05 / SmolVLA policy directory), a `vla train` run directory (its final model), or an
ONNX file written by `vla export policy` (run with onnxruntime as the edge runner runs it: check
an int8 export's success rate before it goes to the robot; --threads sets onnxruntime's threads).
""")
    p.add_argument("--checkpoint", required=True, help="checkpoint or run directory")
    p.add_argument("--task", action="append", dest="tasks", metavar="TASK",
                   help="sim task (repeat); default: the tasks the checkpoint was trained on, if known")
    p.add_argument("--env", default=None, metavar="MODULE:FN",
                   help="evaluate on the gymnasium env that package.module:make_env builds instead of the sim tasks")
    p.add_argument("--max-episode-ticks", "--max-ticks", type=int, default=None, dest="max_ticks",
                   help="--env: control ticks per episode (default: the env's own limit: max_ticks, TimeLimit or "
                        "spec.max_episode_steps, else 200; the rule `vla rl --env` uses)")
    p.add_argument("--control-hz", type=float, default=10.0,
                   help="control rate: the sim tasks' clock and the videos' frame rate (default 10)")
    p.add_argument("--robot", default="sim-franka-fast",
                   help="site preset or YAML of a simulated arm (default sim-franka-fast: physics as fast as the CPU allows)")
    p.add_argument("--episodes", type=int, default=20, help="episodes per task (default 20)")
    p.add_argument("--seed-start", type=int, default=100_000, help="first episode seed (default 100000)")
    p.add_argument("--exec-steps", type=int, default=None,
                   help="execute chunks instead: this many rows of each chunk before re-planning (the chunk "
                        "length = whole chunks, what `vla rl` steers); default: temporal ensembling")
    p.add_argument("--temporal-ensemble", type=float, default=None, metavar="M",
                   help=f"ACT's temporal ensembling, the default (M = {TE_DEFAULT}): re-plan every tick and execute "
                        "the weighted mean of every chunk's prediction for that tick, weights exp(-M * i) from the "
                        "oldest; smooths chunk boundaries and averages the sampler's noise (bench/results/vla_sft "
                        "round 8: 47%% -> 68%% on the pick tasks against re-planning every 4 ticks)")
    p.add_argument("--noise", default="sample", metavar="sample|zero|mean:N",
                   help="the sampler's starting noise for each chunk: sample (one N(0, I) draw, seeded per "
                        "episode; default), zero (deterministic chunks) or mean:N (the mean of N draws' chunks, one "
                        "embedding of the observation shared); bench/results/vla_sft round 19 compares them on the "
                        "shipped base")
    p.add_argument("--gripper", default="auto", choices=["auto", "raw", "binary"],
                   help="the executed gripper opening: raw (as the VLA puts it out), binary (snapped to 0 / 1 at "
                        "0.5, as the scripted demonstrations command it; after temporal ensembling) or auto "
                        "(default: what the checkpoint's config.json names under execution.gripper, else raw; "
                        "the shipped base names binary). Openings in between hold a grasped cube with a fraction "
                        "of the fingers' force (bench/results/vla_sft round 22). The arm's ee_delta action only: "
                        "binary is refused with --env, auto there is raw")
    p.add_argument("--videos", type=int, default=2, help="episodes per task saved as MP4 (default 2)")
    p.add_argument("--instruction", default=None, help="override every task's instruction (prompt experiments)")
    p.add_argument("--token", type=int, default=None, metavar="K",
                   help="hold behaviour token K in every episode (a VLA trained with `vla train --tokens`: what each "
                        "ExToken mode does on its own; 0 = the null token); default: none")
    p.add_argument("--out", default=None, help="output directory (default CHECKPOINT_RUN/eval-<time>)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch; onnxruntime for an .onnx file)")
    p.add_argument("--serve", choices=["auto", "always", "never"], default="auto",
                   help="start the sim bridge if it is not running (auto)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="run the episodes on N evaluation workers (Ray actors), each with its own simulator bridge "
                        "on ports of its own; same per-episode outcomes as one process (default: this process)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="--workers: the Ray cluster to run them on (auto: the one started on this machine with "
                        "`ray start --head`); default: a local Ray cluster for this command")
    p.set_defaults(run=run)


def _check_workers(args) -> None:
    """``--workers`` / ``--ray-address``: refused by name when they cannot apply, before anything loads."""
    workers = getattr(args, "workers", None)
    if workers is None:
        if getattr(args, "ray_address", None):
            raise ValueError("--ray-address names the Ray cluster of --workers N: give --workers too")
        return
    if workers < 1:
        raise ValueError(f"--workers must be >= 1 (the number of evaluation workers), got {workers}")
    if args.serve != "auto":
        raise ValueError(f"--serve {args.serve}: with --workers every worker starts a simulator bridge of its own, "
                         "on ports of its own; drop --serve")
    from vla.cluster import require_ray

    require_ray("--workers")
    if not args.env:
        from robot_io.bridge_process import is_simulated
        from robot_io.site import load_site

        site = load_site(args.robot)
        if not is_simulated(site):
            drivers = ", ".join(sorted({d.driver for d in site.devices.values()}))
            raise ValueError(f"--workers: --robot {args.robot} is not a simulator ({drivers}); each worker runs a "
                             "copy of a simulated site on ports of its own")


def _temporal_ensemble(args) -> float | None:
    """``--temporal-ensemble`` unless ``--exec-steps`` asks for chunk execution."""
    if args.exec_steps is not None and args.temporal_ensemble is not None:
        raise ValueError("--temporal-ensemble executes one row per tick: drop --exec-steps")
    if args.exec_steps is not None:
        return None
    return TE_DEFAULT if args.temporal_ensemble is None else args.temporal_ensemble


def run(args) -> int:
    import torch

    from robot_io.bridge_process import running_bridge
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from vla.evaluate import evaluate
    from vla.models import load_vla, resolve_checkpoint

    if args.episodes <= 0:
        raise ValueError("--episodes must be positive")
    args.noise = getattr(args, "noise", "sample")  # a Namespace built by a caller may predate --noise
    from vla.envs import gripper_option, noise_option, resolve_gripper

    noise_option(args.noise)  # a bad --noise fails before anything loads
    args.gripper = getattr(args, "gripper", "raw")  # a Namespace built by a caller may predate --gripper
    gripper_option(args.gripper, auto=True)  # a bad --gripper fails before anything loads
    if args.gripper == "binary" and args.env:
        raise ValueError(f"--gripper {args.gripper} snaps the opening of the arm's ee_delta action (column 6); an "
                         "--env defines its own actions: drop --gripper")
    _check_workers(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.env:
        from vla.envs import load_env_factory

        make_env = load_env_factory(args.env)  # a wrong spec fails before the model loads
    from vla.models.onnx_vla import is_onnx_file

    onnx = is_onnx_file(args.checkpoint)
    ckpt = args.checkpoint if onnx else resolve_checkpoint(args.checkpoint)
    model = load_vla(ckpt).eval()
    args.gripper = "raw" if args.env else resolve_gripper(args.gripper, ckpt)
    args.token = getattr(args, "token", None)  # a Namespace built by a caller may predate --token
    if args.token is not None:
        k = int(getattr(model, "num_tokens", 0) or 0)
        if not 0 <= args.token <= k:
            raise ValueError(f"--token {args.token}: {ckpt} has behaviour tokens 0..{k} (0 = null; "
                             f"{'train one with `vla train --tokens`' if k == 0 else 'pick one of them'})")
    if getattr(args, "workers", None) is not None:
        return _run_workers(args, model, ckpt)
    if args.env:
        return _run_env(args, model, ckpt, make_env)
    tasks = _tasks(args, ckpt, onnx)
    run_root, out = _out_dir(args, ckpt)
    site = load_site(args.robot)
    with running_bridge(site, os.path.join(out, "bridge.log"), start=args.serve):
        client = RobotClient(site)
        try:
            report = evaluate(model, client, tasks, args.episodes, out, seed_start=args.seed_start,
                              exec_steps=args.exec_steps, videos=args.videos, instruction=args.instruction,
                              control_hz=args.control_hz, temporal_ensemble=_temporal_ensemble(args),
                              token=args.token, noise=args.noise, gripper=args.gripper)
        finally:
            client.close()
    return _report(args, report, ckpt, run_root, out)


def _tasks(args, ckpt: str, onnx: bool) -> list[str]:
    """--task, or the sim tasks the checkpoint was trained on."""
    import json

    tasks = args.tasks
    if not tasks and onnx:
        raise ValueError(f"give --task: {ckpt} is an exported graph, which does not record its sim tasks")
    if not tasks:
        with open(os.path.join(ckpt, "config.json")) as f:
            tasks = json.load(f).get("sim_tasks")
        if not tasks:
            raise ValueError("give --task (this checkpoint does not record which sim tasks it was trained on)")
    from hardware.sim_tasks import get_task

    for t in tasks:
        get_task(t)  # typos fail now, with a suggestion
    return tasks


def _run_workers(args, model, ckpt: str) -> int:
    """``--workers N``: the episodes on N Ray actors, each with its own simulator (or ``--env``)."""
    from vla.cluster import log_dir
    from vla.evaluate import WorkerJob, evaluate_on_workers, make_policy
    from vla.models.onnx_vla import is_onnx_file

    te = _temporal_ensemble(args)
    if args.env:
        if args.tasks or args.instruction is not None:
            raise ValueError("--task / --instruction are the sim tasks'; with --env the env decides them")
        tasks = [args.env.split(":", 1)[1]]
    else:
        tasks = _tasks(args, ckpt, is_onnx_file(ckpt))
    run_root, out = _out_dir(args, ckpt)
    job = WorkerJob(checkpoint=os.path.abspath(ckpt), robot=args.robot, env=args.env, max_ticks=args.max_ticks,
                    control_hz=args.control_hz, instruction=args.instruction, exec_steps=args.exec_steps,
                    temporal_ensemble=te, token=args.token, noise=args.noise, gripper=args.gripper,
                    threads=args.threads,
                    logs=log_dir(os.path.join(out, "workers"), local=not args.ray_address))
    exec_steps = make_policy(model, args.exec_steps, te, args.token, args.noise).exec_steps
    report = evaluate_on_workers(job, tasks, args.episodes, out, args.workers, exec_steps, seed_start=args.seed_start,
                                 videos=args.videos, ray_address=args.ray_address)
    if args.env:
        report["env"] = args.env
    return _report(args, report, ckpt, run_root, out)


def _out_dir(args, ckpt: str) -> tuple[str, str]:
    if os.path.isfile(ckpt):  # an exported .onnx: its results go beside it, named by it
        run_root = os.path.dirname(os.path.abspath(ckpt))
        out = args.out or os.path.join(run_root, f"eval-{os.path.basename(ckpt)[:-5]}-{dt.datetime.now():%Y%m%d-%H%M%S}")
        os.makedirs(out, exist_ok=True)
        return run_root, out
    run_root = os.path.dirname(os.path.dirname(ckpt)) if os.path.basename(os.path.dirname(ckpt)) == "checkpoints" \
        else os.path.dirname(ckpt)
    out = args.out or os.path.join(run_root, f"eval-{dt.datetime.now():%Y%m%d-%H%M%S}")
    os.makedirs(out, exist_ok=True)
    return run_root, out


def _run_env(args, model, ckpt: str, make_env) -> int:
    """``--env``: the user's gymnasium env instead of the sim tasks (no bridge)."""
    from vla.evaluate import evaluate_env

    if args.tasks:
        raise ValueError("--task names a sim task; with --env the env decides the task (drop --task)")
    if args.instruction is not None:
        raise ValueError("--instruction overrides the sim tasks' prompts; with --env the env's observation "
                         "carries the instruction")
    from vla.envs import episode_limit, make_user_env

    env = make_user_env(args.env, make_env)
    name = args.env.split(":", 1)[1]
    try:
        max_ticks = episode_limit(env, args.max_ticks)  # the rule `vla rl --env` uses; refuses a bad flag
        run_root, out = _out_dir(args, ckpt)
        report = evaluate_env(model, env, name, args.episodes, out, int(max_ticks), seed_start=args.seed_start,
                              exec_steps=args.exec_steps, videos=args.videos, control_hz=args.control_hz,
                              temporal_ensemble=_temporal_ensemble(args), token=args.token, noise=args.noise)
    finally:
        env.close()
    report["env"] = args.env
    return _report(args, report, ckpt, run_root, out)


def _report(args, report: dict, ckpt: str, run_root: str, out: str) -> int:
    import json

    from vla.evaluate import format_table, plot_success

    report["checkpoint"] = os.path.abspath(ckpt)
    report["token"] = args.token
    with open(os.path.join(out, "eval.json"), "w") as f:
        json.dump(report, f, indent=2)
    plot_success(report["tasks"], os.path.join(out, "success.png"), f"{os.path.basename(run_root)}: "
                 f"{args.episodes} episodes per task")
    print(format_table(report["tasks"]))
    how = [f"noise {report.get('noise', args.noise)}", f"gripper {report.get('gripper', args.gripper)}"]
    if report.get("temporal_ensemble") is not None:
        how.append(f"temporal ensemble m={report['temporal_ensemble']}")
    print("executed: " + ", ".join(how))
    print(f"report: {os.path.join(out, 'eval.json')}  plot: {os.path.join(out, 'success.png')}  "
          f"videos: {os.path.join(out, 'videos')}")
    return 0
