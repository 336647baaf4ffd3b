"""`vla rl`: an online RL session that steers a frozen VLA on a robot (or its simulator)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from policies import DEFAULT_METHOD  # no torch: the registry imports no method
from session.flags import UNSET


def add_parser(sub, name: str, help_: str) -> None:
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "Run an online RL session: an RL module steers the VLA from --checkpoint, whose files are never "
        "modified (DSRL, residual and SARL keep it frozen; GRPO, LfH and ExToken train their own copy). "
        "DSRL (--method dsrl) learns the initial noise of the VLA's flow sampler with SAC; its "
        "noise-aliased variant (--variant na, default) also learns an action-space critic that demos and "
        "operator interventions feed. Residual RL (--method residual, ResFiT) adds a small learned, bounded "
        "correction to every executed action of the VLA's chunk: the fix for a base that is off by centimetres. "
        "SARL (--method sarl) learns which language prompt to give the frozen VLA at each semantic step (a prompt "
        "held for --chunks-per-prompt chunks or until --terminator fires), composing its sub-skills into long "
        "tasks; it prints the learned prompt sequence at the end and writes RUN/grounding.json (what each "
        "prompt made the VLA do). "
        "GRPO (--method grpo) moves weights: groups of --group-size rollouts from one "
        "scene, the VLA acting through its stochastic flow sampler, group-normalised advantages and PPO-clip on "
        "the sampler's log-probabilities, on its own copy of the VLA (--train head | policy | lora; the base "
        "checkpoint is never touched), saved as RUN/policy. LfH (--method lfh) adds hindsight relabelling: for a "
        "group below --eta a judge (--judge sim | vlm:DIR | classifier:DIR | human) says what a failed rollout did "
        "achieve and re-scores the group under that instruction. ExToken (--method extoken) wraps GRPO "
        "around a VLA trained with behaviour tokens (`vla train --tokens`): rollouts try every token, and a "
        "state-conditioned selector p(c | s), trained from the tokens' returns, picks the token at deployment. "
        "The run directory gets the learning curve, TensorBoard scalars, "
        "episode logs, evaluation videos and a checkpoint after every episode; --resume continues a "
        "killed session exactly (step count, replay buffers, optimisers, RNG states). "
        "--role local (default) runs actor and learner in this process; --role learner / actor split "
        "them over ZMQ (SERL / HIL-SERL style): the actor drives the robot and streams transitions, "
        "the learner owns replay buffers, optimisers, checkpoints and --resume, and pushes policy "
        "parameters back (protocol: session/protocol.py). Methods come from policies.REGISTRY; each one's settings are flags generated from its config dataclass."),
        epilog="""\
examples:
  vla rl --method dsrl --checkpoint runs/vla_pick --task pick_red_cube --out runs/dsrl_red
  vla rl --method dsrl --variant sac --checkpoint runs/vla_pick --task lift_green_cube --total-ticks 4000 --out runs/x
  vla rl --method residual --checkpoint vla/checkpoints/base --task pick_blue_cube --total-ticks 20000 --out runs/res_blue
  vla rl --checkpoint runs/vla_pick --task pick_red_cube --demos data/demos_red --out runs/dsrl_red_demos
                                                     # NA's action critic also learns from recorded demos
  vla rl --method grpo --checkpoint vla/checkpoints/base --task place_cube_in_bowl --total-episodes 240 --out runs/grpo
  vla rl --method extoken --checkpoint runs/extoken/paired --task pick_red_cube_crowded --total-episodes 64 \
         --out runs/extoken_crowded                 # the VLA was trained with `vla train --tokens`
  vla rl --resume runs/dsrl_red                      # continue after a kill
  vla rl --checkpoint runs/vla_x --env my_pkg.envs:make_env --instruction "reach" --out runs/rl_x
                                                     # any gymnasium env with images / state / instruction;
                                                     # one action per step is fine: chunks are stepped row by
                                                     # row, episodes end at its TimeLimit / --max-episode-ticks
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

faster sessions (--updates async, split sessions only): the learner stores transitions as they arrive and
updates whenever it is free, never more often than lockstep (one update round per macro-step), so the robot
acts at its own rate instead of waiting for every round; the learner and the actor each take a core.
  vla rl --role learner --updates async --bind tcp://127.0.0.1:5800 --method residual \
         --checkpoint vla/checkpoints/base --task pick_blue_cube --out runs/res_blue
  vla rl --role actor --learner tcp://127.0.0.1:5800
