"""`vla rl --safety workspace`: every executed chunk goes through AutoSafe's workspace blend (session.safety)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("lerobot")

BOX = (0.30, -0.30, 0.20, 0.80, 0.30, 0.56)  # the top face 4 cm above the home pose's tcp


@pytest.fixture(scope="module")
def tiny_vla(tmp_path_factory) -> str:
    from tests.conftest import save_tiny_vla

    return save_tiny_vla(str(tmp_path_factory.mktemp("vla") / "ckpt"))


def _session(tiny_vla, out, safety: bool):
    """An operator who pushes the arm up at the bridge's max step on every row of every chunk."""
    from robot_io.bridge_process import running_bridge
    from robot_io.robot import RobotClient
    from robot_io.site import load_site
    from session.config import RLConfig
    from session.runner import run_session
    from vla.envs import task_env
    from vla.models import load_vla

    heights = []

    def operator(obs, ctx):
        heights.append(float(obs["state"][2]))
        return np.tile(np.array([0.0, 0.0, 0.05, 0, 0, 0, 1.0], np.float32), (8, 1))

    extra = {"safety": "workspace", "workspace_box": BOX} if safety else {}
    cfg = RLConfig.flat(checkpoint=tiny_vla, out=str(out), task="pick_red_cube", total_ticks=48,
                        max_episode_ticks=24, warmup_steps=2, utd=1, batch_size=8, num_critics=2, hidden=(32,),
                        eval_every=0, eval_episodes=1, videos=0, **extra)
    site = load_site("sim-franka-fast")
    with running_bridge(site, str(out) + ".bridge.log"):
        client = RobotClient(site)
        try:
            summary = run_session(cfg, task_env(client, "pick_red_cube"), load_vla(tiny_vla), operator=operator,
                                  progress=False)
        finally:
            client.close()
    return summary, heights


@pytest.mark.e2e  # two sessions on the sim bridge
def test_the_workspace_layer_keeps_a_pushing_operator_inside_and_stores_what_ran(tiny_vla, tmp_path):
    from policies.common.replay import ReplayBuffer

    summary, heights = _session(tiny_vla, tmp_path / "guarded", safety=True)
    assert summary["safety"]["layer"] == "workspace" and summary["safety"]["box"] == list(BOX)
    assert 0 < summary["safety"]["sharpness"] <= summary["safety"]["certified_sharpness"]
    assert len(heights) == 6 and max(heights) <= BOX[5]  # every macro-step starts inside the box
    eps = [json.loads(x) for x in open(tmp_path / "guarded" / "episodes.jsonl")]
    assert all(0 < e["safety"]["lambda_mean"] <= e["safety"]["lambda_max"] <= 1 for e in eps)
    # the stored chunk is the executed (blended) one: its dz is below the operator's full push
    demo = ReplayBuffer.load(tmp_path / "guarded/checkpoint/demo.npz")
    assert len(demo) == 6 and np.all(demo.extras["chunk"][:6, :, 6] > 0.9)  # the gripper stays the agent's
    # the same operator without the layer leaves the box (the test bites)
    _, free = _session(tiny_vla, tmp_path / "free", safety=False)
    assert max(free) > BOX[5] + 0.02


def test_refusals():
    from session.config import RLConfig

    with pytest.raises(ValueError, match="6 numbers"):
        RLConfig.flat(checkpoint="x", out="y", task="pick_red_cube", safety="workspace", workspace_box=(0, 0, 0))
    with pytest.raises(ValueError, match="not on"):
        RLConfig.flat(checkpoint="x", out="y", task="pick_red_cube", workspace_box=BOX)
    with pytest.raises(ValueError, match="safety must be"):
        RLConfig.flat(checkpoint="x", out="y", task="pick_red_cube", safety="cage")


def test_the_layer_refuses_an_env_without_the_arm_layout_or_a_sharpness_past_its_certificate():
    import gymnasium as gym

    from session.safety import WorkspaceGuard

    class Env:
        action_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)

    with pytest.raises(ValueError, match=r"action space is \(3,\)"):
        WorkspaceGuard(Env(), BOX)

    class Arm:
        action_space = gym.spaces.Box(np.array([-0.05] * 3 + [-0.25] * 3 + [0.0], np.float32),
                                      np.array([0.05] * 3 + [0.25] * 3 + [1.0], np.float32))

    with pytest.raises(ValueError, match="no workspace limits"):
        WorkspaceGuard(Arm())
    with pytest.raises(ValueError, match="certified range"):
        WorkspaceGuard(Arm(), BOX, sharpness=50.0)
    g = WorkspaceGuard(Arm(), BOX)
    chunk = np.tile(np.array([0.0, 0.0, 0.05, 0.1, 0, 0, 1.0], np.float32), (8, 1))
    out, lam = g({"state": np.array([0.55, 0.0, 0.52, 1, 0, 0, 0, 1], np.float32)}, chunk)
    z = 0.52 + np.cumsum(out[:, 2])
    assert np.all(z <= BOX[5]) and np.all(out[:, 3:] == chunk[:, 3:]) and lam[-1] > lam[0]  # it takes over as the face nears
