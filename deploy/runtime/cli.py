"""`vla-edge` (or `python -m deploy.runtime`): run an exported policy on a robot over the bridge.
No torch: numpy, pyzmq, msgpack, opencv and onnxruntime, on Python 3.11+ (a Raspberry Pi)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

EPILOG = """\
examples:
  vla-edge --policy deploy/pick.onnx --site sim-franka --hz 10 --seconds 30
  vla-edge --policy pick.onnx --site my_lab.yaml --instruction "pick up the red cube" --stats run.json
  python -m deploy.runtime --policy pick.onnx --site sim-franka --cpu 0   # pinned to one core

The policy file comes from `vla export policy`: it names its cameras, instructions and chunk
layout, and the runner checks them against the site before the arm moves. One chunk row is sent
per control tick; the next chunk is computed when the queue runs out (--exec-steps rows of each,
default the policy's). At the end it prints achieved rate, deadline misses and latency
percentiles (and writes them to --stats). On any error, and at the end, the arm is sent `stop`
(its safe state: it holds); the bridge watchdog holds it too if this process dies.

`python -m deploy.runtime client --help` (or `vla-client --help`): the thin client of a policy
server (`vla serve`) instead of a local ONNX policy.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vla-edge", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                                description="Run an exported ONNX policy on a robot at a fixed control rate "
                                            "(onnxruntime only, no torch).")
    p.add_argument("--policy", required=True, help="ONNX file written by `vla export policy`")
    p.add_argument("--site", default="sim-franka", help="site preset or YAML file of the robot's bridge (default sim-franka)")
    p.add_argument("--instruction", default=None,
                   help="the instruction (one the policy was exported with; default: its only one)")
    p.add_argument("--hz", type=float, default=10.0, help="control rate, ticks per second (default 10)")
    p.add_argument("--seconds", type=float, default=30.0, help="run time (default 30; 0: until Ctrl-C)")
    p.add_argument("--exec-steps", type=int, default=None,
                   help="rows of each chunk executed before the next inference (default: the policy's)")
    p.add_argument("--noise", choices=["sample", "zero"], default="sample",
                   help="the policy's noise input: sample N(0, I) per chunk (default) or zero (deterministic)")
    p.add_argument("--gripper", choices=["auto", "raw", "binary"], default="auto",
                   help="the executed gripper opening: raw (as the policy puts it out), binary (snapped to 0 / 1 at "
                        "0.5, as scripted demonstrations command it) or auto (default: the policy file's 'gripper' "
                        "metadata, written by `vla export policy` from the checkpoint's execution.gripper; else raw)")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime threads (default 1)")
    p.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU core (Linux)")
    p.add_argument("--reset", type=int, default=None, metavar="SEED",
                   help="reset the arm first with this seed (simulators re-randomise the scene); default: no reset")
    p.add_argument("--timeout", type=float, default=2.0,
                   help="deadline of every bridge request and observation, seconds (default 2)")
    p.add_argument("--stats", default=None, help="write the run's stats as JSON here")
    p.add_argument("-v", "--verbose", action="count", default=0)
    return p


def resolve_instruction(policy, instruction: str | None) -> str:
    names = policy.instructions
    if instruction is None:
        if len(names) == 1:
            return names[0]
        if not names:
            return ""
        raise ValueError(f"the policy was exported with {len(names)} instructions; choose one with --instruction: "
                         f"{names}")
    policy.instruction_index(instruction)  # raises naming the exported ones
    return instruction


def check_site(policy, site) -> None:
    """The site must serve every camera the policy reads (checked from the site file, before connecting)."""
    missing = [c for c in policy.cameras if c not in site.cameras]
    if missing:
        raise ValueError(f"the policy reads camera(s) {missing}; site {site.name!r} serves {list(site.cameras)} "
                         "(rename them in the site file or re-export)")
    a = policy.meta.get("action_dim")
    if a is not None and a != 7:
        raise ValueError(f"the policy's action_dim is {a}; the arm takes 7 (dpos, drot, gripper)")


def _sigterm(signum, frame):  # systemd stops a service with SIGTERM: stop the arm as Ctrl-C does
    raise KeyboardInterrupt


def start_up(verbose: int) -> None:
    """What both robot-side entry points (vla-edge, vla-client) do first: log level from -v, and
    SIGTERM handled as Ctrl-C so the arm is stopped."""
    logging.basicConfig(level=max(logging.WARNING - 10 * verbose, logging.DEBUG),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _sigterm)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start_up(args.verbose)
    from robot_io.client import BridgeError
    from robot_io.site import SiteError

    try:
        return _run(args)
    except (ValueError, FileNotFoundError, SiteError, BridgeError) as e:
        if args.verbose:
            raise
        print(f"vla-edge: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the arm was sent stop", file=sys.stderr)
        return 130


def _run(args) -> int:
    from deploy.runtime.edge import EdgeConfig, run_edge
    from deploy.runtime.onnx_policy import OnnxPolicy
    from robot_io.robot import RobotClient
    from robot_io.site import load_site

    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout}")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    policy = OnnxPolicy(args.policy, threads=args.threads)
    gripper = (policy.gripper or "raw") if args.gripper == "auto" else args.gripper
    cfg = EdgeConfig(hz=args.hz, seconds=args.seconds, exec_steps=args.exec_steps, noise=args.noise,
                     gripper=gripper, seed=args.reset or 0)
    instruction = resolve_instruction(policy, args.instruction)
    noise_shape = tuple(policy.inputs["noise"].shape[1:]) if "noise" in policy.inputs else None
    site = load_site(args.site)
    check_site(policy, site)
    with RobotClient(site, sync=False, timeout_s=args.timeout) as client:
        if args.reset is not None:
            client.reset(args.reset, timeout_s=120.0)  # a simulator settles its scene (slow on a busy CPU)
        print(f"vla-edge: {os.path.basename(args.policy)} on {client.site.name} at {args.hz:g} Hz, "
              f"instruction {instruction!r}, gripper {gripper}", flush=True)
        stats = run_edge(client, policy, instruction, cfg, noise_shape=noise_shape, exec_steps=policy.exec_steps)
    stats.update(policy=os.path.basename(args.policy), site=client.site.name, instruction=instruction, gripper=gripper,
                 python=sys.version.split()[0], threads=args.threads)
    lat = stats["latency_ms"]
    print(f"{stats['ticks']} ticks at {stats['achieved_hz'] or 0:.2f} Hz (target {args.hz:g}); "
          f"deadline misses {stats['deadline_misses']}, skipped ticks {stats['skipped_ticks']}; "
          f"latency p50 {lat['p50'] or 0:.1f} ms, p99 {lat['p99'] or 0:.1f} ms; "
          f"inference p50 {stats['inference_ms']['p50'] or 0:.1f} ms")
    if args.stats:
        tmp = args.stats + ".tmp"
        with open(tmp, "w") as f:
            json.dump(stats, f, indent=2)
        os.replace(tmp, args.stats)
    return 0
