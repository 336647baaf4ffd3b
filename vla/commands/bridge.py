"""`vla bridge`: serve a site's devices, ping them, list them, make CurveZMQ keys."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

SITE_HELP = "a site YAML file, or a preset name (sim-franka, sim-franka-fast, franka-lab)"


def add_parser(sub, name: str, help_: str) -> None:
    p = sub.add_parser(name, help=help_, description=(
        "The ZMQ hardware bridge. Every device of a site (arm, cameras) is served on its own command "
        "endpoint (DEALER/ROUTER: typed commands, replies with the command actually applied) and stream "
        "endpoint (PUB: states and frames). A watchdog puts a device in its safe state when commands stop; "
        "safety limits are enforced in the server. Off loopback, CurveZMQ keys are required. A site is a YAML file naming the devices, their drivers, "
        "endpoints, limits and keys, or the name of a preset (sim-franka, sim-franka-fast, franka-lab)."),
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""\
examples:
  vla bridge serve --site sim-franka            # simulated Franka + front/wrist cameras, real time
  vla bridge serve --site my_lab.yaml --only arm
  vla bridge ping --site sim-franka --count 20
  vla bridge devices --site franka-lab
  vla bridge keys --out keys/                   # CurveZMQ keys for a site bound off loopback
""")
    bsub = p.add_subparsers(dest="bridge_command", metavar="ACTION", required=True)

    s = bsub.add_parser("serve", help="serve every device of a site until Ctrl-C",
                        description="Start one device server per device of the site and serve until interrupted "
                                    "(SIGINT/SIGTERM put every device in its safe state before exiting).")
    s.add_argument("--site", required=True, help=SITE_HELP)
    s.add_argument("--only", nargs="+", metavar="DEVICE", help="serve only these devices of the site")
    s.add_argument("--insecure", action="store_true",
                   help="allow binding off loopback WITHOUT CurveZMQ authentication (anyone on the network "
                        "could command the robot; for isolated networks only)")
    s.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: run until Ctrl-C)")
    s.add_argument("--exit-with-parent", nargs="?", type=int, const=0, default=None, metavar="PID",
                   help="stop (devices to their safe state) when the process that started this bridge exits, even "
                        "if it was killed: what `vla record / eval / rl` use for the sim bridge they start. Give "
                        "the starter's PID so that a starter killed while the bridge is still starting is noticed "
                        "too (default: the parent process at start-up)")
    s.set_defaults(run=run_serve)

    pg = bsub.add_parser("ping", help="print each device's command round-trip time",
                         description="Send `ping` commands to every device of a running site and print the "
                                     "round-trip times (ms).")
    pg.add_argument("--site", required=True, help=SITE_HELP)
    pg.add_argument("--count", type=int, default=10, help="pings per device (default 10)")
    pg.add_argument("--timeout", type=float, default=1.0, help="seconds to wait for each reply (default 1)")
    pg.set_defaults(run=run_ping)

    d = bsub.add_parser("devices", help="list a site's devices, drivers and endpoints (asks running servers too)",
                        description="Print the devices a site file declares; with --query also ask each running "
                                    "server to describe itself (limits, image sizes, ...).")
    d.add_argument("--site", required=True, help=SITE_HELP)
    d.add_argument("--query", action="store_true", help="ask running servers for their description")
    d.set_defaults(run=run_devices)

    k = bsub.add_parser("keys", help="write a CurveZMQ server key pair and client key pairs",
                        description="Write CurveZMQ certificates: server.key / server.key_secret, one key pair per "
                                    "client, and the authorized_clients/ folder the server reads.")
    k.add_argument("--out", required=True, help="folder to write the keys into")
    k.add_argument("--clients", nargs="+", default=["client"], help="client names (default: client)")
    k.set_defaults(run=run_keys)


def run_serve(args) -> int:
    # Read the parent first: if the starter dies while the devices are starting, this process is
    # re-parented and a later getppid() would name the new parent, not the starter.
    parent = None
    if args.exit_with_parent is not None:
        parent = args.exit_with_parent or os.getppid()
        if os.getppid() != parent:
            print(f"the process that started this bridge ({parent}) is gone: not starting", flush=True)
            return 1
    import hardware
    from robot_io.site import build_servers, load_site

    site = load_site(args.site)
    servers = build_servers(site, hardware.load_driver, insecure=args.insecure, only=args.only)
    started = []
    try:
        for srv in servers:
            started.append(srv.start())
            print(f"{srv.service.kind:>7} {srv.name:<10} commands {srv.command_endpoint:<24} "
                  f"stream {srv.stream_endpoint or '-'}", flush=True)
        print(f"bridge '{site.name}' serving {len(started)} device(s); Ctrl-C to stop", flush=True)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        t_end = None if args.duration is None else time.monotonic() + args.duration
        while not stop.wait(0.2):
            if t_end is not None and time.monotonic() > t_end:
                break
            if parent is not None and os.getppid() != parent:  # re-parented: the starter is gone
                print("the process that started this bridge exited: stopping", flush=True)
                break
            for srv in started:
                if srv.stream_error is not None:
                    print(f"device {srv.name!r}: stream failed: {srv.stream_error}", file=sys.stderr)
                    return 1
    finally:
        for srv in reversed(started):
            srv.stop()
    print("bridge stopped; every device put in its safe state", flush=True)
    return 0


def run_ping(args) -> int:
    import numpy as np

    from robot_io.client import BridgeError, DeviceClient
    from robot_io.robot import _connectable
    from robot_io.site import load_site

    site = load_site(args.site)
    rc = 0
    for name, spec in site.devices.items():
        with DeviceClient(_connectable(spec.command), name, args.timeout, site.security) as cl:
            try:
                rtt = np.array([cl.ping() for _ in range(args.count)]) * 1e3
                print(f"{name:<10} {spec.command:<26} rtt p50 {np.percentile(rtt, 50):7.3f} ms  "
                      f"min {rtt.min():7.3f}  max {rtt.max():7.3f}  (n={args.count})")
            except BridgeError as e:
                print(f"{name:<10} {spec.command:<26} NO ANSWER: {e}")
                rc = 1
    return rc


def run_devices(args) -> int:
    import json

    from robot_io.client import BridgeError, DeviceClient
    from robot_io.robot import _connectable
    from robot_io.site import load_site

    site = load_site(args.site)
    print(f"site {site.name}  ({site.path})")
    if site.description:
        print("  " + " ".join(site.description.split()))
    print(f"  auth: {'CurveZMQ' if site.security else 'none (loopback only)'}")
    for name, spec in site.devices.items():
        print(f"  {name:<10} driver {spec.driver:<18} commands {spec.command:<24} stream {spec.stream or '-'}")
        if args.query:
            with DeviceClient(_connectable(spec.command), name, 1.0, site.security) as cl:
                try:
                    print("    " + json.dumps(cl.describe(), default=str))
                except BridgeError as e:
                    print(f"    (no answer: {e})")
    return 0


def run_keys(args) -> int:
    from robot_io.security import make_keys

    paths = make_keys(args.out, tuple(args.clients))
    for k, v in paths.items():
        print(f"{k:<20} {v}")
    print("Put these paths in the site file's `security:` section; keep *.key_secret files private.")
    return 0