summary.json and episodes.jsonl give the update rounds the learner afforded (bench/rl_throughput.py).

several actors (--actors N, Ray: `pip install -e .[scale]`): the learner in this process, N actors as Ray actors
(a local Ray cluster, or the running one at --ray-address), each with its own simulator bridge on ports of its
own (or its own real robot: --actor-robots SITE once per actor), streaming transitions to the learner, which
pushes the parameters to all of them. Actor i plays the scenes of session episodes i, i + N, i + 2N, ...
(disjoint seeds); the tick budget counts every actor's ticks; actor 0 runs the evaluations. An actor that dies
is dropped (its unfinished episode is not counted) and the others go on; --resume continues with N new actors.
  vla rl --actors 4 --method residual --checkpoint vla/checkpoints/base --task pick_blue_cube --out runs/res4
  vla rl --actors 16 --ray-address auto --bind tcp://*:5800 --keys keys/ --updates async --checkpoint ... --out ...
         # on a cluster (`ray start --head` here, `ray start --address HEAD:6379` on each node; this project and
         # the checkpoint at the same paths on every node, keys/ too): the actors reach the learner on this machine
  vla rl --actors 2 --actor-robots lab/franka_a.yaml --actor-robots lab/franka_b.yaml --reward classifier:... ...
Actors' logs (and their bridges'): RUN/actors/ (a node's temp folder on another cluster).

Rewards come from rewards/: the sim task's success predicate (1 at success, the episode ends), or on a
real robot a success classifier trained with `vla reward train` (--reward classifier:DIR). Between
real-robot episodes the arm goes home and the operator resets the scene and presses Enter (q stops,
s / f record their verdict on the last episode); no answer within --reset-timeout pauses the session
(exit code 3; --resume continues). Evaluations also need resets: keep --eval-episodes small there.
  vla rl --robot my_lab.yaml --reward classifier:runs/succ_towel --instruction "fold the towel" \\
         --checkpoint runs/vla_towel --out runs/rl_towel --eval-every 0 --eval-episodes 3
""")
    from policies import REGISTRY, get_config_class
    from session.config import RLConfig
    from session.flags import add_flags

    p.add_argument("--method", choices=sorted(REGISTRY), default=None,
                   help="the RL method (policies.REGISTRY; default dsrl); its settings are the method's flags below")
    session_flags = add_flags(p, RLConfig, skip=("method", "agent"))
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the session in RUN_DIR from its last checkpoint")
    p.add_argument("--serve", choices=["auto", "always", "never"], default="auto",
                   help="start the robot's bridge: auto (if none answers), always, never")
    method_flags: dict = {}
    shared: dict = {}
    for method in REGISTRY:  # one group of flags per method, generated from its config's documented fields
        cls = get_config_class(method)
        group = p.add_argument_group(f"method {method} ({cls.__name__})")
        method_flags[method] = add_flags(group, cls, skip=tuple(session_flags), existing=shared)
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
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="--actors: the Ray cluster to run them on (auto: the one started on this machine with "
                        "`ray start --head`); default: a local Ray cluster for this session")
    p.set_defaults(run=run, session_flags=session_flags, method_flags=method_flags)


def make_sim_env(cfg, client):
    """The session's env. Reward: the sim task's predicate, or a success classifier. Reset: a
    simulator lays out the task's scene itself; a real arm goes home, then the operator resets
    the scene (a prompt with a timeout)."""
    from vla.envs import task_env

    oracle = wants_privileged(cfg)
    if oracle and cfg.reward != "task":
        raise ValueError("--encoder oracle reads the simulator's object poses: it needs --reward task on a sim task")
    gripper = session_gripper(cfg)
    if cfg.reward == "task":
        return task_env(client, cfg.task, instruction=cfg.instruction, privileged=oracle, gripper=gripper)
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
    env = RobotEnv(client, instruction=instruction, reward_fn=reward_fn, reset_fn=reset_fn, gripper=gripper)
    env.max_ticks = max_ticks
    return env


def session_gripper(cfg) -> str:
    """``--gripper`` made concrete for the session's arm: ``auto`` is what the checkpoint names (its config.json's
    ``execution.gripper``), else raw; a LeRobot hub id or a path without a config names none."""
    from vla.envs import resolve_gripper
    from vla.models import resolve_checkpoint

    if cfg.gripper != "auto":
        return cfg.gripper
    try:
        ckpt = resolve_checkpoint(cfg.checkpoint)
    except FileNotFoundError:
        return "raw"
    return resolve_gripper("auto", ckpt)


def _method_config(args, method: str):
    """The method's config: its defaults with the method flags given on the command line."""
    from policies import get_config_class
    from session.config import replace_flat
    from session.flags import given

    own = args.method_flags[method]
    typed = {}
    for m, flags in args.method_flags.items():
        typed.update(given(args, flags))
    foreign = sorted(set(typed) - set(own))
    if foreign:
        names = ", ".join("--" + n.replace("_", "-") for n in foreign)
        raise ValueError(f"{names}: not a setting of method {method!r}")
    return replace_flat(get_config_class(method)(), typed, f"method {method!r}")


