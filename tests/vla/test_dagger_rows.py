"""`vla train --dagger-rows coherent`: a frame a policy drove (DAgger) trains only the chunk rows that are a
plan the expert carried out. Row k of frame t counts when the expert itself executed frames t .. t+k-1; the
later rows of a policy-driven frame are the expert's labels along the policy's path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("lerobot")

from tests.vla.conftest import DRIVEN_UNTIL  # noqa: E402
from tests.vla.test_train import cfg_for  # noqa: E402
from vla.data.demos import coherent_rows, load_demos  # noqa: E402
from vla.models.flow import row_weights  # noqa: E402
from vla.train import train  # noqa: E402

@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=30), st.integers(1, 10))
def test_a_row_counts_exactly_when_the_expert_executed_every_action_before_it(driven, horizon):
    d = np.array(driven, bool)
    mask = coherent_rows(d, len(d), horizon)
    ext = np.concatenate([d, np.zeros(horizon, bool)])  # padded rows repeat the last label; nobody drives there
    want = np.array([[not ext[t:t + k].any() for k in range(horizon)] for t in range(len(d))])
    np.testing.assert_array_equal(mask, want)
    assert mask[:, 0].all()  # the label at a frame's own state always trains
    assert coherent_rows(None, len(d), horizon).all()


def test_only_dagger_episodes_have_driven_frames(dagger_dataset, tiny_dataset):
    e0, e1 = load_demos([dagger_dataset], 32, progress=False)
    np.testing.assert_array_equal(e0.driven, np.arange(12) < DRIVEN_UNTIL)
    assert e1.driven is None  # the expert drove all of it
    # a demonstration whose intervention flags are False (an idle operator) was not driven by a policy
    assert all(e.driven is None for e in load_demos([tiny_dataset], 32, progress=False))


def test_the_loss_is_the_mean_over_the_kept_rows_and_the_processes_parts_average_to_the_whole():
    from vla.models.flow import FlowHeadConfig, FlowMatchingHead

    torch.manual_seed(0)
    head = FlowMatchingHead(FlowHeadConfig(cond_dim=16, action_dim=3, horizon=4, hidden=32, depth=2))
    cond, a = torch.randn(6, 16), torch.rand(6, 4, 3) * 2 - 1
    noise, t = torch.randn(6, 4, 3), torch.rand(6)
    mask = torch.from_numpy(coherent_rows(np.array([1, 1, 0, 0, 0, 1], bool), 6, 4))
    w = row_weights(mask)
    loss = head.loss(cond, a, noise=noise, t=t, weight=w)
    x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * a  # the chunk is denoised whole: every row is input
    err = ((head.velocity(x_t, t, head._cond(cond, None)) - (noise - a)) ** 2).mean(-1)
    assert torch.allclose(loss, err[mask].mean())  # ... but only the kept rows' errors are the loss
    assert not torch.allclose(loss, err.mean())
    # the mean over the kept rows, however the batch is cut between two processes
    halves = [head.loss(cond[s], a[s], noise=noise[s], t=t[s], weight=w[s]) for s in (slice(0, 3), slice(3, 6))]
    assert torch.allclose((halves[0] + halves[1]) / 2, loss, atol=1e-6)
    full = head.loss(cond, a, noise=noise, t=t, weight=torch.ones(6, 4))
    assert torch.allclose(full, head.loss(cond, a, noise=noise, t=t))


def test_training_with_coherent_rows_weights_the_rows_and_refuses_data_no_policy_drove(dagger_dataset,
                                                                                      tiny_dataset, tmp_path):
    from vla.models.encoders import TextEncoder
    from vla.train import build_data, draw_batch, frame_sampler

    out = train(cfg_for(dagger_dataset, tmp_path / "r", steps=2, save_every=2, dagger_rows="coherent"),
                progress=False)
    assert out["dagger_rows"]["frames_first_row_only"] == DRIVEN_UNTIL
    cfg = cfg_for(dagger_dataset, tmp_path / "x", dagger_rows="coherent", batch_size=64)
    data, _, _ = build_data(cfg, TextEncoder(), progress=False)
    gen = torch.Generator().manual_seed(0)
    batch = draw_batch(data, cfg, lambda: torch.arange(24), gen, torch.ones(8))  # every frame, in order
    keep = batch["action_weight"] > 0
    assert keep[:DRIVEN_UNTIL].sum(1).eq(1).all() and keep[:DRIVEN_UNTIL, 0].all()  # the driven frames: row 0
    assert keep[DRIVEN_UNTIL:].all()  # the expert's own frames (handover, then episode 1): every row
    assert torch.allclose(batch["action_weight"].mean(), torch.tensor(1.0))
    batch = draw_batch(data, cfg, frame_sampler(data, "frames", 64, gen), gen, torch.ones(8))
    assert (batch["action_weight"][:, 0] > 0).all()
    with pytest.raises(ValueError, match="--dagger-rows coherent: none of the datasets"):
        train(cfg_for(tiny_dataset, tmp_path / "t", steps=2, save_every=2, dagger_rows="coherent"), progress=False)
    with pytest.raises(ValueError, match="dagger_rows must be one of"):
        cfg_for(tiny_dataset, tmp_path / "u", dagger_rows="first")
