"""`vla rig host | camera | mcu | agent | calibrate`: the keyboard rig, one part per process.

On the real rig the parts are machines: the host PC (the game on its screen), the camera, the
microcontroller (a USB keyboard to the host, serial to the edge device) and the edge device (the
agent). The emulated rig (site preset ``sim-rig``) runs each as its own process on one machine::

    vla rig host   --site sim-rig      # ALE at 60 Hz; keys from the MCU's HID reports; game_state stream
    vla rig camera --site sim-rig      # the simulated camera filming the host's stream
    vla rig mcu    --site sim-rig      # the emulated microcontroller on a pty, linked at the keyboard's port
    vla rig agent  --site sim-rig --policy random --seconds 30   # the edge: keyboard driver + env + policy
    vla rig calibrate --site sim-rig   # screen homography from the camera + key -> pixel latency

The site names the parts by kind: the ``screen`` device (driver ``ale_screen``), the camera that
films it, and the ``keyboard`` (``serial_keypresser``: the edge side of the microcontroller's
serial link). ``host`` and ``camera`` serve their device on the bridge (as ``vla bridge serve
--only``); ``agent`` serves the keyboard in its own process (the edge device owns the serial
port) and plays through ``robot_io.rig_env.RigEnv``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

SITE_HELP = "site YAML or preset with a screen, a camera filming it and a keyboard (default: sim-rig)"


def add_parser(sub, name: str, help_: str) -> None:
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=__doc__.split("\n\n")[1], epilog=__doc__.split("\n\n", 2)[2].split("The site")[0])
    rs = p.add_subparsers(dest="rig_command", metavar="PART", required=True)

    def common(sp):
        sp.add_argument("--site", default="sim-rig", help=SITE_HELP)
        sp.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")
        sp.add_argument("--exit-with-parent", nargs="?", type=int, const=0, default=None, metavar="PID",
                        help="stop when the process that started this one exits (bench and test harnesses)")

    h = rs.add_parser("host", help="the host screen: the game at 60 Hz, served on the bridge")
    common(h)
    h.set_defaults(run=run_host)
    c = rs.add_parser("camera", help="the camera filming the screen, served on the bridge")
    common(c)
    c.set_defaults(run=run_camera)
    m = rs.add_parser("mcu", help="the emulated microcontroller: a pty at the keyboard's port, HID reports to the host")
    common(m)
    m.set_defaults(run=run_mcu)

    a = rs.add_parser("agent", help="the edge agent: keyboard driver + RigEnv + a policy playing through the rig")
    a.add_argument("--site", default="sim-rig", help=SITE_HELP)
    a.add_argument("--policy", choices=("random", "dqn"), default="random", help="who plays (default random)")
    a.add_argument("--checkpoint", default=None, help="--policy dqn: the DQN run directory (or its model.pt)")
    a.add_argument("--epsilon", type=float, default=0.05, help="--policy dqn: epsilon-greedy (default 0.05)")
    a.add_argument("--seconds", type=float, default=None, help="play this long (default: --episodes)")
    a.add_argument("--episodes", type=int, default=1, help="whole games to play when --seconds is not given")
    a.add_argument("--max-steps", type=int, default=None, help="cut each episode after this many steps")
    a.add_argument("--frames-per-step", type=int, default=2,
                   help="camera frames per decision (the keys stay held meanwhile; 2 at 30 fps = 4 game ticks)")
    a.add_argument("--rectify", choices=("auto", "calibration", "detect", "none"), default="auto",
                   help="how camera frames are rectified: the camera's calibration file (calibration), markers "
                        "found in a frame now (detect), both in that order (auto, default), or not at all (none)")
    a.add_argument("--source", choices=("camera", "screen"), default="camera",
                   help="observe the camera (default) or the screen's own frames (no camera: emulation)")
    a.add_argument("--seed", type=int, default=0, help="seeds the game starts and the policy")
    a.add_argument("--stats", default=None, metavar="JSON", help="write the run's latency / frame statistics here")
    a.set_defaults(run=run_agent)

    k = rs.add_parser("calibrate", help="screen homography (ArUco) and key -> pixel latency over the bridge")
    k.add_argument("--site", default="sim-rig", help=SITE_HELP)
    k.add_argument("--out", default=None, help="calibration file (default: the camera's file in the site)")
    k.add_argument("--presses", type=int, default=12, help="key presses for the latency (default 12)")
    k.add_argument("--skip-screen", action="store_true", help="only the key latency")
    k.add_argument("--skip-latency", action="store_true", help="only the screen homography")
    k.set_defaults(run=run_calibrate)


# --------------------------------------------------------------------------------------------------
def rig_parts(site) -> dict[str, str]:
    """{"screen": name, "camera": name, "keyboard": name} of a site, found by each driver's kind."""
    import hardware

    parts: dict[str, str] = {}
    for name, spec in site.devices.items():
        kind = getattr(hardware.load_driver(spec.driver), "kind", "")
        if kind in ("screen", "camera", "keyboard") and kind not in parts:
            parts[kind] = name
    missing = [k for k in ("screen", "camera", "keyboard") if k not in parts]
    if missing:
        raise ValueError(f"site {site.name!r} has no {' / '.join(missing)} device: a rig site names a screen "
                         f"(ale_screen), a camera filming it and a keyboard (serial_keypresser); see sim-rig")
    return parts


