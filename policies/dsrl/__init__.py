"""DSRL: latent-noise SAC that steers a frozen flow VLA (see agent.py)."""

from policies.dsrl.agent import VARIANTS, DSRLAgent, DSRLConfig

__all__ = ["VARIANTS", "DSRLAgent", "DSRLConfig"]
