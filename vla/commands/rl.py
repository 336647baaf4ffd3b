"""`vla rl`: an online RL session that steers a frozen VLA on a robot (or its simulator)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys


def add_parser(sub, name: str, help_: str) -> None:
    from vla.rl_config import RLConfig

    d = {f.name: f.default for f in dataclasses.fields(RLConfig) if f.default is not dataclasses.MISSING}
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "Run an online RL session: the VLA from --checkpoint stays frozen and an RL module steers it. "
        "DSRL (--method dsrl) learns the initial noise of the VLA's flow sampler with SAC; its "
        "noise-aliased variant (--variant na, default) also learns an action-space critic that demos and "
        "operator interventions feed. The run directory gets the learning curve, TensorBoard scalars, "
        "episode logs, evaluation videos and a checkpoint after every episode; --resume continues a "
        "killed session exactly (step count, replay buffers, optimisers, RNG states). "
        "--role local (default) runs actor and learner in this process; --role learner / actor split "
        "them over ZMQ (SERL / HIL-SERL style): the actor drives the robot and streams transitions, "
        "the learner owns replay buffers, optimisers, checkpoints and --resume, and pushes policy "
        "parameters back (protocol: vla/rl_remote.py)."),
        epilog="""\
examples:
  vla rl --method dsrl --checkpoint runs/vla_pick --task pick_red_cube --out runs/dsrl_red
  vla rl --method dsrl --variant sac --checkpoint runs/vla_pick --task lift_green_cube --total-ticks 4000 --out runs/x
  vla rl --checkpoint runs/vla_pick --task pick_red_cube --demos data/demos_red --out runs/dsrl_red_demos
                                                     # NA's action critic also learns from recorded demos
  vla rl --resume runs/dsrl_red                      # continue after a kill
  tensorboard --logdir runs/dsrl_red/tb

actor / learner on two machines (keys: `vla bridge keys --out keys/`; the learner holds keys/server.key_secret
and keys/authorized_clients/, the actor keys/client.key_secret and keys/server.key):
  gpu-box$ vla rl --role learner --bind tcp://*:5800 --keys keys/ --checkpoint runs/vla_pick \\
             --task pick_red_cube --out runs/dsrl_red
  robot-pc$ vla rl --role actor --learner tcp://gpu-box:5800 --keys keys/ --checkpoint /data/vla_pick
  gpu-box$ vla rl --role learner --bind tcp://*:5800 --keys keys/ --resume runs/dsrl_red   # after a kill
The actor takes the session's config from the learner (--checkpoint / --robot name this machine's copies;
the VLA must have the same weights). If the learner dies, the actor keeps acting on its last parameters,
keeps the transitions the learner has not checkpointed and resends them when it is back; after
--learner-timeout seconds without a word from the learner it stops the robot and exits.
On one machine: --bind tcp://127.0.0.1:5800 and --learner tcp://127.0.0.1:5800, no keys needed.

Rewards come from rewards/: the sim task's success predicate (1 at success, the episode ends), or on a
real robot a success classifier trained with `vla reward train` (--reward classifier:DIR). Between
real-robot episodes the arm goes home and the operator resets the scene and presses Enter (q stops,
s / f record their verdict on the last episode); no answer within --reset-timeout pauses the session
(exit code 3; --resume continues). Evaluations also need resets: keep --eval-episodes small there.
  vla rl --robot my_lab.yaml --reward classifier:runs/succ_towel --instruction "fold the towel" \\
         --checkpoint runs/vla_towel --out runs/rl_towel --eval-every 0 --eval-episodes 3