def _check_role_args(args) -> None:
    actors = getattr(args, "actors", None)
    if actors is not None and actors is not UNSET:
        if actors < 0:
            raise ValueError(f"--actors must be >= 0 (0: act in this process), got {actors}")
        if args.role != "local":
            raise ValueError(f"--actors starts the actors as Ray actors from a session in this process: drop --role "
                             f"{args.role} (one learner, one actor per process is --role learner / actor)")
    resumed = _resumed_actors(args.resume) if args.resume else 0
    if resumed and args.role != "local":
        raise ValueError(f"--resume {args.resume}: that session runs with {resumed} Ray actors; resume it with "
                         f"`vla rl --resume {args.resume}` (no --role)")
    pool = bool(actors) or resumed > 0
    if getattr(args, "ray_address", None) and not pool:
        raise ValueError("--ray-address names the Ray cluster of --actors N: give --actors too")
    if getattr(args, "actor_robots", None) and not actors:
        raise ValueError("--actor-robots gives each of --actors N its robot: give --actors too")
    if pool:
        from vla.cluster import require_ray

        require_ray("--actors")
        if args.serve != "auto":
            raise ValueError(f"--serve {args.serve}: with --actors each actor starts the bridge of its own copy of a "
                             "simulated --robot (a real robot's bridge runs next to it); drop --serve")
    if args.role != "learner" and not pool and (args.bind != "tcp://127.0.0.1:5800" or args.insecure):
        raise ValueError("--bind and --insecure are for --role learner (or --actors)")
    if args.role != "actor" and args.learner:
        raise ValueError("--learner is for --role actor (the learner itself takes --bind)")
    if args.role == "actor":
        if not args.learner:
            raise ValueError("--role actor needs --learner tcp://HOST:PORT")
        given = [f"--{n}" for n in ("task", "out", "resume", "demos", "env") if getattr(args, n)]
        if given:
            raise ValueError(f"the actor takes the session from the learner: give {', '.join(given)} to the learner")
    if args.role == "local" and args.keys and not pool:
        raise ValueError("--keys is for --role learner / actor (or --actors)")
    if (args.role != "local" or pool) and getattr(args, "total_episodes", None):
        raise ValueError("--total-episodes is for in-process sessions (--role local); a split session's budget is "
                         "--total-ticks")
    if (args.role != "local" or pool) and not args.resume:
        from policies import get_method

        method = args.method or DEFAULT_METHOD
        reason = get_method(method)[0].split_refusal(_method_config(args, method))
        if reason:
            raise ValueError(reason)


def _resumed_actors(run_dir: str) -> int:
    """The actors of the session in ``run_dir`` (0 when it ran in one process, or there is none)."""
    import json

    try:
        with open(os.path.join(run_dir, "rl_config.json")) as f:
            return int(json.load(f).get("actors", 0))
    except (OSError, ValueError):
        return 0


