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
