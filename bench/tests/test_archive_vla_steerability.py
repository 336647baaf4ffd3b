"""bench.archive.vla_steerability: pass@k over noise streams per scene, and the streams. Moved from
tests/test_bench_steerability.py (issue 62; the probe's run: tests/test_bench_archive_vla_steerability.py); e2e as it
was."""

import numpy as np
import pytest

pytestmark = pytest.mark.e2e


def test_pass_at_k_is_the_unbiased_estimator_and_streams_differ():
    pytest.importorskip("yaml")
    from bench.archive import vla_steerability as b

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
