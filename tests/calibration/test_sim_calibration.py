"""Acceptance 4 of issue 16 on the simulated cell: the sim renders a ChArUco board whose pose is
known exactly, and calibration recovers the cameras' known intrinsics (fx within 1 %) and the
wrist camera's known pose on the gripper (within 5 mm / 1 degree)."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from calibration import geometry as G  # noqa: E402
from calibration.board import BoardDetector, board_pose  # noqa: E402
from calibration.collect import view_poses  # noqa: E402
from calibration.handeye import hand_eye_from_views  # noqa: E402
from calibration.intrinsics import calibrate_intrinsics, detect_views  # noqa: E402
from hardware.sim_camera import SimCamera, camera_pose_cv  # noqa: E402
from hardware.sim_franka import SimFranka, board_config  # noqa: E402

SIZE = (640, 480)


@pytest.fixture(scope="module")
def sim():
    s = SimFranka(realtime=False, seed=0, calibration_board="table")
    s.connect()
    s.reset(seed=0)
    yield s
    s.disconnect()


@pytest.fixture(scope="module")
def wrist(sim):
    cam = SimCamera("wrist", sim, camera="wrist", width=SIZE[0], height=SIZE[1])
    with cam:
        yield cam


def kinematics(sim) -> mujoco.MjData:
    d = mujoco.MjData(sim.model)
    d.qpos[:] = sim.snapshot_qpos()[0]
    mujoco.mj_kinematics(sim.model, d)
    mujoco.mj_camlight(sim.model, d)
    return d


def tcp_pose(sim) -> np.ndarray:
    st = sim.read_state()
    return G.pose(st.ee_pos, st.ee_quat)


def board_in_world(sim) -> np.ndarray:
    return G.pose(*sim.board_pose())


def drive_to(sim, T, steps: int = 40) -> np.ndarray:
    """In-process stand-in for the bridge's ee_delta loop: an absolute pose target, stepped until reached."""
    sim.command_ee_pose(T[:3, 3], G.mat_to_quat(T[:3, :3]))
    for _ in range(steps):
        sim.step()
        err_m, err_deg = G.pose_error(tcp_pose(sim), T)
        if err_m < 1e-3 and err_deg < 0.2:
            break
    return tcp_pose(sim)


@pytest.fixture(scope="module")
def wrist_views(sim, wrist):
    """12 views of the board on its stand from the wrist camera, the arm turning about the board's
    centre (as `vla calibrate` plans them); the true camera-in-TCP transform."""
    sim.reset(seed=0)
    b = sim.board_description()
    centre = board_in_world(sim) @ np.array([b["squares_x"] * b["square_m"] / 2, b["squares_y"] * b["square_m"] / 2, 0, 1])
    poses = view_poses(tcp_pose(sim), centre[:3], 12, max_angle_deg=25, distance_scale=(0.55, 0.75), shift_deg=10)
    images, arm = [], []
    for T in poses:
        arm.append(drive_to(sim, T))
        images.append(wrist.render_now().rgb)
    truth = G.inv(tcp_pose(sim)) @ camera_pose_cv(sim.model, kinematics(sim), "wrist")
    sim.reset(seed=0)
    return images, arm, truth


def test_the_rendered_board_is_where_the_scene_says(sim, wrist):
    """The texture puts the printed board exactly on its frame: PnP with the exact K finds the pose
    the scene reports (this is what makes the sim a ground truth for calibration)."""
    sim.reset(seed=0)
    det = BoardDetector(sim.board["board"]).require(wrist.render_now().rgb, "home view")
    R, t, rms = board_pose(det, wrist.ideal_K(), np.zeros(5))
    truth = G.inv(camera_pose_cv(sim.model, kinematics(sim), "wrist")) @ board_in_world(sim)
    err_m, err_deg = G.pose_error(G.from_rt(R, t), truth)
    assert len(det) >= 20 and rms < 0.3 and err_m < 0.003 and err_deg < 0.3, (len(det), rms, err_m, err_deg)


