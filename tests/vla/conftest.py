"""Shared fixtures for the VLA tests: a tiny two-task LeRobot dataset written through EpisodeWriter."""

from __future__ import annotations

import numpy as np
import pytest

FPS = 10
CAMERAS = {"front": (64, 64), "wrist": (64, 64)}
TASKS = ("pick up the red cube", "lift the green cube high")


def _frame(ep: int, i: int, rng: np.random.Generator) -> dict:
    base = np.array([30 + 40 * ep, 80 + 8 * i, 200 - 50 * (ep % 2)], np.uint8)
    f = {f"observation.images.{c}": np.clip(base + rng.integers(0, 20, (64, 64, 3)), 0, 255).astype(np.uint8)
         for c in CAMERAS}
    state = np.array([0.4 + 0.01 * i, 0.05 * ep, 0.3, 1, 0, 0, 0, 1.0 - 0.05 * i], np.float32)
    f["observation.state"] = state
    f["action"] = np.array([0.01, -0.005 * ep, -0.01 + 0.001 * i, 0, 0, 0.02, float(i > 6)], np.float32)
    f["intervention"] = False
    f["observation.capture_time"] = i / FPS
    return f


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> str:
    """4 episodes x 12 frames, two cameras at 64 px, two instructions. -> dataset root."""
    pytest.importorskip("lerobot")
    from vla.data import EpisodeWriter, make_features

    root = tmp_path_factory.mktemp("data") / "tiny"
    rng = np.random.default_rng(0)
    w = EpisodeWriter(str(root), "local/tiny", fps=FPS, features=make_features(CAMERAS, 8, 7), robot_type="test")
    for ep in range(4):
        for i in range(12):
            w.add_frame(_frame(ep, i, rng), task=TASKS[ep % 2])
        w.save_episode()
    w.close()
    return str(root)


LONG_TASK = "put the red cube in the bowl"
SUBSKILLS = ("pick up the red cube", "put it in the bowl")


@pytest.fixture(scope="session")
def subskill_dataset(tmp_path_factory) -> str:
    """What `vla record --label-subskills` writes: 2 episodes x 12 frames whose frames carry their
    sub-skill (6 of each) and whose episode-log row carries the task's instruction. -> root."""
    pytest.importorskip("lerobot")
    from vla.data import EpisodeWriter, make_features

    root = tmp_path_factory.mktemp("data") / "subskills"
    rng = np.random.default_rng(1)
    w = EpisodeWriter(str(root), "local/subskills", fps=FPS, features=make_features(CAMERAS, 8, 7), robot_type="test",
                      episode_log=True)
    for ep in range(2):
        for i in range(12):
            w.add_frame(_frame(ep, i, rng), task=SUBSKILLS[i >= 6])
        w.save_episode(outcome_row={"instruction": LONG_TASK, "success": True, "frames": 12,
                                    "segments": [[0, SUBSKILLS[0]], [6, SUBSKILLS[1]]]})
    w.close()
    return str(root)


DRIVEN_UNTIL = 8  # DAgger episode 0: the policy drove frames 0-7, the expert (handover) frames 8-11


@pytest.fixture(scope="session")
def dagger_dataset(tmp_path_factory) -> str:
    """What `vla record --dagger` writes: episode 0 driven by the policy up to a handover, episode 1 handed to
    the expert whole (beta), both logged with their DAgger settings. -> root."""
    pytest.importorskip("lerobot")
    from vla.data import EpisodeWriter, make_features

    root = tmp_path_factory.mktemp("data") / "dagger"
    rng = np.random.default_rng(2)
    w = EpisodeWriter(str(root), "local/dagger", fps=FPS, features=make_features(CAMERAS, 8, 7), robot_type="test",
                      episode_log=True)
    for ep in range(2):
        for i in range(12):
            f = _frame(ep, i, rng)
            f["intervention"] = not (ep == 0 and i < DRIVEN_UNTIL)
            w.add_frame(f, task="pick up the red cube")
        w.save_episode(outcome_row={"instruction": "pick up the red cube", "success": True, "frames": 12,
                                    "dagger": {"checkpoint": "ckpt", "beta": 0.0, "handover": "close",
                                               "handed_over_at": DRIVEN_UNTIL if ep == 0 else 0}})
    w.close()
    return str(root)
