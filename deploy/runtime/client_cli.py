"""`vla-client` (or `python -m deploy.runtime client`): drive a robot with a remote policy server's
chunks (`vla serve`). No torch: numpy, pyzmq and msgpack, on Python 3.11+ (a Raspberry Pi)."""

from __future__ import annotations

import argparse
import json
import os
import sys

EXIT_SERVER_GONE = 3

EPILOG = """\
examples:
  vla-client --server tcp://127.0.0.1:5700 --site sim-franka --instruction "pick up the red cube"
  vla-client --server tcp://gpu-box:5700 --keys keys/ --site my_lab.yaml --hz 10 --blend crossfade --deadline 0.3
  python -m deploy.runtime client --server tcp://127.0.0.1:5700 --blend none --seconds 20 --stats run.json

The server (`vla serve --checkpoint RUN --bind tcp://0.0.0.0:5700 --keys keys/`) runs the VLA. Each
control tick this client sends one row to the arm; when --refill rows or fewer are left (default:
half a chunk) it sends the newest observation and keeps executing while the server computes. The
new chunk (row i meant for the observation's tick + i) is blended with what is left of the old:
  --blend none       the new chunk takes over at once (the arm jumps where the plans disagree)
  --blend ensemble   ACT temporal ensembling: weighted mean of the overlapping chunks
  --blend crossfade  linear cross-fade from the old plan to the new over their overlap (default)
The jump at chunk boundaries (with and without blending) is in the stats and in bench/serve.py.

Every call to the server has a deadline (--deadline); while no chunk is due the client pings the
server every quarter deadline. A missed deadline with an empty queue, or --max-misses in a row, means
the server is gone: the arm is sent `stop` (its safe state: it holds until a reset) and the client
exits with code 3, within about 1.25x the deadline of the server's death. Off loopback the link
uses CurveZMQ keys (--keys DIR from `vla bridge keys`, or the site file's security section).
"""


