"""LeRobot pi0 / pi05 / SmolVLA adapters on tiny random policies, saved and loaded offline.

How the tiny policies are built (nothing comes from the hub):

* pi0 / pi05 only know the "gemma_300m" / "gemma_2b" widths and a full-size SigLIP tower. The
  fixture patches lerobot's variant -> config function (width 32, one layer, 8 heads: the joint
  attention hard-codes 8 heads) and wraps the two model classes to shrink the vision tower and
  the 257k-token vocabulary before they are built.
* SmolVLA builds its VLM from ``config.vlm_model_name``: here a tmp directory holding a tiny
  ``SmolVLMConfig``. Its processor (transformers' ``SmolVLMProcessor`` needs ``num2words``, which
  this environment lacks) is replaced by a stand-in that only carries the tokenizer, which is all
  SmolVLA and the adapter read from it.
* The tokenizer is a char-level ``tokenizers`` WordLevel tokenizer (printable ASCII + SmolVLM's
  image special tokens), saved into ``<checkpoint>/tokenizer`` for pi0 / pi05.
"""

import os
import string
import types

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("lerobot")
pytest.importorskip("peft")

from vla.models.lerobot_adapters import LeRobotPi0, LeRobotPi05, LeRobotVLA  # noqa: E402

KINDS = ("pi0", "pi05", "smolvla")
B, H, A, A_MAX, STEPS = 2, 4, 3, 6, 3
VOCAB = 128


def _tokenizer():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<fake_token_around_image>", "<global-img>", "<image>"]
    vocab = {t: i for i, t in enumerate(specials + list(string.printable))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per character
    image_tokens = {"fake_image_token": "<fake_token_around_image>", "global_image_token": "<global-img>",
                    "image_token": "<image>"}  # SmolVLA reads their ids from its tokenizer
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>",
                                  extra_special_tokens=image_tokens)
    assert len(tok) <= VOCAB
    return tok


def _patch_tiny(mp: pytest.MonkeyPatch, tok) -> None:
    import lerobot.policies.pi0.modeling_pi0 as m0
    import lerobot.policies.pi05.modeling_pi05 as m5
    import lerobot.policies.smolvla.smolvlm_with_expert as swe

    for m in (m0, m5):
        paligemma_cls, expert_cls = m.PaliGemmaForConditionalGenerationWithPiGemma, m.PiGemmaForCausalLM

        def tiny_paligemma(config, _cls=paligemma_cls):
            v = config.vision_config
            v.hidden_size, v.intermediate_size, v.num_hidden_layers, v.num_attention_heads = 16, 32, 1, 2
            v.projection_dim = config.text_config.hidden_size  # lerobot sets 2048 (gemma_2b's width)
            config.text_config.vocab_size = VOCAB
            return _cls(config=config)

        def tiny_expert(config, _cls=expert_cls):
            config.vocab_size = VOCAB
            return _cls(config=config)

        mp.setattr(m, "PaliGemmaForConditionalGenerationWithPiGemma", tiny_paligemma)
        mp.setattr(m, "PiGemmaForCausalLM", tiny_expert)
        mp.setattr(m, "get_gemma_config", lambda variant, _m=m: _m.GemmaConfig(
            width=32, depth=1, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=4))
    mp.setattr(swe, "AutoProcessor", types.SimpleNamespace(
        from_pretrained=lambda name, **kw: types.SimpleNamespace(tokenizer=tok)))


def _save_tiny_vlm(path) -> None:
    """SmolVLA's VLM config (``vlm_model_name``): a tiny SmolVLM, saved at ``path``."""
    from transformers import SmolVLMConfig

    SmolVLMConfig(vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     image_size=32, patch_size=8),
                  text_config=dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=VOCAB),
                  scale_factor=2).save_pretrained(path)


