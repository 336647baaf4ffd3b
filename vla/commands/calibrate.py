"""`vla calibrate intrinsics | hand-eye | latency`: calibration files for a site's cameras and devices.

Each subcommand writes one section of a device's calibration file (``calibration/io.py``), by
default the file the site names for the device (``devices.<name>.calibration``); the bridge
loads it when it serves the device (a camera gets its K and distortion, every section shows in
the device's ``describe``). Views are taken over the bridge: the arm is driven through poses
around the board (``calibration.collect``), or a person moves the board in front of a fixed
camera, or they are read from a folder saved earlier (``--from``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

SITE_HELP = "site YAML or preset (for a simulated check: a sim_franka site with params.calibration_board)"

EPILOG = """\
examples:
  # the simulated cell with a ChArUco board on a stand (site params: calibration_board: table)
  vla calibrate intrinsics --robot calib_sim.yaml --camera wrist --drive-arm --poses 15 --coverage runs/wrist_cov.png
  vla calibrate hand-eye   --robot calib_sim.yaml --camera wrist --poses 12
  vla calibrate latency    --robot calib_sim.yaml --count 200
  # a real cell: a person moves a printed board in front of a fixed camera, one view a second
  vla calibrate intrinsics --robot my_lab.yaml --camera front --poses 20 --interval 1.0
  # a board held in the gripper, seen by a fixed camera (the camera's pose in the base frame)
  vla calibrate hand-eye --robot my_lab.yaml --camera front --mode eye-to-hand --poses 15

Without --out a result goes into the file the site names for the device
(devices.<name>.calibration); other sections of that file are kept.
"""


# calibration.board.BoardSpec's defaults (a test keeps them equal), here so that `vla --help` imports no OpenCV
BOARD_DEFAULTS = {"squares_x": 9, "squares_y": 6, "square_m": 0.05, "marker_m": 0.037, "dictionary": "DICT_4X4_50"}


def _board_args(p: argparse.ArgumentParser) -> None:
    d = argparse.Namespace(**BOARD_DEFAULTS)
    g = p.add_argument_group("board (a simulated cell tells its own board; these are for a printed one)")
    g.add_argument("--squares", default=f"{d.squares_x}x{d.squares_y}", metavar="XxY",
                   help=f"chessboard squares across x down (default {d.squares_x}x{d.squares_y})")
    g.add_argument("--square-mm", type=float, default=d.square_m * 1000, help="measured side of a square, mm")
    g.add_argument("--marker-mm", type=float, default=d.marker_m * 1000, help="measured side of a marker, mm")
    g.add_argument("--dictionary", default=d.dictionary, help=f"ArUco dictionary (default {d.dictionary})")


def _drive_args(p: argparse.ArgumentParser, poses: int, max_angle: float) -> None:
    g = p.add_argument_group("driving the arm")
    g.add_argument("--poses", type=int, default=poses, help=f"views to take (default {poses})")
    g.add_argument("--mode", choices=("eye-in-hand", "eye-to-hand"), default="eye-in-hand",
                   help="eye-in-hand: the camera rides on the gripper, the board is fixed (default); "
                        "eye-to-hand: the camera is fixed, the board rides on the gripper")
    g.add_argument("--look-at", type=float, nargs=3, metavar=("X", "Y", "Z"), default=None,
                   help="eye-in-hand: the board's centre, roughly, in the base frame (m): the gripper turns "
                        "about it so that the board stays in view (default: a simulated cell's board; else "
                        "0.4 m along the gripper's approach axis)")
    g.add_argument("--max-angle", type=float, default=max_angle, help=f"largest tilt, degrees (default {max_angle:g})")
    g.add_argument("--distance", type=float, nargs=2, default=None, metavar=("LO", "HI"),
                   help="scale the pivot-to-gripper distance by LO..HI (default 0.85 1.1; a simulated cell, whose "
                        "home pose is far from its board: 0.55 0.75)")
    g.add_argument("--save-views", default=None, metavar="DIR", help="also save the views (PNG + views.json)")


def add_parser(sub, name: str, help_: str) -> None:
    p = sub.add_parser(name, help=help_, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "Calibrate a site's cameras and devices over the bridge and save the results where the site "
        "names them: camera intrinsics from ChArUco views, the camera's pose relative to the arm "
        "(hand-eye), and each device's clock offset and latency to this host."), epilog=EPILOG)
    csub = p.add_subparsers(dest="calibrate_command", metavar="WHAT", required=True)

    i = csub.add_parser("intrinsics", help="camera matrix and distortion from ChArUco views",
                        formatter_class=argparse.RawDescriptionHelpFormatter, description=(
                            "Find a ChArUco board in 10-20 views (OpenCV's CharucoDetector + matchImagePoints), "
                            "solve K and the distortion (cv2.calibrateCamera), print the reprojection error per "
                            "view and draw where the corners were seen (--coverage). Good views tilt the board "
                            "20-45 degrees in different directions and together cover the whole image."),
                        epilog="""\
