"""`vla record`: teleoperated (or scripted) demonstrations into a LeRobot v3 dataset.

The loop, per episode: reset the robot (a simulator lays out the task's scene from the seed),
then every control tick read the teleop device, step ``robot_io.RobotEnv`` with its action and
add one frame: the observation the operator saw, the action the server actually applied (after
its limits), the intervention flag and the real capture time. Operator events end an episode
(success / failure), discard it (re-record) or end the session (stop). Each finished episode
is durable when it is saved (``vla.data.EpisodeWriter``); Ctrl-C or a kill loses at most the
episode in progress, and ``vla dataset repair`` restores a dataset left by a crash.

Beside lerobot's files, the episode log (``meta/vla_episodes.jsonl``, ``vla.data.episode_log``)
records per episode: task, seed, instruction, success, frames, the scripted expert's grasp mode
(``expert_mode``) and the achieved control rate --
what ``vla replay`` needs to re-create the scene and ``vla train --success-only`` to filter. The
writer commits each row with its episode, so every saved episode has exactly one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import signal
import time

from vla.commands.eval import TE_DEFAULT

log = logging.getLogger(__name__)


def add_parser(sub, name: str, help_: str) -> None:
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "Record demonstrations into a LeRobot v3 dataset through the bridge. The teleop device drives "
        "the robot at a fixed control rate; every frame stores the cameras, the state, the action the "
        "server applied, an intervention flag and the real capture time. A finished episode is durable "
        "as soon as it is saved: a crash loses at most the episode in progress (`vla dataset repair`)."),
        epilog="""\
examples:
  vla record --robot sim-franka --task pick_red_cube --teleop scripted --episodes 20 --root data/pick
  vla record --robot sim-franka-fast --task stack_cubes --teleop scripted --expert-quality 0.6 --root data/stack
  vla record --robot sim-franka-fast --task pick_red_cube --teleop scripted --dagger runs/vla_pick --root data/pick_dagger1
  vla record --robot sim-franka-fast --task pick_red_cube --teleop scripted --dagger vla/checkpoints/base \
      --dagger-temporal-ensemble --dagger-noise zero --seed 1000 --root data/pick_dagger_te   # as `vla eval --noise zero` runs it
  vla record --robot sim-franka-fast --task pick_red_cube_yaw45 --teleop scripted --expert-mode random --root data/modes
  vla record --robot my_lab.yaml --teleop keyboard --instruction "fold the towel" --episodes 10 --root data/towel