def build_parser() -> argparse.ArgumentParser:
    from deploy.runtime.blend import BLEND_MODES

    p = argparse.ArgumentParser(prog="vla-client", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                                description="Drive a robot over the bridge with action chunks from a policy server "
                                            "(`vla serve`), asynchronously, with blending and deadlines (no torch).")
    p.add_argument("--server", required=True, help="the policy server's endpoint, e.g. tcp://gpu-box:5700")
    p.add_argument("--site", default="sim-franka", help="site preset or YAML file of the robot's bridge (default sim-franka)")
    p.add_argument("--instruction", default=None,
                   help="the instruction (default: the checkpoint's only training instruction, if it records one)")
    p.add_argument("--hz", type=float, default=10.0, help="control rate, ticks per second (default 10)")
    p.add_argument("--seconds", type=float, default=30.0, help="run time (default 30; 0: until Ctrl-C)")
    p.add_argument("--blend", choices=BLEND_MODES, default="crossfade",
                   help="how overlapping chunks are blended (default crossfade)")
    p.add_argument("--gripper", choices=["auto", "raw", "binary"], default="auto",
                   help="the executed gripper opening: raw (as blended), binary (the blended opening snapped to "
                        "0 / 1 at 0.5) or auto (default: what the served checkpoint names, its config.json's "
                        "execution.gripper; else raw)")
    p.add_argument("--ensemble-m", type=float, default=0.01, help="--blend ensemble: weights exp(-m i), i = 0 oldest")
    p.add_argument("--refill", type=int, default=None,
                   help="ask for the next chunk when this many rows or fewer are left (default: half the chunk)")
    p.add_argument("--deadline", type=float, default=0.5, help="deadline of every call to the server, seconds (default 0.5)")
    p.add_argument("--max-misses", type=int, default=1,
                   help="missed deadlines in a row before the safe state (default 1; a miss with an empty queue "
                        "always stops the arm)")
    p.add_argument("--first-deadline", type=float, default=30.0,
                   help="deadline of the first chunk, before the clock starts (server warm-up; default 30)")
    p.add_argument("--keys", default=None, metavar="DIR",
                   help="CurveZMQ key folder from `vla bridge keys` (client.key_secret, server.key); default: the "
                        "site file's security section")
    p.add_argument("--key-name", default="client", help="this client's key name in --keys (default client)")
    p.add_argument("--insecure", action="store_true",
                   help="talk to a server off loopback WITHOUT CurveZMQ (isolated networks only)")
    p.add_argument("--reset", type=int, default=None, metavar="SEED",
                   help="reset the arm first with this seed (simulators re-randomise the scene); default: no reset")
    p.add_argument("--timeout", type=float, default=2.0,
                   help="deadline of every bridge request and observation, seconds (default 2)")
    p.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU core (Linux)")
    p.add_argument("--stats", default=None, help="write the run's stats as JSON here")
    p.add_argument("-v", "--verbose", action="count", default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from deploy.runtime.cli import start_up

    start_up(args.verbose)
    from deploy.runtime.client import PolicyRefused, ServerGone
    from robot_io.client import BridgeError
    from robot_io.security import SecurityError
    from robot_io.site import SiteError

    try:
        return _run(args)
    except ServerGone as e:
        print(f"vla-client: {e}; the arm was sent stop (safe state)", file=sys.stderr)
        return EXIT_SERVER_GONE
    except (ValueError, FileNotFoundError, SiteError, SecurityError, BridgeError, PolicyRefused) as e:
        if args.verbose:
            raise
        print(f"vla-client: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the arm was sent stop", file=sys.stderr)
        return 130


def check_description(desc: dict, site, instruction: str | None) -> str:
    """The server's policy must fit the site (cameras, a 7-dim arm action); returns the instruction."""
    cams = desc.get("cameras")
    if cams:
        missing = [c for c in cams if c not in site.cameras]
        if missing:
            raise ValueError(f"the served policy reads camera(s) {missing}; site {site.name!r} serves "
                             f"{list(site.cameras)} (rename them in the site file)")
    if desc.get("action_dim") not in (None, 7):
        raise ValueError(f"the served policy's action_dim is {desc['action_dim']}; the arm takes 7 (dpos, drot, gripper)")
    if instruction is None:
        known = desc.get("instructions") or []
        if len(known) != 1:
            raise ValueError("give --instruction" + (f" (the checkpoint was trained on {known})" if known else
                                                     " (the checkpoint records no training instruction)"))
        instruction = known[0]
    return instruction


def _run(args) -> int:
    from deploy.runtime.client import ClientConfig, PolicyLink, run_client
    from robot_io.gripper import gripper_mode
    from robot_io.robot import RobotClient
    from robot_io.security import keys_from_dir
    from robot_io.site import load_site

    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout}")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    site = load_site(args.site)
    keys = keys_from_dir(args.keys, args.key_name) if args.keys else site.security
    with PolicyLink(args.server, keys, insecure=args.insecure) as link:
        desc = link.describe(max(args.first_deadline, args.deadline))
        instruction = check_description(desc, site, args.instruction)
        gripper = args.gripper
        if gripper == "auto":  # a server from before the field, or a checkpoint that names none: raw
            gripper = gripper_mode(desc.get("gripper") or "raw", "the server's described 'gripper'")
        cfg = ClientConfig(hz=args.hz, seconds=args.seconds, blend=args.blend, ensemble_m=args.ensemble_m,
                           gripper=gripper, refill=args.refill, deadline_s=args.deadline,
                           max_misses=args.max_misses, first_deadline_s=args.first_deadline)
        # observe only the cameras the policy reads (the server names them; all of the site's otherwise)
        cams = desc.get("cameras")
        with RobotClient(site, cameras=list(cams) if cams is not None else None, timeout_s=args.timeout) as robot:
            if args.reset is not None:
                robot.reset(args.reset, timeout_s=120.0)  # a simulator settles its scene (slow on a busy CPU)
            print(f"vla-client: {desc.get('policy')} from {args.server} on {robot.site.name} at {args.hz:g} Hz, "
                  f"blend {args.blend}, gripper {gripper}, deadline {args.deadline:g} s, instruction "
                  f"{instruction!r}", flush=True)
            stats = run_client(robot, link, instruction, cfg, horizon=desc.get("horizon"), cameras=desc.get("cameras"))
    stats.update(server=args.server, policy=desc.get("policy"), site=site.name, instruction=instruction,
                 gripper=gripper, python=sys.version.split()[0])
    lat, req, jump = stats["latency_ms"], stats["request_ms"], stats["jump_arm"]
    print(f"{stats['ticks']} ticks at {stats['achieved_hz'] or 0:.2f} Hz (target {args.hz:g}); deadline misses "
          f"{stats['deadline_misses']}, skipped {stats['skipped_ticks']}, starved {stats['starved_ticks']}; latency "
          f"p50 {lat['p50'] or 0:.1f} ms p99 {lat['p99'] or 0:.1f} ms; {stats['replies']} chunks, request p50 "
          f"{req['p50'] or 0:.1f} ms p99 {req['p99'] or 0:.1f} ms; arm jump at chunk boundaries mean "
          f"{jump['boundary']['mean'] or 0:.4f} max {jump['boundary']['max'] or 0:.4f}, within chunks mean "
          f"{jump['within']['mean'] or 0:.4f}")
    if args.stats:
        tmp = args.stats + ".tmp"
        with open(tmp, "w") as f:
            json.dump(stats, f, indent=2)
        os.replace(tmp, args.stats)
    return 0
