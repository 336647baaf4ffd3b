"""The rig agent's PRIVILEGED RAM teachers play, and behaviour cloning + DAgger learns a teacher's
labels from pictures, plays its rounds with the student, and leaves a loadable DQN checkpoint."""

import json

import numpy as np
import pytest

pytest.importorskip("ale_py")

from policies.dqn.bc import BCConfig, collect, dagger  # noqa: E402
from policies.dqn.dqn import DQN  # noqa: E402
from policies.dqn.preprocess import AleEnv  # noqa: E402
from policies.dqn.teacher import make_teacher  # noqa: E402


def _play(game, teacher, steps, seed):
    env = AleEnv(game, seed=seed, max_episode_steps=steps)
    env.reset(seed=seed)
    teacher.reset()
    score = 0.0
    while True:
        _, r, term, trunc, _ = env.step(teacher(env.ale.getRAM()))
        score += r
        if term or trunc:
            return score


def test_teachers_beat_random_play():
    """Random play scores -20.7 (Pong) and 1.7 (Breakout) a game (Nature's table); the trackers
    win Pong points and clear Breakout bricks within two minutes of game."""
    pong = [_play("pong", make_teacher("pong"), 1800, s) for s in (101, 104)]
    assert np.mean(pong) > -5, pong
    breakout = _play("breakout", make_teacher("breakout"), 1800, 101)
    assert breakout >= 10, breakout
    with pytest.raises(ValueError, match="no RAM teacher for 'tennis'"):
        make_teacher("tennis")


class _Always:
    """A teacher that always says action ``a``."""

    def __init__(self, a):
        self.a, self.calls = a, 0

    def reset(self):
        pass

    def __call__(self, ram):
        self.calls += 1
        return self.a


def test_dagger_learns_the_labels_and_plays_the_student(tmp_path):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: more threads only wait on each other
    try:
        _dagger_case(tmp_path)
    finally:
        torch.set_num_threads(threads)


def _dagger_case(tmp_path):
    cfg = BCConfig(rounds=1, round0_steps=120, round_steps=60, train_steps=40, batch_size=16, learning_rate=1e-3,
                   episode_steps=50)
    teacher = _Always(2)
    agent, rounds = dagger(lambda s: AleEnv("pong", seed=s), lambda: teacher, cfg, out=str(tmp_path), progress=False,
                           log=lambda m: None)
    assert [r["player"] for r in rounds] == ["teacher", "student"]
    assert rounds[0]["samples"] == 120 and rounds[1]["samples"] == 180
    assert teacher.calls == 180  # every decision labelled, whoever acted
    assert rounds[1]["student_agrees"] is not None and rounds[1]["accuracy"] == 1.0
    loaded = DQN.from_checkpoint(str(tmp_path))
    rng = np.random.default_rng(0)
    d = collect(AleEnv("pong", seed=0), _Always(0), loaded, 40, 0.0, rng, 40, seed=0)
    assert d["agree"] == 0.0  # the student plays 2 where this teacher says 0: its own choice, not the label
    assert set(d["label"].tolist()) == {0}
    assert len(open(tmp_path / "rounds.jsonl").read().splitlines()) == 2
    assert json.load(open(tmp_path / "bc_config.json"))["rounds"] == 1


def test_collect_records_the_teachers_ram_targets_now_and_one_decision_earlier():
    """The auxiliary targets are the teacher's RAM features at each decision, beside those of the
    decision before (the first decision of a game repeats its own); epsilon's random keys are played,
    the label stays the teacher's."""
    teacher = make_teacher("pong")
    d = collect(AleEnv("pong", seed=0), teacher, None, 60, 0.0, np.random.default_rng(0), 60, seed=3, epsilon=0.5)
    assert d["aux"].shape == (60, 6) and d["aux"].dtype == np.float32
    np.testing.assert_array_equal(d["aux"][1:, 3:], d["aux"][:-1, :3])
    np.testing.assert_array_equal(d["aux"][0, 3:], d["aux"][0, :3])
    assert np.abs(d["aux"]).max() <= 1.0
    assert set(d["label"].tolist()) <= {0, 2, 3}  # the tracker's NOOP / UP / DOWN, never epsilon's other keys
    assert collect(AleEnv("pong", seed=0), _Always(0), None, 10, 0.0, np.random.default_rng(0), 10, seed=0)["aux"].shape == (10, 0)


def test_the_auxiliary_head_learns_where_the_dot_is():
    """train_steps with an AuxHead: the hidden layer comes to encode a dot's position (the aux loss
    falls well below the variance of the targets), and without the head there is no aux loss."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: more threads only wait on each other
    try:
        _aux_case()
    finally:
        torch.set_num_threads(threads)


def _aux_case():
    import torch

    from policies.dqn.bc import AuxHead, train_steps
    from policies.dqn.config import DQNConfig

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n = 128
    pos = rng.integers(4, 80, (n, 2))
    obs = np.zeros((n, 4, 84, 84), np.uint8)
    for i, (r, c) in enumerate(pos):
        obs[i, :, r - 2:r + 2, c - 2:c + 2] = 255
    aux = (pos / 42.0 - 1.0).astype(np.float32)
    label = np.zeros(n, np.int64)
    agent = DQN(3, DQNConfig(learning_rate=1e-3))
    head = AuxHead(512, 2, 1e-3)
    first = train_steps(agent, obs, label, 5, 32, rng, aux, head, 1.0)["aux_loss"]
    last = train_steps(agent, obs, label, 80, 16, rng, aux, head, 1.0)["aux_loss"]
    assert last < 0.3 * float(aux.var(0).sum() / 2) and last < first, (first, last)
    assert "aux_loss" not in train_steps(agent, obs, label, 2, 8, rng)
