"""Nature-DQN (policies/dqn): loss, target network, epsilon, preprocessing, replay, learning on a toy
env, checkpoint + resume. Runs on one thread in a few seconds."""

import json
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from policies.dqn.config import DQNConfig
from policies.dqn.dqn import DQN, FrameReplay, QNetwork, evaluate, linear_schedule, td_target, train
from policies.dqn.preprocess import AleEnv, FrameStack, grey_resize

torch.set_num_threads(1)


class ToyEnv(gym.Env):
    """One-step episodes: the screen is black or white (drawn per episode); action 0 pays 1 on black,
    action 1 pays 1 on white, anything else 0. The optimal policy reads the picture."""

    def __init__(self, seed: int = 0, n_actions: int = 3):
        self.action_space = spaces.Discrete(n_actions)
        self.action_names = tuple(f"A{i}" for i in range(n_actions))
        self.rng = np.random.default_rng(seed)
        self.white = False

    def _obs(self):
        return {"images": {"screen": np.full((210, 160, 3), 255 if self.white else 0, np.uint8)},
                "state": np.zeros(1, np.float32)}

    def reset(self, *, seed=None, options=None):
        self.white = bool(self.rng.random() < 0.5)
        return self._obs(), {"lives": 0, "score": 0}

    def step(self, action):
        r = float(int(action) == (1 if self.white else 0))
        return self._obs(), r, True, False, {"lives": 0, "score": r}


def toy_cfg(**kw):
    base = dict(game="toy", total_steps=300, learning_starts=32, buffer_size=500, batch_size=16, train_every=1,
                target_update_every=20, exploration_fraction=0.5, end_e=0.05, learning_rate=1e-3, frame_size=36,
                checkpoint_every=100, terminal_on_life_loss=False)
    base.update(kw)
    return DQNConfig(**base)


def test_nature_cnn_shapes():
    q = QNetwork(6)
    assert q(torch.zeros(5, 4, 84, 84, dtype=torch.uint8)).shape == (5, 6)
    assert q.conv(torch.zeros(1, 4, 84, 84)).shape[1] == 3136  # 64 x 7 x 7, the Nature CNN
    with pytest.raises(AssertionError, match="QNetwork wants"):
        q(torch.zeros(1, 3, 84, 84))


def test_epsilon_schedule():
    assert linear_schedule(1.0, 0.01, 100, 0) == 1.0
    assert linear_schedule(1.0, 0.01, 100, 50) == pytest.approx(0.505)
    assert linear_schedule(1.0, 0.01, 100, 100) == pytest.approx(0.01)
    assert linear_schedule(1.0, 0.01, 100, 10_000) == pytest.approx(0.01)


def test_config_errors_are_actionable():
    with pytest.raises(ValueError, match="optimizer must be one of adam, rmsprop"):
        DQNConfig(optimizer="sgd")
    with pytest.raises(ValueError, match="learning_starts"):
        DQNConfig(learning_starts=4, batch_size=32)
    with pytest.raises(ValueError, match="end_e"):
        DQNConfig(start_e=0.1, end_e=0.5)


def test_preprocessing_grey_resize_stack():
    rgb = np.zeros((210, 160, 3), np.uint8)
    rgb[:105, :, 0] = 255  # top half pure red
    g = grey_resize(rgb)
    assert g.shape == (84, 84) and g.dtype == np.uint8
    assert abs(int(g[10, 40]) - 76) <= 1 and g[80, 40] == 0  # ITU-R 601: 0.299 * 255
    fs = FrameStack(84, 4)
    s0 = fs.reset(rgb)
    assert s0.shape == (4, 84, 84) and all(np.array_equal(s0[i], g) for i in range(4))
    white = np.full((210, 160, 3), 255, np.uint8)
    s1 = fs.push(white)
    assert np.array_equal(s1[:3], s0[1:]) and (s1[3] == 255).all()  # oldest first, newest last
    # rectify runs before grey: an identity in emulation, the homography warp on the rig
    fs2 = FrameStack(84, 4, rectify=lambda img: img[:, ::-1])
    flipped = np.zeros((210, 160, 3), np.uint8)
    flipped[:, :80] = 255
    assert fs2.reset(flipped)[0, 40, 80] == 255 and fs2.reset(flipped)[0, 40, 3] == 0


