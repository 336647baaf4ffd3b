"""bench.harness.stats: the Wilson interval is vla eval's, and the paired test of two policies on the same scenes."""

import pytest

from bench.harness.stats import mcnemar, sign_test, wilson


def test_wilson_is_vla_evals_interval_as_a_list():
    from vla.evaluate import wilson_interval

    assert wilson(3, 10) == list(wilson_interval(3, 10)) and wilson(0, 0) == [0.0, 1.0]
    lo, hi = wilson(10, 10)
    assert hi == 1.0 and 0.69 < lo < 0.73


def test_sign_test_on_the_discordant_scenes():
    assert sign_test(0, 0) == 1.0
    assert sign_test(8, 0) == pytest.approx(2 / 2 ** 8)  # two-sided: both 8-0 splits
    assert sign_test(8, 0, "greater") == pytest.approx(1 / 2 ** 8) and sign_test(0, 8, "greater") == 1.0
    with pytest.raises(ValueError, match=">= 0"):
        sign_test(-1, 2)


def test_mcnemar_pairs_only_the_scenes_both_ran():
    a = {("t", i): x for i, x in enumerate([1, 1, 0, 0, 1])}
    b = {("t", i): x for i, x in enumerate([1, 0, 1, 1, 1])} | {("t", 99): True}
    r = mcnemar(a, b)
    assert (r["episodes"], r["only_first"], r["only_second"]) == (5, 1, 2) and r["mcnemar_p"] == 1.0
