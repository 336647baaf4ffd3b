"""`vla`: one command line for the whole stack.

Each subcommand lives in its own module and is imported only when it runs, so `vla --help`
and `vla bridge ...` start fast and never import torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# MuJoCo reads MUJOCO_GL when it is first imported: headless EGL unless the user chose otherwise.
os.environ.setdefault("MUJOCO_GL", "egl")

# subcommand -> (module, one-line help). Each module defines add_parser(subparsers) and run(args).
COMMANDS: dict[str, tuple[str, str]] = {
    "bridge": ("vla.commands.bridge", "serve devices over the ZMQ hardware bridge, ping them, list them, make keys"),
    "demo": ("vla.commands.demo", "the main job on the simulated default: sim Franka bridge, scripted motion, plots"),
    "record": ("vla.commands.record", "record teleop or scripted demonstrations into a LeRobot v3 dataset"),
    "replay": ("vla.commands.replay", "replay a recorded episode through the bridge"),
    "dataset": ("vla.commands.dataset", "check, repair or view a LeRobot v3 dataset"),
    "train": ("vla.commands.train", "supervised fine-tuning of the compact VLA on LeRobot datasets (frozen / LoRA / full)"),
    "tokens": ("vla.commands.tokens", "ExToken's behaviour prior: k-means over demonstrations -> behaviour tokens for `vla train --tokens`"),
    "rl": ("vla.commands.rl", "online RL session that steers a frozen VLA (DSRL latent-noise SAC), with resume"),
    "eval": ("vla.commands.eval", "roll a VLA checkpoint out in the sim tasks: success rate per task, videos"),
    "reward": ("vla.commands.reward", "train / evaluate a success classifier on camera frames: the reward on real robots"),
    "export": ("vla.commands.export", "export a policy (compact VLA, + DSRL) or a success classifier to ONNX for the edge"),
    "calibrate": ("vla.commands.calibrate", "camera intrinsics, hand-eye and device latency, saved where the site names them"),
    "serve": ("vla.commands.serve", "serve a VLA (+ DSRL) on a GPU box to thin robot clients (`vla-client`)"),
    "rig": ("vla.commands.rig", "the keyboard rig (Atari through a camera and a USB keyboard): host, camera, mcu, agent, calibrate"),
}

EPILOG = """\
examples:
  vla demo                                   # sim Franka over the bridge; frames + tracking plot in runs/
  vla bridge serve --site sim-franka         # serve the simulated Franka and its cameras
  vla bridge ping --site sim-franka          # round-trip time of every device
  vla bridge devices --site sim-franka       # what a site serves, and where
  vla record --robot sim-franka --task pick_red_cube --teleop scripted --episodes 20 --root data/pick
  vla dataset check --root data/pick         # every file readable, lerobot opens it
  vla replay --robot sim-franka --root data/pick --episode 0
  vla tokens --dataset data/pick --k 4 --out runs/pick_tokens.json   # ExToken: demos' behaviour modes -> tokens
  vla export policy --checkpoint runs/vla_pick --out deploy/pick.onnx   # ONNX for `vla-edge`
  vla calibrate intrinsics --robot my_lab.yaml --camera front           # ChArUco views -> K, distortion
  vla serve --checkpoint runs/vla_pick --bind tcp://127.0.0.1:5700      # chunks for `vla-client`

Every device (robot arm, cameras, ...) sits behind one ZMQ bridge; simulators are the default,
so all of this runs on a laptop. `vla SUBCOMMAND --help` explains each subcommand.
"""


def _user_errors() -> tuple[type[BaseException], ...]:
    from robot_io.client import BridgeError
    from robot_io.security import SecurityError
    from robot_io.site import SiteError
    from session.protocol import RemoteRLError  # imports no torch

    return (SiteError, SecurityError, BridgeError, RemoteRLError, FileNotFoundError, ValueError, KeyError)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vla",
        description="Fine-tune and steer vision-language-action policies on real robots (or their simulators).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = p.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    for name, (module, help_) in COMMANDS.items():
        importlib.import_module(module).add_parser(sub, name, help_)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    USER_ERRORS = _user_errors()
    level = logging.WARNING - 10 * args.verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args) or 0)
    except USER_ERRORS as e:  # a problem the user can fix: one clear line, no traceback (-v shows it)
        if args.verbose:
            raise
        print(f"vla {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
