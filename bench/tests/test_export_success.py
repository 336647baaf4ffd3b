"""bench/export_success.py's comparison (rates, paired counts over identical seeds, the McNemar p-value) on
generated per-seed outcomes, and its plot."""

import numpy as np
import pytest

from bench import export_success as es


def _eval(outcomes: dict[str, list[bool]]) -> dict:
    tasks, per_seed = {}, {}
    for task, xs in outcomes.items():
        k, n = sum(xs), len(xs)
        tasks[task] = {"successes": k, "episodes": n, "ci95": [max(0.0, k / n - 0.1), min(1.0, k / n + 0.1)]}
        per_seed[task] = {100_000 + i: x for i, x in enumerate(xs)}
    return {"tasks": tasks, "per_seed": per_seed, "wall_s": 1.0}


@pytest.mark.parametrize("seed", range(5))
def test_summary_counts_what_each_variant_solved_on_the_same_seeds(seed, tmp_path):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    outcomes = {v: {"pick_red_cube": list(rng.random(n) < rng.random())} for v in es.VARIANTS}
    evals = {v: _eval(o) for v, o in outcomes.items()}
    s = es.summarize(evals, ["pick_red_cube"])["pick_red_cube"]
    for v in es.VARIANTS:
        assert s[v]["rate"] == pytest.approx(np.mean(outcomes[v]["pick_red_cube"]))
    a, b = np.array(outcomes["int8"]["pick_red_cube"]), np.array(outcomes["fp32"]["pick_red_cube"])
    r = s["int8_vs_fp32"]
    assert (r["only_first"], r["only_second"]) == (int((a & ~b).sum()), int((b & ~a).sum()))
    assert r["change"] == pytest.approx(a.mean() - b.mean()) == pytest.approx((r["only_first"] - r["only_second"]) / n)
    assert 0 < r["mcnemar_p"] <= 1 and r["episodes"] == n
    es.plot(es.summarize(evals, ["pick_red_cube"]), tmp_path / "p.png", "t")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_identical_outcomes_are_no_change_and_a_one_sided_split_is_significant():
    same = _eval({"t": [True] * 30 + [False] * 20})
    s = es.summarize({"fp32": same, "int8": same}, ["t"])["t"]
    assert s["int8_vs_fp32"] == {"change": 0.0, "episodes": 50, "only_first": 0, "only_second": 0, "mcnemar_p": 1.0}
    worse = _eval({"t": [False] * 50})
    s = es.summarize({"fp32": same, "int8": worse}, ["t"])["t"]
    assert s["int8_vs_fp32"]["only_second"] == 30 and s["int8_vs_fp32"]["mcnemar_p"] < 1e-6
    assert "int8_vs_torch" not in s  # only the variants that ran are compared
