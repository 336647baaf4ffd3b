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
    assert not (tmp_path / "rounds").exists()  # the last student only, unless keep_rounds


def test_keep_rounds_keeps_each_rounds_student(tmp_path):
    """``keep_rounds``: RUN/rounds/NN/model.pt is the student as it stood after round NN (the budget curve scores
    each), the last of them the run's own checkpoint."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = BCConfig(rounds=2, round0_steps=60, round_steps=40, train_steps=20, batch_size=16, learning_rate=1e-3,
                       episode_steps=40, keep_rounds=True)
        dagger(lambda s: AleEnv("pong", seed=s), lambda: _Always(2), cfg, out=str(tmp_path), progress=False,
               log=lambda m: None)
    finally:
        torch.set_num_threads(threads)
    assert sorted(p.name for p in (tmp_path / "rounds").iterdir()) == ["00", "01", "02"]
    assert not list((tmp_path / "rounds").rglob("*.tmp"))
    w = {n: DQN.from_checkpoint(str(tmp_path / "rounds" / n)).q_network.state_dict() for n in ("00", "01", "02")}
    last = DQN.from_checkpoint(str(tmp_path)).q_network.state_dict()
    assert all(torch.equal(w["02"][k], last[k]) for k in last)
    for a, b in (("00", "01"), ("01", "02")):  # trained between them
        assert any(not torch.equal(w[a][k], w[b][k]) for k in last)


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


def test_action_history_is_oldest_first_and_empty_at_a_games_start():
    from policies.dqn.preprocess import ActionHistory

    h = ActionHistory(2)
    assert h.reset().tolist() == [-1, -1]
    assert h.push(3).tolist() == [-1, 3]
    assert h.push(1).tolist() == [3, 1]
    assert h.reset().tolist() == [-1, -1]
    assert ActionHistory(0).push(2).shape == (0,)
    with pytest.raises(ValueError, match=">= 0"):
        ActionHistory(-1)


def test_a_widened_agent_acts_as_before_and_round_trips(tmp_path):
    """with_action_history: the new inputs' weights start at zero, so the delay-aware copy gives the
    pictures-only agent's Q values whatever the history; its checkpoint keeps the history length."""
    import torch

    from policies.dqn.bc import save_student
    from policies.dqn.config import DQNConfig

    torch.manual_seed(0)
    agent = DQN(4, DQNConfig())
    wide = agent.with_action_history(2)
    x = torch.randint(0, 255, (5, 4, 84, 84), dtype=torch.uint8)
    prev = torch.tensor([[-1, -1], [0, 1], [3, 3], [2, -1], [1, 0]])
    with torch.no_grad():
        torch.testing.assert_close(wide.q_network(x, prev), agent.q_network(x))
    wider = wide.with_action_history(3)  # the old history's columns stay the newest actions'
    with torch.no_grad():
        wide.q_network.head[0].weight[:, -8:].normal_()
        wider = wide.with_action_history(3)
        torch.testing.assert_close(wider.q_network(x, torch.cat([torch.full((5, 1), 2), prev], 1)),
                                   wide.q_network(x, prev))
    with pytest.raises(ValueError, match="cannot shorten"):
        wider.with_action_history(1)
    with pytest.raises(ValueError, match="last 2 actions"):
        wide.act(x[0].numpy(), 0.0, np.random.default_rng(0))
    save_student(wide, str(tmp_path))
    loaded = DQN.from_checkpoint(str(tmp_path))
    assert loaded.cfg.action_history == 2
    with torch.no_grad():
        torch.testing.assert_close(loaded.q_network(x, prev), wide.q_network(x, prev))


def test_only_a_student_with_the_action_history_learns_a_label_the_pictures_do_not_show():
    """The label is the action played before (what the rig's late picture cannot show): from the
    pictures alone the student stays near chance, with its last action as an input it learns it."""
    import torch

    from policies.dqn.bc import train_steps
    from policies.dqn.config import DQNConfig

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        rng = np.random.default_rng(0)
        n = 256
        obs = rng.integers(0, 255, (n, 4, 84, 84), dtype=np.uint8)
        prev = rng.integers(0, 3, (n, 1))
        label = prev[:, 0].copy()
        fits = {}
        for k in (0, 1):
            agent = DQN(3, DQNConfig(learning_rate=1e-3, action_history=k))
            fits[k] = train_steps(agent, obs, label, 60, 32, np.random.default_rng(1), prev=prev)["accuracy"]
    finally:
        torch.set_num_threads(threads)
    assert fits[1] > 0.95 and fits[0] < 0.7, fits


def test_collect_records_the_actions_played_before_each_decision():
    d = collect(AleEnv("pong", seed=0), _Always(2), None, 30, 0.0, np.random.default_rng(0), 30, seed=0, history=2)
    assert d["prev"].shape == (30, 2)
    assert d["prev"][0].tolist() == [-1, -1] and d["prev"][1].tolist() == [-1, 2]
    assert (d["prev"][2:] == 2).all()
    d = collect(AleEnv("pong", seed=0), _Always(2), None, 60, 0.0, np.random.default_rng(0), 60, seed=0, epsilon=0.5,
                history=2)
    np.testing.assert_array_equal(d["prev"][2:, 0], d["prev"][1:-1, 1])  # shifted by one decision
    assert (d["prev"][1:, 1] != 2).any()  # epsilon's random keys are what was played, and are recorded
    assert set(d["label"].tolist()) == {2}


