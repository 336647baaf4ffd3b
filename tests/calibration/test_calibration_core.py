"""Calibration without a simulator: the board, the file format, intrinsics and hand-eye on
synthetic projections, the NTP-style clock offset, and how a site hands a file to its camera."""

from __future__ import annotations

import os

import cv2
import numpy as np
import pytest
import yaml

from calibration import geometry as G
from calibration.board import BoardDetector, BoardSpec, board_pose
from calibration.handeye import calibrate_hand_eye
from calibration.intrinsics import calibrate_intrinsics, coverage_image, detect_views
from calibration.io import (CalibrationFileError, HandEye, Intrinsics, Latency, load_calibration, parse_calibration,
                            save_section)
from calibration.latency import PingSample, measure, offset_from_samples

K_TRUE = np.array([[600.0, 0.0, 319.5], [0.0, 600.0, 239.5], [0.0, 0.0, 1.0]])
BOARD = BoardSpec()


def render_board(T_cam_board: np.ndarray, K: np.ndarray = K_TRUE, size=(640, 480), board: BoardSpec = BOARD):
    """The printed board seen by a pinhole camera at ``T_cam_board``: a perspective warp of its image."""
    img = board.image(px_per_square=60)
    h_px, w_px = img.shape
    w, h = board.size_m
    corners_m = np.array([[0, 0, 0], [w, 0, 0], [w, h, 0], [0, h, 0]], np.float64)
    cam = (T_cam_board[:3, :3] @ corners_m.T).T + T_cam_board[:3, 3]
    uv = (K @ cam.T).T
    uv = (uv[:, :2] / uv[:, 2:]).astype(np.float32)
    src = np.array([[-0.5, -0.5], [w_px - 0.5, -0.5], [w_px - 0.5, h_px - 0.5], [-0.5, h_px - 0.5]], np.float32)
    H = cv2.getPerspectiveTransform(src, uv)
    out = cv2.warpPerspective(img, H, size, flags=cv2.INTER_AREA, borderValue=160)
    return np.repeat(out[:, :, None], 3, axis=2)


def board_facing(distance: float, tilt_deg=(0.0, 0.0), shift=(0.0, 0.0)) -> np.ndarray:
    """T_cam_board with the board's centre ``distance`` ahead, tilted about its x / y axes."""
    R = G.rotvec_to_mat([np.radians(tilt_deg[0]), 0, 0]) @ G.rotvec_to_mat([0, np.radians(tilt_deg[1]), 0])
    w, h = BOARD.size_m
    centre = np.array([shift[0], shift[1], distance])
    return G.from_rt(R, centre - R @ np.array([w / 2, h / 2, 0.0]))


# --------------------------------------------------------------------------------------------
# board
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, match", [
    ({"marker_m": 0.06}, "marker_m < square_m"),
    ({"dictionary": "DICT_4X4_5O"}, "unknown ArUco dictionary"),
    ({"squares_x": 12, "squares_y": 10, "dictionary": "DICT_4X4_50"}, "need 60 markers"),
    ({"squares_x": 2}, "squares_x and squares_y"),
])
def test_bad_board_specs_say_what_is_wrong(kw, match):
    with pytest.raises(ValueError, match=match):
        BoardSpec(**kw)


def test_board_found_and_its_pose_recovered_from_a_synthetic_view():
    T = board_facing(0.7, tilt_deg=(20, -15), shift=(0.03, -0.02))
    det = BoardDetector(BOARD).require(render_board(T), "synthetic view")
    assert len(det) >= 30 and det.object_points.shape == (len(det), 3)
    R, t, rms = board_pose(det, K_TRUE, np.zeros(5))
    err_m, err_deg = G.pose_error(G.from_rt(R, t), T)
    assert rms < 0.5 and err_m < 0.003 and err_deg < 0.3, (rms, err_m, err_deg)


def test_board_not_in_view_is_none_or_a_clear_error():
    blank = np.full((480, 640, 3), 128, np.uint8)
    det = BoardDetector(BOARD)
    assert det.detect(blank) is None
    with pytest.raises(ValueError, match="frame 7: the ChArUco board .* was not found"):
        det.require(blank, "frame 7")


# --------------------------------------------------------------------------------------------
# intrinsics (synthetic views: exact pinhole)
# --------------------------------------------------------------------------------------------


def synthetic_views(n: int = 10) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [render_board(board_facing(rng.uniform(0.6, 0.9), tilt_deg=rng.uniform(-35, 35, 2),
                                      shift=rng.uniform(-0.08, 0.08, 2))) for _ in range(n)]


