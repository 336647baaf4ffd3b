"""DSRL (``vla rl --method dsrl``): ``agent`` (the update, read top to bottom), ``config`` (no torch),
the demo buffer from recorded demonstrations (``policies.common.demos``). ``DSRLAgent`` / ``DSRLConfig`` are
importable from here; the agent (torch) is imported on first use only."""

from policies.dsrl.config import ENCODERS, VARIANTS, DSRLConfig

__all__ = ["DSRLAgent", "DSRLConfig", "ENCODERS", "VARIANTS"]


def __getattr__(name: str):
    if name == "DSRLAgent":
        from policies.dsrl.agent import DSRLAgent

        return DSRLAgent
    raise AttributeError(f"module 'policies.dsrl' has no attribute {name!r}")