def _serve(args, part: str) -> int:
    from robot_io.site import load_site
    from vla.commands.bridge import run_serve

    site = load_site(args.site)
    name = rig_parts(site)[part]
    return run_serve(argparse.Namespace(site=args.site, only=[name], insecure=False, duration=args.duration,
                                        exit_with_parent=args.exit_with_parent))


def run_host(args) -> int:
    return _serve(args, "screen")


def run_camera(args) -> int:
    return _serve(args, "camera")


def run_mcu(args) -> int:
    import threading

    from hardware.keyboard_mcu_emulator import main as mcu_main
    from robot_io.site import load_site

    site = load_site(args.site)
    parts = rig_parts(site)
    port = site.devices[parts["keyboard"]].params.get("port")
    hid = site.devices[parts["screen"]].params.get("hid_endpoint")
    if not port:
        raise ValueError(f"devices.{parts['keyboard']}.params.port: the path where the MCU's pty is linked is required")
    argv = ["--link", port, "--quiet"] + (["--hid", hid] if hid else [])
    if args.duration is not None or args.exit_with_parent is not None:
        parent = args.exit_with_parent or os.getppid()
        t_end = None if args.duration is None else time.monotonic() + args.duration

        def watch() -> None:
            while (t_end is None or time.monotonic() < t_end) and os.getppid() == parent:
                time.sleep(0.2)
            os.kill(os.getpid(), 15)  # SIGTERM: the emulator releases the keys and removes its link

        threading.Thread(target=watch, daemon=True).start()
    print(f"mcu: pty linked at {port}; HID reports to {hid or '(nowhere)'}", flush=True)
    return mcu_main(argv)


