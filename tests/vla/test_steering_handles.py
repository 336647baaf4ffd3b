"""The VLA steering handles (normalize / unnormalize_actions, embed, sample_actions_from_embedding,
noise_shape, action_shape, require_handles) on the compact VLA and on tiny random-config LeRobot
SmolVLA and pi0 adapters (built offline as in test_lerobot_adapters), and DSRL built on them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla.models.base import VLA
from vla.models.compact import CompactVLA, CompactVLAConfig

BACKBONES = ("compact", "smolvla", "pi0")
B = 2


def _compact() -> CompactVLA:
    torch.manual_seed(0)
    cfg = CompactVLAConfig(cameras=("front",), image_size=32, horizon=4, hidden=32, cond_dim=32, keypoints=4,
                           state_dim=4, action_dim=3, pretrained=False)
    vla = CompactVLA(cfg).eval()
    vla.set_normalization(np.zeros(4), np.ones(4), np.array([-1.0, 0.0, -3.0]), np.array([1.0, 2.0, 3.0]))
    return vla


def _lerobot_stats() -> dict:
    mean, std = np.array([1.0, -2.0, 0.5], np.float32), np.array([2.0, 0.5, 3.0], np.float32)
    ident = {"mean": np.zeros(4), "std": np.ones(4), "q01": -np.ones(4), "q99": np.ones(4)}
    return {"observation.state": ident, "action": {"mean": mean, "std": std, "q01": mean - std, "q99": mean + std}}


@pytest.fixture(scope="module")
def tiny_lerobot(tmp_path_factory):
    """Tiny random SmolVLA and pi0 checkpoints, built offline with test_lerobot_adapters' recipe."""
    pytest.importorskip("lerobot")
    pytest.importorskip("peft")
    from transformers import SmolVLMConfig

    from tests.vla import test_lerobot_adapters as t
    from vla.models.lerobot_adapters import LeRobotVLA

    root = tmp_path_factory.mktemp("lerobot_handles")
    vlm_dir = root / "tiny_smolvlm"
    SmolVLMConfig(vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     image_size=32, patch_size=8),
                  text_config=dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=t.VOCAB),
                  scale_factor=2).save_pretrained(vlm_dir)
    tok = t._tokenizer()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            t._patch_tiny(mp, tok)
            for kind in ("smolvla", "pi0"):
                torch.manual_seed(0)
                t._policy(kind, t._config(kind, vlm_dir)).save_pretrained(root / kind)
                if kind != "smolvla":
                    tok.save_pretrained(root / kind / "tokenizer")
            yield lambda kind, **kw: LeRobotVLA.from_checkpoint(root / kind, **kw)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=BACKBONES)
def vla(request, tiny_lerobot_factory):
    return tiny_lerobot_factory(request.param)


@pytest.fixture(scope="module")
def tiny_lerobot_factory(request):
    made = {}

    def make(kind: str) -> VLA:
        if kind not in made:
            made[kind] = _compact() if kind == "compact" else \
                request.getfixturevalue("tiny_lerobot")(kind, stats=_lerobot_stats())
        return made[kind]
    return make


def _obs(seed: int = 0, instruction=("pick up the cube", "open the drawer")) -> dict:
    rng = np.random.default_rng(seed)
    return {"images": {"front": rng.integers(0, 256, (B, 24, 32, 3), dtype=np.uint8)},
            "state": rng.normal(size=(B, 4)).astype(np.float32), "instruction": list(instruction)}


def _noise(vla: VLA, seed: int) -> torch.Tensor:
    return torch.randn(B, *vla.noise_shape, generator=torch.Generator().manual_seed(seed))


def test_shapes_and_same_noise_same_actions(vla):
    h, a = vla.action_shape
    assert vla.noise_shape[0] == h and vla.noise_shape[1] >= a
    obs = _obs()
    a1, a1b, a2 = (vla.sample_actions(obs, noise=_noise(vla, s)) for s in (1, 1, 2))
    assert a1.shape == (B, h, a) and a1.dtype == torch.float32
    assert torch.equal(a1, a1b) and not torch.allclose(a1, a2)