def test_wrist_intrinsics_and_camera_to_gripper_recovered(wrist, wrist_views, sim):
    """Acceptance 4: fx within 1 % and the camera-to-gripper transform within 5 mm / 1 degree, the
    hand-eye solve using the intrinsics calibrated from the same rendered views."""
    images, arm, truth = wrist_views
    dets, used, size = detect_views(images, sim.board["board"])
    assert size == SIZE and len(used) >= 10
    intr = calibrate_intrinsics(dets, size, sim.board["board"])
    K = wrist.ideal_K()
    fx_err, fy_err = abs(intr.K[0, 0] / K[0, 0] - 1), abs(intr.K[1, 1] / K[1, 1] - 1)
    print(f"wrist intrinsics: fx {intr.K[0, 0]:.2f} vs {K[0, 0]:.2f} ({fx_err * 100:.3f} %), fy error "
          f"{fy_err * 100:.3f} %, rms {intr.rms_px:.3f} px, {intr.views} views")
    assert fx_err < 0.01 and fy_err < 0.01
    assert abs(intr.K[0, 2] - K[0, 2]) < 3 and abs(intr.K[1, 2] - K[1, 2]) < 3
    he, used = hand_eye_from_views(images, arm, intr.K, intr.dist, sim.board["board"], mode="eye_in_hand")
    err_m, err_deg = G.pose_error(he.T, truth)
    print(f"wrist hand-eye: {err_m * 1000:.2f} mm, {err_deg:.3f} deg from the truth; residual "
          f"{he.residual_mm:.2f} mm / {he.residual_deg:.3f} deg over {he.views} views")
    assert len(used) >= 10 and err_m < 0.005 and err_deg < 1.0
    assert G.pose_error(he.fixed, board_in_world(sim))[0] < 0.005  # and the board where it stands


def test_front_camera_intrinsics_from_a_board_moved_in_front_of_it(sim):
    """A fixed camera: the board is moved (teleported) to tilted poses in front of it."""
    front = SimCamera("front", sim, camera="front", width=SIZE[0], height=SIZE[1])
    rng = np.random.default_rng(0)
    board = sim.board["board"]
    w, h = board.size_m
    images = []
    with front:
        T_world_cam = camera_pose_cv(sim.model, kinematics(sim), "front")
        for _ in range(10):
            R = G.rotvec_to_mat(np.radians(np.r_[rng.uniform(-35, 35, 2), rng.uniform(-20, 20)]))
            centre = np.r_[rng.uniform(-0.12, 0.12, 2), rng.uniform(0.75, 1.0)]
            T = T_world_cam @ G.from_rt(R, centre - R @ np.array([w / 2, h / 2, 0.0]))
            sim.set_board_pose(T[:3, 3], G.mat_to_quat(T[:3, :3]))
            images.append(front.render_now().rgb)
        K = front.ideal_K()
    sim.reset(seed=0)
    dets, used, size = detect_views(images, board)
    intr = calibrate_intrinsics(dets, size, board)
    fx_err = abs(intr.K[0, 0] / K[0, 0] - 1)
    print(f"front intrinsics: fx {intr.K[0, 0]:.2f} vs {K[0, 0]:.2f} ({fx_err * 100:.3f} %), {len(used)} views")
    assert len(used) >= 8 and fx_err < 0.01 and abs(intr.K[1, 1] / K[1, 1] - 1) < 0.01


def test_board_out_of_view_is_a_clear_error(sim, wrist):
    sim.set_board_pose([3.0, 3.0, -2.0], [1, 0, 0, 0])  # far away under the floor
    images = [wrist.render_now().rgb for _ in range(3)]
    arm = [tcp_pose(sim)] * 3
    sim.reset(seed=0)
    with pytest.raises(ValueError, match="board was found in only 0 of 3 views"):
        hand_eye_from_views(images, arm, wrist.ideal_K(), np.zeros(5), sim.board["board"])
    dets, _, size = detect_views(images, sim.board["board"])
    with pytest.raises(ValueError, match=r"only 0 view\(s\) show the ChArUco board"):
        calibrate_intrinsics(dets, size, sim.board["board"])


@pytest.mark.parametrize("value, match", [
    ("wall", "mount must be one of"),
    ({"mount": "table", "centre": [0, 0, 0]}, "unknown field 'centre'"),
    ({"mount": "table", "center": [0, 0]}, r"center must be \[x, y, z\]"),
    ({"mount": "hand", "marker_m": 0.05}, "marker_m < square_m"),
])
def test_bad_board_params_are_refused(value, match):
    with pytest.raises(ValueError, match=match):
        board_config(value)