def test_intrinsics_from_synthetic_views_and_the_coverage_picture(tmp_path):
    dets, used, size = detect_views(synthetic_views(10), BOARD)
    assert size == (640, 480) and len(used) == 10
    res = calibrate_intrinsics(dets, size, BOARD)
    assert abs(res.K[0, 0] / K_TRUE[0, 0] - 1) < 0.01 and abs(res.K[1, 1] / K_TRUE[1, 1] - 1) < 0.01, res.K
    assert abs(res.K[0, 2] - K_TRUE[0, 2]) < 5 and abs(res.K[1, 2] - K_TRUE[1, 2]) < 5
    assert res.rms_px < 0.5 and res.per_view_rms_px.shape == (10,) and 0 < res.coverage <= 1
    png = tmp_path / "cov.png"
    img = coverage_image(res, str(png))
    assert png.exists() and img.ndim == 3 and cv2.imread(str(png)).shape == img.shape


def test_intrinsics_with_too_few_views_says_how_many_are_needed():
    dets, _, size = detect_views(synthetic_views(3), BOARD)
    with pytest.raises(ValueError, match=r"only 3 view\(s\) show the ChArUco board; intrinsics need at least 6"):
        calibrate_intrinsics(dets, size, BOARD)


def test_views_of_different_sizes_are_refused():
    a, b = np.zeros((480, 640, 3), np.uint8), np.zeros((240, 320, 3), np.uint8)
    with pytest.raises(ValueError, match="image 1 is 320x240 but the first one is 640x480"):
        detect_views([a, b], BOARD)


# --------------------------------------------------------------------------------------------
# hand-eye (exact synthetic poses, then noisy ones)
# --------------------------------------------------------------------------------------------


