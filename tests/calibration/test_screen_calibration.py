"""Screen calibration against the simulated rig: the ArUco homography recovers the simulated
camera's known one (corner error < 2 px), the key -> pixel latency recovers the camera's configured
latency within 10%, and both go through calibration files that the agent loads."""

from __future__ import annotations

import time

import numpy as np
import pytest

from calibration.io import load_calibration, save_section
from calibration.screen import Rectifier, ScreenMarkers, calibrate_screen, flash_latencies, measure_key_latency
from hardware.screen_camera import ScreenCamera
from tests.hardware.test_screen_camera import CLEAN, StillScreen


@pytest.fixture
def screen():
    with StillScreen() as s:
        yield s


@pytest.mark.parametrize("setup", ["defaults", "strong_tilt", "no_distortion"])
def test_the_homography_recovers_the_simulated_cameras_corners_within_2_px(screen, setup):
    kw = {"defaults": {}, "strong_tilt": {"yaw_deg": -25.0, "pitch_deg": 12.0, "roll_deg": -5.0, "fill": 0.75},
          "no_distortion": {"dist": (0, 0, 0, 0, 0)}}[setup]
    cam = ScreenCamera(screen=screen, **kw)  # noise, blur and flicker at their defaults
    img = cam.render(screen.picture, t_s=0.01)
    K = None if setup == "no_distortion" else cam.ideal_K()  # the intrinsics `vla calibrate intrinsics` gives
    res = calibrate_screen(img, cam.markers, K=K, dist=None if K is None else cam.true_dist)
    assert res.markers_seen == 8
    err = np.linalg.norm(res.corners_px - cam.true_corners(), axis=1)
    assert err.max() < 2.0, err
    # and the rectified picture is the screen's
    rect = Rectifier(res.H, res.frame_size, K, None if K is None else cam.true_dist)(img)
    assert rect.shape == (210, 160, 3)
    inner = (slice(5, -5), slice(5, -5))
    assert np.abs(rect[inner].astype(int) - screen.picture[inner]).mean() < \
        np.abs(screen.picture[inner].astype(int) - np.roll(screen.picture, 1, 0)[inner]).mean()


def test_too_few_markers_is_an_error_that_says_so(screen):
    cam = ScreenCamera(screen=screen, **CLEAN)
    img = cam.render(screen.picture)
    img[:, :330] = 30  # cover the left half: 3 markers left
    with pytest.raises(ValueError, match="need 4"):
        calibrate_screen(img, cam.markers)


def test_screen_and_key_latency_sections_round_trip_and_the_agent_rectifies_from_the_file(screen, tmp_path):
    from calibration.io import Intrinsics

    cam = ScreenCamera(screen=screen)
    img = cam.render(screen.picture)
    path = str(tmp_path / "cam.yaml")
    save_section(path, Intrinsics(K=cam.ideal_K(), dist=cam.true_dist, image_size=(640, 480)), device="cam")
    res = calibrate_screen(img, cam.markers, K=cam.ideal_K(), dist=cam.true_dist)
    save_section(path, res)
    lat = flash_latencies([(0, np.zeros((4, 4))), (10_000_000, np.full((4, 4), 255.0))], [5_000_000])
    save_section(path, lat)
    cal = load_calibration(path)
    assert cal.screen is not None and cal.key_latency.median_ms == pytest.approx(5.0) and cal.intrinsics is not None
    np.testing.assert_allclose(cal.screen.H, res.H)
    summary = cal.summary()
    assert {"intrinsics", "screen", "key_latency"} <= set(summary["sections"])
    a = Rectifier.from_calibration(cal)(img)
    b = Rectifier.from_description({"name": "cam", "calibration": summary})(img)
    np.testing.assert_array_equal(a, b)
    assert ScreenMarkers.from_dict(cal.screen.markers) == cam.markers


def test_key_to_pixel_latency_recovers_the_configured_camera_latency_within_10_percent(tmp_path):
    pytest.importorskip("ale_py")
    from hardware.ale_screen import AleScreen
    from hardware.serial_keypresser import SerialKeyPresser

    latency_ms, fps = 80.0, 60.0
    with AleScreen(game="pong", keys="emulated_mcu") as screen:
        screen.reset(game="key_flash")
        cam = ScreenCamera(screen=screen, fps=fps, latency_ms=latency_ms)  # noise, blur, flicker, jitter: defaults
        with cam, SerialKeyPresser(port=screen.describe()["mcu_port"]) as kb:
            res = calibrate_screen(cam.read().rgb, cam.markers, K=cam.ideal_K(), dist=cam.true_dist)
            rect = Rectifier(res.H, res.frame_size, cam.ideal_K(), cam.true_dist)

            def press():
                t = time.monotonic_ns()
                kb.press(["SPACE"])
                return t

            def shown(t_press):
                return next((f.t_mono_ns for f in screen.frames_since(t_press) if f.rgb[0, 0, 0] == 255), None)

            def read():
                f = cam.read()
                return f.t_mono_ns, f.rgb

            out = measure_key_latency(press, kb.release_all, read, presses=12, hold_s=0.2, gap_s=(0.15, 0.3),
                                      shown=shown, camera_fps=fps, rectify=rect)
    print(f"key->pixel: median {out.median_ms:.1f} ms, camera {out.camera_ms:.1f} ms (configured {latency_ms})")
    assert out.presses == 12
    assert out.camera_ms == pytest.approx(latency_ms, rel=0.10), out
    # end to end adds the keyboard link, the wait for the game's next tick and the camera's exposure phase
    assert latency_ms < out.median_ms < latency_ms + 1000 / 60 + 1000 / fps + 10
    save_section(str(tmp_path / "c.yaml"), out)
    assert load_calibration(str(tmp_path / "c.yaml")).key_latency.camera_ms == pytest.approx(out.camera_ms)


def test_vla_calibrate_screen_from_an_image_writes_the_screen_section(screen, tmp_path, capsys):
    import cv2

    from calibration.io import Intrinsics
    from vla.cli import main

    cam = ScreenCamera(screen=screen)
    png = str(tmp_path / "frame.png")
    cv2.imwrite(png, cv2.cvtColor(cam.render(screen.picture), cv2.COLOR_RGB2BGR))
    out = str(tmp_path / "cam.yaml")
    save_section(out, Intrinsics(K=cam.ideal_K(), dist=cam.true_dist, image_size=(640, 480)), device="cam")
    assert main(["calibrate", "screen", "--from", png, "--out", out, "--device", "cam"]) == 0
    assert "8/8 markers" in capsys.readouterr().out
    cal = load_calibration(out)
    assert cal.screen.undistorted and cal.intrinsics is not None
    assert np.linalg.norm(cal.screen.corners_px - cam.true_corners(), axis=1).max() < 2.0
    assert main(["calibrate", "screen", "--from", str(tmp_path / "nope.png"), "--out", out]) == 2
