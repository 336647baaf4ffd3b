"""The compact VLA's handles (noise, token, stochastic sampler), its training modes and checkpoints."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from vla.models.compact import CompactVLA, CompactVLAConfig
from vla.models.modes import count_parameters, freeze


def make(**kw) -> CompactVLA:
    torch.manual_seed(0)
    cfg = CompactVLAConfig(image_size=64, horizon=4, hidden=64, cond_dim=64, keypoints=8, pretrained=False, **kw)
    return CompactVLA(cfg).eval()


def obs(b: int = 2, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"images": {c: rng.integers(0, 255, (b, 80, 80, 3), dtype=np.uint8) for c in ("front", "wrist")},
            "state": rng.normal(size=(b, 8)).astype(np.float32),
            "instruction": ["pick up the red cube"] * b}


@pytest.fixture(scope="module")
def model() -> CompactVLA:
    return make()


def test_same_noise_same_actions_different_noise_different(model):
    o = obs()
    n1 = torch.randn(2, *model.noise_shape, generator=torch.Generator().manual_seed(1))
    n2 = torch.randn(2, *model.noise_shape, generator=torch.Generator().manual_seed(2))
    a = model.sample_actions(o, noise=n1)
    b = model.sample_actions(o, noise=n1.clone())
    c = model.sample_actions(o, noise=n2)
    assert a.shape == (2, *model.action_shape)
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 1e-4


@pytest.mark.parametrize("shape", [(2, 4), (2, 4, 6), (1, 4, 7), (2, 7, 4)])
def test_wrong_noise_shape_is_refused(model, shape):
    with pytest.raises(ValueError, match=r"noise must have shape \[B=2, H=4, A=7\]"):
        model.sample_actions(obs(), noise=torch.zeros(shape))


def test_non_finite_noise_is_refused(model):
    n = torch.zeros(2, 4, 7)
    n[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        model.sample_actions(obs(), noise=n)


def test_bad_observation_names_the_field(model):
    o = obs()
    del o["images"]["wrist"]
    with pytest.raises(ValueError, match=r"missing camera\(s\) \['wrist'\]"):
        model.sample_actions(o)
    o = obs()
    o["state"] = o["state"][:, :5]
    with pytest.raises(ValueError, match="'state' must have 8 dims"):
        model.sample_actions(o)
    o = obs()
    o["images"]["front"] = o["images"]["front"].astype(np.float32)
    with pytest.raises(ValueError, match="images.front"):
        model.sample_actions(o)


def test_tokens_change_actions_and_are_checked():
    m = make(num_tokens=3)
    with torch.no_grad():
        m.head.token_emb.weight.normal_()
    n = torch.randn(2, *m.noise_shape)
    a0 = m.sample_actions(obs(), noise=n)  # null token by default
    assert torch.equal(a0, m.sample_actions(obs(), noise=n, token=0))
    assert (a0 - m.sample_actions(obs(), noise=n, token=2)).abs().max() > 1e-4
    with pytest.raises(ValueError, match="token must be in"):
        m.sample_actions(obs(), noise=n, token=4)


def test_stochastic_logprobs_match_gaussian_densities(model):
    """Recompute each transition's density with torch.distributions from the chain itself."""
    o = obs()
    sigma = 0.2
    s = model.sample_actions_stochastic(o, sigma=sigma, generator=torch.Generator().manual_seed(3))
    k = s.logprob.shape[1]
    assert s.chain.shape == (2, k + 1, *model.noise_shape)
    cond = model.embed(o)
    dt = -1.0 / k
    for step in range(k - 1):  # the last step is deterministic (log-prob 0)
        x = s.chain[:, step]
        t = torch.full((2,), 1.0 + step * dt)
        mean = x + dt * model.head.velocity(x, t, model.head._cond(cond, None))
        ref = torch.distributions.Normal(mean, sigma).log_prob(s.chain[:, step + 1]).sum(dim=(1, 2))
        assert torch.allclose(s.logprob[:, step], ref, atol=1e-3), (step, s.logprob[:, step], ref)
    assert torch.all(s.logprob[:, -1] == 0)
    assert torch.allclose(model.chain_logprob(o, s.chain, sigma=sigma), s.logprob, atol=1e-3)
    # the returned actions are the chain's end, in robot units
    assert torch.allclose(s.actions, model.unnormalize_actions(s.chain[:, -1]))


def _train_steps(m: CompactVLA, steps: int = 3) -> None:
    m.train()
    opt = torch.optim.Adam(m.trainable_parameters(), lr=1e-2)
    o = obs(4)
    batch = {**o, "action": torch.randn(4, *m.action_shape) * 0.01}
    for _ in range(steps):
        loss, info = m.loss(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert math.isfinite(info["flow_loss"])


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_lora_mode_trains_only_adapters_in_the_trunk():
    m = make().set_mode("lora", lora_rank=4)
    trunk_trainable = [n for n, p in m.trunk.named_parameters() if p.requires_grad]
    assert trunk_trainable and all("lora_" in n for n in trunk_trainable)
    assert all(p.requires_grad for p in m.head.parameters())
    before = _snapshot(m.trunk)
    _train_steps(m)
    after = m.trunk.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed), sorted(changed)[:5]
    c = count_parameters(m)
    assert c["trainable"] < c["total"]


