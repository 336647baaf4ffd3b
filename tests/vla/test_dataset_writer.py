"""EpisodeWriter writes LeRobot v3 datasets that lerobot itself loads back, frame for frame."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("lerobot")

from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402

from vla.data import EpisodeWriter, check_dataset, make_features  # noqa: E402
from vla.data.writer import ONE_EPISODE_PER_FILE_MB  # noqa: E402

FPS = 15
H = W = 64
CAMERAS = {"front": (H, W), "wrist": (H, W)}


def colour(episode: int, frame: int, camera: str) -> np.ndarray:
    """RGB colour of a synthetic frame: encodes the episode, the frame index and the camera."""
    v = 20 + 9 * frame + 3 * episode
    return np.array([v, 255 - v, 60], np.uint8) if camera == "front" else np.array([60, v, 255 - v], np.uint8)


def frame_dict(episode: int, i: int) -> dict:
    frame = {f"observation.images.{cam}": np.broadcast_to(colour(episode, i, cam), (H, W, 3)).copy() for cam in CAMERAS}
    frame["observation.state"] = np.array([episode, i, 0, 0, 0, 0, 0, 0], np.float32)
    frame["action"] = np.full(7, i / 10, np.float32)
    frame["intervention"] = i % 3 == 0
    frame["observation.capture_time"] = i / FPS + 0.001 * (i % 2)  # a little measured jitter
    return frame


def record(writer: EpisodeWriter, episode: int, frames: int, task: str) -> int:
    for i in range(frames):
        writer.add_frame(frame_dict(episode, i), task=task)
    return writer.save_episode()


@pytest.fixture
def features():
    return make_features(CAMERAS)


def test_make_features_layout(features):
    assert features["observation.images.front"] == {
        "dtype": "video",
        "shape": (H, W, 3),
        "names": ["height", "width", "channels"],
    }
    assert features["observation.state"]["shape"] == (8,) and features["action"]["shape"] == (7,)
    assert features["intervention"]["dtype"] == "bool"
    assert features["observation.capture_time"]["dtype"] == "float64"
    assert make_features(CAMERAS, video=False)["observation.images.front"]["dtype"] == "image"


def test_written_dataset_loads_in_lerobot(tmp_path, features):
    root = tmp_path / "ds"
    tasks = ["pick the cube", "open the drawer", "pick the cube"]
    with EpisodeWriter(root, "local/test", FPS, features, robot_type="franka") as writer:
        for ep, task in enumerate(tasks):
            assert record(writer, ep, 20, task) == ep
        assert (writer.num_episodes, writer.num_frames, writer.root) == (3, 60, root)

    ds = LeRobotDataset("local/test", root=root)
    assert (ds.num_episodes, ds.num_frames, ds.fps) == (3, 60, FPS)
    for key, ft in features.items():
        assert ds.features[key]["dtype"] == ft["dtype"]
        assert tuple(ds.features[key]["shape"]) == ft["shape"]
    assert [ds.meta.episodes[ep]["tasks"] for ep in range(3)] == [[t] for t in tasks]
    info = json.loads((root / "meta/info.json").read_text())
    assert info["robot_type"] == "franka" and info["data_files_size_in_mb"] == ONE_EPISODE_PER_FILE_MB

    for ep in range(3):
        start = ds.meta.episodes[ep]["dataset_from_index"]
        for i in (0, 7, 19):
            item = ds[start + i]
            assert int(item["episode_index"]) == ep and int(item["frame_index"]) == i
            assert item["task"] == tasks[ep]
            assert item["timestamp"].item() == pytest.approx(i / FPS)  # nominal, lerobot's sync check
            assert item["observation.capture_time"].item() == pytest.approx(i / FPS + 0.001 * (i % 2))
            assert bool(item["intervention"]) == (i % 3 == 0)
            np.testing.assert_allclose(item["observation.state"][:2].numpy(), [ep, i])
            for cam in CAMERAS:
                image = item[f"observation.images.{cam}"]  # CHW float in [0, 1], decoded from mp4
                assert tuple(image.shape) == (3, H, W)
                mean = image.mean(dim=(1, 2)).numpy() * 255
                np.testing.assert_allclose(mean, colour(ep, i, cam), atol=8, err_msg=f"ep {ep} frame {i} {cam}")

    # one episode per file, every file written once
    for pattern, count in [("data/*/*.parquet", 3), ("meta/episodes/*/*.parquet", 3), ("videos/*/*/*.mp4", 6)]:
        assert len(list(root.glob(pattern))) == count, pattern
    assert not list(root.rglob("*.tmp"))
    assert check_dataset(root).ok


def test_resume_appends(tmp_path, features):
    root = tmp_path / "ds"
    with EpisodeWriter(root, "local/test", FPS, features) as writer:
        record(writer, 0, 12, "a")
        record(writer, 1, 10, "b")
    with EpisodeWriter(root, "local/test", FPS, features, resume=True) as writer:
        assert (writer.num_episodes, writer.num_frames) == (2, 22)
        assert record(writer, 2, 14, "c") == 2
        assert (writer.num_episodes, writer.num_frames) == (3, 36)

    ds = LeRobotDataset("local/test", root=root)
    assert (ds.num_episodes, ds.num_frames) == (3, 36)
    last = ds[35]
    assert int(last["episode_index"]) == 2 and int(last["frame_index"]) == 13 and last["task"] == "c"
    np.testing.assert_allclose(last["observation.images.front"].mean(dim=(1, 2)).numpy() * 255, colour(2, 13, "front"), atol=8)
    assert check_dataset(root).ok


def test_discard_drops_the_episode_in_progress(tmp_path, features):
    root = tmp_path / "ds"
    with EpisodeWriter(root, "local/test", FPS, features) as writer:
        for i in range(9):
            writer.add_frame(frame_dict(5, i), task="bad take")
        writer.discard_episode()
        assert writer.frames_in_episode == 0 and writer.num_episodes == 0
        record(writer, 0, 11, "good take")
    ds = LeRobotDataset("local/test", root=root)
    assert (ds.num_episodes, ds.num_frames) == (1, 11)
    assert ds[0]["task"] == "good take"
    np.testing.assert_allclose(ds[10]["observation.images.wrist"].mean(dim=(1, 2)).numpy() * 255, colour(0, 10, "wrist"), atol=8)
    assert check_dataset(root).ok


def test_resume_refuses_other_features_or_fps(tmp_path, features):
    root = tmp_path / "ds"
    with EpisodeWriter(root, "local/test", FPS, features) as writer:
        record(writer, 0, 5, "a")
    with pytest.raises(ValueError, match=r"observation\.state.*shape"):
        EpisodeWriter(root, "local/test", FPS, make_features(CAMERAS, state_dim=9))
    with pytest.raises(ValueError, match=r"observation\.images\.side"):
        EpisodeWriter(root, "local/test", FPS, make_features({**CAMERAS, "side": (H, W)}))
    with pytest.raises(ValueError, match="fps"):
        EpisodeWriter(root, "local/test", FPS + 1, features)
    with pytest.raises(ValueError, match="already holds a dataset"):
        EpisodeWriter(root, "local/test", FPS, features, resume=False)
    with pytest.raises(ValueError, match="holds no dataset"):
        EpisodeWriter(tmp_path / "nothing", "local/test", FPS, features, resume=True)
    assert check_dataset(root).ok  # the refused writers left it untouched


def test_misuse_is_refused(tmp_path, features):
    writer = EpisodeWriter(tmp_path / "ds", "local/test", FPS, features)
    with pytest.raises(ValueError, match="no frames"):
        writer.save_episode()
    bad = frame_dict(0, 0)
    bad["observation.state"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="observation.state"):
        writer.add_frame(bad, task="a")
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        writer.add_frame(frame_dict(0, 0), task="a")


@pytest.mark.e2e  # a child interpreter records and encodes videos
def test_no_encoder_statistics_on_the_terminal(tmp_path):
    """libx264 prints a statistics block per video at FFmpeg's INFO level, and lerobot's encoder
    thread hands logging back to FFmpeg's own printer after every video: a recording of several
    episodes must still print none of it (FFmpeg writes to the C stderr, so this runs in a child)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(__import__('pathlib').Path(__file__).resolve().parents[2])!r})
        from tests.vla.test_dataset_writer import CAMERAS, FPS, record
        from vla.data import EpisodeWriter, make_features
        with EpisodeWriter({str(tmp_path / 'ds')!r}, "local/test", FPS, make_features(CAMERAS)) as w:
            for ep in range(3):
                record(w, ep, 6, "t")
        print("done")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "done" in r.stdout
    noise = [line for line in (r.stdout + r.stderr).splitlines() if "libx264" in line or "x264 [info]" in line]
    assert not noise, f"{len(noise)} encoder lines, e.g. {noise[:3]}"