examples:
  vla calibrate intrinsics --robot calib_sim.yaml --camera wrist --drive-arm --coverage runs/wrist_cov.png
  vla calibrate intrinsics --robot my_lab.yaml --camera front --poses 20 --interval 1.0
  vla calibrate intrinsics --from runs/wrist_views --out calib/wrist.yaml --device wrist
""")
    i.add_argument("--robot", default=None, help=SITE_HELP)
    i.add_argument("--camera", default=None, help="the site's camera to calibrate")
    i.add_argument("--drive-arm", action="store_true",
                   help="move the arm through --poses poses (a camera on the gripper looking at a fixed board, or "
                        "a board in the gripper shown to a fixed camera); without it, take a frame every --interval "
                        "seconds while a person moves the board, keeping frames that show it from a new angle")
    i.add_argument("--interval", type=float, default=1.0, help="seconds between frames without --drive-arm (default 1)")
    i.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds without --drive-arm")
    i.add_argument("--shift", type=float, default=12.0,
                   help="with --drive-arm: also turn the gripper up to this many degrees so the board visits the "
                        "image's edges (default 12)")
    i.add_argument("--from", dest="from_dir", default=None, metavar="DIR",
                   help="calibrate from the images (*.png, *.jpg) in DIR instead of the bridge")
    i.add_argument("--coverage", default=None, metavar="PNG",
                   help="write the coverage picture here (default: next to the calibration file)")
    i.add_argument("--out", default=None, help="calibration file to write (default: the camera's file in the site)")
    i.add_argument("--device", default=None, help="device name recorded in the file (default: --camera)")
    i.add_argument("--fix-k3", action="store_true", help="fix the k3 distortion term at 0 (few or near-frontal views)")
    i.add_argument("--serve", default="auto", choices=("auto", "always", "never"),
                   help="start the bridge for a simulated site that is not running (auto, default)")
    _drive_args(i, poses=15, max_angle=25.0)
    _board_args(i)
    i.set_defaults(run=run_intrinsics)

    h = csub.add_parser("hand-eye", help="the camera's pose relative to the arm (cv2.calibrateHandEye)",
                        formatter_class=argparse.RawDescriptionHelpFormatter, description=(
                            "Drive the arm through poses around the board, find the board's pose in each image "
                            "with the camera's intrinsics, and solve AX = XB (cv2.calibrateHandEye). eye-in-hand "
                            "gives the camera's pose in the gripper (TCP) frame, eye-to-hand its pose in the robot "
                            "base frame. The residual is the spread of the board's pose implied by each view."),
                        epilog="""\
examples:
  vla calibrate hand-eye --robot calib_sim.yaml --camera wrist --poses 12
  vla calibrate hand-eye --robot my_lab.yaml --camera wrist --look-at 0.5 0.0 0.02 --method auto
  vla calibrate hand-eye --robot my_lab.yaml --camera front --mode eye-to-hand --poses 15
  vla calibrate hand-eye --from runs/wrist_views --intrinsics calib/wrist.yaml --out calib/wrist.yaml
