"""`vla rl --method dsrl` steering a LeRobot SmolVLA / pi0 adapter (issue 14, acceptance 2).

Tiny random-config policies built offline with test_lerobot_adapters' recipe (nothing from the hub),
saved as checkpoint directories with their processors and mean / std action stats (std 0.5: the
adapters' normalised units are twice the robot's, so a robot action of 0.9 is 1.8 normalised, outside
the compact VLA's [-1, 1]). The session runs from the command line, in process (the tiny-model
patches must be active when the CLI loads the checkpoint), on the toy env of tests/session. Also the
unit checks that DSRL on these backbones needs: operator chunks and recorded demos are stored in
mean / std units without a [-1, 1] clip, demos are embedded from the recorded frames, and the
critics read the embedding's summary columns only.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("lerobot")
pytest.importorskip("peft")

from tests.session.toy_env import INSTRUCTION, make_env  # noqa: E402
from vla.models import load_vla as _load_vla  # noqa: E402  (the test below wraps vla.models.load_vla)

ACTION_STD = 0.5
DEMO_ACTION_STD = 0.05  # the tiny dataset's actions are 0.001 - 1: up to 20 normalised
ENV = "tests.session.toy_env:make_env"


def _stats(state_dim: int, action_dim: int, std: float) -> dict:
    ident = {"mean": np.zeros(state_dim), "std": np.ones(state_dim), "q01": -np.ones(state_dim),
             "q99": np.ones(state_dim)}
    a_std = np.full(action_dim, std, np.float32)
    return {"observation.state": ident,
            "action": {"mean": np.zeros(action_dim, np.float32), "std": a_std, "q01": -a_std, "q99": a_std}}


@pytest.fixture(scope="module")
def lerobot_ckpts(tmp_path_factory):
    """Checkpoint directories: ``smolvla`` / ``pi0`` sized for the toy env (camera front, state 2,
    action 2), ``smolvla_demos`` for tests/vla/conftest's tiny dataset (front + wrist, state 8,
    action 7, action std 0.05). The tiny-model patches stay active for the whole module."""
    from tests.vla import test_lerobot_adapters as t
    from vla.models.lerobot_adapters import ADAPTERS

    root = tmp_path_factory.mktemp("lerobot_rl")
    t._save_tiny_vlm(root / "tiny_smolvlm")
    tok = t._tokenizer()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: thread hand-offs cost more than the work
    layouts = {"smolvla": ("smolvla", ("front",), 2, 2, ACTION_STD), "pi0": ("pi0", ("front",), 2, 2, ACTION_STD),
               "smolvla_demos": ("smolvla", ("front", "wrist"), 8, 7, DEMO_ACTION_STD)}
    try:
        with pytest.MonkeyPatch.context() as mp:
            t._patch_tiny(mp, tok)
            for name, (kind, cams, s, a, std) in layouts.items():
                torch.manual_seed(0)
                policy = t._policy(kind, t._config(kind, root / "tiny_smolvlm", cameras=cams, state_dim=s,
                                                   action_dim=a))
                ADAPTERS[kind](policy, tokenizer=tok, stats=_stats(s, a, std)).save_pretrained(root / name)
            yield {name: str(root / name) for name in layouts}
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", ["smolvla", "pi0"])
def test_vla_rl_dsrl_steers_a_lerobot_adapter_and_leaves_its_weights_bit_identical(lerobot_ckpts, kind, tmp_path,
                                                                                   monkeypatch):
    """`vla rl --method dsrl --checkpoint <LeRobot policy dir> --env ...`: a short DSRL-NA session end to
    end (base evaluation, warm-up, updates, checkpoint, final evaluation, summary); the VLA the CLI
    loaded has the same weights, tensor for tensor, after the session as when it was loaded."""
    import vla.models
    from vla.cli import main

    loaded: list = []

    def load_vla(path):  # the CLI's loader, keeping the model and a copy of its weights as loaded
        model = _load_vla(path)
        loaded.append((model, {k: v.detach().clone() for k, v in model.state_dict().items()}))
        return model

    monkeypatch.setattr(vla.models, "load_vla", load_vla)
    out = tmp_path / "run"
    argv = ["rl", "--method", "dsrl", "--checkpoint", lerobot_ckpts[kind], "--env", ENV, "--instruction", INSTRUCTION,
            "--out", str(out), "--total-ticks", "24", "--warmup-steps", "2", "--eval-every", "2",
            "--eval-episodes", "1", "--videos", "0", "--threads", "1", "--utd", "1", "--batch-size", "4",
            "--num-critics", "2", "--hidden", "16", "--distill-steps", "1"]
    assert main(argv) == 0
    (model, before), = loaded
    assert type(model).kind == kind
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not any(p.requires_grad for p in model.parameters())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ticks"] >= 24 and summary["vla_weights_unchanged"]
    assert summary["vla_weights_sha256_before"] == summary["vla_weights_sha256_after"]
    assert summary["final_success_rate"] is not None and summary["base_success_rate"] is not None
    eps = [json.loads(x) for x in open(out / "episodes.jsonl")]
    assert any("losses/qa_loss" in e for e in eps)  # DSRL-NA updated after its warm-up
    from policies.common.replay import ReplayBuffer

    online = ReplayBuffer.load(out / "checkpoint/online.npz")
    assert len(online) == summary["steps"] and online.obs["feat"].shape[1] == model.embed_dim
    assert json.loads((out / "rl_config.json").read_text())["checkpoint"] == lerobot_ckpts[kind]


def _session(ckpt: str, out, operator=None, **kw):
    from session.config import RLConfig
    from session.runner import Session

    cfg = RLConfig.flat(checkpoint=ckpt, out=str(out), task="", env=ENV, instruction=INSTRUCTION, total_ticks=32,
                        warmup_steps=0, utd=1, batch_size=2, num_critics=2, hidden=(16,), distill_steps=1,
                        eval_every=0, eval_episodes=1, videos=0, **kw)
    os.makedirs(cfg.out, exist_ok=True)
    return Session(cfg, make_env(), _load_vla(ckpt), operator=operator, progress=False)


def test_the_agent_reads_the_embedding_summary_and_the_replay_stores_all_of_it(lerobot_ckpts, tmp_path):
    sess = _session(lerobot_ckpts["smolvla"], tmp_path / "run")
    vla, agent = sess.vla, sess.agent
    assert 0 < vla.embed_summary_dim < vla.embed_dim
    assert agent.obs_spec["feat"][0] == (vla.embed_dim,)  # what sample_actions_from_embedding rebuilds from
    assert agent.sac.obs_dim == vla.embed_summary_dim  # what actor and critics read
    feat = torch.randn(3, vla.embed_dim)
    assert torch.equal(agent.sac.features({"feat": feat}), feat[:, : vla.embed_summary_dim])


def test_an_operator_chunk_is_stored_in_the_adapters_mean_std_units_without_a_clip(lerobot_ckpts, tmp_path):
    """The operator's robot-unit chunk 0.9 / -0.9 is 1.8 / -1.8 in the adapter's units (std 0.5): stored as
    such, in the online and the demo buffer (the compact VLA's [-1, 1] clip would store 1 / -1)."""
    op = np.tile(np.array([0.9, -0.9], np.float32), (4, 1))
    sess = _session(lerobot_ckpts["smolvla"], tmp_path / "run",
                    operator=lambda obs, ctx: op if ctx["step_in_episode"] == 0 else None)
    r = sess.run_episode(seed=3)
    assert r["interventions"] == 1
    np.testing.assert_allclose(sess.online.extras["chunk"][0], op / ACTION_STD, atol=1e-6)
    np.testing.assert_allclose(sess.demo.extras["chunk"][0], op / ACTION_STD, atol=1e-6)


def test_demos_enter_in_mean_std_units_embedded_from_the_recorded_frames(lerobot_ckpts, tiny_dataset, tmp_path):
    """`vla rl --demos` on a LeRobot adapter (no ``cfg``): chunks are the recorded actions normalised by
    the adapter (unclipped: up to 1 / 0.05 = 20 here), and the features are the adapter's embedding of
    the recorded 64 px frames, not of frames shrunk to DSRL's cnn ``image_size`` (32 here)."""
    from session.config import RLConfig
    from session.runner import Session
    from vla.data.demos import load_demos
    from vla.envs import VLAPolicy

    data = tmp_path / "demos"
    shutil.copytree(tiny_dataset, data)  # 4 episodes x 12 frames; 0 and 2 say "pick up the red cube"
    with open(data / "meta/vla_episodes.jsonl", "w") as f:
        for ep, ok in [(0, True), (1, True), (2, False), (3, False)]:
            f.write(json.dumps({"episode_index": ep, "success": ok}) + "\n")
    ckpt = lerobot_ckpts["smolvla_demos"]
    vla = _load_vla(ckpt)
    cfg = RLConfig.flat(checkpoint=ckpt, out=str(tmp_path / "run"), task="", env=ENV, instruction="pick up the red cube",
                        demos=(str(data),), image_size=32, warmup_steps=0, utd=1, batch_size=4, num_critics=2,
                        hidden=(16,), distill_steps=1, total_ticks=64)
    os.makedirs(cfg.out)
    sess = Session(cfg, None, vla, progress=False)
    report = sess.add_demos()
    assert report["episodes"] == 2 and report["transitions"] == 6  # ceil(12 / 4) macro-steps per episode
    ep0 = next(e for e in load_demos([str(data)], None, progress=False) if e.episode_index == 0)
    d = sess.demo
    np.testing.assert_allclose(d.extras["chunk"][0], ep0.action[:4] / DEMO_ACTION_STD, atol=1e-4)
    assert np.abs(d.extras["chunk"][:6]).max() > 1.5  # not clipped to [-1, 1]
    first = {"images": {c: ep0.images[c][0] for c in ep0.images}, "state": ep0.state[0], "instruction": ""}
    with torch.no_grad():
        want = vla.embed(VLAPolicy.batch(first, instruction="pick up the red cube"))[0].numpy()
    assert ep0.images["front"].shape[1:3] == (64, 64)
    np.testing.assert_allclose(d.obs["feat"][0], want, atol=1e-5)
    losses = sess.agent.update(d, d, sess.rng)  # NA learns from them
    assert np.isfinite(losses["losses/qa_loss"])
