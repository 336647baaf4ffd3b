"""The rig on a simulated clock (hardware.virtual_rig): its picture is the screen through the
calibrated camera, its capture latency shows the past, its key latency delays the game's response,
and each failure source switches off by name."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("ale_py")

from hardware.virtual_rig import SOURCES, RigNoise, VirtualRig  # noqa: E402

UP = 2  # Pong's minimal actions: NOOP, FIRE, RIGHT (up), LEFT (down), ...


def _still(**kw) -> RigNoise:
    """Every source off, then the given fields."""
    return dataclasses.replace(RigNoise.off(), **kw)


def _play(env, actions):
    obs, _ = env.reset(seed=3)
    pics, paddles = [obs["images"]["screen"]], [int(env.ale.getRAM()[51])]
    for a in actions:
        obs, *_ = env.step(a)
        pics.append(obs["images"]["screen"])
        paddles.append(int(env.ale.getRAM()[51]))
    return pics, paddles


def test_clean_rig_shows_the_screen():
    env = VirtualRig("pong", _still(), noop_max=0)
    obs, _ = env.reset(seed=0)
    for _ in range(5):
        obs, *_ = env.step(0)
    pic, screen = obs["images"]["screen"].astype(float), env.render().astype(float)
    assert obs["images"]["screen"].shape == (210, 160, 3)
    assert env.calibration_residual_px < 1.0
    assert np.abs(pic - screen)[2:-2, 2:-2].mean() < 6.0  # resampled twice, nothing else


def test_capture_latency_shows_the_previous_step():
    """With 4 ticks of capture latency (one decision at 2 frames of 30 fps), every picture is the one
    a zero-latency rig showed a step earlier."""
    actions = [UP, UP, 3, 3, 0, UP, 3, 0] * 3
    now, _ = _play(VirtualRig("pong", _still(), noop_max=0, seed=1), actions)
    late, _ = _play(VirtualRig("pong", _still(latency_ms=4000 / 60), noop_max=0, seed=1), actions)
    for k in range(2, len(actions)):
        assert np.array_equal(late[k], now[k - 1]), k
    assert any(not np.array_equal(now[k], now[k - 1]) for k in range(2, len(actions)))


def test_key_latency_delays_the_paddle():
    """A step is 4 ticks (67 ms): with 100 ms from frame to key the paddle has not moved after the
    first step, and it has without key latency."""
    _, fast = _play(VirtualRig("pong", _still(), noop_max=0), [UP] * 4)
    _, slow = _play(VirtualRig("pong", _still(key_ms_median=100.0, key_ms_p99=100.0), noop_max=0), [UP] * 4)
    assert fast[0] == slow[0]
    assert fast[1] != fast[0] and slow[1] == slow[0]
    assert slow[3] != slow[0]


def test_sources_switch_off_by_name():
    full = RigNoise()
    for s, fields in SOURCES.items():
        off = full.without(s)
        for k, v in fields.items():
            assert getattr(off, k) == v
        others = {f.name for f in dataclasses.fields(RigNoise)} - set(fields)
        assert all(getattr(off, k) == getattr(full, k) for k in others)
    with pytest.raises(ValueError, match="unknown rig failure source 'glare'"):
        full.without("glare")
    with pytest.raises(ValueError, match="drop_prob"):
        RigNoise(drop_prob=1.5)
    with pytest.raises(ValueError, match="outside the game"):
        VirtualRig("pong", RigNoise.off()).step(17)


def test_the_rig_game_runs_at_60_hz():
    env = VirtualRig("pong", RigNoise(), noop_max=0, seed=0)
    env.reset(seed=0)
    f0 = env.frames
    for _ in range(150):
        _, _, term, _, info = env.step(0)
    ticks = env.frames - f0
    assert 150 * 4 * 0.97 < ticks < 150 * 4 * 1.03  # 2 camera frames at 30 fps = 4 ticks, jitter and drops aside