# --------------------------------------------------------------------------------------------------
class EdgeRig:
    """The edge device's side of a rig site: the keyboard served in this process (it owns the serial
    port), clients of the screen, camera and keyboard, the key sets of the game's actions."""

    def __init__(self, site_name: str, connect_timeout_s: float = 10.0) -> None:
        import hardware
        from hardware.ale_screen import KeyMap
        from robot_io.client import DeviceClient
        from robot_io.robot import _connectable
        from robot_io.site import build_servers, load_site

        self.site = load_site(site_name)
        self.parts = rig_parts(self.site)
        spec = {k: self.site.devices[v] for k, v in self.parts.items()}
        self.specs = spec
        deadline = time.monotonic() + connect_timeout_s
        while not os.path.exists(spec["keyboard"].params.get("port", "") or "/nonexistent"):
            if time.monotonic() > deadline:
                raise FileNotFoundError(f"no microcontroller at {spec['keyboard'].params.get('port')!r} "
                                        f"(is `vla rig mcu --site {site_name}` running?)")
            time.sleep(0.1)
        self.servers = build_servers(self.site, hardware.load_driver, only=[self.parts["keyboard"]])
        for s in self.servers:
            s.start()
        sec = self.site.security
        self.keyboard = DeviceClient(_connectable(spec["keyboard"].command), self.parts["keyboard"], 2.0, sec,
                                     heartbeat_hz=20)
        self.screen = DeviceClient(_connectable(spec["screen"].command), self.parts["screen"], 2.0, sec)
        self.camera = DeviceClient(_connectable(spec["camera"].command), self.parts["camera"], 2.0, sec)
        while True:  # the host and the camera may still be starting
            try:
                self.screen_desc = self.screen.describe()
                self.camera_desc = self.camera.describe()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        km = KeyMap(self.screen_desc["key_map"])
        self.action_names = tuple(self.screen_desc["actions"])
        self.key_sets = [km.keys_for(a) for a in self.action_names]

    def rectifier(self, mode: str = "auto"):
        """Camera frame -> the screen's picture: from the camera's calibration, or markers found now."""
        import numpy as np

        from calibration.screen import Rectifier, calibrate_screen

        if mode == "none":
            return None
        if mode in ("auto", "calibration"):
            try:
                return Rectifier.from_description(self.camera_desc)
            except ValueError:
                if mode == "calibration":
                    raise
        deadline = time.monotonic() + 5.0
        while True:
            try:
                image = np.asarray(self.camera.request("capture").arrays["rgb"])
                res = calibrate_screen(image)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        return Rectifier(res.H, res.frame_size)

    def env(self, rectify=None, source: str = "camera", frames_per_step: int = 2, max_episode_steps=None):
        from robot_io.rig_env import RigEnv

        return RigEnv(self.keyboard, self.screen, self.key_sets, camera_stream=self.specs["camera"].stream,
                      screen_stream=self.specs["screen"].stream, rectify=rectify, source=source,
                      frames_per_step=frames_per_step, max_episode_steps=max_episode_steps,
                      action_names=self.action_names)

    def close(self) -> None:
        for c in (self.keyboard, self.screen, self.camera):
            c.close()
        for s in self.servers:
            s.stop()


def play(env, policy, seconds: float | None, episodes: int, max_steps: int | None, seed: int,
         history: int = 0) -> dict:
    """Play through the rig: ``policy(obs_stack, prev_actions, rng) -> action`` (or None: uniformly random)
    for ``seconds`` of wall time or ``episodes`` games; ``prev_actions``: the last ``history`` actions
    played (a delay-aware agent's input). -> scores and the env's stats."""
    import numpy as np

    from policies.dqn.preprocess import ActionHistory, FrameStack, obs_picture

    rng = np.random.default_rng(seed)
    stack, hist = FrameStack(), ActionHistory(history)
    scores, t_end, ep = [], None if seconds is None else time.monotonic() + seconds, 0
    while True:
        obs, info = env.reset(seed=seed + ep)
        s, prev = stack.reset(obs_picture(obs)), hist.reset()
        steps, score, done = 0, 0.0, False
        while not done:
            a = int(rng.integers(env.action_space.n)) if policy is None else policy(s, prev, rng)
            obs, r, term, trunc, info = env.step(a)
            s, prev = stack.push(obs_picture(obs)), hist.push(a)
            score += r
            steps += 1
            done = term or trunc or (max_steps is not None and steps >= max_steps) or \
                (t_end is not None and time.monotonic() >= t_end)
        scores.append(score)
        ep += 1
        if (t_end is not None and time.monotonic() >= t_end) or (t_end is None and ep >= episodes):
            break
    return {"scores": scores, "episodes": len(scores), "rig": env.stats(),
            "latencies_ms": [round(x, 3) for x in env.latencies_ms]}


