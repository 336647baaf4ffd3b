"""SimCamera: frames of the Franka scene (shape, content, depth, pacing, thread binding)."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import concurrent.futures  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from hardware.base import DeviceError, NotConnectedError  # noqa: E402
from hardware import sim_camera  # noqa: E402
from hardware.sim_camera import SimCamera  # noqa: E402
from hardware.sim_franka import HOME_Q, SimFranka  # noqa: E402


@pytest.fixture(scope="module")
def sim():
    s = SimFranka(realtime=False, seed=0)
    s.connect()
    s.reset(seed=0)
    yield s
    s.disconnect()


@pytest.fixture(scope="module")
def front(sim):
    cam = SimCamera("front", sim, camera="front", width=224, height=224, depth=True)
    cam.connect()
    yield cam
    cam.disconnect()


def colour_mask(rgb, channel):
    rgb = rgb.astype(np.int32)
    others = [c for c in range(3) if c != channel]
    return (rgb[..., channel] > 120) & (rgb[..., channel] > 2 * rgb[..., others[0]] + 20) & \
           (rgb[..., channel] > 2 * rgb[..., others[1]] + 20)


def test_front_frame_shape_content_and_depth(front):
    f = front.render_now()
    assert f.rgb.shape == (224, 224, 3) and f.rgb.dtype == np.uint8
    assert f.rgb.std() > 10  # not blank
    for channel in range(3):  # the red, green and blue cubes are in view
        assert colour_mask(f.rgb, channel).sum() >= 15, f"channel {channel}"
    assert f.depth is not None and f.depth.shape == (224, 224) and f.depth.dtype == np.float32
    assert np.all(np.isfinite(f.depth)) and f.depth.min() > 0.3  # camera ~1 m from the table
    # the pixels of the red cube are about as far as the cube is (front camera at x=1.45, z=0.8)
    red = colour_mask(f.rgb, 0)
    assert 0.8 < float(np.median(f.depth[red])) < 1.4


def test_read_is_paced_and_indexed(sim):
    cam = SimCamera("paced", sim, camera="front", width=64, height=48, fps=20)
    with pytest.raises(NotConnectedError):
        cam.read()
    with cam:
        cam.read()  # the first frame creates the GL context (slow)
        frames = []
        t0 = time.monotonic()
        for _ in range(6):
            frames.append(cam.read())
        elapsed = time.monotonic() - t0
    assert [f.index for f in frames] == [1, 2, 3, 4, 5, 6]
    assert all(b.t_mono_ns > a.t_mono_ns for a, b in zip(frames, frames[1:]))
    # 5 periods of 50 ms, less up to one after the slow first frame (the schedule skips ahead, as a
    # camera drops a frame); free-running would take ~6 render times (~30 ms)
    assert 0.15 < elapsed < 0.6
    assert frames[0].rgb.shape == (48, 64, 3) and frames[0].depth is None


def test_wrist_differs_from_front_and_follows_the_arm(sim, front):
    wrist = SimCamera("wrist", sim, camera="wrist", width=224, height=224, depth=True)
    with wrist:
        sim.reset(seed=0)
        w = wrist.render_now()
        f = front.render_now()
        assert w.rgb.std() > 10
        assert np.abs(w.rgb.astype(int) - f.rgb.astype(int)).mean() > 20
        assert np.all(np.isfinite(w.depth)) and w.depth.min() > 0.0
        assert w.depth.min() < 0.2  # the fingers are right in front of the wrist camera
        # moving the arm changes both views (frames are rendered from the live state, not cached)
        sim.command_joint_positions(HOME_Q + np.array([0.5, 0.2, 0, 0, 0, 0, 0]))
        sim.advance(1.0)
        w2, f2 = wrist.render_now(), front.render_now()
        assert np.abs(w2.rgb.astype(int) - w.rgb.astype(int)).mean() > 5
        assert np.abs(f2.rgb.astype(int) - f.rgb.astype(int)).mean() > 0.5
        sim.reset(seed=0)


def test_vga_frame_and_construction_errors(sim):
    cam = SimCamera("vga", sim, camera="front", width=640, height=480)
    with cam:
        f = cam.render_now()
    assert f.rgb.shape == (480, 640, 3) and f.rgb.std() > 10
    with pytest.raises(ValueError, match="no camera"):
        SimCamera("x", sim, camera="overhead")
    with pytest.raises(ValueError, match="offscreen"):
        SimCamera("x", sim, camera="front", width=4096, height=4096)
    assert cam.describe()["camera"] == "front"


def test_renderer_is_bound_to_its_thread(sim):
    cam = SimCamera("threaded", sim, camera="front", width=32, height=32)
    cam.connect()
    orphans = len(sim_camera._ORPHANED_RENDERERS)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as worker:  # one thread, reused
        frame = worker.submit(cam.render_now).result(timeout=30)
        assert frame.rgb.shape == (32, 32, 3)
        with pytest.raises(DeviceError, match="thread"):  # the main thread is refused
            cam.render_now()
        worker.submit(cam.disconnect).result(timeout=30)  # freed by the thread that owns the GL context
    assert not cam.is_connected
    assert len(sim_camera._ORPHANED_RENDERERS) == orphans


def test_realtime_sim_with_streaming_camera():
    s = SimFranka(realtime=True, seed=1)
    cam = SimCamera("rt", s, camera="front", width=96, height=96, fps=30)
    with s, cam:
        st = s.reset(seed=1)
        s.command_ee_pose(st.ee_pos + np.array([0.0, 0.0, -0.1]), st.ee_quat)
        t_sim0 = s.sim_time
        frames = [cam.read() for _ in range(10)]
        assert s.sim_time - t_sim0 > 0.2  # physics kept running while we rendered
        assert frames[-1].rgb.std() > 10
        assert np.abs(frames[-1].rgb.astype(int) - frames[0].rgb.astype(int)).mean() > 0.2  # the arm moved


def test_side_camera_sees_the_front_cameras_depth_axis_across_its_image(sim, front):
    """Moving a cube 10 cm away from the robot (x, the front camera's viewing axis) shifts it mostly up / down in
    the front image and mostly left / right in the side image: the view sim-franka-fast-3cam adds for depth."""
    side = SimCamera("side", sim, camera="side", width=224, height=224)

    def centroid(cam):
        ys, xs = np.nonzero(colour_mask(cam.render_now().rgb, 0))
        assert len(xs) >= 10, "the red cube is out of view"
        return np.array([xs.mean(), ys.mean()])

    with side:
        sim.reset(seed=0)
        for x in (0.40, 0.50):  # the red cube alone near the middle of the object region, others out of the way
            sim.set_object_pose("red_cube", [x, 0.0, 0.02])
            for i, name in enumerate(("green_cube", "blue_cube")):
                sim.set_object_pose(name, [0.6, 0.2 + 0.05 * i, 0.02])
            if x == 0.40:
                f0, s0 = centroid(front), centroid(side)
        df, ds = centroid(front) - f0, centroid(side) - s0
        assert abs(df[1]) > 2 * abs(df[0]) and abs(ds[0]) > 2 * abs(ds[1])
        assert abs(ds[0]) > 10  # pixels at 224 px: the side view resolves centimetres along x
        sim.reset(seed=0)