def test_unnormalize_inverts_normalize_within_the_action_range(vla):
    h, a = vla.action_shape
    if isinstance(vla, CompactVLA):
        lo, hi = vla.action_min, vla.action_max
    else:  # mean +- 2 std of the stats above
        st = _lerobot_stats()["action"]
        lo, hi = torch.from_numpy(st["mean"] - 2 * st["std"]), torch.from_numpy(st["mean"] + 2 * st["std"])
    u = torch.rand(B, h, a, generator=torch.Generator().manual_seed(0))
    acts = lo + u * (hi - lo)
    n = vla.normalize_actions(acts)
    assert n.shape == acts.shape and not torch.allclose(n, acts)
    assert torch.allclose(vla.unnormalize_actions(n), acts, atol=1e-5)


def test_clip_normalized_actions_clips_only_where_the_units_are_bounded(vla):
    """An operator's or a demo's normalised chunk is limited to what the sampler returns: [-1, 1] for
    the compact VLA's min / max units; LeRobot's mean / std units are unbounded (left as they are)."""
    h, a = vla.action_shape
    x = torch.linspace(-3, 3, h * a).reshape(1, h, a)
    clipped = vla.clip_normalized_actions(x)
    if isinstance(vla, CompactVLA):
        assert torch.allclose(clipped, x.clamp(-1, 1), atol=1e-6)
    else:
        assert torch.equal(clipped, x)
    with torch.no_grad():
        sampled = vla.sample_actions_from_embedding(vla.embed(_obs()), noise=3 * _noise(vla, 0), normalized=True)
    assert torch.allclose(vla.clip_normalized_actions(sampled), sampled, atol=1e-6)  # the sampler's own: kept


def test_sampling_from_the_embedding_is_sampling_from_the_observation(vla):
    obs, noise = _obs(), _noise(vla, 3)
    with torch.no_grad():
        emb = vla.embed(obs)
    assert emb.shape == (B, vla.embed_dim) and torch.isfinite(emb).all()
    assert 0 < vla.embed_summary_dim <= vla.embed_dim
    direct = vla.sample_actions(obs, noise=noise)
    stored = vla.sample_actions_from_embedding(emb, noise=noise)
    assert torch.allclose(stored, direct, atol=1e-5), float((stored - direct).abs().max())
    normalized = vla.sample_actions_from_embedding(emb, noise=noise, normalized=True)
    assert normalized.shape == direct.shape
    assert torch.allclose(vla.unnormalize_actions(normalized), direct, atol=1e-5)
    # a different instruction (another language length): the same embed width, other features
    other = vla.embed(_obs(instruction=("go", "a much longer instruction than the others")))
    assert other.shape == emb.shape and not torch.allclose(other, emb)
    with pytest.raises(ValueError, match="noise"):
        vla.sample_actions_from_embedding(emb, noise=torch.zeros(B, 1, 1))


def test_embedding_of_the_wrong_width_is_refused(tiny_lerobot_factory):
    vla = tiny_lerobot_factory("smolvla")
    with pytest.raises(ValueError, match=rf"embedding must be \[B, {vla.embed_dim}\]"):
        vla.sample_actions_from_embedding(torch.zeros(B, 5), noise=_noise(vla, 0))


def test_require_handles_names_the_missing_handle_and_the_backbone(vla):
    vla.require_handles("noise", "embed", "embed_dim", "normalize_actions", "unnormalize_actions",
                        "sample_actions_from_embedding", "sample_actions_stochastic")
    with pytest.raises(ValueError, match=r"lacks steering handle.*'token'.*num_tokens = 0") as e:
        vla.require_handles("noise", "token")
    assert type(vla).__name__ in str(e.value)
    with pytest.raises(ValueError, match="unknown steering handle"):
        vla.require_handles("nosie")