""")
    p.add_argument("--method", choices=["dsrl"], default="dsrl")
    p.add_argument("--variant", choices=["na", "sac", "action"], default=d["variant"],
                   help="DSRL variant: na (default), sac; action = the baseline, plain SAC on the raw action chunk")
    p.add_argument("--encoder", choices=["vla", "cnn"], default=d["encoder"],
                   help="what the agent reads: vla = the frozen VLA's embedding (default); cnn = the camera frames "
                        "at 64x64 + the robot state through a small CNN (~280K parameters with 2 cameras) trained by "
                        "the critic loss, as DSRL on pi0 (replay stores the frames; --role local only)")
    p.add_argument("--checkpoint", help="the VLA to steer (checkpoint or `vla train` run directory)")
    p.add_argument("--task", help="sim task; its success predicate is the reward")
    p.add_argument("--reward", default=d["reward"], metavar="SOURCE",
                   help="task: the sim task's success predicate (default); classifier:DIR: a success classifier "
                        "from `vla reward train` (on a real robot the operator resets the scene between episodes)")
    p.add_argument("--instruction", help="real robot: the instruction given to the VLA (a sim task has its own)")
    p.add_argument("--demos", action="append", default=[], metavar="DATASET",
                   help="variant na: a LeRobot dataset (from `vla record`) whose episodes with the session's "
                        "instruction enter the demo buffer before the first episode (repeatable)")
    p.add_argument("--reset-timeout", type=float, default=d["reset_timeout_s"],
                   help=f"real robot: seconds to answer the reset prompt before the session pauses "
                        f"(default {d['reset_timeout_s']:g})")
    p.add_argument("--robot", default=None, help=f"site preset or YAML (default {d['robot']}; actor: the learner's)")
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
    p.add_argument("--eval-policy", choices=["sample", "mean"], default=d["eval_policy"],
                   help="evaluations draw the noise from the agent's policy (sample, seeded per episode, as the base "
                        "VLA's N(0, I)) or take its mean (SAC's deterministic action)")
    p.add_argument("--init-temperature", type=float, default=d["init_temperature"], metavar="ALPHA",
                   help="SAC's initial entropy temperature (auto-tuned from there; a high one keeps the noise "
                        "policy broad, near the base VLA, for longer)")
    p.add_argument("--init-log-std", type=_float_or_none, default=d["init_log_std"], metavar="X|none",
                   help="the noise policy's initial log std before the tanh (0: close to the base VLA's N(0, I); "
                        "none: PyTorch's default init, std ~0.22)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=d["threads"])
    p.add_argument("--serve", choices=["auto", "always", "never"], default="auto")
    g = p.add_argument_group("actor / learner")
    g.add_argument("--role", choices=["local", "learner", "actor"], default="local",
                   help="local: actor and learner in this process (default); learner: serve a session to an "
                        "actor; actor: drive the robot for a learner")
    g.add_argument("--bind", default="tcp://127.0.0.1:5800",
                   help="learner: endpoint to listen on (default tcp://127.0.0.1:5800; tcp://*:5800 for every "
                        "interface, which needs --keys or --insecure)")
    g.add_argument("--learner", metavar="ENDPOINT", help="actor: the learner's endpoint, e.g. tcp://gpu-box:5800")
    g.add_argument("--learner-timeout", type=float, default=30.0,
                   help="actor: stop the robot and exit after this many seconds without a word from the learner "
                        "(default 30)")
    g.add_argument("--keys", metavar="DIR", help="CurveZMQ keys from `vla bridge keys --out DIR`")
    g.add_argument("--insecure", action="store_true", help="learner: bind off loopback without keys")
    p.set_defaults(run=run)


def _float_or_none(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def make_sim_env(cfg, client):
    """The session's env. Reward: the sim task's predicate, or a success classifier. Reset: a
    simulator lays out the task's scene itself; a real arm goes home, then the operator resets
    the scene (a prompt with a timeout)."""
    from vla.envs import task_env

    if cfg.reward == "task":
        return task_env(client, cfg.task, instruction=cfg.instruction)
    from rewards.success_classifier import classifier_reward
    from robot_io.env import RobotEnv
    from vla.operator_reset import OperatorReset, OperatorResetHook

    reward_fn = classifier_reward(cfg.reward.split(":", 1)[1])
    if client.description.get("objects") and cfg.task:  # a simulator: it re-lays the scene from the seed
        from hardware.sim_tasks import get_task

        t = get_task(cfg.task)
        reset_fn = lambda env, seed: client.reset(seed=seed, task=t.name)  # noqa: E731
        instruction, max_ticks = cfg.instruction or t.instruction, t.max_steps
    else:
        reset_fn = OperatorResetHook(OperatorReset(timeout_s=cfg.reset_timeout_s),
                                     log_path=os.path.join(cfg.out, "operator_verdicts.jsonl"))
        instruction, max_ticks = cfg.instruction, cfg.max_episode_ticks
    env = RobotEnv(client, instruction=instruction, reward_fn=reward_fn, reset_fn=reset_fn)
    env.max_ticks = max_ticks
    return env


def _check_role_args(args) -> None:
    if args.role != "learner" and (args.bind != "tcp://127.0.0.1:5800" or args.insecure):
        raise ValueError("--bind and --insecure are for --role learner")
    if args.role != "actor" and args.learner:
        raise ValueError("--learner is for --role actor (the learner itself takes --bind)")
    if args.role == "actor":
        if not args.learner:
            raise ValueError("--role actor needs --learner tcp://HOST:PORT")
        given = [f"--{n}" for n in ("task", "out", "resume", "demos") if getattr(args, n)]
        if given:
            raise ValueError(f"the actor takes the session from the learner: give {', '.join(given)} to the learner")
    if args.role == "local" and args.keys:
        raise ValueError("--keys is for --role learner / actor")
    if args.role != "local" and args.encoder != "vla":
        raise ValueError(f"--encoder {args.encoder} runs with --role local only: the actor / learner link carries "
                         "the VLA's features, not camera frames (use --encoder vla to split the session)")


def run(args) -> int:
    _check_role_args(args)
    if args.role == "actor":
        return run_actor(args)

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
        need = ["checkpoint", "out"] + (["task"] if args.reward == "task" else [])
        missing = [f"--{n}" for n in need if not getattr(args, n)]
        if missing:
            raise ValueError(f"give {', '.join(missing)} for a new session (or --resume RUN_DIR)")
        from hardware.sim_tasks import get_task

        if args.task:
            get_task(args.task)
        reward = args.reward
        if reward.startswith("classifier:"):
            from rewards.success_classifier import read_meta

            path = os.path.abspath(reward.split(":", 1)[1])
            read_meta(path)  # a wrong path fails now, before the VLA loads
            reward = f"classifier:{path}"  # absolute, so --resume works from anywhere
            if not args.task and not args.instruction:
                raise ValueError("a real-robot session needs --instruction (or --task for a sim task)")
        cfg = RLConfig(checkpoint=os.path.abspath(args.checkpoint), out=args.out, method=args.method,
                       variant=args.variant, encoder=args.encoder, robot=args.robot or RLConfig.robot,
                       total_ticks=args.total_ticks,
                       max_episode_ticks=args.max_episode_ticks, exec_steps=args.exec_steps,
                       noise_bound=args.noise_bound, noise_dims=args.noise_dims, warmup_steps=args.warmup_steps,
                       distill_steps=args.distill_steps, utd=args.utd, batch_size=args.batch_size,
                       num_critics=args.num_critics, eval_every=args.eval_every, eval_episodes=args.eval_episodes,
                       eval_policy=args.eval_policy, init_log_std=args.init_log_std,
                       init_temperature=args.init_temperature,
                       seed=args.seed, threads=args.threads, task=args.task or "", reward=reward,
                       instruction=args.instruction, reset_timeout_s=args.reset_timeout,
                       demos=tuple(os.path.abspath(d) for d in args.demos))
    vla = load_vla(resolve_checkpoint(cfg.checkpoint))
    if args.role == "learner":
        from vla.rl_remote import curve_keys, run_learner

        summary = run_learner(cfg, vla, bind=args.bind, resume=bool(args.resume), keys=curve_keys(args.keys),
                              insecure=args.insecure)
        _print_summary(cfg, summary)
        return 0
    site = load_site(cfg.robot)
    os.makedirs(cfg.out, exist_ok=True)
    with running_bridge(site, os.path.join(cfg.out, "bridge.log"), start=args.serve):
        client = RobotClient(site)
        from vla.operator_reset import OperatorStop, OperatorTimeout

        try:
            summary = run_session(cfg, make_sim_env(cfg, client), vla, resume=bool(args.resume))
        except OperatorStop as e:
            paused = isinstance(e, OperatorTimeout)
            print(f"session {'paused' if paused else 'stopped'}: {e}\nthe robot holds its safe state; "
                  f"`vla rl --resume {cfg.out}` continues from the last finished episode", file=sys.stderr)
            return 3 if paused else 0
        finally:
            client.close()
    _print_summary(cfg, summary)
    return 0


def _print_summary(cfg, summary) -> None:
    import json

    rate = lambda x: "    n/a" if x is None else f"{x:>8.0%}"  # noqa: E731
    print(f"{'':<14}{'success':>9}\nbase VLA      {rate(summary['base_success_rate'])}\n"
          f"DSRL-{cfg.variant:<9}{rate(summary['final_success_rate'])}   ({summary['eval_episodes']} eval episodes)")
    print(json.dumps({k: summary[k] for k in ("run_dir", "episodes", "ticks", "vla_weights_unchanged")}))
    print(f"learning curve: {os.path.join(cfg.out, 'learning_curve.png')}")


def run_actor(args) -> int:
    """`--role actor`: the session's config from the learner, this machine's VLA and robot."""
    import json
    import tempfile

    from robot_io.client import BridgeError
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from vla.commands._bridge import running_bridge
    from vla.models import load_vla
    from vla.rl_remote import Actor, ActorConfig, LearnerGone, curve_keys
    from vla.train import resolve_checkpoint

    actor = Actor(ActorConfig(learner=args.learner, learner_timeout_s=args.learner_timeout, keys=curve_keys(args.keys),
                              checkpoint=os.path.abspath(args.checkpoint) if args.checkpoint else None,
                              robot=args.robot))
    try:
        print(f"actor {actor.actor_id}: waiting for the learner at {args.learner}", flush=True)
        cfg = actor.connect()
        print(f"actor: session {cfg.out} on the learner, task {cfg.task}, robot {cfg.robot}", flush=True)
        vla = load_vla(resolve_checkpoint(cfg.checkpoint))
        site = load_site(cfg.robot)
        log_path = os.path.join(tempfile.gettempdir(), f"vla-rl-actor-{os.getpid()}-bridge.log")
        with running_bridge(site, log_path, start=args.serve):
            client = RobotClient(site)
            try:
                actor.prepare(vla, make_sim_env(cfg, client))
                summary = actor.run()
            except LearnerGone:
                try:
                    client.stop()  # the robot's safe state now, not only when the bridge's watchdog fires
                except BridgeError as e:
                    print(f"actor: could not stop the robot: {e}", flush=True)
                raise
            finally:
                client.close()
    finally:
        actor.close()
    print(json.dumps(summary))
    return 0
