"""OpenCVCamera on a small MJPG video written in the test, and its live-mode reader thread on a
fake cv2.VideoCapture (no camera here)."""

from __future__ import annotations

import time

import cv2
import numpy as np
import pytest

from hardware.base import DeviceError, NotConnectedError
from hardware.opencv_camera import OpenCVCamera

W, H = 64, 48
COLOURS_RGB = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255)]


@pytest.fixture(scope="module")
def video(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("video") / "colours.avi")
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"MJPG"), 20.0, (W, H))
    assert writer.isOpened()
    for r, g, b in COLOURS_RGB:
        frame = np.empty((H, W, 3), np.uint8)
        frame[:] = (b, g, r)  # OpenCV writes BGR
        writer.write(frame)
    writer.release()
    return path


def centre(rgb: np.ndarray) -> np.ndarray:
    return rgb[rgb.shape[0] // 2, rgb.shape[1] // 2].astype(int)


def test_frames_decode_in_order_as_rgb(video):
    with OpenCVCamera(video, width=W, height=H, fps=200.0, loop=False) as cam:
        for i, colour in enumerate(COLOURS_RGB):
            f = cam.read()
            assert f.rgb.shape == (H, W, 3) and f.rgb.dtype == np.uint8
            assert f.index == i and f.depth is None
            np.testing.assert_allclose(centre(f.rgb), colour, atol=8)  # MJPG is lossy
        with pytest.raises(DeviceError, match="end of the video file"):
            cam.read()


def test_loops_back_to_the_start(video):
    with OpenCVCamera(video, width=W, height=H, fps=500.0, loop=True) as cam:
        frames = [cam.read() for _ in range(len(COLOURS_RGB) + 2)]
    assert [f.index for f in frames] == list(range(len(COLOURS_RGB) + 2))
    np.testing.assert_allclose(centre(frames[len(COLOURS_RGB)].rgb), COLOURS_RGB[0], atol=8)
    np.testing.assert_allclose(centre(frames[len(COLOURS_RGB) + 1].rgb), COLOURS_RGB[1], atol=8)


def test_resizes_to_the_requested_size(video):
    with OpenCVCamera(video, width=32, height=20, fps=500.0) as cam:
        f = cam.read()
    assert f.rgb.shape == (20, 32, 3)
    np.testing.assert_allclose(centre(f.rgb), COLOURS_RGB[0], atol=8)


def test_paced_at_fps(video):
    fps, n = 10.0, 8
    with OpenCVCamera(video, width=W, height=H, fps=fps, loop=True) as cam:
        cam.read()
        cam.read()  # a slow start puts the schedule behind; _pace then lets <= 2 reads through at once
        t0 = time.monotonic()
        for _ in range(n):
            cam.read()
        elapsed = time.monotonic() - t0
    # n reads span about n periods; a stall under load (CI shares 2 cores) makes the schedule skip ahead
    # and give back at most two periods, so 0.6 x leaves room for one. Unpaced, the file reads in ms.
    assert n / fps * 0.6 <= elapsed <= n / fps + 0.5, elapsed


def test_timeout_shorter_than_the_period_raises(video):
    with OpenCVCamera(video, width=W, height=H, fps=2.0) as cam:
        cam.read()
        with pytest.raises(DeviceError, match="no frame within"):
            cam.read(timeout_s=0.05)


def test_errors(tmp_path, video):
    missing = str(tmp_path / "missing.avi")
    with pytest.raises(DeviceError, match="missing.avi"):
        OpenCVCamera(missing).connect()
    junk = tmp_path / "junk.avi"
    junk.write_bytes(b"not a video at all")
    with pytest.raises(DeviceError, match="junk.avi"):
        OpenCVCamera(str(junk)).connect()
    with pytest.raises(ValueError, match="depth"):
        OpenCVCamera(video, depth=True)
    with pytest.raises(NotConnectedError):
        OpenCVCamera(video).read()
    assert OpenCVCamera(video).describe()["live"] is False
    assert OpenCVCamera(3).is_live and OpenCVCamera("/dev/video2").is_live


# --------------------------------------------------------------------------------------------
# live mode on a fake VideoCapture
# --------------------------------------------------------------------------------------------


class FakeCapture:
    """Produces frames at ``rate`` Hz whose red channel is the frame counter; then ``fail_after``
    frames it fails every read. Records the properties set on it."""

    instances: list[FakeCapture] = []

    def __init__(self, source, backend=None, *, rate=200.0, fail_after=None, size=(H, W)):
        self.source, self.rate, self.fail_after, self.size = source, rate, fail_after, size
        self.props: dict[int, float] = {}
        self.count = 0
        self.released = False
        FakeCapture.instances.append(self)

    def isOpened(self):  # noqa: N802 -- cv2's name
        return self.source != 99

    def set(self, prop, value):
        self.props[prop] = value
        return True

    def read(self):
        time.sleep(1.0 / self.rate)
        if self.fail_after is not None and self.count >= self.fail_after:
            return False, None
        frame = np.zeros((*self.size, 3), np.uint8)
        frame[..., 2] = self.count % 256  # red in BGR
        self.count += 1
        return True, frame

    def release(self):
        self.released = True


@pytest.fixture
def fake_capture(monkeypatch):
    FakeCapture.instances.clear()

    def install(**kw):
        monkeypatch.setattr(cv2, "VideoCapture", lambda source, backend=None: FakeCapture(source, backend, **kw))

    return install


def test_live_sets_properties_and_returns_fresh_frames(fake_capture):
    fake_capture(rate=200.0, size=(96, 128))
    cam = OpenCVCamera(0, width=W, height=H, fps=30.0, fourcc="MJPG")
    with cam:
        cap = FakeCapture.instances[-1]
        assert cap.props[cv2.CAP_PROP_FRAME_WIDTH] == W and cap.props[cv2.CAP_PROP_FRAME_HEIGHT] == H
        assert cap.props[cv2.CAP_PROP_FPS] == 30.0
        assert cap.props[cv2.CAP_PROP_FOURCC] == cv2.VideoWriter_fourcc(*"MJPG")
        first = cam.read()
        time.sleep(0.1)  # ~20 frames go by; read() must give the newest, not the next buffered one
        second = cam.read()
        assert first.rgb.shape == (H, W, 3)  # resized from the device's 128x96
        assert second.index >= first.index + 10
        assert cap.count - 1 - second.index <= 3  # the latest grabbed (give or take a frame in flight)
        assert second.rgb[0, 0, 0] == second.index % 256 and second.rgb[0, 0, 2] == 0  # BGR -> RGB
        third = cam.read()
        assert third.index > second.index  # never the same frame twice
    assert cap.released


def test_live_consecutive_failures_raise_loudly(fake_capture, caplog):
    fake_capture(rate=500.0, fail_after=3)
    with OpenCVCamera(5, width=W, height=H, fps=100.0, max_consecutive_failures=4) as cam:
        cam.read()
        deadline = time.monotonic() + 2.0
        with pytest.raises(DeviceError, match="4 consecutive failed reads from 5"):
            while time.monotonic() < deadline:
                cam.read(timeout_s=0.5)
    assert "consecutive failed reads" in caplog.text


def test_live_device_that_cannot_open(fake_capture):
    fake_capture()
    with pytest.raises(DeviceError, match="camera device 99"):
        OpenCVCamera(99).connect()


def test_live_read_times_out_without_frames(fake_capture):
    fake_capture(rate=2.0)
    with OpenCVCamera(1, width=W, height=H) as cam:
        reader = cam._thread
        with pytest.raises(DeviceError, match="no new frame"):
            cam.read(timeout_s=0.05)
    assert not reader.is_alive()  # disconnect stops the reader thread
