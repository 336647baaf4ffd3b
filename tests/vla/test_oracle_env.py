"""The labelled oracle env: the sim task env with the simulator's object poses in the observation."""

from __future__ import annotations

import types

import numpy as np
import pytest

from vla.oracle_env import PrivilegedTaskEnv, privileged_dim, privileged_vector


class FakeSimClient:
    """Just enough of ``RobotClient`` for ``RobotEnv``: a simulator's description and state message."""

    sync = True

    def __init__(self, objects: list[str] | None) -> None:
        self.description = {"limits": {}, **({"objects": objects} if objects else {})}
        self.n = len(objects or [])
        self.last_state = None
        self.ticks = 0

    def _arrays(self) -> dict:
        objs = np.zeros((self.n, 7))
        objs[:, 0] = 0.5 + 0.1 * np.arange(self.n) + 0.01 * self.ticks
        objs[:, 6] = 1.0
        return {"objects": objs, "ee_pos": np.array([0.4, 0.0, 0.3]), "gripper": np.array([0.04])}

    def observe(self, instruction, newer_than_ns=0, cameras_newer_than_ns=0):
        self.last_state = types.SimpleNamespace(arrays=self._arrays())
        return {"images": {"front": np.zeros((8, 8, 3), np.uint8)}, "state": np.zeros(8, np.float32),
                "instruction": instruction, "t": {"arm": 1}}

    def reset(self, seed=None, task=None):
        self.ticks = 0

    def ee_delta(self, row):
        self.ticks += 1
        return types.SimpleNamespace(arrays={"applied": np.asarray(row)}, get=lambda k, d=None: d)


def test_vector_is_object_offsets_orientations_then_the_gripper():
    arrays = {"objects": np.array([[0.5, 0.1, 0.02, 1, 0, 0, 0], [0.6, -0.1, 0.02, 0, 0, 0, 1]]),
              "ee_pos": np.array([0.4, 0.0, 0.3]), "gripper": np.array([0.04])}
    v = privileged_vector(arrays, 2)
    assert v.dtype == np.float32 and v.shape == (privileged_dim(2),) == (18,)
    np.testing.assert_allclose(v[:6], [0.1, 0.1, -0.28, 0.2, -0.1, -0.28], atol=1e-6)
    np.testing.assert_allclose(v[6:14], [1, 0, 0, 0, 0, 0, 0, 1])
    np.testing.assert_allclose(v[14:], [0.4, 0.0, 0.3, 0.04], atol=1e-6)
    with pytest.raises(ValueError, match="3 object poses"):
        privileged_vector({**arrays, "objects": np.zeros((3, 7))}, 2)


def test_env_adds_the_vector_on_reset_and_step_and_declares_it():
    env = PrivilegedTaskEnv(FakeSimClient(["red_cube", "blue_cube"]), instruction="pick")
    obs, _ = env.reset(seed=0)
    assert env.observation_space["privileged"].shape == (18,)
    assert env.observation_space["privileged"].contains(obs["privileged"])
    assert obs["privileged"][0] == pytest.approx(0.1)
    obs, *_ = env.step(np.zeros((2, 7), np.float32))
    assert obs["privileged"][0] == pytest.approx(0.12)  # the fake's cube moved 1 cm per tick, 2 ticks


def test_a_real_arm_without_object_poses_is_refused():
    with pytest.raises(ValueError, match="names no `objects`"):
        PrivilegedTaskEnv(FakeSimClient(None), instruction="pick")


def test_vla_rl_refuses_the_oracle_without_a_sim_task():
    from policies.dsrl import DSRLConfig
    from vla.commands.rl import make_env, make_sim_env

    cfg = types.SimpleNamespace(agent=DSRLConfig(encoder="oracle"), env="my_pkg.envs:make_env", reward="task")
    with pytest.raises(ValueError, match="an --env has none"):
        make_env(cfg)
    cfg = types.SimpleNamespace(agent=DSRLConfig(encoder="oracle"), env="", reward="classifier:runs/clf", task="")
    with pytest.raises(ValueError, match="--reward task"):
        make_sim_env(cfg, FakeSimClient(["red_cube"]))
