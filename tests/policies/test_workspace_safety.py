"""AutoSafe on the arm: the workspace-box SafetySpec and the chunk guard (policies.safety.workspace)."""

import math

import pytest
import torch

from policies.common.sac import TanhGaussianActor
from policies.safety.autosafe import AutoSafeActor, blend_weight
from policies.safety.config import AutoSafeConfig
from policies.safety.workspace import ChunkGuard, Workspace, certified_sharpness, workspace_spec

torch.set_num_threads(1)
WS = Workspace(low=(0.3, -0.2, 0.05), high=(0.7, 0.2, 0.35), step=0.02, gain=0.2)
A = 7  # xyz displacement, 3 rotation entries, gripper (the arm's action row)


def starts(n: int, g: torch.Generator) -> torch.Tensor:
    lo, hi = torch.tensor(WS.low), torch.tensor(WS.high)
    p = lo + (hi - lo) * torch.rand(n, 3, generator=g)
    face = torch.rand(n, generator=g) < 0.3  # a third start on a face of the box
    axis = torch.randint(0, 3, (n,), generator=g)
    side = torch.rand(n, generator=g) < 0.5
    p[face, axis[face]] = torch.where(side[face], hi[axis[face]], lo[axis[face]])
    return p


def test_margin_and_lambda_at_the_boundary():
    g = torch.Generator().manual_seed(0)
    p = starts(2000, g)
    on_face = ((p - torch.tensor(WS.low)).abs() < 1e-7).any(-1) | ((p - torch.tensor(WS.high)).abs() < 1e-7).any(-1)
    delta = WS.margin_of(p)
    assert on_face.sum() > 100 and (delta[on_face] == 0).all() and (delta[~on_face] > 0).all()
    assert WS.margin_of(torch.tensor([WS.centre])).item() == pytest.approx(1.0)
    for sharp in (1e-6, 0.5, 2.0, 4.0):
        lam, one_minus = blend_weight(torch.full_like(delta, sharp), delta)
        assert (lam[on_face] == 1).all() and (one_minus[on_face] == 0).all()
        assert ((lam >= 0) & (lam <= 1)).all()
    # the same through the AutoSafe layer over a SAC actor reading [pos, other state]
    obs = torch.cat([p, torch.randn(len(p), 3, generator=g)], -1)
    actor = AutoSafeActor(TanhGaussianActor(6, A, (32, 32)), workspace_spec(WS, A))
    b = actor.blend(obs)
    assert (b["lambda"][on_face] == 1).all() and ((b["lambda"] >= 0) & (b["lambda"] <= 1)).all()
    # the safe action points back to the centre on xyz and holds the rest
    a_safe = b["a_safe"]
    assert (a_safe[:, 3:] == 0).all()
    assert ((a_safe[:, :3] * (torch.tensor(WS.centre) - p)) >= 0).all()


def test_a_random_sac_actor_under_autosafe_never_leaves_the_box():
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    cfg = AutoSafeConfig()
    assert cfg.sharpness_max <= certified_sharpness(WS)
    base = TanhGaussianActor(6, A, (32, 32), init_log_std=1.5)  # wide: the learner's actions often saturate
    actor = AutoSafeActor(base, workspace_spec(WS, A), cfg)
    p = starts(1000, g)
    extra = torch.randn(len(p), 3, generator=g)
    with torch.no_grad():
        for _ in range(80):
            a, _ = actor.sample(torch.cat([p, extra], -1), generator=g)
            p = p + WS.step * a[:, :3]  # the point mass (the arm's displacement command)
            assert WS.inside(p).all(), f"left the box at {p[~WS.inside(p)][:3]}"


def test_chunk_guard_keeps_any_chunk_inside_and_unguarded_chunks_leave():
    g = torch.Generator().manual_seed(2)
    guard = ChunkGuard(WS, sharpness=2.0)
    left_unguarded = 0
    for trial in range(40):
        p = starts(200, g)
        if trial % 4 == 0:  # adversarial: every row pushes full force away from the centre
            chunk = torch.sign(p - torch.tensor(WS.centre))[:, None, :].expand(200, 16, 3)
            chunk = torch.cat([chunk, torch.zeros(200, 16, A - 3)], -1)
        else:  # uniform random actor
            chunk = 2 * torch.rand(200, 16, A, generator=g) - 1
        out, lam = guard(p, chunk)
        assert out.shape == chunk.shape and ((lam >= 0) & (lam <= 1)).all()
        q, raw = p.clone(), p.clone()
        for h in range(16):
            q = q + WS.step * out[:, h, :3]
            raw = raw + WS.step * chunk[:, h, :3]
            assert WS.inside(q).all()
        left_unguarded += int((~WS.inside(raw)).sum())
        # rotation / gripper entries are the agent's, untouched (a gripper in [0, 1] is not pulled shut)
        assert torch.equal(out[:, :, 3:], chunk[:, :, 3:])
    assert left_unguarded > 0  # the test bites: the same chunks without the guard leave the box


def test_refusals():
    with pytest.raises(ValueError, match="certified range"):
        ChunkGuard(WS, sharpness=certified_sharpness(WS) * 1.5)
    with pytest.raises(ValueError, match="gain"):
        Workspace(low=(0, 0, 0), high=(1, 1, 1), gain=1.5)
    with pytest.raises(ValueError, match="smallest half"):
        Workspace(low=(0, 0, 0), high=(1, 1, 0.01), step=0.1)
    p = certified_sharpness(WS)  # (1 - e^-p) / p = step b / min h = 0.02 / 0.15
    assert (1 - math.exp(-p)) / p == pytest.approx(0.02 / 0.15, rel=1e-6)
