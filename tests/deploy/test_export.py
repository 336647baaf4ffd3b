"""`vla export`: the compact VLA's sampler, the DSRL-steered sampler and the success classifier
to ONNX, with the parity check (fp32 < 1e-4) and the metadata the edge runner reads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from deploy import export as ex  # noqa: E402
from deploy.runtime import OnnxPolicy  # noqa: E402

INSTR = ["pick up the red cube", "lift the green cube high"]


def tiny_vla(**kw):
    from vla.models.compact import CompactVLA, CompactVLAConfig

    torch.manual_seed(0)
    cfg = CompactVLAConfig(image_size=64, horizon=4, hidden=64, cond_dim=64, keypoints=8, pretrained=False,
                           crops=(("front", 0.1, 0.1, 0.9, 0.9),), **kw)
    m = CompactVLA(cfg).eval()
    rng = np.random.default_rng(0)
    m.set_normalization(rng.normal(size=8) * 0.1, 0.5 + rng.random(8), -0.2 - rng.random(7), 0.2 + rng.random(7))
    with torch.no_grad():  # the FiLM layer starts at zero: give it weights, so the instruction matters
        for n in m.necks.values():
            n.film.weight.normal_(0, 0.05)
    # A random-init trunk's features are ~1e-5 (the model is blind to the frames): a variance-keeping
    # init makes the chunk depend on the pixels, so a crop / resize mismatch cannot pass parity.
    for mod in m.trunk.modules():
        if isinstance(mod, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(mod.weight, nonlinearity="relu")
        elif isinstance(mod, torch.nn.BatchNorm2d):
            torch.nn.init.ones_(mod.weight)
            torch.nn.init.zeros_(mod.bias)
    return m


def test_tiny_vla_sees_the_frames():
    """The fixtures' model must react to its camera frames, or the parity checks below prove nothing
    about image preprocessing."""
    m = tiny_vla()
    rng = np.random.default_rng(0)
    o1, o2 = raw_obs(rng), raw_obs(rng)
    batch = lambda o: {"images": {c: v[None] for c, v in o["images"].items()}, "state": o1["state"][None],  # noqa: E731
                       "instruction": [INSTR[0]]}
    noise = torch.zeros(1, 4, 7)
    assert (m.sample_actions(batch(o1), noise=noise) - m.sample_actions(batch(o2), noise=noise)).abs().max() > 1e-3


def raw_obs(rng, instruction=INSTR[0]) -> dict:
    """Frames at the cameras' own size: front 80x80 (the 0.1..0.9 crop is 64x64), wrist 64x64."""
    return {"images": {"front": rng.integers(0, 256, (80, 80, 3), dtype=np.uint8),
                       "wrist": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)},
            "state": rng.normal(size=8).astype(np.float32), "instruction": instruction}


@pytest.fixture(scope="session")
def vla_export(tmp_path_factory):
    """One fp32 + int8 export of the tiny VLA, shared with test_onnx_vla (an export takes ~20 s)."""
    vla = tiny_vla()
    out = str(tmp_path_factory.mktemp("export") / "policy.onnx")
    rep = ex.export_vla(vla, out, INSTR, quantize=True, source="/some/where/runs/vla_pick", gripper="binary")
    return vla, out, rep


def test_vla_export_parity_and_metadata(vla_export):
    vla, out, rep = vla_export
    print("compact VLA parity:", json.dumps(rep["parity"]), "int8:", json.dumps(rep["int8"]["parity"]))
    assert rep["parity"]["max_abs_diff"] < 1e-4 and rep["parity"]["samples"] >= 8
    m = onnx.load(out)
    assert [o.domain for o in m.opset_import if o.domain in ("", "ai.onnx")] and \
        {o.version for o in m.opset_import if o.domain in ("", "ai.onnx")} == {ex.OPSET}
    meta = {p.key: json.loads(p.value) for p in m.metadata_props}
    assert meta["kind"] == "compact-flow-vla" and meta["cameras"] == ["front", "wrist"]
    assert meta["instructions"] == INSTR and meta["image_size"] == 64 and meta["horizon"] == 4
    assert meta["crops"] == {"front": [0.1, 0.1, 0.9, 0.9]}
    np.testing.assert_allclose(meta["normalization"]["state_std"], vla.state_std.numpy(), rtol=1e-6)
    assert meta["source"] == "vla_pick"  # no machine path in the file
    assert meta["gripper"] == "binary"  # the checkpoint's executed opening, for `vla-edge --gripper auto`
    assert meta["parity"]["max_abs_diff"] == rep["parity"]["max_abs_diff"]
    # int8: a smaller file with the same metadata, and outputs near (not equal to) fp32
    q = onnx.load(rep["int8"]["path"])
    qmeta = {p.key: json.loads(p.value) for p in q.metadata_props}
    assert qmeta["quantization"] == "int8-dynamic" and qmeta["instructions"] == INSTR
    assert qmeta["parity"] == rep["int8"]["parity"] != meta["parity"]
    assert any(n.op_type in ("MatMulInteger", "DynamicQuantizeLinear", "ConvInteger") for n in q.graph.node)
    assert 0 < rep["int8"]["parity"]["max_abs_diff"] < 1.0


