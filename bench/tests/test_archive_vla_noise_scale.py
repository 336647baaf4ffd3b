"""bench.archive.vla_noise_scale's initial-noise distributions and its interval. Moved from
tests/test_bench_noise_scale.py (issue 62; the probe's run: tests/test_bench_archive_vla_noise_scale.py); e2e as it
was."""

import numpy as np
import pytest

pytestmark = pytest.mark.e2e


def test_noise_distributions():
    from bench.archive import vla_noise_scale as b

    rng = np.random.default_rng(0)
    draws = {name: np.asarray(fn(rng, (20_000, 7))) for name, (_, fn) in b.NOISES.items()}
    assert not draws["zero"].any()
    assert abs(draws["gauss0.33"].std() - 0.33) < 0.01 and abs(draws["gauss1"].std() - 1) < 0.02
    assert np.abs(draws["tanh1.5"]).max() <= 1.5 and abs(draws["tanh1.5"].std() - 0.94) < 0.03
    assert b.wilson(0, 20)[0] == 0.0 and 0.08 < b.wilson(4, 20)[0] < 0.09
