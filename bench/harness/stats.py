"""The statistics of the benches: the Wilson interval of a success rate (``vla eval``'s own) and a paired test of
two policies on the same scenes (the exact sign test on the scenes only one of them solved: McNemar's exact
test)."""

from __future__ import annotations

from vla.evaluate import wilson_interval


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson interval of ``k`` successes in ``n`` as ``[low, high]`` (``[0, 1]`` when n is 0)."""
    lo, hi = wilson_interval(int(k), int(n), z)
    return [float(lo), float(hi)]


def sign_test(wins: int, losses: int, alternative: str = "two-sided") -> float:
    """p-value of the exact sign test: ``wins`` scenes only the candidate solved, ``losses`` only the reference
    solved (ties dropped). ``alternative``: ``two-sided``, ``greater`` (the candidate is better) or ``less``.
    1.0 when no scene tells them apart."""
    from scipy.stats import binomtest

    if wins < 0 or losses < 0:
        raise ValueError(f"wins and losses must be >= 0, got {wins} and {losses}")
    n = wins + losses
    return float(binomtest(wins, n, 0.5, alternative=alternative).pvalue) if n else 1.0


def mcnemar(a: dict, b: dict) -> dict:
    """Two policies on the same scenes (scene key -> success), compared on the scenes both ran: ``episodes`` (that
    many), ``only_first`` / ``only_second`` (solved by ``a`` only / ``b`` only) and ``mcnemar_p``, the exact
    two-sided McNemar p-value (:func:`sign_test` on the discordant scenes)."""
    common = sorted(set(a) & set(b))
    only_a = sum(bool(a[s]) and not b[s] for s in common)
    only_b = sum(bool(b[s]) and not a[s] for s in common)
    return {"episodes": len(common), "only_first": only_a, "only_second": only_b,
            "mcnemar_p": sign_test(only_a, only_b)}