def _new_config(args):
    """A new session's RLConfig from the command line (session flags + the method's flags)."""
    from session.config import RLConfig
    from session.flags import given

    v = given(args, args.session_flags)
    method = args.method or DEFAULT_METHOD
    reward = v.get("reward", "task")
    need = ["checkpoint", "out"] + (["task"] if reward == "task" and not v.get("env") else [])
    missing = [f"--{n}" for n in need if not v.get(n)]
    if missing:
        raise ValueError(f"give {', '.join(missing)} for a new session (or --resume RUN_DIR)")
    if v.get("task"):
        from hardware.sim_tasks import get_task

        get_task(v["task"])
    if v.get("env"):
        from vla.envs import load_env_factory

        load_env_factory(v["env"])  # a wrong spec fails now, before the VLA loads
    if reward.startswith("classifier:"):
        from rewards.success_classifier import read_meta

        path = os.path.abspath(reward.split(":", 1)[1])
        read_meta(path)  # a wrong path fails now, before the VLA loads
        v["reward"] = f"classifier:{path}"  # absolute, so --resume works from anywhere
        if not v.get("task") and not v.get("instruction"):
            raise ValueError("a real-robot session needs --instruction (or --task for a sim task)")
    v["checkpoint"] = os.path.abspath(v["checkpoint"])
    v["demos"] = tuple(os.path.abspath(d) for d in v.get("demos", ()))
    v.setdefault("task", "")
    return RLConfig(method=method, agent=_method_config(args, method), **v)


def wants_privileged(cfg) -> bool:
    """DSRL's ``--encoder oracle`` reads the simulator's privileged state (a labelled oracle)."""
    return getattr(cfg.agent, "encoder", None) == "oracle"


def make_env(cfg, client=None):
    """The session's env: ``--env``'s factory, or the robot (sim) env on the bridge client; with ``--shaping DIR``
    its reward shaped by the saved potential."""
    if cfg.env:
        if wants_privileged(cfg):
            raise ValueError("--encoder oracle reads a sim task's object poses; an --env has none: use --task")
        from vla.envs import make_user_env

        env = make_user_env(cfg.env)
    else:
        env = make_sim_env(cfg, client)
    return shaped(env, cfg.shaping) if getattr(cfg, "shaping", "") else env


def shaped(env, path: str):
    """``env`` with its reward shaped by the potential saved in ``path`` (``rewards.shaping``), read from the
    observation's ``state``; a potential of another input size is refused before the first episode."""
    import numpy as np

    from rewards.shaping import ShapedRewardWrapper, load_potential, load_shaping

    _, meta = load_potential(path)
    space = getattr(env, "observation_space", None)
    state = space["state"].shape if space is not None and "state" in getattr(space, "spaces", {}) else None
    if state is not None and int(np.prod(state)) != int(meta["in_dim"]):
        raise ValueError(f"--shaping {path}: the potential reads {meta['in_dim']} state dims, this env's observation "
                         f"'state' has {int(np.prod(state))}")
    wrapped = ShapedRewardWrapper(env, load_shaping(path), feature_fn=lambda obs: np.asarray(obs["state"], np.float32))
    for name in ("max_ticks", "chunk_actions", "client"):  # the env contract the session reads (vla.envs)
        if hasattr(env, name):
            setattr(wrapped, name, getattr(env, name))
    return wrapped