def _config(kind: str, vlm_dir, cameras=("front",), state_dim: int = 4, action_dim: int = A):
    from lerobot.configs import FeatureType, PolicyFeature

    images = {f"observation.images.{c}": PolicyFeature(FeatureType.VISUAL, (3, 28, 28)) for c in cameras}
    common = dict(input_features={**images, "observation.state": PolicyFeature(FeatureType.STATE, (state_dim,))},
                  output_features={"action": PolicyFeature(FeatureType.ACTION, (action_dim,))},
                  chunk_size=H, n_action_steps=H, max_state_dim=8, max_action_dim=max(A_MAX, action_dim),
                  device="cpu")
    if kind == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config

        return PI0Config(**common, image_resolution=(28, 28), num_inference_steps=STEPS, tokenizer_max_length=24)
    if kind == "pi05":  # the prompt carries the discretised state: "Task: ..., State: 12 200 ...;\nAction: "
        from lerobot.policies.pi05.configuration_pi05 import PI05Config

        return PI05Config(**common, image_resolution=(28, 28), num_inference_steps=STEPS, tokenizer_max_length=64)
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig

    return SmolVLAConfig(**common, resize_imgs_with_padding=(32, 32), num_steps=STEPS, tokenizer_max_length=24,
                         vlm_model_name=str(vlm_dir), num_vlm_layers=2)


