"""`vla export`: a trained policy (compact VLA, optionally steered by a DSRL agent) or a success
classifier to an ONNX file the edge runner (`vla-edge`) runs with onnxruntime alone."""

from __future__ import annotations

import argparse


def add_parser(sub, name: str, help_: str) -> None:
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "Export to ONNX (opset 17) for the edge runtime. `policy`: the compact VLA's whole sampler -- camera "
        "frames, state and instruction to an action chunk, every Euler step of the flow head included, with "
        "the sampler's initial noise as an input; with --dsrl the DSRL noise actor chooses that noise. "
        "`classifier`: a success classifier (frames -> P(success)). The file carries its cameras, crops, "
        "image size, state / action layout, instructions and normalisation statistics in its metadata, "
        "so `vla-edge` needs nothing else. Every export checks parity against torch on random "
        "observations (fp32: max abs difference < 1e-4) and writes nothing if it fails."),
        epilog="""\
examples:
  vla export policy --checkpoint runs/vla_pick --instruction "pick up the red cube" --out deploy/pick.onnx
  vla export policy --checkpoint runs/vla_pick --dsrl runs/dsrl_red --out deploy/pick_dsrl.onnx --int8
  vla export classifier --classifier runs/towel_succ --out deploy/towel_succ.onnx
  vla-edge --policy deploy/pick.onnx --site sim-franka --hz 10 --seconds 30   # run it on the robot

The instruction is embedded at export (MiniLM does not run on the edge): name every prompt the
robot will be given with --instruction (repeat); the default is the instructions the checkpoint
was trained on. --int8 also writes NAME.int8.onnx (dynamic quantisation of the dense layers:
int8 weights per channel; the conv trunk stays fp32, quantising it cost success and speed); its
difference from torch is reported, not bounded -- check its success rate in sim before using it:
  vla eval --checkpoint deploy/pick.int8.onnx --task pick_red_cube --episodes 50
""")
    asub = p.add_subparsers(dest="export_command", metavar="WHAT", required=True)
    q = asub.add_parser("policy", help="the compact VLA's sampler (optionally DSRL-steered)",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Export the compact VLA's sampler (and a DSRL noise actor) to ONNX.",
                        epilog="examples:\n  vla export policy --checkpoint runs/vla_pick --instruction "
                               "\"pick up the red cube\" --out deploy/pick.onnx\n")
    q.add_argument("--checkpoint", required=True, help="compact VLA checkpoint or `vla train` run directory")
    q.add_argument("--instruction", action="append", dest="instructions", metavar="TEXT",
                   help="an instruction the robot will be given (repeat; default: the checkpoint's training "
                        "instructions)")
    q.add_argument("--dsrl", default=None, metavar="RUN",
                   help="a `vla rl --method dsrl` run directory (or its agent.pt): its noise actor steers the sampler")
    _common(q)
    q.set_defaults(run=run_policy)
    c = asub.add_parser("classifier", help="a success classifier (frames -> P(success))",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Export a success classifier written by `vla reward train` to ONNX.",
                        epilog="examples:\n  vla export classifier --classifier runs/towel_succ "
                               "--out deploy/towel_succ.onnx\n")
    c.add_argument("--classifier", required=True, help="directory written by `vla reward train`")
    _common(c)
    c.set_defaults(run=run_classifier)


def _common(q) -> None:
    q.add_argument("--out", required=True, help="the .onnx file to write (its folder is created)")
    q.add_argument("--int8", action="store_true", help="also write NAME.int8.onnx: dense layers dynamically quantised to int8")
    q.add_argument("--samples", type=int, default=8,
                   help="random observations per instruction in the parity check (default 8)")
    q.add_argument("--seed", type=int, default=0, help="seed of the parity check's random inputs")


def _print(rep: dict) -> None:
    import json

    p = rep["parity"]
    print(f"wrote {rep['path']} ({rep['bytes'] / 1e6:.1f} MB); parity vs torch: max abs diff "
          f"{p['max_abs_diff']:.2e} over {p['samples']} samples (bound 1e-4)")
    if "int8" in rep:
        q = rep["int8"]
        print(f"wrote {q['path']} ({q['bytes'] / 1e6:.1f} MB); int8 vs torch: max abs diff "
              f"{q['parity']['max_abs_diff']:.2e} (not bounded: check its success rate in sim)")
    print(json.dumps(rep))


def run_policy(args) -> int:
    import json
    import os

    from deploy.export import export_vla, load_dsrl_agent
    from vla.models import load_vla, resolve_checkpoint
    from vla.models.compact import CompactVLA

    if args.samples < 1:
        raise ValueError(f"--samples must be >= 1, got {args.samples}")
    ckpt = resolve_checkpoint(args.checkpoint)
    vla = load_vla(ckpt)
    if not isinstance(vla, CompactVLA):
        raise ValueError(f"{ckpt}: `vla export policy` supports the compact flow VLA; this is a "
                         f"{type(vla).__name__} (LeRobot policies are not exported yet)")
    instructions = args.instructions
    if not instructions:
        with open(os.path.join(ckpt, "config.json")) as f:
            instructions = json.load(f).get("instructions") or []
        if not instructions:
            raise ValueError(f"{ckpt} records no training instructions: pass --instruction TEXT (repeat)")
    agent = load_dsrl_agent(vla, args.dsrl) if args.dsrl else None
    from vla.envs import checkpoint_gripper

    _print(export_vla(vla, args.out, instructions, agent=agent, quantize=args.int8, samples=args.samples,
                      seed=args.seed, source=args.checkpoint, gripper=checkpoint_gripper(ckpt)))
    return 0


def run_classifier(args) -> int:
    from deploy.export import export_classifier
    from rewards.success_classifier import SuccessClassifier

    if args.samples < 1:
        raise ValueError(f"--samples must be >= 1, got {args.samples}")
    clf = SuccessClassifier.load(args.classifier)
    _print(export_classifier(clf, args.out, quantize=args.int8, samples=args.samples, seed=args.seed,
                             source=args.classifier))
    return 0
