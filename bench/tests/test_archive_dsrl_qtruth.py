"""bench.archive.dsrl_qtruth's pieces: the rank correlation and the permutation test of "the noise does not matter
here". Moved from tests/test_bench_dsrl_qtruth.py (issue 62; the probe's run: tests/test_bench_archive_dsrl_qtruth.py);
e2e as they were."""

import numpy as np
import pytest

from bench.archive.dsrl_qtruth import noise_effect, spearman

pytestmark = pytest.mark.e2e


def test_spearman_ranks_and_refuses_constant_sides():
    assert spearman(np.array([0.0, 0.5, 1.0]), np.array([1.0, 2.0, 9.0])) == pytest.approx(1.0)
    assert spearman(np.array([0.0, 0.5, 1.0]), np.array([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    assert spearman(np.zeros(4), np.arange(4.0)) is None and spearman(np.arange(4.0), np.ones(4)) is None


def test_noise_effect_separates_a_noise_that_matters_from_binomial_scatter():
    one_works = np.zeros((8, 4), bool)
    one_works[3] = True  # one noise always succeeds, the others never
    sd, p = noise_effect(one_works)
    assert p < 0.01 and sd > 0.3
    assert noise_effect(np.zeros((8, 4), bool)) == (0.0, 1.0)
    rng = np.random.default_rng(0)  # every noise the same 25%: the scatter is binomial, not the noise's
    ps = [noise_effect(rng.random((8, 4)) < 0.25, perms=500)[1] for _ in range(40)]
    assert np.mean(np.array(ps) < 0.05) <= 0.15