def test_edge_policy_from_raw_frames_matches_torch(vla_export):
    """The runtime's crop / resize / instruction lookup + the graph = the torch VLA on the same frames."""
    vla, out, _ = vla_export
    pol = OnnxPolicy(out)
    rng = np.random.default_rng(5)
    for instr in INSTR:
        o = raw_obs(rng, instr)
        noise = rng.standard_normal((4, 7)).astype(np.float32)
        got = pol(o, noise=noise)
        batch = {"images": {c: v[None] for c, v in o["images"].items()}, "state": o["state"][None],
                 "instruction": [instr]}
        want = vla.sample_actions(batch, noise=torch.from_numpy(noise[None]))[0].numpy()
        assert got.shape == (4, 7)
        np.testing.assert_allclose(got, want, atol=1e-4)
    # the instruction reaches the graph: the two prompts give different chunks for the same frames
    o = raw_obs(np.random.default_rng(1))
    noise = np.zeros((4, 7), np.float32)
    a = pol(dict(o, instruction=INSTR[0]), noise=noise)
    b = pol(dict(o, instruction=INSTR[1]), noise=noise)
    assert np.abs(a - b).max() > 1e-5
    with pytest.raises(ValueError, match="not one of the exported instructions"):
        pol(dict(o, instruction="stack the cubes"))


def test_parity_failure_is_loud_and_writes_nothing(tmp_path, monkeypatch):
    vla = tiny_vla()
    run_onnx = ex._run_onnx
    monkeypatch.setattr(ex, "_run_onnx", lambda path, feeds: [o + 1e-3 for o in run_onnx(path, feeds)])
    out = tmp_path / "bad.onnx"
    with pytest.raises(ex.ParityError, match=r"differ by 0\.001"):
        ex.export_vla(vla, str(out), INSTR[:1])
    assert list(tmp_path.iterdir()) == []


def test_wrapper_mistake_is_caught_before_export(tmp_path, monkeypatch):
    vla = tiny_vla()
    monkeypatch.setattr(ex._VLASampler, "embedding",
                        lambda self, images, state, instr: self.vla.cond_from_features(
                            self.vla.trunk_features(dict(zip(self.cameras, images))), state * 0.5,
                            self.text_table[instr]))
    with pytest.raises(ex.ParityError, match="wrapper disagrees"):
        ex.export_vla(vla, str(tmp_path / "p.onnx"), INSTR[:1])
    assert list(tmp_path.iterdir()) == []


def test_dsrl_steered_export(tmp_path):
    from policies.common.sac_config import SACConfig
    from policies.dsrl import DSRLAgent, DSRLConfig

    vla = tiny_vla()
    cfg = DSRLConfig(exec_steps=2, sac=SACConfig(hidden=(32, 32), num_critics=2, init_log_std=0.0))
    agent = DSRLAgent(vla, cfg, seed=3)
    with torch.no_grad():  # a trained-looking actor: the mean depends on the observation
        agent.sac.actor.mean.weight.normal_(0, 0.3)
    torch.save(agent.state_dict(), tmp_path / "agent.pt")
    loaded = ex.load_dsrl_agent(vla, str(tmp_path))
    out = str(tmp_path / "dsrl.onnx")
    rep = ex.export_vla(vla, out, INSTR[:1], agent=loaded)
    print("DSRL-steered parity:", json.dumps(rep["parity"]))
    assert rep["parity"]["max_abs_diff"] < 1e-4
    pol = OnnxPolicy(out)
    assert pol.meta["kind"] == "compact-flow-vla+dsrl" and pol.meta["exec_steps"] == 2
    assert pol.inputs["noise"].shape[1:] == [4 * 7]
    # eps = 0 is the agent's deterministic policy (the tanh of its mean), denoised by the VLA
    o = raw_obs(np.random.default_rng(2))
    got = pol(o, noise=np.zeros(28, np.float32))
    batch = {"images": {c: v[None] for c, v in o["images"].items()}, "state": o["state"][None],
             "instruction": [INSTR[0]]}
    feat = vla.embed(batch)
    w = agent.act(feat, np.random.default_rng(0), warmup=False, deterministic=True)
    want = agent.chunk(feat, w)[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    with pytest.raises(FileNotFoundError, match="no DSRL agent"):
        ex.load_dsrl_agent(vla, str(tmp_path / "nowhere"))


def test_classifier_export(tmp_path):
    from rewards.classifier_config import ClassifierConfig
    from rewards.success_classifier import SuccessClassifier

    torch.manual_seed(0)
    clf = SuccessClassifier(ClassifierConfig(cameras=("front",), image_size=64, pretrained=False, threshold=0.7))
    out = str(tmp_path / "succ.onnx")
    rep = ex.export_classifier(clf, out)
    print("success classifier parity:", json.dumps(rep["parity"]))
    assert rep["parity"]["max_abs_diff"] < 1e-4
    pol = OnnxPolicy(out)
    assert pol.meta["kind"] == "success-classifier" and pol.meta["threshold"] == 0.7
    img = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    p = float(pol({"images": {"front": img}}))
    assert abs(p - float(clf.predict_proba({"front": img[None]})[0])) < 1e-5