def run(args) -> int:
    _check_role_args(args)
    if args.role == "actor":
        return run_actor(args)

    from robot_io.bridge_process import running_bridge
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from session.config import RLConfig
    from session.flags import given
    from session.runner import run_session
    from vla.models import load_vla, resolve_checkpoint

    if args.resume:
        cfg_path = os.path.join(args.resume, "rl_config.json")
        if not os.path.isfile(cfg_path):
            raise FileNotFoundError(f"--resume {args.resume}: no rl_config.json there (not an RL session)")
        cfg = RLConfig.from_json(cfg_path)
        typed = given(args, args.session_flags)
        total = typed.get("total_ticks")
        if total is not None and total > cfg.total_ticks:
            cfg = dataclasses.replace(cfg, total_ticks=total)
        if "actors" in typed and typed["actors"] != cfg.actors:
            raise ValueError(f"--actors {typed['actors']}: {args.resume} runs with {cfg.actors} actor(s) (their "
                             "scenes are split by that number); resume it with the same")
    else:
        cfg = _new_config(args)
    if cfg.actors:
        from session.pool import check_pool

        check_pool(cfg)  # before the VLA loads
    if args.role == "local" and cfg.updates != "lockstep" and not cfg.actors:
        raise ValueError(f"--updates {cfg.updates} runs the learner in its own process: start the session with "
                         "`vla rl --role learner ...` and its actor with `vla rl --role actor --learner ENDPOINT`")
    vla = load_vla(resolve_checkpoint(cfg.checkpoint))
    if cfg.actors:
        from session.pool import run_pool
        from session.protocol import curve_keys

        summary = run_pool(cfg, vla, make_env, resume=bool(args.resume), ray_address=args.ray_address,
                           bind=None if args.bind == "tcp://127.0.0.1:5800" else args.bind,
                           keys=curve_keys(args.keys), insecure=args.insecure)
        _print_summary(cfg, summary)
        return 0
    if args.role == "learner":
        from session.learner import run_learner
        from session.protocol import curve_keys

        summary = run_learner(cfg, vla, bind=args.bind, resume=bool(args.resume), keys=curve_keys(args.keys),
                              insecure=args.insecure)
        _print_summary(cfg, summary)
        return 0
    from vla.operator_reset import OperatorStop, OperatorTimeout

    os.makedirs(cfg.out, exist_ok=True)
    try:
        if cfg.env:  # the user's env: no robot, no bridge
            summary = run_session(cfg, make_env(cfg), vla, resume=bool(args.resume))
        else:
            site = load_site(cfg.robot)
            with running_bridge(site, os.path.join(cfg.out, "bridge.log"), start=args.serve):
                client = RobotClient(site)
                try:
                    summary = run_session(cfg, make_env(cfg, client), vla, resume=bool(args.resume))
                finally:
                    client.close()
    except OperatorStop as e:
        paused = isinstance(e, OperatorTimeout)
        print(f"session {'paused' if paused else 'stopped'}: {e}\nthe robot holds its safe state; "
              f"`vla rl --resume {cfg.out}` continues from the last finished episode", file=sys.stderr)
        return 3 if paused else 0
    _print_summary(cfg, summary)
    return 0


def _print_summary(cfg, summary) -> None:
    import json

    rate = lambda x: "    n/a" if x is None else f"{x:>8.0%}"  # noqa: E731
    print(f"{'':<14}{'success':>9}\nbase VLA      {rate(summary['base_success_rate'])}\n"
          f"{cfg.label:<14}{rate(summary['final_success_rate'])}   ({summary['eval_episodes']} eval episodes)")
    print(json.dumps({k: summary[k] for k in ("run_dir", "episodes", "ticks", "vla_weights_unchanged")}))
    print(f"learning curve: {os.path.join(cfg.out, 'learning_curve.png')}")


def run_actor(args) -> int:
    """`--role actor`: the session's config from the learner, this machine's VLA and robot."""
    import json
    import tempfile

    from robot_io.bridge_process import running_bridge
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from session.actor import Actor, ActorConfig
    from session.flags import given
    from session.protocol import curve_keys
    from vla.models import load_vla, resolve_checkpoint

    v = given(args, args.session_flags)
    actor = Actor(ActorConfig(learner=args.learner, learner_timeout_s=args.learner_timeout, keys=curve_keys(args.keys),
                              checkpoint=os.path.abspath(v["checkpoint"]) if v.get("checkpoint") else None,
                              robot=v.get("robot")))
    try:
        print(f"actor {actor.actor_id}: waiting for the learner at {args.learner}", flush=True)
        cfg = actor.connect()
        print(f"actor: session {cfg.out} on the learner, task {cfg.task}, robot {cfg.robot}", flush=True)
        vla = load_vla(resolve_checkpoint(cfg.checkpoint))
        if cfg.env:  # the user's env on this machine: no robot, no bridge
            actor.prepare(vla, make_env(cfg))
            print(json.dumps(actor.run()))
            return 0
        site = load_site(cfg.robot)
        log_path = os.path.join(tempfile.gettempdir(), f"vla-rl-actor-{os.getpid()}-bridge.log")
        with running_bridge(site, log_path, start=args.serve):
            client = RobotClient(site)
            summary = actor.run_on_robot(vla, client, lambda: make_sim_env(cfg, client))
    finally:
        actor.close()
    print(json.dumps(summary))
    return 0
