"""`vla serve`: a VLA (+ a DSRL agent) on a GPU box, action chunks for thin robot clients."""

from __future__ import annotations

import argparse

EPILOG = """\
examples:
  vla serve --checkpoint runs/vla_pick --bind tcp://127.0.0.1:5700           # same machine as the client
  vla serve --checkpoint runs/vla_pick --rl-run runs/dsrl_red --bind tcp://0.0.0.0:5700 --keys keys/
  vla-client --server tcp://gpu-box:5700 --keys keys/ --site my_lab.yaml --hz 10   # on the robot

The client (`vla-client` or `python -m deploy.runtime client`, no torch) streams observations in the
bridge's wire format and receives action chunks asynchronously; see `vla-client --help`. Off
loopback the server needs CurveZMQ keys: `vla bridge keys --out keys/` makes a set (server key pair,
authorized client keys), the same set the bridge uses. A malformed request gets an error reply
naming the field; the server keeps serving. Ctrl-C or SIGTERM stops it; clients then put their
arm in its safe state within their deadline.
"""


def add_parser(sub, name: str, help_: str) -> None:
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Serve a VLA checkpoint (optionally steered by a DSRL agent's noise actor) to thin "
                                   "robot clients over ZMQ: observation in, action chunk [H, A] out.")
    p.add_argument("--checkpoint", required=True, help="VLA checkpoint or `vla train` run directory (any backbone "
                                                       "`vla eval` loads: compact, pi0, SmolVLA)")
    p.add_argument("--rl-run", default=None, metavar="RUN",
                   help="a `vla rl --method dsrl` run directory (or its agent.pt): its noise actor chooses the "
                        "sampler's initial noise (the actor's mean unless --rl-sample)")
    p.add_argument("--rl-sample", action="store_true", help="sample the DSRL actor's noise instead of its mean")
    p.add_argument("--noise", choices=["sample", "zero"], default="sample",
                   help="without --rl-run, the sampler's starting noise: one N(0, I) draw per chunk (default, the "
                        "policy as trained) or zero (deterministic: what `vla eval --noise zero` measures; the "
                        "shipped base's figures in bench/results/vla_sft are at zero noise)")
    p.add_argument("--bind", default="tcp://127.0.0.1:5700",
                   help="ZMQ endpoint to serve on (default tcp://127.0.0.1:5700; tcp://0.0.0.0:PORT for the network)")
    p.add_argument("--keys", default=None, metavar="DIR",
                   help="CurveZMQ key folder from `vla bridge keys` (server.key_secret, authorized_clients/); "
                        "required off loopback")
    p.add_argument("--insecure", action="store_true",
                   help="allow binding off loopback WITHOUT CurveZMQ (for isolated networks only)")
    p.add_argument("--device", default="auto", help="torch device: auto (cuda if available), cpu, cuda, cuda:1 ...")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--seconds", type=float, default=0.0, help="stop after this many seconds (default 0: until Ctrl-C)")
    p.set_defaults(run=run)


def run(args) -> int:
    import signal
    import threading

    import torch

    from deploy.server import PolicyServer, load_source
    from robot_io.security import keys_from_dir

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.seconds < 0:
        raise ValueError(f"--seconds must be >= 0, got {args.seconds}")
    source = load_source(args.checkpoint, args.rl_run, device=args.device, rl_sample=args.rl_sample,
                         noise=args.noise)
    print(f"vla serve: warm-up chunk {source.warmup():.1f} s", flush=True)  # not on a client's first deadline
    server = PolicyServer(source, args.bind, keys=keys_from_dir(args.keys), insecure=args.insecure)
    endpoint = server.bind()
    d = server.description
    print(f"vla serve: {d['policy']} on {endpoint} (chunk [{d['horizon']}, {d['action_dim']}], cameras "
          f"{d['cameras']}, {'CurveZMQ' if args.keys else 'no auth'})", flush=True)

    def _sigterm(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _sigterm)
    if args.seconds:
        timer = threading.Timer(args.seconds, server.stop)
        timer.daemon = True
        timer.start()
    try:
        server.serve()
    finally:
        print(f"vla serve: stopped after {server.stats['chunks']} chunks, {server.stats['errors']} refused requests",
              flush=True)
    return 0