def synthetic_hand_eye(mode: str, n: int = 12, noise_m: float = 0.0, noise_deg: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = G.from_rt(G.rotvec_to_mat([0.3, -0.2, 1.5]), [0.08, -0.01, -0.06])  # the unknown
    F = G.from_rt(G.rotvec_to_mat([np.pi, 0, 0.3]), [0.5, -0.2, 0.05])  # the other fixed transform
    arm = [G.from_rt(G.rotvec_to_mat(rng.normal(size=3) * 0.3) @ G.rotvec_to_mat([np.pi, 0, 0]),
                     [0.5, 0.0, 0.4] + rng.normal(size=3) * 0.08) for _ in range(n)]
    if mode == "eye_in_hand":  # X = T_gripper_cam, F = T_base_board
        cam = [G.inv(X) @ G.inv(A) @ F for A in arm]
    else:  # X = T_base_cam, F = T_gripper_board
        cam = [G.inv(X) @ A @ F for A in arm]
    noisy = [T @ G.from_rt(G.rotvec_to_mat(rng.normal(size=3) * np.radians(noise_deg)), rng.normal(size=3) * noise_m)
             for T in cam]
    return arm, noisy, X, F


@pytest.mark.parametrize("mode", ["eye_in_hand", "eye_to_hand"])
def test_hand_eye_recovers_the_transform_in_both_modes(mode):
    arm, cam, X, F = synthetic_hand_eye(mode)
    res = calibrate_hand_eye(arm, cam, mode=mode)
    err_m, err_deg = G.pose_error(res.T, X)
    assert err_m < 1e-6 and err_deg < 1e-4
    assert G.pose_error(res.fixed, F)[0] < 1e-6 and res.residual_mm < 1e-3
    # mixing the modes up gives a wrong answer that the residual exposes
    other = calibrate_hand_eye(arm, cam, mode="eye_to_hand" if mode == "eye_in_hand" else "eye_in_hand")
    assert other.residual_mm > 10 and G.pose_error(other.T, X)[0] > 0.01


def test_hand_eye_with_noise_within_a_millimetre_and_every_method_agrees():
    arm, cam, X, _ = synthetic_hand_eye("eye_in_hand", n=15, noise_m=0.0005, noise_deg=0.05, seed=3)
    for method in ("tsai", "park", "horaud", "andreff", "daniilidis", "auto"):
        res = calibrate_hand_eye(arm, cam, method=method)
        err_m, err_deg = G.pose_error(res.T, X)
        assert err_m < 0.003 and err_deg < 0.3, (method, err_m, err_deg)
        assert 0.1 < res.residual_mm < 5


def test_hand_eye_bad_inputs_name_the_problem():
    arm, cam, _, _ = synthetic_hand_eye("eye_in_hand", n=6)
    with pytest.raises(ValueError, match="at least 3 views"):
        calibrate_hand_eye(arm[:2], cam[:2])
    with pytest.raises(ValueError, match="6 gripper poses but 5 board poses"):
        calibrate_hand_eye(arm, cam[:5])
    with pytest.raises(ValueError, match="mode must be one of eye_in_hand, eye_to_hand"):
        calibrate_hand_eye(arm, cam, mode="eye_on_base")
    with pytest.raises(ValueError, match="unknown hand-eye method 'parks'"):
        calibrate_hand_eye(arm, cam, method="parks")
    # translations and turns about one axis only: the rotation is not observable
    flat = [G.from_rt(G.rotvec_to_mat([0, 0, a]), [0.4 + a, 0, 0.3]) for a in np.linspace(0, 0.5, 6)]
    with pytest.raises(ValueError, match="rotations are too alike"):
        calibrate_hand_eye(flat, cam)


# --------------------------------------------------------------------------------------------
# calibration files
# --------------------------------------------------------------------------------------------


def intrinsics(size=(640, 480)) -> Intrinsics:
    return Intrinsics(K=K_TRUE, dist=np.zeros(5), image_size=size, rms_px=0.1, views=12, coverage=0.5)


def test_sections_round_trip_and_writing_one_keeps_the_others(tmp_path):
    path = str(tmp_path / "calib" / "wrist.yaml")
    save_section(path, intrinsics(), device="wrist")
    T = G.from_rt(G.rotvec_to_mat([0.1, 0.2, 0.3]), [0.1, 0.0, -0.07])
    save_section(path, HandEye(mode="eye_in_hand", T=T, residual_mm=0.1, views=10, method="park"))
    save_section(path, Latency(offset_mono_ns=-12345, offset_wall_ns=67, rtt_ms={"min": 0.2, "p50": 0.3}, samples=50))
    cal = load_calibration(path)
    assert cal.device == "wrist" and np.allclose(cal.intrinsics.K, K_TRUE) and cal.intrinsics.image_size == (640, 480)
    assert np.allclose(cal.hand_eye.T, T) and cal.hand_eye.frame == "gripper"
    assert cal.latency.offset_mono_ns == -12345 and cal.latency.to_host_mono_ns(1_000_000) == 1_012_345
    assert cal.summary()["sections"] == ["intrinsics", "hand_eye", "latency"]
    assert not [f for f in os.listdir(tmp_path / "calib") if f.startswith(".calib-")]  # no temp file left


def _valid_raw() -> dict:
    return {"version": 1, "device": "front",
            "intrinsics": {"image_size": [640, 480], "K": K_TRUE.tolist(), "dist": [0, 0, 0, 0, 0]},
            "hand_eye": {"mode": "eye_to_hand", "T": np.eye(4).tolist()},
            "latency": {"offset_mono_ns": 5, "offset_wall_ns": 0, "rtt_ms": {"p50": 0.4}, "samples": 10}}


@pytest.mark.parametrize("patch, field", [
    (("intrinsics", "K", [[600, 0, 320], [0, 600, 240]]), "intrinsics.K"),
    (("intrinsics", "K", [[-600, 0, 320], [0, 600, 240], [0, 0, 1]]), "intrinsics.K"),
    (("intrinsics", "dist", [0.1, 0.2, 0.3]), "intrinsics.dist"),
    (("intrinsics", "dist", [0.1, 0.2, "x", 0, 0]), "intrinsics.dist"),
    (("intrinsics", "image_size", [640]), "intrinsics.image_size"),
    (("intrinsics", "focal", 600), "intrinsics.focal"),
    (("hand_eye", "mode", "eye_on_base"), "hand_eye.mode"),
    (("hand_eye", "T", (2 * np.eye(4)).tolist()), "hand_eye.T"),
    (("latency", "samples", 0), "latency.samples"),
    (("latency", "offset_mono_ns", 1.5), "latency.offset_mono_ns"),
    (("latency", "rtt_ms", {"p50": -1}), "latency.rtt_ms"),
    ((None, "intrinsic", {}), "intrinsic"),
    ((None, "version", 2), "version"),
])
def test_malformed_files_name_the_file_and_field(tmp_path, patch, field):
    raw = _valid_raw()
    parse_calibration(raw, "ok.yaml")  # the unpatched file is fine
    section, key, value = patch
    (raw if section is None else raw[section])[key] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(CalibrationFileError) as e:
        load_calibration(str(path))
    assert str(e.value).startswith(f"{path}: {field}:"), str(e.value)


def test_a_malformed_file_is_not_overwritten(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("version: 1\nintrinsics: {K: 3}\n")
    with pytest.raises(CalibrationFileError, match="intrinsics"):
        save_section(str(path), intrinsics())
    assert path.read_text() == "version: 1\nintrinsics: {K: 3}\n"
    with pytest.raises(CalibrationFileError, match="not found"):
        load_calibration(str(tmp_path / "missing.yaml"))
    (tmp_path / "garbage.yaml").write_text("version: [1\n")
    with pytest.raises(CalibrationFileError, match="not a readable YAML file"):
        load_calibration(str(tmp_path / "garbage.yaml"))


# --------------------------------------------------------------------------------------------
# sites: a camera loads its calibration file
# --------------------------------------------------------------------------------------------


def _site(tmp_path, cal: str, size=(640, 480)) -> str:
    site = {"name": "cal", "devices": {"cam": {
        "driver": "synthetic_camera", "command": "tcp://127.0.0.1:1", "stream": "tcp://127.0.0.1:2",
        "params": {"width": size[0], "height": size[1]}, "calibration": cal}}}
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    return str(path)


def test_the_site_hands_the_calibration_to_the_camera(tmp_path):
    import hardware
    from robot_io.site import build_servers, load_site

    save_section(str(tmp_path / "calib" / "cam.yaml"), intrinsics(), device="cam")
    site = load_site(_site(tmp_path, "calib/cam.yaml"))
    assert site.devices["cam"].calibration == str(tmp_path / "calib" / "cam.yaml")
    (srv,) = build_servers(site, hardware.load_driver)
    cam = srv.service.device
    assert np.allclose(cam.K, K_TRUE) and cam.dist.shape == (5,)
    d = srv.service.describe()
    assert np.allclose(d["intrinsics"]["K"], K_TRUE) and d["calibration"]["sections"] == ["intrinsics"]


def test_site_calibration_errors_name_the_device_and_field(tmp_path):
    import hardware
    from robot_io.site import SiteError, build_servers, load_site

    (tmp_path / "calib").mkdir()
    (tmp_path / "calib" / "bad.yaml").write_text("version: 1\nintrinsics: {image_size: [640, 480], K: 1, dist: []}\n")
    with pytest.raises(SiteError, match=r"devices\.cam\.calibration: .*bad\.yaml: intrinsics\.K:"):
        load_site(_site(tmp_path, "calib/bad.yaml"))
    # calibrated at another size than the camera delivers
    save_section(str(tmp_path / "calib" / "cam.yaml"), intrinsics(size=(1280, 720)))
    site = load_site(_site(tmp_path, "calib/cam.yaml", size=(640, 480)))
    with pytest.raises(SiteError, match=r"devices\.cam\.calibration: .*made at 1280x720 but the camera delivers 640x480"):
        build_servers(site, hardware.load_driver)
    # not written yet: the site loads and the camera is served uncalibrated
    site = load_site(_site(tmp_path, "calib/later.yaml"))
    (srv,) = build_servers(site, hardware.load_driver)
    assert srv.service.device.K is None and "calibration" not in srv.service.describe()


# --------------------------------------------------------------------------------------------
# latency
# --------------------------------------------------------------------------------------------


def test_clock_offset_from_samples_with_asymmetric_jitter():
    rng = np.random.default_rng(0)
    offset, wall_offset = 5_000_000_000, -2_500_000  # the device's clocks run 5 s / -2.5 ms off ours
    samples, t = [], 1_000_000_000
    for _ in range(200):
        up, down = rng.exponential(200_000) + 50_000, rng.exponential(800_000) + 50_000  # ns, uneven ways
        t1 = t + up
        samples.append(PingSample(t, t1 + offset, t1 + down, t + 7, t1 + wall_offset + 7, t1 + down + 7))
        t += 5_000_000
    res = offset_from_samples(samples)
    assert abs(res.offset_mono_ns - offset) <= res.bound_ms * 1e6 and abs(res.offset_mono_ns - offset) < 100_000
    assert abs(res.offset_wall_ns - wall_offset) < 100_000
    assert res.rtt_ms["min"] <= res.rtt_ms["p50"] <= res.rtt_ms["p99"] and res.samples == 200
    with pytest.raises(ValueError, match="at least 4 ping samples"):
        offset_from_samples(samples[:3])


def test_offset_to_a_device_on_this_host_is_zero_within_its_bound(tmp_path):
    from robot_io.client import DeviceClient, StreamReader
    from robot_io.server import ArmService, DeviceServer
    from tests.mocks.fake_arm import KinematicArm

    srv = DeviceServer(ArmService("arm", KinematicArm(), state_hz=200), "tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    srv.start()
    try:
        with DeviceClient(srv.command_endpoint, "arm", timeout_s=2.0) as cl, \
                StreamReader(srv.stream_endpoint, "record", name="arm") as reader:
            res = measure(cl, reader, count=40, stream_count=20, interval_s=0.001)
    finally:
        srv.stop()
    # same clock on both ends: the true offset is 0
    assert abs(res.offset_mono_ns) <= res.bound_ms * 1e6 + 1e5, (res.offset_mono_ns, res.bound_ms)
    assert abs(res.offset_wall_ns) <= res.bound_ms * 1e6 + 1e6
    assert res.stream_delay_ms is not None and 0 <= res.stream_delay_ms["p50"] < 100
    save_section(str(tmp_path / "arm.yaml"), res.section(), device="arm")
    assert load_calibration(str(tmp_path / "arm.yaml")).latency.samples == 40


def test_cli_board_defaults_match_the_board_spec():
    from vla.commands.calibrate import BOARD_DEFAULTS

    assert BOARD_DEFAULTS == BoardSpec().to_dict()


def test_cli_intrinsics_from_a_person_moving_the_board_then_offline(tmp_path, capsys):
    """No arm: a camera (here one that plays synthetic views of the board) is captured over the
    bridge and a view is kept whenever the board shows from a new angle; `--from` re-solves the
    saved images offline."""
    from hardware.base import Camera, CameraFrame
    from robot_io.server import CameraService, DeviceServer
    from tests.net import free_ports
    from vla.cli import main

    tilts = [(0, 0), (30, 0), (-30, 0), (0, 30), (0, -30), (25, 25), (-25, -25), (25, -25)]
    views = [render_board(board_facing(0.65 + 0.03 * k, tilt_deg=t, shift=(0.02 * (k % 3) - 0.02, 0.0)))
             for k, t in enumerate(tilts)]

    class BoardPlayer(Camera):  # the same view twice, then the next: the duplicates must be skipped
        def __init__(self):
            super().__init__("cam", 640, 480, 30.0)
            self.i = 0

        def _connect(self):
            self.i = 0

        def _disconnect(self):
            pass

        def read(self, timeout_s: float = 1.0) -> CameraFrame:
            rgb = views[(self.i // 2) % len(views)]
            self.i += 1
            return CameraFrame(rgb=rgb, t_mono_ns=0, index=self.i)

    (port,) = free_ports(1)
    srv = DeviceServer(CameraService("cam", BoardPlayer(), stream=False), f"tcp://127.0.0.1:{port}")
    srv.start()
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"name": "manual", "devices": {"cam": {
        "driver": "opencv_camera", "command": f"tcp://127.0.0.1:{port}", "streaming": False,
        "calibration": "calib/cam.yaml"}}}))
    try:
        assert main(["calibrate", "intrinsics", "--robot", str(site), "--camera", "cam", "--poses", "7",
                     "--interval", "0", "--timeout", "20", "--save-views", str(tmp_path / "views")]) == 0
    finally:
        srv.stop()
    out = capsys.readouterr().out
    assert "view 7/7" in out and "view 8/7" not in out
    cal = load_calibration(str(tmp_path / "calib" / "cam.yaml"))
    assert abs(cal.intrinsics.fx / K_TRUE[0, 0] - 1) < 0.01 and cal.intrinsics.views == 7
    assert (tmp_path / "calib" / "cam_coverage.png").exists()
    assert len([f for f in os.listdir(tmp_path / "views") if f.endswith(".png")]) == 7
    # offline, from the saved images, into another file; a missing --out is a clear error
    assert main(["calibrate", "intrinsics", "--from", str(tmp_path / "views"), "--out",
                 str(tmp_path / "again.yaml"), "--device", "cam"]) == 0
    assert abs(load_calibration(str(tmp_path / "again.yaml")).intrinsics.fx - cal.intrinsics.fx) < 1e-6
    assert main(["calibrate", "intrinsics", "--from", str(tmp_path / "views")]) == 2
    assert "pass --out FILE" in capsys.readouterr().err
