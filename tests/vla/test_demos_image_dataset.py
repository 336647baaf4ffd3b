"""`load_demos` reads datasets whose frames are stored as images in the parquet rows
(`vla record --no-video`), not only video datasets."""

from __future__ import annotations

import numpy as np
import pytest

from tests.vla.conftest import CAMERAS, FPS, TASKS, _frame


def test_image_dataset_loads_with_the_same_frames(tmp_path):
    pytest.importorskip("lerobot")
    from vla.data import EpisodeWriter, make_features
    from vla.data.demos import load_demos

    rng = np.random.default_rng(0)
    written = []
    w = EpisodeWriter(str(tmp_path / "img"), "local/img", fps=FPS, features=make_features(CAMERAS, 8, 7, video=False),
                      robot_type="test")
    for ep in range(2):
        frames = [_frame(ep, i, rng) for i in range(5)]
        for f in frames:
            w.add_frame(f, task=TASKS[ep])
        w.save_episode()
        written.append(frames)
    w.close()
    eps = load_demos([str(tmp_path / "img")], 64, progress=False)
    assert [e.instruction for e in eps] == list(TASKS[:2]) and [len(e) for e in eps] == [5, 5]
    for e, frames in zip(eps, written):
        for cam in CAMERAS:  # image features are stored losslessly: the frames come back exactly
            np.testing.assert_array_equal(e.images[cam], np.stack([f[f"observation.images.{cam}"] for f in frames]))
        np.testing.assert_allclose(e.state, np.stack([f["observation.state"] for f in frames]))


def test_success_only_keeps_the_episodes_marked_successful(tmp_path):
    """`vla train --success-only` (filtered BC on data recorded with --keep-failures): episodes come
    back only where meta/vla_episodes.jsonl says success, and a dataset without outcomes is refused."""
    pytest.importorskip("lerobot")
    import json

    from vla.data import EpisodeWriter, make_features
    from vla.data.demos import load_demos

    rng = np.random.default_rng(1)
    root = tmp_path / "mixed"
    w = EpisodeWriter(str(root), "local/mixed", fps=FPS, features=make_features(CAMERAS, 8, 7, video=False),
                      robot_type="test")
    for ep in range(3):
        for i in range(4 + ep):  # lengths 4, 5, 6 tell the episodes apart
            w.add_frame(_frame(ep, i, rng), task=TASKS[0])
        w.save_episode()
    w.close()
    with pytest.raises(FileNotFoundError, match="vla_episodes.jsonl"):
        load_demos([str(root)], 64, progress=False, success_only=True)
    sidecar = root / "meta" / "vla_episodes.jsonl"
    sidecar.write_text("".join(json.dumps({"episode_index": i, "success": ok}) + "\n"
                               for i, ok in enumerate([True, False])))
    with pytest.raises(ValueError, match=r"episode\(s\) \[2\]"):  # an episode with no outcome is not guessed
        load_demos([str(root)], 64, progress=False, success_only=True)
    with open(sidecar, "a") as f:
        f.write(json.dumps({"episode_index": 2, "success": True}) + "\n")
    assert [len(e) for e in load_demos([str(root)], 64, progress=False)] == [4, 5, 6]
    kept = load_demos([str(root)], 64, progress=False, success_only=True)
    assert [(e.episode_index, len(e)) for e in kept] == [(0, 4), (2, 6)]
