"""DSRL: latent-noise SAC that steers a frozen flow VLA (see agent.py)."""

from policies.dsrl.agent import ENCODERS, VARIANTS, DSRLAgent, DSRLConfig

__all__ = ["ENCODERS", "VARIANTS", "DSRLAgent", "DSRLConfig"]