def _policy(kind: str, config):
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    return {"pi0": PI0Policy, "pi05": PI05Policy, "smolvla": SmolVLAPolicy}[kind](config)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny-model patches for the whole module; -> ``load(kind, **kw)`` and the checkpoint dirs."""
    root = tmp_path_factory.mktemp("lerobot_ckpts")
    vlm_dir = root / "tiny_smolvlm"
    _save_tiny_vlm(vlm_dir)
    tok = _tokenizer()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: thread hand-offs cost ~100x the work on a shared CPU
    try:
        with pytest.MonkeyPatch.context() as mp:
            _patch_tiny(mp, tok)
            ckpts = {}
            for kind in KINDS:
                torch.manual_seed(0)
                ckpts[kind] = root / kind
                _policy(kind, _config(kind, vlm_dir)).save_pretrained(ckpts[kind])
                if kind != "smolvla":
                    tok.save_pretrained(ckpts[kind] / "tokenizer")

            def load(kind, path=None, **kw):
                return LeRobotVLA.from_checkpoint(path or ckpts[kind], **kw)

            yield types.SimpleNamespace(load=load, ckpts=ckpts)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=KINDS)
def vla(request, tiny):
    return tiny.load(request.param)


def _obs(seed=0, instruction=("pick up the cube", "open the drawer")):
    rng = np.random.default_rng(seed)
    return {"images": {"front": rng.integers(0, 256, (B, 24, 32, 3), dtype=np.uint8)},
            "state": rng.normal(size=(B, 4)).astype(np.float32), "instruction": list(instruction)}


def _noise(seed):
    return torch.randn(B, H, A_MAX, generator=torch.Generator().manual_seed(seed))


def test_kind_is_detected_and_shapes_are_the_models(vla):
    assert type(vla).kind == vla.policy.config.type
    assert vla.noise_shape == (H, A_MAX) and vla.action_shape == (H, A)
    assert vla.camera_map == {"front": "observation.images.front"}


def test_noise_handle_same_noise_same_actions_different_noise_different_actions(vla):
    obs = _obs()
    a1, a1b, a2 = vla.sample_actions(obs, noise=_noise(1)), vla.sample_actions(obs, noise=_noise(1)), \
        vla.sample_actions(obs, noise=_noise(2))
    assert a1.shape == (B, H, A) and a1.dtype == torch.float32
    assert torch.equal(a1, a1b)
    assert not torch.allclose(a1, a2)


@pytest.mark.parametrize("shape", [(B, H, A), (B, H), (1, H, A_MAX), (B, H + 1, A_MAX)])
def test_wrong_noise_shape_is_refused_with_the_expected_shape(vla, shape):
    with pytest.raises(ValueError, match=rf"noise must have shape \[B={B}, H={H}, A={A_MAX}\]"):
        vla.sample_actions(_obs(), noise=torch.randn(*shape))


def test_token_num_steps_and_observation_errors(vla):
    obs = _obs()
    with pytest.raises(ValueError, match="token"):
        vla.sample_actions(obs, token=1)
    with pytest.raises(ValueError, match="num_steps"):
        vla.sample_actions(obs, num_steps=0)
    one = vla.sample_actions(obs, noise=_noise(1), token=0, num_steps=1)  # 0 = the null token
    assert not torch.allclose(one, vla.sample_actions(obs, noise=_noise(1)))  # default: STEPS steps
    with pytest.raises(ValueError, match="images.wrist"):
        vla.sample_actions({**obs, "images": {"wrist": obs["images"]["front"]}})
    with pytest.raises(ValueError, match="'state' must be"):
        vla.sample_actions({**obs, "state": np.zeros((B, 5), np.float32)})


def test_stochastic_sampler_logprobs_and_its_mean_path_is_the_models_sampler(vla):
    obs, sigma = _obs(), 0.3
    s = vla.sample_actions_stochastic(obs, noise=_noise(1), sigma=sigma, generator=torch.Generator().manual_seed(0))
    assert s.chain.shape == (B, STEPS + 1, H, A_MAX) and s.logprob.shape == (B, STEPS) and s.actions.shape == (B, H, A)
    assert torch.equal(s.chain[:, 0], _noise(1)) and torch.all(s.logprob[:, -1] == 0)
    assert torch.allclose(s.actions, vla._finish_actions(s.chain[:, -1]))
    lp = vla.chain_logprob(obs, s.chain, sigma=sigma)  # re-evaluated under the current weights
    assert lp.requires_grad  # GRPO / PPO ratios backpropagate through it
    assert torch.allclose(lp.detach(), s.logprob, atol=1e-3, rtol=1e-5)
    # with a vanishing sigma the stochastic chain is the model's own deterministic sampler
    tiny = vla.sample_actions_stochastic(obs, noise=_noise(1), sigma=1e-7)
    assert torch.allclose(tiny.actions, vla.sample_actions(obs, noise=_noise(1)), atol=1e-4)


def test_kv_cached_denoiser_matches_the_joint_forward_pass(vla):
    """Each cached Euler velocity v_c(x, t) against the joint (uncached) training pass: with
    actions = x - t v_c and noise = x + (1 - t) v_c the training pass sees x_t = x and the
    target u = v_c, so its squared error is (v_c - v_joint)^2. Checks the transformers shims."""
    m = vla.policy.model
    with torch.no_grad():
        inputs = vla._model_inputs(vla._preprocess(_obs()))
        prefix, x = vla._prefix(inputs), _noise(3)
        args = [inputs["images"], inputs["img_masks"], inputs["tokens"], inputs["masks"]]
        if "state" in inputs and vla.kind != "pi05":
            args.append(inputs["state"])
        for k in range(STEPS):
            t = vla._times(k, STEPS, B)
            v = vla._velocity(prefix, x, t)
            tt = t[:, None, None]
            err = m.forward(*args, x - tt * v, x + (1 - tt) * v, t)
            assert err.max() < 1e-8 * max(1.0, float((v**2).max())), (k, float(err.max()))
            x = x - v / STEPS


def test_embed_features_and_masked_loss(vla):
    e1, e2 = vla.embed(_obs(0)), vla.embed(_obs(1))
    assert e1.shape[0] == B and e1.ndim == 2 and torch.isfinite(e1).all() and not torch.allclose(e1, e2)
    action = np.random.default_rng(0).normal(size=(B, H, A)).astype(np.float32)
    pad = np.zeros((B, H), bool)
    pad[:, 2:] = True

    def loss(is_pad):
        torch.manual_seed(0)  # same flow-matching noise and time
        return vla.loss({**_obs(), "action": action, "action_is_pad": is_pad})

    l_pad, info = loss(pad)
    assert l_pad.ndim == 0 and torch.isfinite(l_pad) and l_pad > 0
    assert info["loss"] == pytest.approx(float(l_pad.detach()))
    assert not torch.allclose(l_pad, loss(np.zeros((B, H), bool))[0])  # padded steps do not count...
    assert float(loss(np.ones((B, H), bool))[0]) == 0.0  # ...and a fully padded batch gives no loss
    # vla train --dagger-rows: rows of weight 0 are left out as padded ones are
    torch.manual_seed(0)
    weight = np.where(pad, 0.0, 1.0).astype(np.float32)
    l_w = vla.loss({**_obs(), "action": action, "action_weight": weight})[0]
    assert torch.allclose(l_w, l_pad)
    with pytest.raises(ValueError, match="'action' must be"):
        vla.loss({**_obs(), "action": action[:, :, :2]})


@pytest.mark.parametrize("kind", KINDS)
def test_modes_frozen_then_lora_train_only_adapters_in_the_backbone(tiny, kind):
    vla = tiny.load(kind)
    obs, noise = _obs(), _noise(1)
    before = vla.sample_actions(obs, noise=noise, num_steps=1)
    vla.set_mode("frozen")
    assert not any(p.requires_grad for m in vla.backbone_modules().values() for p in m.parameters())
    vla.set_mode("lora", lora_rank=2)
    (name, backbone), = vla.backbone_modules().items()
    trainable = [n for n, p in backbone.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable), trainable[:5]
    assert any(p.requires_grad for n, p in vla.policy.model.named_parameters() if "action_out_proj" in n)
    assert not any(p.requires_grad for m in vla.always_frozen_modules().values() for p in m.parameters())
    assert torch.allclose(vla.sample_actions(obs, noise=noise, num_steps=1), before)  # LoRA B starts at 0
    loss, _ = vla.loss({**_obs(), "action": np.zeros((B, H, A), np.float32)})
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in backbone.named_parameters() if "lora_B" in n)


@pytest.mark.parametrize("kind", KINDS)
def test_stats_give_robot_units_and_survive_save_and_reload(tiny, kind, tmp_path):
    mean, std = np.array([1.0, -2.0, 0.5], np.float32), np.array([2.0, 0.5, 3.0], np.float32)
    ident = {"mean": np.zeros(4), "std": np.ones(4), "q01": -np.ones(4), "q99": np.ones(4)}  # state untouched
    stats = {"observation.state": ident,
             "action": {"mean": mean, "std": std, "q01": mean - std, "q99": mean + std}}  # both modes: x * std + mean
    obs, noise = _obs(), _noise(1)
    plain = tiny.load(kind).sample_actions(obs, noise=noise, num_steps=1)
    vla = tiny.load(kind, stats=stats)
    scaled = vla.sample_actions(obs, noise=noise, num_steps=1)
    assert torch.allclose(scaled, plain * torch.from_numpy(std) + torch.from_numpy(mean), atol=1e-4)
    vla.save_pretrained(tmp_path / "ckpt")
    reloaded = tiny.load(kind, path=tmp_path / "ckpt")
    assert torch.allclose(reloaded.sample_actions(obs, noise=noise, num_steps=1), scaled, atol=1e-6)


def test_adapter_built_from_a_loaded_policy_with_a_camera_map(tiny):
    loaded = tiny.load("pi0")
    vla = LeRobotPi0(loaded.policy, tokenizer=loaded.tokenizer, camera_map={"cam_high": "front"})
    obs = _obs()
    renamed = {**obs, "images": {"cam_high": obs["images"]["front"]}}
    assert torch.equal(vla.sample_actions(renamed, noise=_noise(1)), loaded.sample_actions(obs, noise=_noise(1)))
    with pytest.raises(ValueError, match="LeRobotPi05 wraps a PI05Policy, got PI0Policy"):
        LeRobotPi05(loaded.policy, tokenizer=loaded.tokenizer)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        LeRobotPi0(loaded.policy)
    with pytest.raises(TypeError):
        LeRobotVLA(loaded.policy, tokenizer=loaded.tokenizer)  # abstract: use a named subclass


def test_from_checkpoint_errors_name_the_problem(tiny, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        LeRobotVLA.from_checkpoint(tmp_path / "nope")
    with pytest.raises(ValueError, match="no config.json"):
        LeRobotVLA.from_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text('{"type": "act"}')
    with pytest.raises(ValueError, match=r"type 'act'.*pi0.*pi05.*smolvla"):
        LeRobotVLA.from_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text('{"type": "pi0"}')
    with pytest.raises(ValueError, match="no model.safetensors"):
        LeRobotVLA.from_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="kind='pi05'.*'pi0'"):
        LeRobotVLA.from_checkpoint(tiny.ckpts["pi0"], kind="pi05")
    with pytest.raises(ValueError, match="'smolvla' policy"):
        LeRobotPi0.from_checkpoint(tiny.ckpts["smolvla"])
    with pytest.raises(ValueError, match="tokenizer"):
        tiny.load("pi0", tokenizer=tmp_path / "no_tokenizer_here")
    with pytest.raises(ValueError, match="not an image input"):
        tiny.load("pi0", camera_map={"front": "observation.images.wrist"})


def test_weights_that_do_not_match_the_config_are_refused(tiny, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny.ckpts["pi0"], tmp_path / "ckpt")
    state = load_file(tmp_path / "ckpt" / "model.safetensors")
    state.pop("model.action_out_proj.bias")
    state["model.extra.weight"] = torch.zeros(1)
    save_file(state, tmp_path / "ckpt" / "model.safetensors")
    with pytest.raises(ValueError, match=r"1 missing keys \['model.action_out_proj.bias'\], 1 unexpected"):
        tiny.load("pi0", path=tmp_path / "ckpt")
