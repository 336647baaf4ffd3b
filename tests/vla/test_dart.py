"""DART noise injection while recording (`vla record --dart SIGMA`): the robot executes the expert's
action plus noise, the dataset stores the expert's clean action for the state it saw."""

import numpy as np
import pytest

from vla.data.recording import record_episode


class _Cmd:
    def __init__(self, action):
        self.action, self.events, self.intervening = action, frozenset(), True


class _Expert:
    """A closed-loop expert that steers x towards 0: its label depends on the state it sees."""

    def begin_episode(self, task, seed, instruction):
        pass

    def read(self, obs, privileged=None):
        x = float(obs["state"][0])
        return _Cmd(np.array([-0.5 * x, 0, 0, 0, 0, 0, 1], np.float32))


class _Env:
    def __init__(self):
        self.x = np.zeros(3)
        self.executed = []

    def _obs(self):
        return {"images": {"cam": np.zeros((4, 4, 3), np.uint8)}, "state": np.r_[self.x, 0, 0, 0, 0, 1].astype(np.float32),
                "t": {"cam": len(self.executed) + 1}}

    def reset(self, seed=None):
        self.x = np.zeros(3)
        return self._obs(), {}

    def step(self, action):
        a = np.asarray(action, np.float32)
        self.executed.append(a.copy())
        self.x = self.x + a[:3]
        return self._obs(), 0.0, False, False, {"applied": a[None]}

    def loop_stats(self):
        return {}


class _Writer:
    def __init__(self):
        self.frames = []

    def add_frame(self, frame, task):
        self.frames.append(frame)


@pytest.mark.parametrize("sigma", [0.0, 0.02])
def test_dart_executes_noisy_actions_and_stores_the_experts_clean_labels(sigma):
    env, writer = _Env(), _Writer()
    res = record_episode(env, _Expert(), writer, "go", max_steps=30, seed=3, dart_sigma=sigma)
    assert res.frames == 30
    labels = np.stack([f["action"] for f in writer.frames])
    states = np.stack([f["observation.state"] for f in writer.frames])
    executed = np.stack(env.executed)
    # every label is the expert's answer to the state stored beside it
    np.testing.assert_allclose(labels[:, 0], -0.5 * states[:, 0], atol=1e-6)
    if sigma == 0:
        np.testing.assert_array_equal(executed, labels)  # no noise: the label is what ran
        assert np.all(states[:, 0] == 0)
    else:
        noise = executed[:, :3] - labels[:, :3]
        assert 0.5 * sigma < noise.std() < 2 * sigma  # the robot ran perturbed actions
        np.testing.assert_array_equal(executed[:, 3:], labels[:, 3:])  # rotation and gripper untouched
        assert np.abs(states[:, 0]).max() > sigma  # ... so the states left the expert's path


@pytest.mark.parametrize("seed", range(4))
def test_dart_executed_labels_store_the_noisy_command_the_robot_ran(seed):
    env, writer = _Env(), _Writer()
    record_episode(env, _Expert(), writer, "go", max_steps=25, seed=seed, dart_sigma=0.02, dart_label="executed")
    labels = np.stack([f["action"] for f in writer.frames])
    states = np.stack([f["observation.state"] for f in writer.frames])
    np.testing.assert_array_equal(labels, np.stack(env.executed))  # the label is what ran
    clean = -0.5 * states[:, 0]  # the expert's answer to each stored state
    assert 0.5 * 0.02 < (labels[:, 0] - clean).std() < 2 * 0.02  # ... which the stored labels spread around


def test_dart_refuses_an_unknown_label():
    with pytest.raises(ValueError, match="dart_label"):
        record_episode(_Env(), _Expert(), _Writer(), "go", max_steps=3, dart_sigma=0.01, dart_label="noisy")


def test_vla_record_refuses_an_executed_label_without_dart(tmp_path, capsys):
    from vla.cli import main

    assert main(["record", "--task", "pick_red_cube", "--teleop", "scripted", "--dart-label", "executed",
                 "--root", str(tmp_path / "x")]) == 2
    assert "--dart-label" in capsys.readouterr().err


def test_dart_noise_is_seeded_by_the_episode_seed():
    runs = []
    for seed in (5, 5, 6):
        env = _Env()
        record_episode(env, _Expert(), _Writer(), "go", max_steps=10, seed=seed, dart_sigma=0.01)
        runs.append(np.stack(env.executed))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.allclose(runs[0], runs[2])


def test_dart_refuses_a_negative_sigma():
    with pytest.raises(ValueError, match="dart_sigma"):
        record_episode(_Env(), _Expert(), _Writer(), "go", max_steps=3, dart_sigma=-0.1)


def test_vla_record_refuses_dart_without_the_scripted_expert(tmp_path, capsys):
    from vla.cli import main

    assert main(["record", "--task", "pick_red_cube", "--teleop", "keyboard", "--dart", "0.01",
                 "--root", str(tmp_path / "x")]) == 2
    assert "--dart" in capsys.readouterr().err
