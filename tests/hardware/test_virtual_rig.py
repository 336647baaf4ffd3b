"""The rig on a simulated clock (hardware.virtual_rig): its picture is the screen through the
calibrated camera, its capture latency shows the past, its key latency delays the game's response,
and each failure source switches off by name."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("ale_py")

from hardware.virtual_rig import SOURCES, TICK_S, RigNoise, VirtualRig  # noqa: E402

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


def _random_actions(n, seed):
    return [int(a) for a in np.random.default_rng(seed).integers(0, 6, n)]


def test_unfilmed_rig_has_the_rig_timing_and_the_emulators_pictures():
    """film=False skips the camera: the same game as the filmed rig (same seed and keys: rewards, RAM,
    ticks), each picture the emulator's own screen as shown at the exposure time."""
    noise = RigNoise()
    filmed, bare = VirtualRig("pong", noise, seed=4), VirtualRig("pong", noise, seed=4, film=False)
    assert bare.camera is None and bare.rectifier is None
    (o1, _), (o2, _) = filmed.reset(seed=7), bare.reset(seed=7)
    for a in _random_actions(120, 0):
        o1, r1, *_, i1 = filmed.step(a)
        o2, r2, *_, i2 = bare.step(a)
        assert r1 == r2 and i1["frames"] == i2["frames"] and i1["key_ms"] == i2["key_ms"]
        assert np.array_equal(filmed.ale.getRAM(), bare.ale.getRAM())
        assert np.array_equal(o2["images"]["screen"], bare._picture)  # the shown screen, not a camera frame
        assert o2["images"]["screen"].shape == (210, 160, 3) and o2["images"]["screen"].dtype == np.uint8
    # 50 ms of capture latency: the picture is an earlier screen than the emulator's present one
    assert not np.array_equal(o2["images"]["screen"], bare.render())


class _KeySpy(VirtualRig):
    """Records the RAM at the start of each tick where a sent key takes effect."""

    def reset(self, **kw):
        self.landed = []
        return super().reset(**kw)

    def _tick(self):
        if self._pending and self._pending[0][0] <= self._k * TICK_S:
            self.landed.append(self.ale.getRAM().copy())
        return super()._tick()


def test_ram_at_key_is_the_state_the_key_meets_and_changes_nothing():
    """ram_at_key() predicts the RAM at the tick where the key sent next takes effect (a key path of fixed
    delay: its median is the delay), and calling it leaves the game as it was."""
    noise = dataclasses.replace(RigNoise(), key_ms_median=12.0, key_ms_p99=12.0)
    spy, plain = _KeySpy("pong", noise, seed=2, film=False), VirtualRig("pong", noise, seed=2, film=False)
    spy.reset(seed=5)
    plain.reset(seed=5)
    predicted = []
    for a in _random_actions(200, 1):
        predicted.append(spy.ram_at_key())
        o1, r1, *_ = spy.step(a)
        o2, r2, *_ = plain.step(a)
        assert r1 == r2 and np.array_equal(o1["images"]["screen"], o2["images"]["screen"])
        assert np.array_equal(spy.ale.getRAM(), plain.ale.getRAM())
    assert len(spy.landed) == len(predicted)  # each key lands within its step (12 ms < a 67 ms step)
    assert all(np.array_equal(p, q) for p, q in zip(predicted, spy.landed))
    # the key meets a later state than the present one the decision was made in
    spy.reset(seed=5)
    differs = 0
    for a in _random_actions(50, 2):
        differs += not np.array_equal(spy.ram_at_key(), spy.ale.getRAM())
        spy.step(a)
    assert differs > 40
