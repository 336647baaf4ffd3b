"""LeRobot ACT / Diffusion Policy peers: the router adapter behind the VLA interface
(``vla.models.lerobot_peers``) on tiny random policies, and ``bench/sft_peers.py --quick`` end to end."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("lerobot")

ROOT = Path(__file__).resolve().parents[1]
IMG = 64
RED, BLUE = "pick up the red cube", "pick up the blue cube"


def _features():
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs = {f"observation.images.{c}": PolicyFeature(FeatureType.VISUAL, (3, IMG, IMG)) for c in ("front", "wrist")}
    inputs["observation.state"] = PolicyFeature(FeatureType.STATE, (8,))
    return inputs, {"action": PolicyFeature(FeatureType.ACTION, (7,))}


def _stats(action_centre: float) -> dict:
    """Normalisation stats; the actions sit around ``action_centre`` so robot units are recognisable."""
    img = {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25),
           "min": torch.zeros(3, 1, 1), "max": torch.ones(3, 1, 1)}
    return {"observation.images.front": img, "observation.images.wrist": img,
            "observation.state": {"mean": torch.zeros(8), "std": torch.ones(8), "min": -torch.ones(8), "max": torch.ones(8)},
            "action": {"mean": torch.full((7,), action_centre), "std": torch.full((7,), 0.01),
                       "min": torch.full((7,), action_centre - 0.1), "max": torch.full((7,), action_centre + 0.1)}}


def _save_policy(kind: str, path: Path, action_centre: float, seed: int):
    """A tiny randomly initialised LeRobot policy with its processors, saved as lerobot-train does."""
    from lerobot.policies.factory import make_pre_post_processors

    inputs, outputs = _features()
    torch.manual_seed(seed)
    if kind == "act":
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy

        cfg = ACTConfig(input_features=inputs, output_features=outputs, device="cpu", pretrained_backbone_weights=None,
                        chunk_size=5, n_action_steps=3, dim_model=16, n_heads=2, dim_feedforward=32,
                        n_encoder_layers=1, n_decoder_layers=1, n_vae_encoder_layers=1, latent_dim=4)
        policy = ACTPolicy(cfg)
    else:
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

        cfg = DiffusionConfig(input_features=inputs, output_features=outputs, device="cpu",
                              pretrained_backbone_weights=None, horizon=8, n_action_steps=4, n_obs_steps=2,
                              down_dims=(8, 16), n_groups=4, diffusion_step_embed_dim=8,
                              spatial_softmax_num_keypoints=4, num_inference_steps=2)
        policy = DiffusionPolicy(cfg)
    pre, post = make_pre_post_processors(cfg, dataset_stats=_stats(action_centre))
    policy.eval()
    policy.save_pretrained(path)
    pre.save_pretrained(path)
    post.save_pretrained(path)
    return policy, pre, post


def _router(tmp_path: Path, kind: str):
    """Two tasks: red -> actions around +5, blue -> around -5."""
    red = _save_policy(kind, tmp_path / "red" / "pretrained_model", 5.0, seed=0)
    blue = _save_policy(kind, tmp_path / "blue" / "pretrained_model", -5.0, seed=1)
    (tmp_path / "config.json").write_text(json.dumps({
        "kind": "lerobot-peer", "policy": kind,
        "tasks": {RED: "red/pretrained_model", BLUE: "blue/pretrained_model"}}))
    return red, blue


@pytest.fixture(scope="module")
def act_router(tmp_path_factory):
    """(router directory, the red policy with its processors), built once for this module."""
    path = tmp_path_factory.mktemp("act_router")
    red, _ = _router(path, "act")
    return path, red


def _obs(instructions: list[str], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    b = len(instructions)
    return {"images": {c: rng.integers(0, 256, (b, IMG, IMG, 3), dtype=np.uint8) for c in ("front", "wrist")},
            "state": rng.normal(size=(b, 8)).astype(np.float32), "instruction": list(instructions)}


def test_act_peer_routes_by_instruction_in_robot_units(act_router):
    from vla.models import load_vla
    from vla.models.lerobot_peers import LeRobotPeer

    path, (red, red_pre, red_post) = act_router
    model = load_vla(str(path))
    assert isinstance(model, LeRobotPeer) and model.action_shape == (3, 7)  # n_action_steps rows of the chunk

    obs = _obs([RED, BLUE, RED, BLUE])
    a = model.sample_actions(obs)
    assert a.dtype == torch.float32 and tuple(a.shape) == (4, 3, 7) and torch.isfinite(a).all()
    # robot units: each row un-normalised with its own task's stats (mean +-5, std 0.01)
    assert (a[[0, 2]] - 5.0).abs().max() < 1.0 and (a[[1, 3]] + 5.0).abs().max() < 1.0

    # exactly the saved policy behind its saved processors: same numbers as LeRobot's own pipeline
    lb = {f"observation.images.{c}": torch.as_tensor(v[[0, 2]]).permute(0, 3, 1, 2).float() / 255.0
          for c, v in obs["images"].items()}
    lb["observation.state"] = torch.as_tensor(obs["state"][[0, 2]])
    with torch.no_grad():
        ref = red_post(red.predict_action_chunk(red_pre(lb))[:, :3])
    torch.testing.assert_close(a[[0, 2]], ref, rtol=1e-5, atol=1e-5)
    # a row's answer does not depend on the other rows of the batch
    one = {"images": {c: v[1:2] for c, v in obs["images"].items()}, "state": obs["state"][1:2], "instruction": [BLUE]}
    torch.testing.assert_close(model.sample_actions(one)[0], a[1], rtol=1e-5, atol=1e-5)


def test_act_peer_rejects_unknown_instruction_and_steering(act_router):
    from vla.models import load_vla

    model = load_vla(str(act_router[0]))
    with pytest.raises(ValueError, match="stack the cubes") as e:
        model.sample_actions(_obs([RED, "stack the cubes"]))
    assert RED in str(e.value) and BLUE in str(e.value)  # names the instructions it knows
    with pytest.raises(ValueError, match="evaluation-only"):
        model.sample_actions(_obs([RED]), noise=torch.zeros(1, 3, 7))
    with pytest.raises(NotImplementedError, match="evaluation-only"):
        model.noise_shape
    with pytest.raises(NotImplementedError, match="evaluation-only"):
        model.loss({})
    with pytest.raises(NotImplementedError, match="evaluation-only"):
        model.embed(_obs([RED]))
    bad = _obs([RED])
    bad["images"]["front"] = np.zeros((1, 48, 48, 3), np.uint8)  # not the trained size
    with pytest.raises(ValueError, match="images.front"):
        model.sample_actions(bad)


def test_router_config_errors(act_router, tmp_path):
    from vla.models import load_vla

    cfg = json.loads((act_router[0] / "config.json").read_text())
    cfg["tasks"] = {k: str(act_router[0] / v) for k, v in cfg["tasks"].items()}  # absolute subdirs
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_vla(str(tmp_path)).known_instructions == sorted([RED, BLUE])
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "policy": "diffusion"}))
    with pytest.raises(ValueError, match="type 'act'"):
        load_vla(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tasks": {RED: "missing"}}))
    with pytest.raises(ValueError, match="no config.json"):
        load_vla(str(tmp_path))


def test_diffusion_peer_repeats_the_observation_and_unnormalises(tmp_path):
    pytest.importorskip("diffusers")
    from vla.models import load_vla

    _router(tmp_path, "diffusion")
    model = load_vla(str(tmp_path))
    assert model.action_shape == (4, 7)
    a = model.sample_actions(_obs([BLUE, RED]))
    assert a.dtype == torch.float32 and tuple(a.shape) == (2, 4, 7) and torch.isfinite(a).all()
    # DP clips its sample to [-1, 1] (min-max normalised): un-normalised it lies within each task's range
    assert ((a[1] >= 4.9 - 1e-4) & (a[1] <= 5.1 + 1e-4)).all()
    assert ((a[0] >= -5.1 - 1e-4) & (a[0] <= -4.9 + 1e-4)).all()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_bench_sft_peers_quick(tmp_path):
    """Records 2 demos, trains ACT and DP with lerobot-train for a 1-minute budget each, evaluates
    the routers with vla eval (2 episodes) and writes the report (several minutes on 2 CPUs)."""
    pytest.importorskip("diffusers")
    cmd = [sys.executable, "-m", "bench.sft_peers", "--quick", "--out", str(tmp_path / "out"),
           "--data-dir", str(tmp_path / "data"), "--runs-dir", str(tmp_path / "runs"), "--port", "6780"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1100)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rep = json.loads((tmp_path / "out" / "sft_peers.json").read_text())
    assert [p["peer"] for p in rep["peers"]] == ["act", "diffusion"]
    for p in rep["peers"]:
        t = p["tasks"]["pick_red_cube"]
        assert t["episodes"] == 2 and 0 <= t["successes"] <= 2 and t["ci95"][0] <= t["rate"] <= t["ci95"][1]
        assert t["train"]["steps"] >= 1 and 0 < t["train"]["wall_s"] < 60 + 600 and t["train"]["cpu_s"] > 0
        assert p["hyper_parameters"]["pretrained_backbone_weights"] is None
        assert p["hyper_parameters"]["batch_size"] == 8
        router = json.loads((tmp_path / "runs" / p["peer"] / "config.json").read_text())
        assert router["kind"] == "lerobot-peer" and router["tasks"]["pick up the red cube"] == t["train"]["checkpoint"]
    hp = {p["peer"]: p["hyper_parameters"] for p in rep["peers"]}
    assert hp["act"]["chunk_size"] == 100 and hp["act"]["n_action_steps"] == 100  # LeRobot's defaults
    assert hp["diffusion"]["horizon"] == 64 and hp["diffusion"]["num_inference_steps"] == 2
    assert rep["peers"][0]["exec_steps"] == 100 and rep["peers"][1]["exec_steps"] == 32
    assert (tmp_path / "out" / "sft_peers.png").stat().st_size > 5_000
    # a second run reads the finished peers back instead of re-running them
    r2 = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0 and r2.stdout.count("reusing") == 2, r2.stdout[-2000:] + r2.stderr[-2000:]