def test_huber_loss_and_target_from_target_network():
    """The TD target reads the target network: with a target net that outputs a constant c and an
    online net that does not, y must be r + gamma * c * (1 - done). Uses of the online net fail."""
    cfg = DQNConfig(learning_starts=32, batch_size=4)
    agent = DQN(3, cfg)
    c = 2.5
    with torch.no_grad():
        last = agent.target_network.head[-1]
        last.weight.zero_()
        last.bias.fill_(c)
    obs = torch.randint(0, 255, (4, 4, 84, 84), dtype=torch.uint8)
    batch = {"obs": obs, "next_obs": torch.randint(0, 255, (4, 4, 84, 84), dtype=torch.uint8),
             "action": torch.tensor([0, 1, 2, 0]), "reward": torch.tensor([1.0, 0.0, -1.0, 0.5]),
             "done": torch.tensor([0.0, 1.0, 0.0, 0.0])}
    with torch.no_grad():
        online_next = agent.q_network(batch["next_obs"]).max(1).values
    assert not torch.allclose(online_next, torch.full((4,), c))  # the two networks differ
    q_sa = agent.q_network(obs).gather(1, batch["action"][:, None]).squeeze(1).detach()
    info = agent.update(batch)
    y = torch.tensor([1.0 + 0.99 * c, 0.0, -1.0 + 0.99 * c, 0.5 + 0.99 * c])
    assert torch.allclose(info["td_target"], y)
    # the loss is Huber (smooth L1, delta 1) of Q(s, a) against y, before the step
    d = (q_sa - y).abs()
    huber = torch.where(d < 1, 0.5 * d ** 2, d - 0.5).mean()
    assert info["losses/td_loss"] == pytest.approx(float(huber), rel=1e-5)
    assert td_target(agent.target_network, batch["reward"], batch["next_obs"], batch["done"], 0.99).shape == (4,)


def test_target_network_syncs_only_when_told():
    agent = DQN(2, DQNConfig(learning_starts=32, batch_size=4))
    before = {k: v.clone() for k, v in agent.target_network.state_dict().items()}
    rng = np.random.default_rng(0)
    rb = FrameReplay(16)
    s = np.zeros((4, 84, 84), np.uint8)
    for i in range(8):
        s2 = np.concatenate([s[1:], np.full((1, 84, 84), i * 20, np.uint8)])
        rb.add(s, i % 2, 1.0, s2, False)
        s = s2
    agent.update(rb.sample(4, rng))
    assert all(torch.equal(before[k], v) for k, v in agent.target_network.state_dict().items())
    agent.sync_target()
    assert all(torch.equal(agent.q_network.state_dict()[k], v) for k, v in agent.target_network.state_dict().items())


def test_replay_stores_one_new_frame_and_round_trips(tmp_path):
    rb = FrameReplay(4, stack=2, size=3)
    s = np.zeros((2, 3, 3), np.uint8)
    for i in range(6):  # wraps around
        s2 = np.stack([s[1], np.full((3, 3), i + 1, np.uint8)])
        rb.add(s, i, float(i), s2, i == 5)
        s = s2
    assert len(rb) == 4 and rb.pos == 2
    b = rb.sample(64, np.random.default_rng(0))
    assert torch.equal(b["next_obs"][:, 0], b["obs"][:, 1])
    assert torch.all(b["next_obs"][:, 1, 0, 0] == b["action"] + 1)
    with pytest.raises(AssertionError, match="shifted by one frame"):
        rb.add(s, 0, 0.0, np.zeros((2, 3, 3), np.uint8) + 9, False)
    rb.save(str(tmp_path / "r.npz"))
    rb2 = FrameReplay.load(str(tmp_path / "r.npz"))
    assert rb2.pos == rb.pos and rb2.full and np.array_equal(rb2.obs, rb.obs) and np.array_equal(rb2.done, rb.done)


def test_learns_the_optimal_action_on_a_toy_env(tmp_path):
    cfg = toy_cfg()
    summary = train(cfg, lambda c: ToyEnv(seed=1), str(tmp_path / "run"), progress=False)
    assert summary["steps"] == 300 and summary["updates"] == 300 - 32
    agent = DQN.from_checkpoint(str(tmp_path / "run"))
    res = evaluate(agent, ToyEnv(seed=7), episodes=40, epsilon=0.0)
    assert res["mean"] == 1.0, res  # reads the picture: action 0 on black, 1 on white, every time
    rand = evaluate(None, ToyEnv(seed=7), episodes=40, n_actions=3)
    assert rand["mean"] < 0.7