@pytest.mark.e2e  # `vla calibrate` over a bridge process
def test_vla_calibrate_end_to_end_over_the_bridge(tmp_path, sim, capsys):
    """`vla calibrate intrinsics`, `hand-eye` and `latency` on a simulated cell served on free ports:
    the files the site names get the known intrinsics and wrist pose, and each device's latency."""
    import textwrap

    from calibration.io import load_calibration
    from robot_io.bridge_process import running_bridge
    from robot_io.site import load_site
    from tests.net import free_ports
    from vla.cli import main

    p = free_ports(3)
    site = tmp_path / "site.yaml"
    site.write_text(textwrap.dedent(f"""\
        name: calib-test
        robot: {{arm: arm, cameras: [wrist]}}
        devices:
          arm:
            driver: sim_franka
            command: tcp://127.0.0.1:{p[0]}
            stream: tcp://127.0.0.1:{p[1]}
            command_timeout_ms: 5000
            params: {{realtime: false, seed: 0, calibration_board: table}}
            calibration: calib/arm.yaml
          wrist:
            driver: sim_camera
            command: tcp://127.0.0.1:{p[2]}
            streaming: false
            params: {{sim: "@arm", camera: wrist, width: {SIZE[0]}, height: {SIZE[1]}}}
            calibration: calib/wrist.yaml
        """))
    cov = tmp_path / "wrist_coverage.png"
    with running_bridge(load_site(str(site)), str(tmp_path / "bridge.log"), start="always"):
        assert main(["calibrate", "intrinsics", "--robot", str(site), "--camera", "wrist", "--drive-arm",
                     "--poses", "8", "--coverage", str(cov)]) == 0
        assert main(["calibrate", "hand-eye", "--robot", str(site), "--camera", "wrist", "--poses", "6",
                     "--save-views", str(tmp_path / "views")]) == 0
        assert main(["calibrate", "latency", "--robot", str(site), "--count", "20"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "reprojection rms" in out and "consistency residual" in out
    cal = load_calibration(str(tmp_path / "calib" / "wrist.yaml"))
    K = SimCamera("k", sim, camera="wrist", width=SIZE[0], height=SIZE[1]).ideal_K()
    assert cal.device == "wrist" and cal.intrinsics.image_size == SIZE
    assert abs(cal.intrinsics.fx / K[0, 0] - 1) < 0.01 and abs(cal.intrinsics.fy / K[1, 1] - 1) < 0.01
    truth = G.inv(tcp_pose(sim)) @ camera_pose_cv(sim.model, kinematics(sim), "wrist")
    err_m, err_deg = G.pose_error(cal.hand_eye.T, truth)
    print(f"CLI: fx error {abs(cal.intrinsics.fx / K[0, 0] - 1) * 100:.3f} %, hand-eye {err_m * 1000:.2f} mm / "
          f"{err_deg:.3f} deg")
    assert cal.hand_eye.mode == "eye_in_hand" and err_m < 0.005 and err_deg < 1.0
    assert cov.exists() and cal.latency is not None and cal.latency.samples == 20
    arm = load_calibration(str(tmp_path / "calib" / "arm.yaml"))
    assert arm.latency is not None and arm.latency.stream_delay_ms is not None and arm.intrinsics is None
    load_site(str(site))  # the written files pass the site's validation
    # the saved views re-solve offline to the same transform
    assert main(["calibrate", "hand-eye", "--from", str(tmp_path / "views"), "--intrinsics",
                 str(tmp_path / "calib" / "wrist.yaml"), "--out", str(tmp_path / "offline.yaml")]) == 0
    assert G.pose_error(load_calibration(str(tmp_path / "offline.yaml")).hand_eye.T, cal.hand_eye.T)[0] < 1e-6


def test_eye_to_hand_recovers_the_fixed_camera_in_the_base_frame():
    """The board rides on the hand; the arm turns it in front of the fixed front camera (~0.9 m
    away, so the bound is looser than the wrist camera's): the camera's pose in the base frame."""
    sim = SimFranka(realtime=False, seed=0, calibration_board="hand")
    front = SimCamera("front", sim, camera="front", width=SIZE[0], height=SIZE[1])
    with sim, front:
        sim.reset(seed=0)
        T0 = tcp_pose(sim)
        T0[:3, 3] = [0.6, 0.0, 0.45]  # nearer the camera than home
        drive_to(sim, T0)
        images, arm = [], []
        for T in view_poses(tcp_pose(sim), tcp_pose(sim)[:3, 3], 10, max_angle_deg=25):
            arm.append(drive_to(sim, T))
            images.append(front.render_now().rgb)
        truth = camera_pose_cv(sim.model, kinematics(sim), "front")
        board_in_tcp = G.inv(tcp_pose(sim)) @ G.pose(*sim.board_pose())
        he, used = hand_eye_from_views(images, arm, front.ideal_K(), np.zeros(5), sim.board["board"],
                                       mode="eye_to_hand")
    err_m, err_deg = G.pose_error(he.T, truth)
    print(f"front eye-to-hand: {err_m * 1000:.2f} mm, {err_deg:.3f} deg; residual {he.residual_mm:.2f} mm over "
          f"{len(used)} views")
    assert len(used) >= 8 and err_m < 0.01 and err_deg < 1.0
    assert G.pose_error(he.fixed, board_in_tcp)[0] < 0.01  # the board's place on the hand
