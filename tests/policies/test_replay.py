"""ReplayBuffer: ring pointer, exact save/load, input checks that name the field; RLPD mixed sampling."""

import numpy as np
import pytest
import torch

from policies.common.replay import ReplayBuffer, sample_mixed

torch.set_num_threads(1)

SPEC = {"state": ((8,), np.float32), "front": ((16, 16, 3), np.uint8)}


def _obs(i: int) -> dict:
    return {"state": np.full(8, i, np.float32), "front": np.full((16, 16, 3), i % 256, np.uint8)}


def _fill(buf: ReplayBuffer, n: int, start: int = 0, reward_offset: float = 0.0) -> None:
    for i in range(start, start + n):
        buf.add(_obs(i), np.full(3, i / 100, np.float32), i + reward_offset, _obs(i + 1), done=(i % 4 == 3),
                intervention=(i % 2 == 0))


def test_ring_wraps_and_keeps_the_newest():
    buf = ReplayBuffer(5, SPEC, action_dim=3)
    _fill(buf, 3)
    assert (buf.ptr, len(buf)) == (3, 3)
    _fill(buf, 4, start=3)  # 7 transitions into 5 slots: 0 and 1 are overwritten by 5 and 6
    assert (buf.ptr, len(buf)) == (2, 5)
    assert buf.reward.tolist() == [5, 6, 2, 3, 4]
    assert buf.obs["state"][:, 0].tolist() == [5, 6, 2, 3, 4]
    assert buf.next_obs["front"][:, 0, 0, 0].tolist() == [6, 7, 3, 4, 5]
    assert buf.done.tolist() == [False, False, False, True, False]
    assert buf.extras["intervention"].tolist() == [False, True, True, False, True]
    # samples only ever come from the 5 held transitions
    b = buf.sample(200, np.random.default_rng(0))
    assert set(b["reward"].tolist()) == {2.0, 3.0, 4.0, 5.0, 6.0}
    assert torch.equal(b["obs"]["state"][:, 0], b["reward"])
    assert b["obs"]["front"].dtype == torch.uint8 and b["done"].dtype == torch.float32
    assert b["intervention"].dtype == torch.bool and b["action"].shape == (200, 3)


@pytest.mark.parametrize("n", [3, 7])  # partly filled, and wrapped
def test_save_load_is_exact(tmp_path, n):
    buf = ReplayBuffer(5, SPEC, action_dim=3, extras={"w": ((2,), np.float32)})
    _fill(buf, n)
    path = tmp_path / "replay.npz"
    buf.save(path)
    assert not (tmp_path / "replay.npz.tmp").exists()
    back = ReplayBuffer.load(path)
    assert (back.ptr, back.size, back.capacity) == (buf.ptr, buf.size, buf.capacity)
    assert back.obs_spec == buf.obs_spec and back.extras_spec == buf.extras_spec
    for name in ("action", "reward", "done"):
        np.testing.assert_array_equal(getattr(back, name), getattr(buf, name))
    for k in SPEC:
        np.testing.assert_array_equal(back.obs[k], buf.obs[k])
        np.testing.assert_array_equal(back.next_obs[k], buf.next_obs[k])
    # the same generator state gives the same samples, and the next add lands in the same slot
    s1, s2 = buf.sample(32, np.random.default_rng(7)), back.sample(32, np.random.default_rng(7))
    for k in ("action", "reward", "done", "intervention", "w"):
        assert torch.equal(s1[k], s2[k])
    assert all(torch.equal(s1["obs"][k], s2["obs"][k]) for k in SPEC)
    _fill(buf, 1, start=50)
    _fill(back, 1, start=50)
    assert back.ptr == buf.ptr and np.array_equal(back.reward, buf.reward)


def test_save_is_atomic(tmp_path, monkeypatch):
    buf = ReplayBuffer(5, SPEC, action_dim=3)
    _fill(buf, 2)
    path = tmp_path / "replay.npz"
    buf.save(path)
    _fill(buf, 2, start=2)

    def crash(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(OSError):
        buf.save(path)
    assert len(ReplayBuffer.load(path)) == 2  # the old file is intact
    assert not (tmp_path / "replay.npz.tmp").exists()


@pytest.mark.parametrize("kwargs, field", [
    (dict(obs={"state": np.zeros(7, np.float32), "front": np.zeros((16, 16, 3), np.uint8)}), r"obs\['state'\].*shape"),
    (dict(obs={"state": np.zeros(8, np.float64), "front": np.zeros((16, 16, 3), np.uint8)}), r"obs\['state'\].*dtype"),
    (dict(next_obs={"state": np.zeros(8, np.float32), "front": np.zeros((16, 16, 3), np.float32)}),
     r"next_obs\['front'\].*dtype"),
    (dict(obs={"state": np.zeros(8, np.float32)}), r"obs fields.*missing \['front'\]"),
    (dict(next_obs={**_obs(0), "state": np.array([0, 0, 0, np.nan, 0, 0, 0, 0], np.float32)}),
     r"next_obs\['state'\].*NaN"),
    (dict(action=np.array([0.0, np.inf, 0.0], np.float32)), r"action.*NaN or inf"),
    (dict(action=np.zeros(4, np.float32)), r"action.*shape"),
    (dict(reward=float("nan")), r"reward"),
    (dict(done=2), r"done"),
    (dict(intervention="yes"), r"intervention"),
    (dict(surprise=True), r"unknown extra.*surprise"),
])
def test_bad_add_names_the_field_and_writes_nothing(kwargs, field):
    buf = ReplayBuffer(4, SPEC, action_dim=3)
    t = dict(obs=_obs(0), action=np.zeros(3, np.float32), reward=0.0, next_obs=_obs(1), done=False)
    t.update(kwargs)
    with pytest.raises(ValueError, match=field):
        buf.add(**t)
    assert (len(buf), buf.ptr) == (0, 0)


def test_bad_spec_and_empty_sample():
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0, SPEC, 3)
    with pytest.raises(ValueError, match="obs_spec\\['x'\\]"):
        ReplayBuffer(4, {"x": (8,)}, 3)
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(4, SPEC, 3).sample(2, np.random.default_rng(0))