def test_checkpoint_resume_continues_exactly(tmp_path):
    cfg = toy_cfg(total_steps=120, checkpoint_every=60)
    full = train(cfg, lambda c: ToyEnv(seed=1), str(tmp_path / "a"), progress=False)
    # the same run killed at step 75 (its last checkpoint: step 60), then resumed, ends where the full one did
    def kill_at_75(rec):
        if rec["step"] == 75:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, lambda c: ToyEnv(seed=1), str(tmp_path / "b"), progress=False, log=kill_at_75)
    assert json.load(open(tmp_path / "b" / "checkpoint" / "state.json"))["step"] == 60
    with pytest.raises(FileExistsError, match="already holds a DQN run"):
        train(cfg, lambda c: ToyEnv(seed=1), str(tmp_path / "b"), progress=False)
    env_b = ToyEnv(seed=1)
    for _ in range(60):  # the toy env's own RNG stands where it stood at step 60 of the full run
        env_b.reset()
    train(cfg, lambda c: env_b, str(tmp_path / "b"), resume=True, progress=False)
    a = torch.load(tmp_path / "a" / "checkpoint" / "model.pt", weights_only=False)
    b = torch.load(tmp_path / "b" / "checkpoint" / "model.pt", weights_only=False)
    assert a["updates"] == b["updates"] == full["updates"]
    for k in a["q_network"]:
        assert torch.allclose(a["q_network"][k], b["q_network"][k], atol=1e-6), k
    lines = [json.loads(ln) for ln in open(tmp_path / "b" / "episodes.jsonl")]
    assert [ln["episode"] for ln in lines] == list(range(120))
    assert not os.path.exists(tmp_path / "b" / "checkpoint.partial")


def test_a_torn_checkpoint_falls_back_to_the_previous(tmp_path):
    cfg = toy_cfg(total_steps=40, checkpoint_every=40)
    train(cfg, lambda c: ToyEnv(seed=1), str(tmp_path / "r"), progress=False)
    ck = tmp_path / "r" / "checkpoint"
    os.replace(ck, tmp_path / "r" / "checkpoint.old")  # killed between the two renames
    (tmp_path / "r" / "checkpoint.partial").mkdir()  # and a half-written new one
    agent = DQN.from_checkpoint(str(tmp_path / "r"))
    assert agent.updates == 40 - 32
    train(toy_cfg(total_steps=50, checkpoint_every=40), lambda c: ToyEnv(seed=1), str(tmp_path / "r"),
          resume=True, progress=False)
    assert DQN.from_checkpoint(str(tmp_path / "r")).updates == 50 - 32


def test_ale_env_action_repeat_and_pong_actions():
    env = AleEnv("pong", frame_skip=4, noop_max=0, seed=0)
    assert env.action_names == ("NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE")
    obs, info = env.reset(seed=0)
    assert obs["images"]["screen"].shape == (210, 160, 3) and info["frames"] == 0
    obs, r, term, trunc, info = env.step(0)
    assert info["frames"] == 4 and not term
    with pytest.raises(ValueError, match="did you mean"):
        AleEnv("pongg")


def test_ale_env_pictures_pooled_or_single_frame():
    """max_pool: the max of the step's last two frames; False: the last frame alone, what the emulator
    shows after the step (the rig's camera gives one exposure per picture). The same game either way."""
    pooled, single = AleEnv("pong", noop_max=0, seed=0), AleEnv("pong", noop_max=0, seed=0, max_pool=False)
    pooled.reset(seed=0), single.reset(seed=0)
    differ = 0
    for a in [2, 3] * 40:
        op, rp, *_ = pooled.step(a)
        os_, rs, *_ = single.step(a)
        p, s = op["images"]["screen"], os_["images"]["screen"]
        assert np.array_equal(s, single.ale.getScreenRGB()) and rp == rs
        assert (p >= s).all()  # the last frame is one of the two pooled
        differ += int(not np.array_equal(p, s))
    assert differ > 20  # the ball (and the paddles) move between the two frames of most steps