def run_agent(args) -> int:
    if args.policy == "dqn" and not args.checkpoint:
        raise ValueError("--policy dqn needs --checkpoint RUN (a DQN run directory or its model.pt)")
    if args.seconds is not None and args.seconds <= 0:
        raise ValueError(f"--seconds must be positive, got {args.seconds}")
    if args.frames_per_step < 1:
        raise ValueError(f"--frames-per-step must be >= 1, got {args.frames_per_step}")
    policy = None
    if args.policy == "dqn":
        import torch

        from policies.dqn.dqn import DQN

        torch.set_num_threads(1)
        agent = DQN.from_checkpoint(args.checkpoint)
        policy = lambda s, prev, rng: agent.act(s, args.epsilon, rng, prev)  # noqa: E731
    rig = EdgeRig(args.site)
    try:
        if policy is not None and agent.n_actions != len(rig.key_sets):
            raise ValueError(f"the DQN has {agent.n_actions} actions, the game on the screen {len(rig.key_sets)}")
        env = rig.env(rig.rectifier(args.rectify) if args.source == "camera" else None, args.source,
                      args.frames_per_step, args.max_steps)
        try:
            res = play(env, policy, args.seconds, args.episodes, args.max_steps, args.seed,
                       agent.cfg.action_history if policy is not None else 0)
            screen_end = rig.screen.describe()
        finally:
            env.close()
    finally:
        rig.close()
    res.update(policy=args.policy, source=args.source, frames_per_step=args.frames_per_step,
               camera=rig.camera_desc,
               screen={k: screen_end.get(k) for k in ("game", "fps", "stats", "keys", "hid_reports", "hid_bad_reports")})
    r = res["rig"]
    print(f"{res['episodes']} episode(s), scores {res['scores']}; frame->key p50 "
          f"{r.get('frame_to_key_ms_p50', float('nan')):.1f} ms p99 {r.get('frame_to_key_ms_p99', float('nan')):.1f} ms, "
          f"{r.get('decision_hz', 0):.1f} decisions/s, {r['frames_dropped']} frames dropped of "
          f"{r['frames_seen'] + r['frames_dropped']}", flush=True)
    if args.stats:
        tmp = args.stats + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f, indent=2, default=str)
        os.replace(tmp, args.stats)
    return 0


def run_calibrate(args) -> int:
    import numpy as np

    from calibration.io import save_section
    from calibration.screen import Rectifier, calibrate_screen, measure_key_latency
    from robot_io.client import StreamReader

    rig = EdgeRig(args.site)
    try:
        cam_spec = rig.specs["camera"]
        out = args.out or cam_spec.calibration
        image = np.asarray(rig.camera.request("capture").arrays["rgb"])
        res = calibrate_screen(image)
        print(f"screen: {res.markers_seen}/8 markers, residual {res.residual_px:.2f} frame px")
        if not args.skip_screen and out:
            save_section(out, res, device=rig.parts["camera"])
        if args.skip_latency:
            return 0
        rect = Rectifier(res.H, res.frame_size)
        frames = StreamReader(cam_spec.stream, "record", rig.site.security, name="calib-camera")
        rig.screen.request("reset", task="key_flash", timeout_s=5.0)
        key = rig.key_sets[1][0] if len(rig.key_sets) > 1 and rig.key_sets[1] else "SPACE"

        def press() -> int:
            t = time.monotonic_ns()
            rig.keyboard.request("key_press", keys=[key])
            return t

        def read_frame():
            m = frames.next(timeout_s=2.0)
            if m is None:
                raise TimeoutError("no camera frame within 2 s")
            return int(m.t_mono_ns), np.asarray(m.arrays["rgb"])

        try:
            lat = measure_key_latency(press, lambda: rig.keyboard.request("key_release_all"), read_frame,
                                      presses=args.presses, rectify=rect,
                                      camera_fps=float(rig.camera_desc.get("fps", 30)))
        finally:
            frames.close()
            rig.screen.request("reset", task=rig.screen_desc.get("game") or "pong", timeout_s=5.0)
        print(f"key -> pixel latency: median {lat.median_ms:.1f} ms, p90 {lat.p90_ms:.1f} ms over {lat.presses} presses "
              f"(camera configured latency {rig.camera_desc.get('latency_ms')} ms)")
        if out:
            save_section(out, lat, device=rig.parts["camera"])
            print(f"wrote {out}")
        else:
            print("no calibration file named (site devices.<camera>.calibration or --out): not saved", file=sys.stderr)
    finally:
        rig.close()
    return 0