def test_dagger_widens_a_pictures_only_student_and_evaluate_feeds_it_its_actions(tmp_path):
    import torch

    from policies.dqn.config import DQNConfig
    from policies.dqn.dqn import evaluate, train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = DQN(6, DQNConfig(learning_rate=1e-3), tuple(AleEnv("pong").action_names))
        cfg = BCConfig(rounds=1, round_steps=40, train_steps=10, batch_size=8, episode_steps=40, action_history=2)
        agent, rounds = dagger(lambda s: AleEnv("pong", seed=s), lambda: _Always(2), cfg, out=str(tmp_path),
                               agent=start, progress=False, log=lambda m: None)
        assert agent.cfg.action_history == 2 and [r["player"] for r in rounds] == ["student"]
        assert DQN.from_checkpoint(str(tmp_path)).cfg.action_history == 2
        ev = evaluate(agent, AleEnv("pong", seed=0, max_episode_steps=20), 1, seed=0)
        assert ev["lengths"] == [20]
        with pytest.raises(ValueError, match="behaviour cloning"):
            train(DQNConfig(action_history=1), lambda c: AleEnv("pong"), str(tmp_path / "dqn"), progress=False)
    finally:
        torch.set_num_threads(threads)


def test_cotraining_draws_its_share_of_every_batch_from_the_pool_apart():
    """Identical pictures, the pool labelled 0 (1000 samples), the rounds' data 1 (10 samples): mixed
    uniformly the student predicts 0 almost always; drawing half of each batch from the pool it can do
    no better than half right."""
    import torch

    from policies.dqn.bc import train_steps
    from policies.dqn.config import DQNConfig

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        obs = np.zeros((1010, 4, 84, 84), np.uint8)
        label = np.r_[np.zeros(1000, np.int64), np.ones(10, np.int64)]
        acc = {}
        for split in (0, 1000):
            torch.manual_seed(0)
            agent = DQN(3, DQNConfig(learning_rate=1e-2))
            acc[split] = train_steps(agent, obs, label, 60, 32, np.random.default_rng(0), split=split,
                                     share=0.5)["accuracy"]
    finally:
        torch.set_num_threads(threads)
    assert acc[0] > 0.9 and 0.35 < acc[1000] < 0.65, acc


def test_dagger_collects_the_cotraining_samples_once_in_their_own_env(tmp_path):
    import torch

    made = []

    def emulation(s):
        made.append(s)
        return AleEnv("pong", seed=s)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = BCConfig(rounds=1, round0_steps=30, round_steps=20, train_steps=4, batch_size=8, episode_steps=30,
                       cotrain_steps=25)
        with pytest.raises(ValueError, match="needs a cotrain_env"):
            dagger(lambda s: AleEnv("pong", seed=s), lambda: _Always(2), cfg, progress=False, log=lambda m: None)
        _, rounds = dagger(lambda s: AleEnv("pong", seed=s), lambda: _Always(2), cfg, out=str(tmp_path),
                           progress=False, log=lambda m: None, cotrain_env=emulation)
    finally:
        torch.set_num_threads(threads)
    assert len(made) == 1
    assert [r["cotrain_samples"] for r in rounds] == [25, 25] and [r["samples"] for r in rounds] == [30, 50]


class _RamSpy:
    """A teacher that records the RAM it is given and says NOOP."""

    def __init__(self):
        self.rams = []

    def reset(self):
        pass

    def __call__(self, ram):
        self.rams.append(np.array(ram, copy=True))
        return 0


def test_label_at_key_labels_the_state_the_key_meets():
    """With label_at_key the teacher reads env.ram_at_key() (on the rig: the state where its key lands, a
    tick or more after the present one) for every decision; without it, the present RAM. An env without
    ram_at_key is refused by name."""
    from hardware.virtual_rig import RigNoise, VirtualRig

    class Rig(VirtualRig):
        def ram_at_key(self):
            self.given = getattr(self, "given", []) + [super().ram_at_key()]
            return self.given[-1]

    env, teacher = Rig("pong", RigNoise(), seed=0, film=False), _RamSpy()
    collect(env, teacher, None, 40, 0.0, np.random.default_rng(0), 40, seed=1, label_at_key=True)
    assert len(teacher.rams) == len(env.given) == 40
    assert all(np.array_equal(a, b) for a, b in zip(teacher.rams, env.given))
    present = _RamSpy()
    collect(Rig("pong", RigNoise(), seed=0, film=False), present, None, 40, 0.0, np.random.default_rng(0), 40, seed=1)
    assert sum(not np.array_equal(a, b) for a, b in zip(present.rams, teacher.rams)) > 30  # same game, later state
    e = AleEnv("pong", seed=0)
    e.reset(seed=0)
    assert np.array_equal(e.ram_at_key(), e.ale.getRAM())  # emulation: a step's action acts from its first frame

    class NoKeyTime:
        ale, action_space = e.ale, e.action_space

    with pytest.raises(ValueError, match="label_at_key needs an env with ram_at_key"):
        collect(NoKeyTime(), _RamSpy(), None, 4, 0.0, np.random.default_rng(0), 4, seed=0, label_at_key=True)
