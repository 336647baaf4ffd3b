"""`vla rl`: an online RL session that steers a frozen VLA on a robot (or its simulator)."""

from __future__ import annotations

import argparse
import dataclasses
import os


def add_parser(sub, name: str, help_: str) -> None:
    from vla.rl_config import RLConfig

    d = {f.name: f.default for f in dataclasses.fields(RLConfig) if f.default is not dataclasses.MISSING}
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "Run an online RL session: the VLA from --checkpoint stays frozen and an RL module steers it. "
        "DSRL (--method dsrl) learns the initial noise of the VLA's flow sampler with SAC; its "
        "noise-aliased variant (--variant na, default) also learns an action-space critic that demos and "
        "operator interventions feed. The run directory gets the learning curve, TensorBoard scalars, "
        "episode logs, evaluation videos and a checkpoint after every episode; --resume continues a "
        "killed session exactly (step count, replay buffers, optimisers, RNG states)."),
        epilog="""\
examples:
  vla rl --method dsrl --checkpoint runs/vla_pick --task pick_red_cube --out runs/dsrl_red
  vla rl --method dsrl --variant sac --checkpoint runs/vla_pick --task lift_green_cube --total-ticks 4000 --out runs/x
  vla rl --resume runs/dsrl_red                      # continue after a kill
  tensorboard --logdir runs/dsrl_red/tb

Rewards come from rewards/: the sim task's success predicate (1 at success, the episode ends).
""")
    p.add_argument("--method", choices=["dsrl"], default="dsrl")
    p.add_argument("--variant", choices=["na", "sac", "action"], default=d["variant"],
                   help="DSRL variant: na (default), sac; action = the baseline, plain SAC on the raw action chunk")
    p.add_argument("--checkpoint", help="the VLA to steer (checkpoint or `vla train` run directory)")
    p.add_argument("--task", help="sim task; its success predicate is the reward")
    p.add_argument("--robot", default=d["robot"], help=f"site preset or YAML (default {d['robot']})")
    p.add_argument("--out", help="run directory (new)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the session in RUN_DIR from its last checkpoint")
    p.add_argument("--total-ticks", type=int, default=d["total_ticks"],
                   help=f"environment steps (control ticks) to train for (default {d['total_ticks']})")
    p.add_argument("--max-episode-ticks", type=int, default=None, help="episode length (default: the task's)")
    p.add_argument("--exec-steps", type=int, default=None, help="chunk rows executed per macro-step")
    p.add_argument("--noise-bound", type=float, default=d["noise_bound"], help="b: noise actions in [-b, b]")
    p.add_argument("--noise-dims", type=int, default=None, help="A: one A-dim noise row tiled over the chunk")
    p.add_argument("--warmup-steps", type=int, default=d["warmup_steps"], help="macro-steps of the base VLA first")
    p.add_argument("--utd", type=int, default=d["utd"], help="critic updates per macro-step")
    p.add_argument("--distill-steps", type=int, default=d["distill_steps"], help="NA: noise-critic distillation steps")
    p.add_argument("--batch-size", type=int, default=d["batch_size"])
    p.add_argument("--num-critics", type=int, default=d["num_critics"], help="critic ensemble size (RLPD 10)")
    p.add_argument("--eval-every", type=int, default=d["eval_every"], help="episodes between evaluations")
    p.add_argument("--eval-episodes", type=int, default=d["eval_episodes"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=d["threads"])
    p.add_argument("--serve", choices=["auto", "always", "never"], default="auto")
    p.set_defaults(run=run)


def make_sim_env(cfg, client):
    from vla.envs import task_env

    return task_env(client, cfg.task)


def run(args) -> int:
    import json

    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from vla.commands._bridge import running_bridge
    from vla.models import load_vla
    from vla.rl import run_session
    from vla.rl_config import RLConfig
    from vla.train import resolve_checkpoint

    if args.resume:
        cfg_path = os.path.join(args.resume, "rl_config.json")
        if not os.path.isfile(cfg_path):
            raise FileNotFoundError(f"--resume {args.resume}: no rl_config.json there (not an RL session)")
        cfg = RLConfig.from_json(cfg_path)
        if args.total_ticks != RLConfig.total_ticks and args.total_ticks > cfg.total_ticks:
            cfg = dataclasses.replace(cfg, total_ticks=args.total_ticks)
    else:
        missing = [f"--{n}" for n in ("checkpoint", "task", "out") if not getattr(args, n)]
        if missing:
            raise ValueError(f"give {', '.join(missing)} for a new session (or --resume RUN_DIR)")
        from hardware.sim_tasks import get_task

        get_task(args.task)
        cfg = RLConfig(checkpoint=os.path.abspath(args.checkpoint), out=args.out, task=args.task, method=args.method,
                       variant=args.variant, robot=args.robot, total_ticks=args.total_ticks,
                       max_episode_ticks=args.max_episode_ticks, exec_steps=args.exec_steps,
                       noise_bound=args.noise_bound, noise_dims=args.noise_dims, warmup_steps=args.warmup_steps,
                       distill_steps=args.distill_steps, utd=args.utd, batch_size=args.batch_size,
                       num_critics=args.num_critics, eval_every=args.eval_every, eval_episodes=args.eval_episodes, seed=args.seed, threads=args.threads)
    vla = load_vla(resolve_checkpoint(cfg.checkpoint))
    site = load_site(cfg.robot)
    os.makedirs(cfg.out, exist_ok=True)
    with running_bridge(site, os.path.join(cfg.out, "bridge.log"), start=args.serve):
        client = RobotClient(site)
        try:
            summary = run_session(cfg, make_sim_env(cfg, client), vla, resume=bool(args.resume))
        finally:
            client.close()
    print(f"{'':<14}{'success':>9}\nbase VLA      {summary['base_success_rate']:>8.0%}\n"
          f"DSRL-{cfg.variant:<9}{summary['final_success_rate']:>8.0%}   ({summary['eval_episodes']} eval episodes)")
    print(json.dumps({k: summary[k] for k in ("run_dir", "episodes", "ticks", "vla_weights_unchanged")}))
    print(f"learning curve: {os.path.join(cfg.out, 'learning_curve.png')}")
    return 0