def test_frozen_mode_keeps_the_trunk_and_full_mode_trains_it():
    m = make().set_mode("frozen")
    before = _snapshot(m.trunk)
    head_before = _snapshot(m.head)
    _train_steps(m)
    assert all(torch.equal(v, m.trunk.state_dict()[k]) for k, v in before.items())
    assert any(not torch.equal(v, m.head.state_dict()[k]) for k, v in head_before.items())
    m = make().set_mode("full")
    before = _snapshot(m.trunk)
    _train_steps(m)
    assert any(not torch.equal(v, m.trunk.state_dict()[k]) for k, v in before.items())


def test_freeze_stops_everything_from_training():
    m = freeze(make())
    assert not any(p.requires_grad for p in m.parameters())
    assert not m.training


def test_unknown_mode_and_lora_without_targets_are_refused():
    with pytest.raises(ValueError, match="mode must be one of"):
        make().set_mode("half")
    with pytest.raises(ValueError, match="match nothing"):
        make().set_mode("lora", lora_targets=("no_such_module",))


def test_save_load_round_trip_gives_the_same_actions(tmp_path, model):
    m = make().set_mode("lora", lora_rank=4)
    with torch.no_grad():
        m.set_normalization(np.zeros(8), np.ones(8) * 2, -np.ones(7) * 0.05, np.ones(7) * 0.05)
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)  # non-zero adapters, so the round trip has something to carry
    m.save(str(tmp_path / "ckpt"))
    loaded = CompactVLA.load(str(tmp_path / "ckpt"))
    n = torch.randn(2, *m.noise_shape)
    assert torch.equal(m.eval().sample_actions(obs(), noise=n), loaded.sample_actions(obs(), noise=n))
    assert loaded.mode == "lora"


def test_merge_lora_keeps_the_function_and_removes_the_adapters():
    from vla.models.modes import merge_lora

    m = make().set_mode("lora", lora_rank=4)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    n = torch.randn(2, *m.noise_shape)
    before = m.eval().sample_actions(obs(), noise=n)
    merge_lora(m)
    assert not any("lora_" in k for k in m.state_dict())
    assert m.mode == "full"
    assert torch.allclose(before, m.sample_actions(obs(), noise=n), atol=1e-5)


def test_film_neck_reads_the_instruction_and_round_trips(tmp_path):
    m = make(neck="film")
    texts = m.text(["pick up the red cube", "pick up the blue cube"])
    m.set_normalization(np.zeros(8), np.ones(8), -np.ones(7) * 0.05, np.ones(7) * 0.05, **CompactVLA.text_stats(texts))
    o = obs(1)
    red, blue = dict(o, instruction=["pick up the red cube"]), dict(o, instruction=["pick up the blue cube"])
    # The FiLM layer starts at identity; give it weights, as training would.
    with torch.no_grad():
        for neck in m.necks.values():
            neck.film.weight.normal_(0, 0.5)
    fm = m.trunk_features(m.preprocess_images({c: torch.from_numpy(v) for c, v in o["images"].items()}))
    kp = {name: m.necks["front"](fm["front"], fm["front@fine"], m.normalize_text(m.text(i["instruction"])))
          for name, i in (("red", red), ("blue", blue))}
    assert not torch.allclose(kp["red"], kp["blue"], atol=1e-4)  # the same image, other keypoints
    m.save(str(tmp_path / "film"))
    loaded = CompactVLA.load(str(tmp_path / "film"))
    assert loaded.cfg.neck == "film" and torch.equal(loaded.text_mean, m.text_mean)
    n = torch.randn(1, *m.noise_shape)
    for i in (red, blue):
        assert torch.equal(m.sample_actions(i, noise=n), loaded.sample_actions(i, noise=n))


def test_text_statistics_centre_the_training_instructions():
    e = torch.tensor([[1.0, 0.0, 0.5], [0.8, 0.2, 0.5], [0.9, 0.1, 0.5]])
    st = CompactVLA.text_stats(e)
    centred = (e - st["text_mean"]) / st["text_scale"]
    assert torch.allclose(centred.mean(0), torch.zeros(3), atol=1e-6)
    assert math.isclose(float(centred.pow(2).sum(-1).mean()), 1.0, rel_tol=1e-5)  # unit RMS spread
    assert float(CompactVLA.text_stats(e[:1])["text_scale"]) == 1.0  # one instruction: nothing to scale
    with pytest.raises(ValueError, match="neck"):
        CompactVLAConfig(neck="resnet")


def test_checkpoints_from_before_text_statistics_still_load(tmp_path, model):
    from safetensors.torch import load_file, save_file

    model.save(str(tmp_path / "old"))
    path = str(tmp_path / "old" / "model.safetensors")
    state = {k: v for k, v in load_file(path).items() if k not in ("text_mean", "text_scale")}
    save_file(state, path)
    loaded = CompactVLA.load(str(tmp_path / "old"))
    assert torch.equal(loaded.text_mean, torch.zeros_like(loaded.text_mean)) and float(loaded.text_scale) == 1.0


@pytest.mark.e2e  # a child interpreter loads the text encoder
def test_loading_the_text_encoder_prints_no_library_progress_bar():
    """A user's terminal shows our progress bars, not transformers' "Loading weights" bar."""
    import subprocess
    import sys

    code = "from vla.models.encoders import TextEncoder; print(TextEncoder()(['pick up the red cube']).shape)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "384" in r.stdout
    assert "Loading weights" not in r.stderr and "it/s" not in r.stderr, r.stderr[-2000:]