def test_sample_mixed_is_symmetric():
    online, offline = ReplayBuffer(50, SPEC, 3), ReplayBuffer(50, SPEC, 3)
    _fill(online, 20)  # rewards 0..19
    _fill(offline, 20, reward_offset=1000.0)  # rewards 1000..1019
    rng = np.random.default_rng(0)
    for frac, n_off in ((0.5, 128), (0.25, 64), (0.0, 0), (1.0, 256)):
        b = sample_mixed(online, offline, 256, offline_fraction=frac, rng=rng)
        is_off = b["reward"] >= 1000
        assert int(is_off.sum()) == n_off and not is_off[:256 - n_off].any()
        assert b["obs"]["front"].shape == (256, 16, 16, 3) and b["intervention"].shape == (256,)
    empty = ReplayBuffer(50, SPEC, 3)
    assert (sample_mixed(online, empty, 64, rng=rng)["reward"] < 1000).all()  # no offline data: all online
    assert (sample_mixed(empty, offline, 64, rng=rng)["reward"] >= 1000).all()
    with pytest.raises(ValueError, match="different transitions"):
        sample_mixed(online, ReplayBuffer(50, SPEC, 4), 64, rng=rng)


@pytest.mark.parametrize("seed", range(5))
def test_n_step_returns_follow_the_episodes_through_truncations_terminals_and_the_ring(seed):
    """Generated episodes (random lengths, ending in a terminal or a time-limit truncation, random rewards) in a
    ring smaller than the stream: every n-step transition the buffer gives equals the one computed from the
    episode lists, never crossing into the next episode or into an overwritten slot."""
    rng = np.random.default_rng(seed)
    n, gamma, cap = 3, 0.9, 37
    stream = []  # (obs id, reward, next obs id, done) in insertion order; ids are unique per observation
    next_id = 0
    for _ in range(20):
        length, terminal = int(rng.integers(1, 8)), bool(rng.random() < 0.5)
        ids = list(range(next_id, next_id + length + 1))
        next_id += length + 1
        for t in range(length):
            stream.append((ids[t], float(rng.normal()), ids[t + 1], terminal and t == length - 1))
    buf = ReplayBuffer(cap, {"state": ((2,), np.float32)}, action_dim=1)
    for o, r, o2, d in stream:
        buf.add({"state": np.array([o, -o], np.float32)}, np.zeros(1, np.float32), r,
                {"state": np.array([o2, -o2], np.float32)}, d)
    held = stream[-cap:]  # what the ring keeps, oldest first
    idx = np.arange(cap)
    b = buf.n_step_gather(idx, n, gamma)
    for i in idx:
        pos = (i - buf.ptr) % cap  # slot i's place among the held transitions
        ret, disc, k = 0.0, 1.0, pos
        for step in range(n):
            o, r, o2, d = held[k]
            ret += disc * r
            disc *= gamma
            if step == n - 1 or d or k + 1 >= len(held) or held[k + 1][0] != o2:
                break
            k += 1
        assert b["reward"][i].item() == pytest.approx(ret, rel=1e-5, abs=1e-5), (seed, i)
        assert b["discount"][i].item() == pytest.approx(disc, rel=1e-6)
        assert b["next_obs"]["state"][i, 0].item() == held[k][2] and b["done"][i].item() == float(held[k][3])
        assert b["obs"]["state"][i, 0].item() == held[pos][0]
    one = buf.n_step_gather(idx, 1, gamma)  # n = 1 is the one-step transition
    ref = buf.gather(idx)
    assert torch.equal(one["reward"], ref["reward"]) and torch.equal(one["done"], ref["done"])
    assert torch.allclose(one["discount"], torch.full((cap,), gamma))
    with pytest.raises(ValueError, match="n_step must be >= 1"):
        buf.n_step_gather(idx, 0, gamma)
