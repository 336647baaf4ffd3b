"""bench.archive.residual_critic's AUC. Moved from tests/test_bench_residual_diagnostics.py (issue 62; the probes'
runs: tests/test_bench_archive_residual_diagnostics.py); e2e as it was."""

import numpy as np
import pytest

from bench.archive.residual_critic import auc

pytestmark = pytest.mark.e2e


def test_auc_ranks_and_is_undefined_for_one_class():
    assert auc(np.array([0.9, 0.8, 0.1, 0.2]), np.array([True, True, False, False])) == pytest.approx(1.0)
    assert auc(np.array([0.1, 0.2, 0.9, 0.8]), np.array([True, True, False, False])) == pytest.approx(0.0)
    assert auc(np.array([0.5, 0.5]), np.array([True, False])) == pytest.approx(0.5)
    assert auc(np.array([0.5, 0.4]), np.array([True, True])) is None
