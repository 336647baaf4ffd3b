"""bench/extoken.py's arms and their budgets."""

from bench import extoken


def test_extoken_full_is_extoken_at_grpos_budget():
    """The optional ``extoken-full`` arm runs ExToken (the token VLA) for GRPO's full budget: its own budget curve."""
    assert extoken.arm_updates("extoken-full", 8) == extoken.arm_updates("grpo", 8) == 8
    assert extoken.arm_updates("extoken", 8) == 2 and "extoken-full" in extoken.TOKEN_ARMS
