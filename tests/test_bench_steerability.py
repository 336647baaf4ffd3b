"""bench/vla_steerability.py: pass@k over noise streams per scene, and a quick run on the sim."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    import importlib.util  # bench/ is not a package (and its vla.py would shadow ours on sys.path)

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("vla_steerability", ROOT / "bench" / "vla_steerability.py")
        b = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(b)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return b


def test_pass_at_k_is_the_unbiased_estimator_and_streams_differ():
    pytest.importorskip("yaml")
    b = _bench()
    m = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
    assert b.pass_at_k(m, 1) == pytest.approx((0.25 + 0 + 1) / 3)
    # scene 0: 1 - C(3, 2) / C(4, 2) = 1 - 3/6
    assert b.pass_at_k(m, 2) == pytest.approx((0.5 + 0 + 1) / 3)
    assert b.pass_at_k(m, 4) == pytest.approx(2 / 3)
    # monotone in k and a Monte Carlo check of the estimator on a random matrix
    rng = np.random.default_rng(0)
    r = rng.random((6, 8)) < 0.3
    vals = [b.pass_at_k(r, k) for k in range(1, 9)]
    assert all(x <= y + 1e-12 for x, y in zip(vals, vals[1:]))
    mc = np.mean([r[i, rng.choice(8, 3, replace=False)].any() for _ in range(4000) for i in range(6)])
    assert abs(mc - vals[2]) < 0.02
    with pytest.raises(ValueError, match="k must be"):
        b.pass_at_k(m, 5)
    # stream 0 is the noise bench's stream for the scene; the others differ from it and each other
    d = [b.stream_rng(200_000, s).standard_normal(4) for s in range(3)]
    assert np.array_equal(d[0], np.random.default_rng(200_000).standard_normal(4))
    assert not np.allclose(d[0], d[1]) and not np.allclose(d[1], d[2])


def test_quick_run_writes_every_outcome_and_the_plot(tmp_path):
    pytest.importorskip("lerobot")
    from tests.conftest import save_tiny_vla

    save_tiny_vla(str(tmp_path / "ckpt"))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "vla_steerability.py"), "--checkpoint", str(tmp_path / "ckpt"),
                        "--task", "pick_red_cube", "--scenes", "2", "--streams", "2", "--jobs", "2", "--port0", "6400",
                        "--noise", "tanh1.5", "--out", str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads((tmp_path / "res" / "vla_steerability.json").read_text())
    assert out["noise"] == "tanh1.5"
    res = out["results"]["pick_red_cube"]
    assert res["episodes"] == 4 and set(res["outcomes"]) == {"200000", "200001"}
    assert all(len(v) == 2 and set(v) <= {0, 1} for v in res["outcomes"].values())
    assert res["pass_at_1"] == pytest.approx(sum(map(sum, res["outcomes"].values())) / 4)
    assert len(res["pass_at_k"]) == 2 and res["pass_at_k"][1] >= res["pass_at_k"][0]
    assert (tmp_path / "res" / "vla_steerability.png").stat().st_size > 5_000
    assert not list((tmp_path / "res").glob("*.log"))