""")
    h.add_argument("--robot", default=None, help=SITE_HELP)
    h.add_argument("--camera", default=None, help="the site's camera")
    h.add_argument("--intrinsics", default=None, metavar="FILE",
                   help="calibration file with the camera's intrinsics (default: the camera's file in the site)")
    h.add_argument("--method", default="park", choices=("auto", "tsai", "park", "horaud", "andreff", "daniilidis"),
                   help="cv2.calibrateHandEye method; auto tries each and keeps the smallest residual (default park)")
    h.add_argument("--from", dest="from_dir", default=None, metavar="DIR",
                   help="solve from views saved by --save-views instead of the bridge")
    h.add_argument("--out", default=None, help="calibration file to write (default: the camera's file in the site)")
    h.add_argument("--device", default=None, help="device name recorded in the file (default: --camera)")
    h.add_argument("--serve", default="auto", choices=("auto", "always", "never"),
                   help="start the bridge for a simulated site that is not running (auto, default)")
    _drive_args(h, poses=12, max_angle=25.0)
    _board_args(h)
    h.set_defaults(run=run_hand_eye)

    la = csub.add_parser("latency", help="clock offset and round trip between this host and each device",
                         formatter_class=argparse.RawDescriptionHelpFormatter, description=(
                             "Ping each device (NTP-style: the bridge's message headers carry each side's "
                             "monotonic and wall clocks) for the clock offset and the round trip, and time its "
                             "stream (capture -> arrival on this host). Saved into each device's calibration file "
                             "when the site names one."),
                         epilog="""\
examples:
  vla calibrate latency --robot calib_sim.yaml
  vla calibrate latency --robot my_lab.yaml --device front --count 500 --out calib/front.yaml
""")
    la.add_argument("--robot", required=True, help=SITE_HELP)
    la.add_argument("--device", nargs="+", default=None, help="devices to measure (default: all of the site)")
    la.add_argument("--count", type=int, default=200, help="pings per device (default 200)")
    la.add_argument("--stream-count", type=int, default=50, help="stream messages timed per device (default 50)")
    la.add_argument("--out", default=None, help="calibration file to write (one device only; default: the site's)")
    la.add_argument("--no-save", action="store_true", help="print only")
    la.add_argument("--serve", default="auto", choices=("auto", "always", "never"),
                    help="start the bridge for a simulated site that is not running (auto, default)")
    la.set_defaults(run=run_latency)

    sc = csub.add_parser("screen", help="the keyboard rig: ArUco markers around the screen -> homography that "
                         "rectifies the screen to the game's frame",
                         formatter_class=argparse.RawDescriptionHelpFormatter, description=(
                             "Find the ArUco markers taped around the rig's screen (calibration/screen.py: 8 markers, "
                             "corners and side middles, positions in game-frame pixels) in one camera frame and solve "
                             "the homography camera pixel -> game frame pixel (cv2.aruco.ArucoDetector + "
                             "cv2.findHomography). With the camera's intrinsics in its calibration file the corners are "
                             "undistorted first. Saved as the `screen` section of the camera's calibration file; the "
                             "agent rectifies with calibration.screen.Rectifier."),
                         epilog="""\
examples:
  vla calibrate screen --robot rig.yaml --camera screen_cam
  vla calibrate screen --from frame.png --out calib/screen_cam.yaml --device screen_cam
