"""An exported policy behind the VLA interface (``vla.models.onnx_vla``): what `vla eval` runs to
measure an int8 export's success rate. Same chunks as the torch model, refusal of everything
but sampling, and the `vla eval` path names an .onnx file."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")

from deploy import export as ex  # noqa: E402
from tests.deploy.test_export import INSTR, raw_obs, vla_export  # noqa: E402,F401  (the shared export)
from vla.envs import TemporalEnsemble, VLAPolicy  # noqa: E402
from vla.models import checkpoint_kind, load_vla  # noqa: E402
from vla.models.onnx_vla import OnnxVLA  # noqa: E402


@pytest.fixture()
def exported(vla_export):
    vla, out, rep = vla_export
    return vla, out, rep["int8"]["path"]


def _batch(obs_list):
    return {"images": {c: np.stack([o["images"][c] for o in obs_list]) for c in obs_list[0]["images"]},
            "state": np.stack([o["state"] for o in obs_list]),
            "instruction": [o["instruction"] for o in obs_list]}


def test_load_vla_dispatches_on_onnx_file(exported, tmp_path):
    _, out, int8 = exported
    assert checkpoint_kind(out) == "onnx"
    m = load_vla(out)
    assert isinstance(m, OnnxVLA) and m.action_shape == (4, 7) and m.noise_shape == (4, 7)
    assert m.known_instructions == INSTR
    assert isinstance(load_vla(int8), OnnxVLA)
    with pytest.raises(FileNotFoundError, match="no such ONNX file"):
        checkpoint_kind(str(tmp_path / "missing.onnx"))


def test_batch_matches_torch_with_the_same_noise(exported):
    vla, out, _ = exported
    m = load_vla(out)
    rng = np.random.default_rng(3)
    obs = [raw_obs(rng, INSTR[i % 2]) for i in range(3)]
    noise = torch.from_numpy(rng.standard_normal((3, 4, 7)).astype(np.float32))
    got = m.sample_actions(_batch(obs), noise=noise)
    with torch.no_grad():
        want = vla.sample_actions(_batch(obs), noise=noise)
    assert got.shape == (3, 4, 7) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-4)
    # the rows are not one row repeated: each instruction / frame reaches the graph
    assert (got[0] - got[1]).abs().max() > 1e-5
    # without noise the graph's own generator draws it: two calls differ
    a, b = m.sample_actions(_batch(obs[:1])), m.sample_actions(_batch(obs[:1]))
    assert (a - b).abs().max() > 1e-6


def test_runs_in_the_eval_harness(exported):
    """VLAPolicy and temporal ensembling (what `vla eval` executes) over the exported graph."""
    _, _, int8 = exported
    m = load_vla(int8)
    rng = np.random.default_rng(0)
    o = raw_obs(rng)
    assert VLAPolicy(m, 2)(o).shape == (2, 7)
    te = TemporalEnsemble(VLAPolicy(m))
    rows = [te(o) for _ in range(3)]
    assert all(r.shape == (1, 7) and np.isfinite(r).all() for r in rows)


def test_everything_but_sampling_is_refused(exported):
    _, out, _ = exported
    m = load_vla(out)
    o = _batch([raw_obs(np.random.default_rng(0))])
    for call in (lambda: m.embed(o), lambda: m.loss({}), lambda: m.sample_actions_stochastic(o),
                 lambda: m.chain_logprob(o, torch.zeros(1))):
        with pytest.raises(NotImplementedError, match="exported ONNX policy"):
            call()
    with pytest.raises(ValueError, match="token"):
        m.sample_actions(o, token=torch.ones(1, dtype=torch.long))
    with pytest.raises(ValueError, match="num_steps"):
        m.sample_actions(o, num_steps=3)
    with pytest.raises(ValueError, match="noise has 2 rows"):
        m.sample_actions(o, noise=torch.zeros(2, 4, 7))
    with pytest.raises(ValueError, match="lacks steering handle"):
        m.require_handles("embed")


def test_a_classifier_graph_is_not_a_vla(tmp_path):
    from rewards.success_classifier import ClassifierConfig, SuccessClassifier

    clf = SuccessClassifier(ClassifierConfig(cameras=("front",), image_size=64, pretrained=False, threshold=0.7))
    out = str(tmp_path / "clf.onnx")
    ex.export_classifier(clf.eval(), out)
    with pytest.raises(ValueError, match="not a policy exported"):
        load_vla(out)


def test_vla_eval_wants_a_task_for_an_onnx_file(exported, tmp_path):
    from vla.commands import eval as ev

    _, out, _ = exported
    args = argparse.Namespace(checkpoint=out, tasks=None, env=None, episodes=1, threads=None, out=str(tmp_path),
                              robot="sim-franka-fast", serve="never")
    with pytest.raises(ValueError, match="give --task"):
        ev.run(args)