keyboard: w/s a/d r/f move x/y/z, q/e yaw, space gripper, Enter success, x failure,
z re-record, Esc stop. Recording into an existing dataset appends to it.
""")
    p.add_argument("--robot", default="sim-franka", help="site YAML or preset (default sim-franka; "
                   "sim-franka-fast records simulated demos as fast as the CPU allows)")
    p.add_argument("--task", default=None, help="sim task name (sets the scene, the instruction, success "
                   "detection and the scripted expert); see `vla record --list-tasks`")
    p.add_argument("--list-tasks", action="store_true", help="print the sim tasks and exit")
    p.add_argument("--instruction", default=None, help="language instruction stored with each episode "
                   "(default: the task's instruction)")
    p.add_argument("--teleop", default="keyboard", help="keyboard | gamepad | spacemouse | scripted (default keyboard)")
    p.add_argument("--expert-quality", type=float, default=1.0,
                   help="scripted expert quality in [0, 1]: 1 = best, lower adds noise, hesitation and mistakes")
    p.add_argument("--mistake-rate", type=float, default=None, metavar="P",
                   help="--teleop scripted: share of episodes with one fatal mistake, overriding the rate "
                   "--expert-quality sets while keeping its other knobs (with --keep-failures: demos of a competent "
                   "expert that goes wrong in P of the episodes)")
    p.add_argument("--mistake-kind", action="append", default=None, metavar="KIND",
                   help="--teleop scripted: a kind of fatal mistake to draw from, repeatable: wrong_object, misplace, "
                   "stop_short (the default: those the task allows) or close_early (the first pick closes 5 cm above "
                   "the cube and gives up; only when named)")
    p.add_argument("--expert-seed", type=int, default=None, metavar="N",
                   help="--teleop scripted: seed of the expert's own draws (which episodes get the mistake, noise, "
                   "pauses), default --seed; the same scenes (--seed) recorded with several expert seeds get "
                   "different outcomes")
    p.add_argument("--expert-mode", default=None, choices=("near", "ccw", "cw", "random"),
                   help="--teleop scripted: the grasp mode of its picks, behaviour modes for ExToken's token prior: "
                   "near (default: the face pair nearest the fingers), ccw / cw (turn the fingers counter-clockwise "
                   "/ clockwise to the next face pair), random (ccw or cw per episode, half each, from the seed). "
                   "Each episode's mode goes to the episode log (expert_mode). Scenes where both turns are 45 degrees: "
                   "--task pick_red_cube_yaw45, pick_red_cube_crowded (a neighbour cube on one face axis)")
    p.add_argument("--episodes", type=int, default=10, help="episodes to keep (default 10)")
    p.add_argument("--root", default=None, help="dataset folder (created, or appended to if it exists); "
                   "required unless --list-tasks")
    p.add_argument("--repo-id", default=None, help="dataset repo id (default local/<folder name>)")
    p.add_argument("--fps", type=float, default=10.0, help="control and recording rate, Hz (default 10)")
    p.add_argument("--max-steps", type=int, default=None, help="ticks per episode before it counts as a "
                   "failure (default: the task's limit, else 300)")
    p.add_argument("--seed", type=int, default=0, help="first scene seed; episode k uses seed+k")
    p.add_argument("--dart", type=float, default=0.0, metavar="SIGMA",
                   help="DART noise injection for --teleop scripted: execute the expert's action plus Gaussian "
                   "noise of SIGMA m per tick on the translation, store the expert's clean action (recovery data "
                   "for behaviour cloning; default 0 = off)")
    p.add_argument("--dart-label", choices=("clean", "executed"), default="clean",
                   help="with --dart: the action each frame stores. clean (default): the expert's, for the state it "
                   "saw (DART's recovery labels); executed: the noisy command the robot carried out, so the demos' "
                   "actions are as broad as the noise (a base for latent-noise RL: the noise then has good and bad "
                   "actions to choose between)")
    p.add_argument("--dagger", default=None, metavar="CHECKPOINT",
                   help="DAgger with --teleop scripted: the VLA checkpoint drives the robot and the expert labels "
                   "every state it reaches (the frame's action is the expert's; it reads the pick, lift, place and "
                   "push phases off the state: every sim task); every episode is kept, failed or not. Train "
                   "on the demos plus these datasets")
    p.add_argument("--dagger-exec-steps", type=int, default=4, metavar="N",
                   help="--dagger: rows of each chunk the policy executes before it re-plans (default 4)")
    p.add_argument("--dagger-temporal-ensemble", type=float, nargs="?", const=TE_DEFAULT, default=None, metavar="M",
                   help="--dagger: the policy drives as `vla eval` runs it by default, with ACT's temporal ensembling "
                   f"(re-plan every tick, weights exp(-M i), M = {TE_DEFAULT} if not given), instead of "
                   "--dagger-exec-steps chunks: the states visited are the evaluated policy's own")
    p.add_argument("--dagger-noise", default="sample", metavar="sample|zero|mean:N",
                   help="--dagger: the sampler's starting noise per chunk, as `vla eval --noise` (default sample)")
    p.add_argument("--dagger-gripper", choices=["auto", "raw", "binary"], default="auto",
                   help="--dagger: the gripper opening the policy drives with, as `vla eval --gripper` (default auto: "
                        "the checkpoint's execution.gripper, else raw; binary: snapped to 0 / 1 at 0.5)")
    p.add_argument("--dagger-handover", choices=["never", "close"], default="never",
                   help="--dagger: close = on a task that opens with a pick, the expert drives from the policy's first "
                   "gripper-close command to the episode's end (the policy's approach and descent are labelled; the "
                   "grasp, a retry and the lift are the expert's own from there); a task that opens otherwise (a "
                   "push: shut fingers from the first tick) is driven by the policy throughout. Default never: the "
                   "policy drives every tick")
    p.add_argument("--dagger-labels", choices=["realign", "correct"], default="realign",
                   help="--dagger: how the expert labels a descent off the cube's axis: realign = back up to the "
                   "hover height unless within 1.2 cm (default, round 7); correct = keep descending towards the "
                   "axis within 2 cm and close only once within 0.8 cm at grasp height")
    p.add_argument("--dagger-prompts", choices=["task", "subskills"], default="task",
                   help="--dagger: what the policy is prompted with. task (default): the task's instruction; subskills "
                   "(a task made of sub-skills): each tick the instruction of the sub-skill the expert reads off the "
                   "state (\"pick up the red cube\", \"put it in the bowl\"; a dropped cube's pick again), so the "
                   "policy carries out the task as a sequence of sub-skill prompts and the expert labels the hand-over "
                   "states it reaches itself (the sub-skill base, `make base-subskills`). Needs --label-subskills "
                   "(each frame trains under the prompt it was driven with) and --dagger-handover never")
    p.add_argument("--dagger-beta", type=float, default=0.0, metavar="B",
                   help="--dagger: share of chunks (of ticks with --dagger-temporal-ensemble) the expert drives "
                   "instead of the policy (default 0)")
    p.add_argument("--label-subskills", action="store_true",
                   help="--teleop scripted on a task made of sub-skills (place_cube_in_bowl, stack_cubes, "
                   "put_all_cubes_in_bowl): each frame's task is the sub-skill the expert is carrying out "
                   "(\"pick up the red cube\", \"put it in the bowl\"); the episode keeps the task's instruction "
                   "in meta/vla_episodes.jsonl with the segments. `vla train` learns both labels")
    p.add_argument("--keep-failures", action="store_true", help="save failed episodes too (default: re-record them)")
    p.add_argument("--max-attempts", type=int, default=None, help="give up after this many attempts (default 3x episodes)")
    p.add_argument("--no-video", action="store_true", help="store PNG images instead of encoded video")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="--dagger: torch threads of the driving policy (default 1: a policy step is small, and torch's "
                   "default of one thread per core made each tick 15x slower with two recordings side by side)")
    p.add_argument("--serve", default="auto", choices=("auto", "always", "never", "own"),
                   help="start the bridge for a simulated site when it is not running (auto, default); own: a "
                        "bridge of this recording's own on free loopback ports, so several recordings of a simulated "
                        "site run at once")
    p.set_defaults(run=run)


def _list_tasks() -> int:
    from hardware.sim_tasks import TASKS

    for name, t in TASKS.items():
        variant = f", a scene variant of {t.variant_of}" if t.variant_of else ""
        print(f"  {name:<26} {t.instruction!r}  (max {t.max_steps} steps{variant})")
        if t.paraphrases and not t.variant_of:
            print(f"  {'':<26}   paraphrases: " + "; ".join(repr(w) + (" (held out)" if w in t.held_out else "")
                                                         for w in t.paraphrases))
    print("\nheld out: wordings `vla train --paraphrases sim` leaves out, for measuring unseen wordings")
    return 0


class _StopRequested:
    """SIGINT / SIGTERM set a flag: the loop discards the episode in progress and closes cleanly."""

    def __init__(self) -> None:
        self.flag = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._set)
        return self

    def _set(self, *_):
        if self.flag:  # second Ctrl-C: the user means it
            raise KeyboardInterrupt
        self.flag = True
        print("\nstop requested: discarding the episode in progress, closing the dataset", flush=True)

    def __exit__(self, *exc):
        for sig, h in self._old.items():
            signal.signal(sig, h)


def dagger_hands_over(skills, handover: str) -> bool:
    """Whether ``--dagger-handover`` hands a task's episodes to the expert at the policy's first close command:
    "close" on a task that opens with a pick. A task that opens otherwise (a push, whose fingers stay shut from
    the first tick) would hand over at once, so there the policy drives every tick."""
    return handover == "close" and bool(skills) and skills[0][0] == "pick"


def dagger_unsupported_skills(skills, supported, handover: str) -> list[str]:
    """The skills of a task the policy may drive in a DAgger episode that the expert cannot label from the
    state (``ScriptedExpert.FOLLOW_STATE_SKILLS``). With ``--dagger-handover close`` the expert takes over at the
    policy's first close command, so when the task opens with a pick the policy drives that pick's approach only
    (a pick ends in a grasp, which needs a close) and the expert carries out every later skill itself."""
    drives = skills[:1] if dagger_hands_over(skills, handover) else skills
    return sorted({step[0] for step in drives} - set(supported))


def run(args) -> int:
    if args.list_tasks:
        return _list_tasks()
    if not args.root:
        raise ValueError("--root is required: the dataset folder to create or append to")
    import numpy as np
    from tqdm import tqdm

    import hardware.teleop as teleop_pkg
    from robot_io.bridge_process import running_bridge
    from robot_io.env import RobotEnv
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from vla.data import EpisodeWriter, make_features
    from vla.data.recording import STALL_CODES, record_episode

    if args.episodes <= 0:
        raise ValueError("--episodes must be positive")
    task = None
    if args.task is not None:
        from hardware.sim_tasks import get_task

        task = get_task(args.task)
    instruction = args.instruction or (task.instruction if task else None)
    if not instruction:
        raise ValueError("give --instruction (or --task for a sim task): every episode needs its instruction")
    if args.dart < 0 or (args.dart > 0 and args.teleop != "scripted"):
        raise ValueError(f"--dart must be >= 0 and needs --teleop scripted (a closed-loop expert labels the "
                         f"perturbed states), got --dart {args.dart} with --teleop {args.teleop}")
    args.dart_label = getattr(args, "dart_label", "clean")  # a Namespace built by a caller may predate it
    if args.dart_label != "clean" and args.dart <= 0:
        raise ValueError(f"--dart-label {args.dart_label} needs --dart SIGMA > 0 (the noise whose executed action "
                         "it stores)")
    if args.dagger and (args.teleop != "scripted" or args.dart > 0):
        raise ValueError("--dagger needs --teleop scripted (the expert labels the states the policy reaches) and "
                         "no --dart")
    te = args.dagger_temporal_ensemble
    args.dagger_gripper = getattr(args, "dagger_gripper", "auto")  # a Namespace built by a caller may predate it
    if not args.dagger and (te is not None or args.dagger_noise != "sample" or args.dagger_beta > 0
                            or args.dagger_handover != "never" or args.dagger_labels != "realign"
                            or args.dagger_gripper not in ("auto", "raw")):
        raise ValueError("--dagger-temporal-ensemble, --dagger-noise, --dagger-gripper, --dagger-beta, "
                         "--dagger-handover and --dagger-labels set how the policy drives and is labelled: they need "
                         "--dagger CHECKPOINT")
    if te is not None and not (te >= 0 and te < float("inf")):
        raise ValueError(f"--dagger-temporal-ensemble M must be a finite weight >= 0, got {te}")
    if args.dagger:
        from vla.envs import noise_option

        noise_option(args.dagger_noise)  # a bad --dagger-noise fails before the bridge starts
    if args.teleop != "scripted":
        for flag, value in (("--mistake-rate", args.mistake_rate), ("--mistake-kind", args.mistake_kind),
                            ("--expert-seed", args.expert_seed), ("--expert-mode", args.expert_mode)):
            if value is not None:
                raise ValueError(f"{flag} sets the scripted expert: it needs --teleop scripted, got --teleop "
                                 f"{args.teleop}")
    if args.mistake_rate is not None and not 0.0 <= args.mistake_rate <= 1.0:
        raise ValueError(f"--mistake-rate must lie in [0, 1], got {args.mistake_rate}")
    if args.mistake_kind:
        from hardware.teleop.scripted import MISTAKE_KINDS

        unknown = sorted(set(args.mistake_kind) - set(MISTAKE_KINDS))
        if unknown:
            raise ValueError(f"--mistake-kind {unknown[0]!r} is not one of {list(MISTAKE_KINDS)}")
    if args.teleop == "scripted" and task is None:
        raise ValueError("--teleop scripted needs --task: the scripted expert is written per sim task")
    if args.label_subskills and (args.teleop != "scripted" or not task.segmented):
        from hardware.sim_tasks import TASKS

        raise ValueError("--label-subskills needs --teleop scripted (the expert knows which sub-skill it is in) on a "
                         "task made of sub-skills: " + ", ".join(n for n, t in TASKS.items() if t.segmented)
                         + f"; got --teleop {args.teleop} --task {args.task}")
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.dagger_prompts == "subskills":
        if not args.dagger:
            raise ValueError("--dagger-prompts subskills prompts the --dagger policy: give --dagger CHECKPOINT")
        if not args.label_subskills:
            raise ValueError("--dagger-prompts subskills needs --label-subskills: each frame is labelled with the "
                             "sub-skill prompt the policy was driven with")
        if args.dagger_handover != "never":
            raise ValueError("--dagger-prompts subskills has the policy carry out every sub-skill, the hand-overs "
                             f"between them included: use --dagger-handover never, got {args.dagger_handover}")
    max_steps = args.max_steps or (task.max_steps if task else 300)
    site = load_site(args.robot)
    if args.serve == "own":
        from robot_io.bridge_process import is_simulated

        if not is_simulated(site):
            raise ValueError(f"--serve own copies a simulated site onto free ports; --robot {args.robot} is a real "
                             "robot's, whose bridge runs beside it: drop --serve own")
    os.makedirs(os.path.dirname(os.path.abspath(args.root)) or ".", exist_ok=True)
    repo_id = args.repo_id or f"local/{os.path.basename(os.path.normpath(args.root))}"
    teleop_cls = teleop_pkg.load_teleop(args.teleop)
    knobs = {} if args.mistake_rate is None else {"mistake_prob": args.mistake_rate}
    if args.mistake_kind:
        knobs["mistake_kinds"] = tuple(dict.fromkeys(args.mistake_kind))
    if args.expert_mode is not None:
        knobs["grasp_mode"] = args.expert_mode
    expert_seed = args.seed if args.expert_seed is None else args.expert_seed
    if args.teleop == "scripted":
        teleop = teleop_cls(quality=args.expert_quality, seed=expert_seed, **knobs)
        expert_row = {"expert_quality": args.expert_quality, "mistake_rate": teleop.knobs.mistake_prob,
                      "expert_seed": expert_seed, "mistake_kinds": list(teleop.knobs.mistake_kinds)}
    else:
        teleop = teleop_cls()
        expert_row = dict.fromkeys(("expert_quality", "mistake_rate", "expert_seed", "mistake_kinds"))
    driver, hands_over = None, False
    if args.dagger:
        unsupported = dagger_unsupported_skills(task.skills, teleop.FOLLOW_STATE_SKILLS, args.dagger_handover)
        if unsupported:
            raise ValueError(f"--dagger: the scripted expert labels only {list(teleop.FOLLOW_STATE_SKILLS)} skills "
                             f"from the state a policy reached; task {task.name!r} also has {unsupported}"
                             + ("" if args.dagger_handover == "close" or task.skills[0][0] != "pick" else
                                " (with --dagger-handover close the policy drives only the task's first pick, up "
                                "to its first close command, and the expert carries out the rest)"))
        from vla.envs import ChunkDriver
        from vla.evaluate import make_policy
        from vla.models import load_vla, resolve_checkpoint

        from vla.envs import resolve_gripper

        import torch

        torch.set_num_threads(args.threads)
        ckpt = resolve_checkpoint(args.dagger)
        args.dagger_gripper = resolve_gripper(args.dagger_gripper, ckpt)
        policy = make_policy(load_vla(ckpt).eval(),
                             None if te is not None else args.dagger_exec_steps, te, None, args.dagger_noise,
                             args.dagger_gripper)
        hands_over = dagger_hands_over(task.skills, args.dagger_handover)
        if args.dagger_handover == "close" and not hands_over:
            print(f"--dagger-handover close: {task.name} does not open with a pick, so the policy drives every tick",
                  flush=True)
        prompt_fn = None
        if args.dagger_prompts == "subskills":  # the expert has read this tick's state before the driver is asked
            def prompt_fn():
                return task.skill_instruction(teleop.last_info["skill"])
        driver = ChunkDriver(policy, beta=args.dagger_beta, seed=args.seed, handover_at_close=hands_over,
                             prompt_fn=prompt_fn)
        teleop.follow_state = True if args.dagger_labels == "realign" else args.dagger_labels
    keep_failures = args.keep_failures or driver is not None

    log_path = os.path.abspath(args.root.rstrip("/") + f".bridge-{dt.datetime.now():%Y%m%d-%H%M%S}.log")
    if args.serve == "own":  # the site copied onto leased ports, its bridge started here (vla eval --workers' way)
        from vla.cluster import worker_robot

        bridge = worker_robot(args.robot, os.path.dirname(log_path), os.path.basename(log_path)[:-4])
    else:
        bridge = running_bridge(site, log_path, start=args.serve)
    with bridge as served, teleop, _StopRequested() as stop:
        site = served if args.serve == "own" else site
        client = RobotClient(site)
        reward_fn = None
        if task is not None:
            from rewards.sim_success import success_reward

            reward_fn = success_reward(task.name)

        def reset_fn(env, seed):
            client.reset(seed=seed, task=task.name if task else None)

        env = RobotEnv(client, instruction=instruction, control_hz=args.fps, reward_fn=reward_fn, reset_fn=reset_fn)
        obs0 = client.observe(instruction)
        cams = {c: img.shape[:2] for c, img in obs0["images"].items()}
        features = make_features(cams, state_dim=obs0["state"].shape[0], action_dim=7, video=not args.no_video)
        writer = EpisodeWriter(args.root, repo_id, fps=int(round(args.fps)), features=features,
                               robot_type=client.description.get("driver", site.name), video=not args.no_video,
                               episode_log=True)
        names = list(client.description.get("objects", []))
        rois = {c: list(site.devices[c].roi) for c in cams if c in site.devices and site.devices[c].roi}
        max_attempts = args.max_attempts or 3 * args.episodes
        kept = successes = attempts = stalls = 0
        bar = tqdm(total=args.episodes, desc="episodes", unit="ep")
        try:
            while kept < args.episodes and attempts < max_attempts and not stop.flag:
                # a stalled episode (the robot refused a late command) is the same scene again
                seed = args.seed + attempts - stalls
                attempts += 1
                privileged_fn = None
                if args.teleop == "scripted":  # the scripted expert is an oracle: it reads the simulator's truth
                    def privileged_fn():
                        return {**{k: np.asarray(v) for k, v in client.last_state.arrays.items()}, "object_names": names}
                if driver is not None:
                    driver.reset(seed)
                res = record_episode(env, teleop, writer, instruction, max_steps, seed=seed,
                                     task=task.name if task else None, privileged_fn=privileged_fn,
                                     end_on_success=args.teleop != "scripted", should_stop=lambda: stop.flag,
                                     dart_sigma=args.dart, dart_label=args.dart_label, driver=driver,
                                     frame_task=((lambda: task.skill_instruction(teleop.last_info["skill"]))
                                                 if args.label_subskills else None))
                outcome, n = res.outcome, res.frames
                if outcome in STALL_CODES.values():
                    stalls += 1
                    why = ("the bridge watchdog stopped the robot (this recorder stalled past command_timeout_ms)"
                           if outcome == "watchdog" else
                           "a command reached the robot after its deadline and was not applied (a loaded machine?)")
                    tqdm.write(f"WARNING: attempt {attempts}: {why}; episode discarded, recording seed {seed} again")
                if outcome in ("stop", "rerecord", "interrupted", *STALL_CODES.values()) or n == 0 or (outcome == "failure" and not keep_failures):
                    writer.discard_episode()
                    bar.set_postfix_str(f"attempt {attempts}: {outcome or 'stopped'}, discarded")
                    if outcome == "stop":
                        break
                    continue
                loop = res.loop
                rate = loop.get("achieved_hz")
                idx = writer.save_episode(outcome_row={
                    "task": task.name if task else None, "seed": seed, "instruction": instruction,
                    "success": outcome == "success", "frames": n, "teleop": args.teleop,
                    "segments": res.segments if args.label_subskills else None,
                    **expert_row, "expert_mode": teleop.mode if args.teleop == "scripted" else None,
                    "dart_sigma": args.dart if args.dart > 0 else None,
                    "dart_label": args.dart_label if args.dart > 0 else None,
                    "dagger": ({"checkpoint": os.path.abspath(args.dagger),
                                "exec_steps": None if te is not None else args.dagger_exec_steps,
                                "temporal_ensemble": te, "noise": args.dagger_noise,
                                "gripper": args.dagger_gripper, "beta": args.dagger_beta,
                                "handover": "close" if hands_over else "never",  # as applied to this task
                                "handed_over_at": driver.handed_over_at,
                                "prompts": driver.prompts if args.dagger_prompts == "subskills" else None,
                                "labels": args.dagger_labels}
                               if args.dagger else None),
                    "roi": rois or None, "achieved_hz": rate, "recorded_at": time.time()})
                kept += 1
                successes += outcome == "success"
                if rate is not None and rate < 0.95 * args.fps and not client.sync:
                    tqdm.write(f"WARNING: episode {idx} ran at {rate:.2f} Hz, below the target {args.fps:g} Hz "
                               f"(lateness p99 {loop['late_ms_p99']:.1f} ms); capture times record the real timing")
                bar.update(1)
                bar.set_postfix(success=f"{successes}/{kept}", frames=n)
        finally:
            bar.close()
            writer.close()
            env.close()
    print(f"dataset: {os.path.abspath(args.root)} (repo_id {repo_id}): {writer.num_episodes} episode(s), "
          f"{writer.num_frames} frames; kept {kept} of {attempts} attempt(s), {successes} successful")
    if kept < args.episodes and not stop.flag:
        print(f"stopped after {attempts} attempts with {kept} of {args.episodes} episodes kept", flush=True)
        return 1
    return 0