""")
    sc.add_argument("--robot", default=None, help="site YAML with the camera that films the screen")
    sc.add_argument("--camera", default=None, help="the site's camera that films the screen")
    sc.add_argument("--from", dest="from_image", default=None, metavar="IMAGE",
                    help="solve from a saved camera image (PNG/JPG) instead of the bridge")
    sc.add_argument("--marker-px", type=float, default=28.0, help="side of a marker in game-frame pixels (default 28)")
    sc.add_argument("--gap-px", type=float, default=6.0, help="picture edge -> marker quiet zone, frame pixels (default 6)")
    sc.add_argument("--quiet-px", type=float, default=6.0, help="white border around a marker, frame pixels (default 6)")
    sc.add_argument("--frame-size", type=int, nargs=2, default=(160, 210), metavar=("W", "H"),
                    help="the game's frame (default ALE's 160 210)")
    sc.add_argument("--dictionary", default="DICT_4X4_50", help="ArUco dictionary (default DICT_4X4_50)")
    sc.add_argument("--no-intrinsics", action="store_true", help="ignore the intrinsics in the calibration file")
    sc.add_argument("--out", default=None, help="calibration file to write (default: the camera's file in the site)")
    sc.add_argument("--device", default=None, help="device name recorded in the file (default: --camera)")
    sc.add_argument("--serve", default="auto", choices=("auto", "always", "never"),
                    help="start the bridge for a simulated site that is not running (auto, default)")
    sc.set_defaults(run=run_screen)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _board_from_args(args, description: dict | None = None):
    from calibration.board import BoardSpec

    if description and description.get("calibration_board"):  # a simulated cell prints its own board
        b = description["calibration_board"]
        return BoardSpec.from_dict({k: b[k] for k in ("squares_x", "squares_y", "square_m", "marker_m", "dictionary")})
    try:
        sx, sy = (int(v) for v in args.squares.lower().split("x"))
    except ValueError:
        raise ValueError(f"--squares must look like 9x6, got {args.squares!r}") from None
    return BoardSpec(squares_x=sx, squares_y=sy, square_m=args.square_mm / 1000, marker_m=args.marker_mm / 1000,
                     dictionary=args.dictionary)


def _site_and_camera(args):
    from robot_io.site import load_site

    if args.robot is None:
        raise ValueError("name the site with --robot (or calibrate offline with --from DIR)")
    site = load_site(args.robot)
    if args.camera is None:
        cams = [n for n, d in site.devices.items() if d.driver.endswith("camera")]
        raise ValueError(f"name the camera with --camera; the site's cameras: {', '.join(cams) or 'none'}")
    if args.camera not in site.devices:
        raise ValueError(f"site {site.name!r} has no device {args.camera!r}; devices: {', '.join(site.devices)}")
    return site, site.devices[args.camera]


def _bridge_log(site) -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"vla-calibrate-{site.name}-bridge.log")


def _out_path(args, spec, what: str) -> str:
    path = args.out or (spec.calibration if spec is not None else None)
    if path is None:
        name = spec.name if spec is not None else "the device"
        raise ValueError(f"where should the {what} go? pass --out FILE, or set devices.{name}.calibration in the site")
    return path


def _pivot(args, description: dict, T_start):
    """The point the gripper turns about (see calibration.collect)."""
    import numpy as np

    from calibration import geometry as G

    if args.mode == "eye-to-hand":
        return T_start[:3, 3].copy()
    if args.look_at is not None:
        return np.asarray(args.look_at, np.float64)
    b = description.get("calibration_board")
    if b and b.get("mount") == "table":  # the simulated board's centre
        return np.asarray(b["pos"]) + G.quat_to_mat(b["quat"]) @ np.array(
            [b["squares_x"] * b["square_m"] / 2, b["squares_y"] * b["square_m"] / 2, 0.0])
    return T_start[:3, 3] + 0.4 * T_start[:3, 2]


def _drive(args, site, camera: str, shift_deg: float = 0.0):
    """Connect, plan the poses, visit them, go back to the start; returns (views, arm description)."""
    import numpy as np

    from calibration import collect as C
    from robot_io.bridge_process import running_bridge
    from robot_io.robot import RobotClient

    if site.arm is None:
        raise ValueError(f"site {site.name!r} names no arm (robot.arm): --drive-arm and hand-eye need one")
    log_path = _bridge_log(site)
    with running_bridge(site, log_path, start=args.serve):
        robot = RobotClient(site, cameras=[camera], timeout_s=30.0)
        try:
            state = C.arm_state(robot)
            q_start = np.asarray(state["q"], np.float64)
            T_start = C.pose_of(state)
            pivot = _pivot(args, robot.description, T_start)
            distance = args.distance or ((0.55, 0.75) if robot.description.get("calibration_board") else (0.85, 1.1))
            poses = C.view_poses(T_start, pivot, args.poses, args.max_angle, tuple(distance), shift_deg=shift_deg)
            print(f"{args.poses} poses about ({pivot[0]:.3f}, {pivot[1]:.3f}, {pivot[2]:.3f}) m, tilts up to "
                  f"{args.max_angle:g} deg, camera {camera!r}", flush=True)

            def report(i, v):
                print(f"  view {i + 1}/{args.poses}: {'reached' if v.reached else 'NOT reached (using where it stopped)'}",
                      flush=True)

            views = C.collect(robot, camera, poses, on_view=report)
            C.move_joints(robot, q_start)  # leave the arm where it was
            return views, robot.description
        finally:
            robot.close()


def _save_views(folder: str, images, poses=None) -> None:
    import cv2

    os.makedirs(folder, exist_ok=True)
    meta = []
    for k, img in enumerate(images):
        name = f"view_{k:03d}.png"
        cv2.imwrite(os.path.join(folder, name), img[:, :, ::-1])
        meta.append({"image": name, **({"T_base_gripper": poses[k].tolist()} if poses is not None else {})})
    with open(os.path.join(folder, "views.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"saved {len(meta)} views to {folder}")


def _load_views(folder: str, need_poses: bool):
    import cv2
    import numpy as np

    meta_path = os.path.join(folder, "views.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        names = [m["image"] for m in meta]
    else:
        if need_poses:
            raise FileNotFoundError(f"{meta_path}: hand-eye needs the gripper poses saved with the views "
                                    "(`vla calibrate hand-eye --save-views DIR`)")
        meta, names = None, sorted(n for n in os.listdir(folder) if n.lower().endswith((".png", ".jpg", ".jpeg")))
    if not names:
        raise FileNotFoundError(f"no images in {folder}")
    images = []
    for n in names:
        img = cv2.imread(os.path.join(folder, n), cv2.IMREAD_COLOR)
        if img is None:
            raise ValueError(f"{os.path.join(folder, n)}: not a readable image")
        images.append(img[:, :, ::-1].copy())
    poses = None
    if need_poses:
        try:
            poses = [np.asarray(m["T_base_gripper"], np.float64).reshape(4, 4) for m in meta]
        except (KeyError, ValueError):
            raise ValueError(f"{meta_path}: every view needs a T_base_gripper 4x4 matrix") from None
    return images, poses


def _manual_views(args, site, spec, board) -> list:
    """Frames from a camera while a person moves the board: keep those that show it from a new angle."""
    import numpy as np

    from calibration.board import BoardDetector
    from robot_io.bridge_process import running_bridge
    from robot_io.client import DeviceClient
    from robot_io.robot import _connectable

    det = BoardDetector(board)
    kept, kept_sig = [], []
    with running_bridge(site, _bridge_log(site), start=args.serve):
        with DeviceClient(_connectable(spec.command), spec.name, 30.0, site.security) as cam:
            print(f"move the board in front of {spec.name!r}: tilt it, bring it near and far, visit the corners of "
                  f"the image ({args.poses} views, one every {args.interval:g} s at most)", flush=True)
            deadline = time.monotonic() + args.timeout
            while len(kept) < args.poses and time.monotonic() < deadline:
                t0 = time.monotonic()
                img = np.asarray(cam.request("capture").arrays["rgb"])
                d = det.detect(img)
                if d is not None:
                    sig = _view_signature(d, img.shape[1], img.shape[0])
                    if all(_differs(sig, old) for old in kept_sig):
                        kept.append(img)
                        kept_sig.append(sig)
                        print(f"  view {len(kept)}/{args.poses}: {len(d)} corners", flush=True)
                time.sleep(max(0.0, args.interval - (time.monotonic() - t0)))
    if len(kept) < args.poses:
        print(f"timed out after {args.timeout:g} s with {len(kept)} views")
    return kept


def _view_signature(det, width: int, height: int):
    """Where a view puts the board: its rough pose (PnP with a guessed K: focal length = image width)
    and the centre of its corners in the image."""
    import cv2
    import numpy as np

    K0 = np.array([[width, 0, width / 2], [0, width, height / 2], [0, 0, 1]], np.float64)
    ok, rvec, tvec = cv2.solvePnP(det.object_points.astype(np.float64), det.image_points.astype(np.float64), K0,
                                  np.zeros(5))
    R = cv2.Rodrigues(rvec)[0] if ok else np.eye(3)
    return R, tvec.reshape(3), det.image_points.mean(axis=0), float(np.hypot(width, height))


def _differs(a, b, min_deg: float = 8.0) -> bool:
    """A new view: tilted by ``min_deg`` more, or 10 % nearer / farther, or moved a tenth of the image."""
    import numpy as np

    from calibration.geometry import angle_deg

    (Ra, ta, ca, diag), (Rb, tb, cb, _) = a, b
    return (angle_deg(Ra.T @ Rb) > min_deg or abs(np.linalg.norm(ta) - np.linalg.norm(tb)) > 0.1 * np.linalg.norm(tb)
            or float(np.linalg.norm(ca - cb)) > 0.1 * diag)


# --------------------------------------------------------------------------------------------
# subcommands
# --------------------------------------------------------------------------------------------


def run_intrinsics(args) -> int:
    import cv2
    import numpy as np

    from calibration.intrinsics import calibrate_intrinsics, coverage_image, detect_views
    from calibration.io import save_section

    spec, description = None, None
    if args.from_dir:
        images, _ = _load_views(args.from_dir, need_poses=False)
        board = _board_from_args(args)
    else:
        site, spec = _site_and_camera(args)
        if args.drive_arm:
            views, description = _drive(args, site, args.camera, shift_deg=args.shift)
            images = [v.image for v in views]
            if args.save_views:
                _save_views(args.save_views, images, [v.T_base_gripper for v in views])
        else:
            board = _board_from_args(args)
            images = _manual_views(args, site, spec, board)
            if args.save_views:
                _save_views(args.save_views, images)
        board = _board_from_args(args, description)
    out = _out_path(args, spec, "intrinsics")
    dets, used, size = detect_views(images, board)
    print(f"board found in {len(used)} of {len(images)} images ({board.squares_x}x{board.squares_y} squares, "
          f"{board.dictionary})")
    res = calibrate_intrinsics(dets, size, board, flags=cv2.CALIB_FIX_K3 if args.fix_k3 else 0)
    K = res.K
    print(f"fx {K[0, 0]:.2f}  fy {K[1, 1]:.2f}  cx {K[0, 2]:.2f}  cy {K[1, 2]:.2f}  (+-{res.std_fx_fy[0]:.2f} px)")
    print(f"dist {np.array2string(res.dist, precision=5)}")
    print(f"reprojection rms {res.rms_px:.3f} px; per view: {' '.join(f'{e:.2f}' for e in res.per_view_rms_px)}")
    print(f"coverage {res.coverage * 100:.0f}% of the image (8x6 grid)")
    cov = args.coverage or os.path.splitext(out)[0] + "_coverage.png"
    os.makedirs(os.path.dirname(os.path.abspath(cov)), exist_ok=True)
    coverage_image(res, cov)
    save_section(out, res.section(), device=args.device or args.camera)
    print(f"wrote {out} (intrinsics) and {cov}")
    return 0


def _intrinsics_for(args, spec):
    from calibration.io import load_calibration

    path = args.intrinsics or (spec.calibration if spec is not None else None)
    if path is None or not os.path.exists(path):
        where = path or "the site (devices.<camera>.calibration)"
        raise ValueError(f"hand-eye needs the camera's intrinsics and {where} has none yet: run `vla calibrate "
                         "intrinsics` first, or pass --intrinsics FILE")
    cal = load_calibration(path)
    if cal.intrinsics is None:
        raise ValueError(f"{path} has no intrinsics section: run `vla calibrate intrinsics` first")
    return cal.intrinsics


def run_hand_eye(args) -> int:
    import numpy as np

    from calibration import geometry as G
    from calibration.handeye import hand_eye_from_views
    from calibration.io import save_section

    spec, description = None, None
    if args.from_dir:
        images, poses = _load_views(args.from_dir, need_poses=True)
    else:
        site, spec = _site_and_camera(args)
    intr = _intrinsics_for(args, spec)  # before moving the arm: fail early
    if not args.from_dir:
        views, description = _drive(args, site, args.camera)
        images, poses = [v.image for v in views], [v.T_base_gripper for v in views]
        if args.save_views:
            _save_views(args.save_views, images, poses)
    board = _board_from_args(args, description)
    size = (images[0].shape[1], images[0].shape[0])
    if size != tuple(intr.image_size):
        raise ValueError(f"the intrinsics were calibrated at {intr.image_size[0]}x{intr.image_size[1]} but the views "
                         f"are {size[0]}x{size[1]}")
    mode = args.mode.replace("-", "_")
    res, used = hand_eye_from_views(images, poses, intr.K, intr.dist, board, mode=mode, method=args.method)
    out = _out_path(args, spec, "hand-eye result")
    T = res.T
    frame = "gripper (TCP)" if mode == "eye_in_hand" else "robot base"
    rpy = np.degrees(G.mat_to_rotvec(T[:3, :3]))
    print(f"board used in {len(used)} of {len(images)} views; method {res.method}")
    print(f"camera in the {frame} frame: t = ({T[0, 3] * 1000:.1f}, {T[1, 3] * 1000:.1f}, {T[2, 3] * 1000:.1f}) mm, "
          f"rotation vector = ({rpy[0]:.2f}, {rpy[1]:.2f}, {rpy[2]:.2f}) deg")
    print(f"consistency residual {res.residual_mm:.2f} mm / {res.residual_deg:.3f} deg (spread of the board pose "
          "implied by each view)")
    if res.residual_mm > 10 or res.residual_deg > 1:
        print("the residual is large: check --mode (is the camera on the gripper or fixed?), the camera's "
              "intrinsics, the board's measured square size, and that the arm was still in every view")
    save_section(out, res.section(), device=args.device or args.camera)
    print(f"wrote {out} (hand_eye)")
    return 0


def run_latency(args) -> int:
    from calibration.io import save_section
    from calibration.latency import measure
    from robot_io.bridge_process import running_bridge
    from robot_io.client import DeviceClient, StreamReader
    from robot_io.robot import _connectable
    from robot_io.site import load_site

    site = load_site(args.robot)
    names = args.device or list(site.devices)
    bad = [n for n in names if n not in site.devices]
    if bad:
        raise ValueError(f"site {site.name!r} has no device {bad[0]!r}; devices: {', '.join(site.devices)}")
    if args.out and len(names) != 1:
        raise ValueError("--out writes one device's file: name that device with --device")
    log_path = _bridge_log(site)
    results = {}
    with running_bridge(site, log_path, start=args.serve):
        for n in names:
            spec = site.devices[n]
            reader = None
            if spec.stream and spec.streaming and args.stream_count > 0:
                reader = StreamReader(_connectable(spec.stream), "record", site.security, name=n)
            try:
                with DeviceClient(_connectable(spec.command), n, 2.0, site.security) as cl:
                    results[n] = measure(cl, reader, count=args.count, stream_count=args.stream_count)
            finally:
                if reader is not None:
                    reader.close()
    print(f"{'device':12s} {'offset mono':>14s} {'offset wall':>12s} {'+-':>7s} {'rtt p50':>8s} {'rtt p99':>8s} "
          f"{'stream p50':>10s} {'stream p99':>10s}")
    for n, r in results.items():
        sd = r.stream_delay_ms
        print(f"{n:12s} {r.offset_mono_ns / 1e6:11.3f} ms {r.offset_wall_ns / 1e6:9.3f} ms {r.bound_ms:5.2f}ms "
              f"{r.rtt_ms['p50']:6.2f}ms {r.rtt_ms['p99']:6.2f}ms "
              + (f"{sd['p50']:8.2f}ms {sd['p99']:8.2f}ms" if sd else f"{'-':>10s} {'-':>10s}"))
    if args.no_save:
        return 0
    for n, r in results.items():
        path = args.out or site.devices[n].calibration
        if path is None:
            print(f"{n}: not saved (the site names no calibration file for it; set devices.{n}.calibration or --out)")
            continue
        save_section(path, r.section(), device=n)
        print(f"wrote {path} (latency)")
    return 0


def run_screen(args) -> int:
    import cv2
    import numpy as np

    from calibration.io import load_calibration, save_section
    from calibration.screen import ScreenMarkers, calibrate_screen

    spec, site = None, None
    if args.from_image:
        bgr = cv2.imread(args.from_image, cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(f"--from {args.from_image}: not a readable image")
        image = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        if args.robot and args.camera:
            site, spec = _site_and_camera(args)
    else:
        from robot_io.bridge_process import running_bridge
        from robot_io.client import DeviceClient
        from robot_io.robot import _connectable

        site, spec = _site_and_camera(args)
        with running_bridge(site, _bridge_log(site), start=args.serve):
            with DeviceClient(_connectable(spec.command), spec.name, 5.0, site.security) as cl:
                deadline = time.monotonic() + 5.0
                while True:  # a streaming camera answers capture once it has a frame
                    try:
                        image = np.asarray(cl.request("capture").arrays["rgb"])
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
    out = _out_path(args, spec, "screen homography")
    K = dist = None
    if not args.no_intrinsics and os.path.exists(out):
        cal = load_calibration(out)
        if cal.intrinsics is not None:
            K, dist = cal.intrinsics.K, cal.intrinsics.dist
    markers = ScreenMarkers(frame_size=tuple(args.frame_size), marker_px=args.marker_px, gap_px=args.gap_px,
                            quiet_px=args.quiet_px, dictionary=args.dictionary)
    res = calibrate_screen(image, markers, K=K, dist=dist)
    print(f"screen: {res.markers_seen}/8 markers, residual {res.residual_px:.2f} frame px, "
          f"{'undistorted with the file' + chr(39) + 's intrinsics' if res.undistorted else 'no intrinsics'}; "
          f"corners (px): {np.round(res.corners_px, 1).tolist()}")
    save_section(out, res, device=args.device or args.camera)
    print(f"wrote {out} (screen)")
    return 0