class _Bare(VLA):
    """A backbone with only the abstract methods: none of the optional steering handles."""

    noise_shape = (2, 2)
    action_shape = (2, 2)

    def sample_actions(self, obs, noise=None, token=None, num_steps=None):
        return torch.zeros(1, 2, 2)

    def sample_actions_stochastic(self, *a, **k):
        raise NotImplementedError

    def chain_logprob(self, *a, **k):
        raise NotImplementedError

    def embed(self, obs):
        return torch.zeros(1, 3)

    def loss(self, batch):
        return torch.zeros(()), {}


def test_a_backbone_without_handles_says_which_ones():
    bare = _Bare()
    with pytest.raises(ValueError) as e:
        bare.require_handles("noise", "normalize_actions", "sample_actions_from_embedding", "embed_dim")
    msg = str(e.value)
    assert "_Bare" in msg and "'noise'" not in msg
    for name in ("normalize_actions", "sample_actions_from_embedding", "embed_dim"):
        assert f"'{name}'" in msg and "not implemented" in msg
    with pytest.raises(NotImplementedError, match="_Bare backbone does not implement the steering handle "
                                                  "'unnormalize_actions'"):
        bare.unnormalize_actions(torch.zeros(1, 2))
    with pytest.raises(NotImplementedError, match="'embed_dim'"):
        bare.embed_dim


def test_relative_actions_make_the_action_units_unsupported(tiny_lerobot_factory):
    vla = tiny_lerobot_factory("pi0")
    vla.policy.config.use_relative_actions = True
    try:
        with pytest.raises(ValueError, match=r"'normalize_actions'.*use_relative_actions"):
            vla.require_handles("normalize_actions")
        with pytest.raises(ValueError, match="use_relative_actions"):
            vla.normalize_actions(torch.zeros(1, 3))
    finally:
        vla.policy.config.use_relative_actions = False


@pytest.mark.parametrize("variant", ["na", "sac"])
def test_dsrl_acts_and_updates_on_the_smolvla_adapter_through_the_handles(tiny_lerobot_factory, variant):
    """DSRL on a LeRobot backbone with only the VLA interface: build, act, one update."""
    from policies.common.replay import STEP_EXTRAS, ReplayBuffer
    from policies.common.sac import SACConfig
    from policies.dsrl import DSRLAgent, DSRLConfig

    vla = tiny_lerobot_factory("smolvla")
    before = {k: v.clone() for k, v in vla.state_dict().items()}
    cfg = DSRLConfig(variant=variant, distill_steps=1, sac=SACConfig(utd=1, batch_size=4, num_critics=2, hidden=(16, 16)))
    agent = DSRLAgent.build(vla, cfg, seed=0) if hasattr(DSRLAgent, "build") else DSRLAgent(vla, cfg, seed=0)
    assert agent.feat_dim == vla.embed_dim  # inferred from the handle, no feat_dim=
    h, a = vla.action_shape
    chunk_shape = (agent.exec_steps, agent.chunk_dim // agent.exec_steps)
    assert chunk_shape == (h, a)  # Q^A reads the real action dims, not the padded noise width
    buf = ReplayBuffer(16, agent.obs_spec, agent.noise_dim, {"chunk": (chunk_shape, np.float32), **STEP_EXTRAS})
    rng = np.random.default_rng(0)
    for i in range(4):
        feat, feat2 = agent.embed(_obs(i)), agent.embed(_obs(i + 1))
        w = agent.act({"feat": feat}, rng, warmup=False)
        assert w.shape == (B, agent.noise_dim)
        chunk = agent.chunk(feat, w, normalized=True)
        assert chunk.shape == (B, h, a) and torch.isfinite(vla.unnormalize_actions(chunk)).all()
        for j in range(B):
            buf.add({"feat": feat[j].numpy()}, w[j].numpy(), float(i), {"feat": feat2[j].numpy()}, False,
                    chunk=chunk[j, : agent.exec_steps].numpy())
    info = agent.update(buf, None, rng)
    assert info and all(np.isfinite(v) for v in info.values())
    assert all(torch.equal(before[k], v) for k, v in vla.state_dict().items())  # the VLA stays frozen
